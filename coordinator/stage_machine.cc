#include "coordinator/stage_machine.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"

namespace onebit {

absl::Status ValidateStageMachineOptions(const StageMachineOptions& o) {
  if (o.world_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("onebit.workers: must be >= 1, got ", o.world_size));
  }
  if (o.lease_steps < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("onebit.lease_steps: must be >= 1, got ", o.lease_steps));
  }
  if (o.total_steps < 0) {
    return absl::InvalidArgumentError(absl::StrCat("steps: must be >= 0, got ", o.total_steps));
  }
  switch (o.policy) {
    case FreezePolicy::kNever:
      break;
    case FreezePolicy::kStatic:
      if (o.static_freeze_step < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("optimizer.params.freeze_step: must be >= 0, got ", o.static_freeze_step));
      }
      break;
    case FreezePolicy::kAutomatic:
      if (!(o.threshold > 0) || !std::isfinite(o.threshold)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "onebit.freeze.threshold: must be a finite number > 0, got ", o.threshold));
      }
      if (o.reports_in_a_row < 1) {
        return absl::InvalidArgumentError(
            absl::StrCat("onebit.freeze.reports_in_a_row: must be >= 1, got ", o.reports_in_a_row));
      }
      if (o.min_warmup < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("onebit.freeze.min_warmup: must be >= 0, got ", o.min_warmup));
      }
      if (o.max_warmup < o.min_warmup) {
        return absl::InvalidArgumentError(
            absl::StrCat("onebit.freeze.max_warmup: must be >= min_warmup (", o.min_warmup,
                         "), got ", o.max_warmup));
      }
      break;
  }
  return absl::OkStatus();
}

absl::StatusOr<StageMachine> StageMachine::Create(const StageMachineOptions& options) {
  absl::Status status = ValidateStageMachineOptions(options);
  if (!status.ok()) return status;
  return StageMachine(options);
}

StageMachine::StageMachine(const StageMachineOptions& options)
    : options_(options),
      stop_after_step_(options.total_steps),
      lease_through_(options.world_size, options.resume_step),
      last_step_(options.world_size, options.resume_step) {
  const int64_t start = options_.resume_step;
  max_lease_step_ = max_reported_step_ = last_counted_step_ = start;
  if (start > 0 && options_.resume_freeze_step >= 0 && options_.resume_freeze_step < start) {
    Schedule(options_.resume_freeze_step, "the switch of the checkpoint resumed from");
  } else if (options_.policy == FreezePolicy::kStatic) {
    Schedule(std::max(options_.static_freeze_step, start),
             options_.static_freeze_step >= start ? "static freeze_step from the job config"
                                                  : "static freeze_step, passed before the resume");
  }
  // max_warmup 0: the first lease could only be empty, so the switch is due at once.
  ForceAtMaxWarmupIfDue();
}

absl::Status StageMachine::CheckRankStep(int rank, int64_t step) const {
  if (rank < 0 || rank >= options_.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " is out of range [0, ", options_.world_size, ")"));
  }
  if (step < 0) {
    return absl::InvalidArgumentError(absl::StrCat("step must be >= 0, got ", step));
  }
  if (step > lease_through_[rank]) {
    return absl::FailedPreconditionError(absl::StrCat("rank ", rank, " reported step ", step,
                                                      " but holds a lease only through step ",
                                                      lease_through_[rank]));
  }
  return absl::OkStatus();
}

absl::StatusOr<LeaseGrant> StageMachine::Lease(int rank, int64_t next_step) {
  if (rank < 0 || rank >= options_.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " is out of range [0, ", options_.world_size, ")"));
  }
  if (next_step < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("next_step must be >= 1 (steps are numbered from 1), got ", next_step));
  }
  if (next_step > lease_through_[rank] + 1) {
    return absl::FailedPreconditionError(absl::StrCat(
        "rank ", rank, " holds a lease through step ", lease_through_[rank],
        "; it may ask from step ", lease_through_[rank] + 1, " at the latest, not ", next_step));
  }
  // next_step <= stop + 1 here, so the sum cannot overflow unless lease_steps is huge.
  int64_t through = next_step - 1 > std::numeric_limits<int64_t>::max() - options_.lease_steps
                        ? std::numeric_limits<int64_t>::max()
                        : next_step - 1 + options_.lease_steps;
  through = std::min(through, stop_after_step_);
  if (options_.policy == FreezePolicy::kAutomatic && freeze_step_ < 0) {
    // Never promise warmup past max_warmup: the switch must be possible there.
    through = std::min(through, std::max(options_.max_warmup, max_lease_step_));
  }
  if (through >= next_step) {
    lease_through_[rank] = std::max(lease_through_[rank], through);
    max_lease_step_ = std::max(max_lease_step_, through);
  }
  ForceAtMaxWarmupIfDue();
  return LeaseGrant{through, freeze_step_, stop_after_step_, CheckpointSteps(next_step, through)};
}

