#include "worker/coordinator_step_controller.h"

#include <algorithm>
#include <cstdio>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace onebit {

CoordinatorStepController::~CoordinatorStepController() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

bool CoordinatorStepController::Droppable(absl::StatusCode code) {
  return code == absl::StatusCode::kUnavailable || code == absl::StatusCode::kDeadlineExceeded ||
         code == absl::StatusCode::kResourceExhausted;
}

absl::Status CoordinatorStepController::EndAfter(int64_t last_step) {
  if (absl::Status queued = Flush(); !queued.ok()) return queued;
  bool unreported;
  {
    absl::MutexLock lock(&mu_);
    unreported = last_.has_value() && last_->step > last_reported_step_;
  }
  if (unreported) {
    if (absl::Status sent = SendNow(Message(*last_)); !sent.ok()) return sent;
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
  // The coordinator decides leases (a freeze, say) on the reports: it must have them all.
  if (absl::Status queued = Flush(); !queued.ok()) return queued;
  v1::LeaseRequest request;
  request.set_rank(rank_);
  request.set_next_step(next_step);
  const absl::Time give_up = absl::Now() + absl::Minutes(10);
  absl::Duration backoff = absl::Milliseconds(5);
  for (;;) {
    absl::StatusOr<v1::LeaseResponse> r = client_->Lease(request);
    if (!r.ok()) return r.status();
    const bool stops_before = r->stop_after_step() >= 0 && r->stop_after_step() < next_step;
    bool unreported;
    {
      absl::MutexLock lock(&mu_);
      unreported = last_.has_value() && last_->step > last_reported_step_;
    }
    if (stops_before && unreported) {
      // The job ended at this worker's last step: the coordinator must hear of it.
      stop_after_step_ = r->stop_after_step();
      absl::Status sent = SendNow(Message(*last_));
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
  const bool last = report.step == stop_after_step_;
  const bool due = report.variance_change.has_value() || report.step == 1 || last ||
                   (report_every_ > 0 && report.step % report_every_ == 0);
  if (!due) {
    absl::MutexLock lock(&mu_);
    return std::exchange(error_, absl::OkStatus());
  }
  if (!last) {
    Enqueue(Message(report));
    absl::MutexLock lock(&mu_);
    return std::exchange(error_, absl::OkStatus());
  }
  // The final step's report matters: sent now, and its failure is the run's.
  if (absl::Status queued = Flush(); !queued.ok()) return queued;
  return SendNow(Message(report));
}

v1::StatsReport CoordinatorStepController::Message(const StepReport& report) const {
  v1::StatsReport stats;
  stats.set_rank(rank_);
  stats.set_step(report.step);
  stats.set_stage(report.stage == Stage::kWarmup ? v1::STAGE_WARMUP : v1::STAGE_COMPRESSION);
  stats.set_loss(report.loss);
  stats.set_no_loss(!report.loss_given);
  stats.set_lr(report.lr);
  stats.set_hyper_digest(report.hyper_digest);
  stats.set_variance_change(report.variance_change.value_or(-1.0));
  stats.set_step_seconds(report.seconds());
  if (exchange_) {
    stats.set_bytes_sent(exchange_->bytes_sent());
    stats.set_bytes_received(exchange_->bytes_received());
  }
  return stats;
}

absl::Status CoordinatorStepController::SendNow(const v1::StatsReport& stats) {
  absl::Status status = client_->ReportStats(stats).status();
  if (status.ok()) {
    absl::MutexLock lock(&mu_);
    last_reported_step_ = std::max(last_reported_step_, stats.step());
  }
  return status;
}

void CoordinatorStepController::Enqueue(v1::StatsReport stats) {
  absl::MutexLock lock(&mu_);
  queue_.push_back(std::move(stats));
  if (!thread_.joinable()) thread_ = std::thread([this] { Run(); });
}

absl::Status CoordinatorStepController::Flush() {
  absl::MutexLock lock(&mu_);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return queue_.empty() && !sending_; };
  mu_.Await(absl::Condition(&idle));
  return std::exchange(error_, absl::OkStatus());
}

void CoordinatorStepController::Run() {
  mu_.Lock();
  for (;;) {
    auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || !queue_.empty(); };
    mu_.Await(absl::Condition(&ready));
    // Stopping: what is queued is dropped (the final report never is: it goes directly).
    if (stop_) break;
    v1::StatsReport stats = std::move(queue_.front());
    queue_.pop_front();
    sending_ = true;
    mu_.Unlock();  // the round trip runs without the lock: Report queues meanwhile
    const absl::Status sent = client_->ReportStats(stats).status();
    mu_.Lock();
    sending_ = false;
    if (sent.ok()) {
      last_reported_step_ = std::max(last_reported_step_, stats.step());
    } else if (Droppable(sent.code())) {
      // Statistics are not worth a job: an unreachable coordinator costs a report.
      std::fprintf(stderr, "worker rank %d: stats report of step %lld not delivered: %s\n", rank_,
                   static_cast<long long>(stats.step()), std::string(sent.message()).c_str());
    } else if (error_.ok()) {
      // About this member (a newer generation, say): the run's business, at its next call.
      // The reports queued behind it would only be refused the same way.
      error_ = sent;
      queue_.clear();
    }
  }
  mu_.Unlock();
}

}  // namespace onebit
