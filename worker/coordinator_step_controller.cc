#include "worker/coordinator_step_controller.h"

#include <algorithm>
#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace onebit {

absl::Status CoordinatorStepController::EndAfter(int64_t last_step) {
  if (last_.has_value() && last_->step > last_reported_step_) {
    const StepReport final_report = *last_;
    if (absl::Status sent = Send(final_report); !sent.ok()) return sent;
  }
  v1::LeaseRequest request;
  request.set_rank(rank_);
  request.set_next_step(last_step + 1);
  request.set_ended(true);
  absl::StatusOr<v1::LeaseResponse> r = client_->Lease(request);
  if (!r.ok()) return r.status();
  stop_after_step_ = r->stop_after_step();
  return absl::OkStatus();
}

absl::StatusOr<Lease> CoordinatorStepController::Acquire(int64_t next_step) {
  v1::LeaseRequest request;
  request.set_rank(rank_);
  request.set_next_step(next_step);
  const absl::Time give_up = absl::Now() + absl::Minutes(10);
  absl::Duration backoff = absl::Milliseconds(5);
  for (;;) {
    absl::StatusOr<v1::LeaseResponse> r = client_->Lease(request);
    if (!r.ok()) return r.status();
    const bool stops_before = r->stop_after_step() >= 0 && r->stop_after_step() < next_step;
    if (stops_before && last_.has_value() && last_->step > last_reported_step_) {
      // The job ended at this worker's last step: the coordinator must hear of it.
      const StepReport final_report = *last_;
      stop_after_step_ = r->stop_after_step();
      absl::Status sent = Send(final_report);
      if (!sent.ok()) return sent;
    }
    if (r->through_step() >= next_step || stops_before) {
      freeze_step_ = r->freeze_step();
      stop_after_step_ = r->stop_after_step();
      Lease lease{r->through_step(), r->freeze_step(), r->stop_after_step(),
                  std::vector<int64_t>(r->checkpoint_steps().begin(), r->checkpoint_steps().end())};
      if (r->exchange_schedule()) {
        lease.exchange_steps.emplace(r->exchange_steps().begin(), r->exchange_steps().end());
      }
      return lease;
    }
    if (absl::Now() > give_up) {
      return absl::DeadlineExceededError(
          absl::StrCat("the coordinator granted no lease for step ", next_step, " in 10 minutes"));
    }
    absl::SleepFor(backoff);
    backoff = std::min(backoff * 2, absl::Milliseconds(200));
  }
}

absl::Status CoordinatorStepController::Report(const StepReport& report) {
  if (session_) session_->SetStep(report.step);
  last_ = report;
  // The last step is always reported: the coordinator ends the job when every worker has.
  const bool due = report.variance_change.has_value() || report.step == 1 ||
                   report.step == stop_after_step_ ||
                   (report_every_ > 0 && report.step % report_every_ == 0);
  if (!due) return absl::OkStatus();
  const absl::Status sent = Send(report);
  // Statistics are not worth a job: an unreachable coordinator (being restarted, say) costs
  // a report, not the training. The final step's report does matter; so does an answer
  // about this member (not registered any more: a newer generation).
  const absl::StatusCode code = sent.code();
  if (report.step != stop_after_step_ &&
      (code == absl::StatusCode::kUnavailable || code == absl::StatusCode::kDeadlineExceeded ||
       code == absl::StatusCode::kResourceExhausted)) {
    std::fprintf(stderr, "worker rank %d: stats report of step %lld not delivered: %s\n", rank_,
                 static_cast<long long>(report.step), std::string(sent.message()).c_str());
    return absl::OkStatus();
  }
  return sent;
}

absl::Status CoordinatorStepController::Send(const StepReport& report) {
  v1::StatsReport stats;
  stats.set_rank(rank_);
  stats.set_step(report.step);
  stats.set_stage(report.stage == Stage::kWarmup ? v1::STAGE_WARMUP : v1::STAGE_COMPRESSION);
  stats.set_loss(report.loss);
  stats.set_variance_change(report.variance_change.value_or(-1.0));
  stats.set_step_seconds(report.seconds());
  if (exchange_) {
    stats.set_bytes_sent(exchange_->bytes_sent());
    stats.set_bytes_received(exchange_->bytes_received());
  }
  absl::Status status = client_->ReportStats(stats).status();
  if (status.ok()) last_reported_step_ = std::max(last_reported_step_, report.step);
  return status;
}

}  // namespace onebit