absl::StatusOr<int64_t> StageMachine::RequestCheckpoint(int64_t at_step) {
  const int64_t step = at_step > 0 ? at_step : max_lease_step_ + 1;
  if (step <= max_lease_step_) {
    return absl::FailedPreconditionError(
        absl::StrCat("a checkpoint after step ", step, " is too late: workers hold leases through step ",
                     max_lease_step_, "; the earliest possible is ", max_lease_step_ + 1));
  }
  if (step > stop_after_step_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "a checkpoint after step ", step, " is past the job's end (step ", stop_after_step_, ")"));
  }
  requested_checkpoints_.insert(step);
  return step;
}

std::vector<int64_t> StageMachine::CheckpointSteps(int64_t from, int64_t through) const {
  std::vector<int64_t> steps;
  if (through < from) return steps;
  const int64_t k = options_.checkpoint_every;
  for (auto it = requested_checkpoints_.lower_bound(from);
       it != requested_checkpoints_.end() && *it <= through; ++it) {
    steps.push_back(*it);
  }
  if (k > 0) {
    for (int64_t s = ((from + k - 1) / k) * k; s <= through; s += k) steps.push_back(s);
  }
  std::sort(steps.begin(), steps.end());
  steps.erase(std::unique(steps.begin(), steps.end()), steps.end());
  return steps;
}

absl::Status StageMachine::ReportProgress(int rank, int64_t step) {
  absl::Status status = CheckRankStep(rank, step);
  if (!status.ok()) return status;
  last_step_[rank] = step;
  max_reported_step_ = std::max(max_reported_step_, step);
  return absl::OkStatus();
}

absl::Status StageMachine::ReportVarianceChange(int rank, int64_t step, double variance_change) {
  absl::Status status = ReportProgress(rank, step);
  if (!status.ok()) return status;
  if (options_.policy != FreezePolicy::kAutomatic || freeze_step_ >= 0) return status;
  // Negative: not measured. Already counted steps: a late or repeated report.
  if (variance_change < 0 || step <= last_counted_step_) return status;
  PendingReport& report = pending_[step];
  if (report.seen.empty()) report.seen.assign(options_.world_size, false);
  if (report.seen[rank]) return status;
  report.seen[rank] = true;
  ++report.count;
  if (std::isnan(variance_change)) {
    report.any_nan = true;
  } else {
    report.max_value = std::max(report.max_value, variance_change);
  }
  if (report.count == options_.world_size) {
    const PendingReport complete = report;
    // Steps before this one that some worker skipped will never complete: drop them.
    pending_.erase(pending_.begin(), pending_.upper_bound(step));
    CountReportStep(step, complete);
  }
  return status;
}

void StageMachine::CountReportStep(int64_t step, const PendingReport& report) {
  last_counted_step_ = step;
  last_counted_variance_change_ =
      report.any_nan ? std::numeric_limits<double>::quiet_NaN() : report.max_value;
  const bool under = !report.any_nan && report.max_value < options_.threshold;
  streak_ = under ? streak_ + 1 : 0;
  if (streak_ >= options_.reports_in_a_row && step >= options_.min_warmup) {
    Schedule(std::max(max_lease_step_, step),
             absl::StrCat("automatic: variance change under ", options_.threshold, " for ", streak_,
                          " reports in a row through step ", step));
  }
}

void StageMachine::ForceAtMaxWarmupIfDue() {
  if (options_.policy == FreezePolicy::kAutomatic && freeze_step_ < 0 &&
      max_lease_step_ >= options_.max_warmup) {
    Schedule(std::max(max_lease_step_, options_.max_warmup),
             absl::StrCat("automatic: max_warmup ", options_.max_warmup, " reached"));
  }
}

void StageMachine::Schedule(int64_t step, std::string reason) {
  freeze_step_ = step;
  freeze_reason_ = std::move(reason);
  pending_.clear();
  streak_ = 0;
}

absl::Status StageMachine::CheckCanFreeze() const {
  if (options_.policy == FreezePolicy::kNever) {
    return absl::FailedPreconditionError(
        "optimizer Adam never switches to compression (optimizer.type is \"Adam\")");
  }
  return absl::OkStatus();
}

absl::Status StageMachine::FreezeAt(int64_t step) {
  absl::Status status = CheckCanFreeze();
  if (!status.ok()) return status;
  if (step < 0) {
    return absl::InvalidArgumentError(absl::StrCat("at_step must be >= 0, got ", step));
  }
  if (step == freeze_step_) return absl::OkStatus();
  if (FreezeFixed()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the switch after step ", freeze_step_, " is already leased (leases run through step ",
        max_lease_step_, "); it can no longer move"));
  }
  if (step < max_lease_step_) {
    return absl::FailedPreconditionError(
        absl::StrCat("workers hold leases through step ", max_lease_step_,
                     " in warmup; the earliest freeze step is ", max_lease_step_));
  }
  if (step >= stop_after_step_) {
    return absl::FailedPreconditionError(absl::StrCat("the job stops after step ", stop_after_step_,
                                                      "; a freeze at step ", step,
                                                      " would never take effect"));
  }
  Schedule(step, absl::StrCat("operator: freeze at step ", step));
  return absl::OkStatus();
}

absl::Status StageMachine::FreezeNow() {
  absl::Status status = CheckCanFreeze();
  if (!status.ok()) return status;
  if (FreezeFixed()) {
    return absl::FailedPreconditionError(
        absl::StrCat("the switch after step ", freeze_step_, " is already under way"));
  }
  const int64_t step = std::max(max_lease_step_, max_reported_step_);
  if (step >= stop_after_step_) {
    return absl::FailedPreconditionError(absl::StrCat("the job stops after step ", stop_after_step_,
                                                      ", which is already leased in warmup"));
  }
  Schedule(step, absl::StrCat("operator: freeze now (after step ", step, ")"));
  return absl::OkStatus();
}

absl::Status StageMachine::DelayFreeze(int64_t to_step) {
  absl::Status status = CheckCanFreeze();
  if (!status.ok()) return status;
  if (freeze_step_ < 0) {
    if (to_step < 0) return absl::OkStatus();  // nothing to cancel
    return absl::FailedPreconditionError(
        "no freeze is scheduled, so there is nothing to delay; use Freeze to schedule one");
  }
  if (to_step == freeze_step_) return absl::OkStatus();
  if (FreezeFixed()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the switch after step ", freeze_step_, " is already leased (leases run through step ",
        max_lease_step_, "); it can no longer move"));
  }
  if (to_step < 0) {
    if (options_.policy == FreezePolicy::kAutomatic && max_lease_step_ >= options_.max_warmup) {
      return absl::FailedPreconditionError(
          absl::StrCat("automatic mode switches at max_warmup (", options_.max_warmup,
                       ") at the latest and leases already reach step ", max_lease_step_,
                       "; delay to a later step instead of cancelling"));
    }
    freeze_step_ = -1;
    freeze_reason_.clear();
    pending_.clear();
    streak_ = 0;
    return absl::OkStatus();
  }
  if (to_step < freeze_step_) {
    return absl::InvalidArgumentError(
        absl::StrCat("to_step ", to_step, " is before the scheduled freeze step ", freeze_step_,
                     "; DelayFreeze only postpones (use Freeze to move it earlier)"));
  }
  if (to_step >= stop_after_step_) {
    return absl::FailedPreconditionError(
        absl::StrCat("the job stops after step ", stop_after_step_, "; a freeze at step ", to_step,
                     " would never take effect (cancel with a negative to_step instead)"));
  }
  Schedule(to_step, absl::StrCat("operator: freeze delayed to step ", to_step));
  return absl::OkStatus();
}

absl::Status StageMachine::Stop(int64_t after_step) {
  if (after_step >= 0 && after_step < max_lease_step_) {
    return absl::FailedPreconditionError(
        absl::StrCat("workers hold leases through step ", max_lease_step_,
                     "; the earliest stop is after step ", max_lease_step_));
  }
  const int64_t step = after_step >= 0 ? after_step : std::max(max_lease_step_, max_reported_step_);
  if (step > stop_after_step_) {
    return absl::FailedPreconditionError(absl::StrCat("the job already stops after step ",
                                                      stop_after_step_, "; it cannot be extended"));
  }
  stop_after_step_ = step;
  return absl::OkStatus();
}

absl::Status StageMachine::EndAfter(int64_t step) {
  if (step < 0) return absl::InvalidArgumentError(absl::StrCat("step must be >= 0, got ", step));
  if (max_reported_step_ > step) {
    return absl::FailedPreconditionError(absl::StrCat(
        "a worker already ran step ", max_reported_step_, ", past the end after step ", step));
  }
  if (step < stop_after_step_) stop_after_step_ = step;
  return absl::OkStatus();
}

bool StageMachine::Finished() const {
  for (int64_t step : last_step_) {
    if (step < stop_after_step_) return false;
  }
  return true;
}

}  // namespace onebit
