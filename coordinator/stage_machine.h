// The job's stage machine: when the workers switch from warmup to compression, step leases
// that make every worker switch at the same step, and when the job stops. Pure logic: no
// I/O, no clock, no locking (the owner serialises calls; see Coordinator).
//
// Steps 1..F are warmup and steps > F compress (F: the freeze step; < 0: none scheduled). A
// lease "through L" lets a worker run steps up to and including L, knowing F as of the
// grant. The invariants (docs/design.md, "Step leases and the stage switch"): F is
// scheduled or moved only to some F >= max_lease_step; once a lease extends past F, F never
// moves again; no lease passes the stop step, which only ever moves earlier and never below
// max_lease_step. An operator call that would break them gets FAILED_PRECONDITION naming
// the earliest step that would work.
#ifndef ONEBIT_COORDINATOR_STAGE_MACHINE_H_
#define ONEBIT_COORDINATOR_STAGE_MACHINE_H_

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace onebit {

// Who schedules F.
enum class FreezePolicy {
  kNever,   // optimizer "Adam": no freeze ever; freeze requests fail
  kStatic,  // F = static_freeze_step from the start
  // The workers' variance changes (ReportVarianceChange): when reports_in_a_row counted
  // report steps in a row are under the threshold and the last is >= min_warmup, F =
  // max(max_lease_step, that step). While no freeze is scheduled, leases stop at max_warmup
  // and the lease that reaches it schedules F = max_warmup: the switch at the latest.
  kAutomatic,
};

struct StageMachineOptions {
  int world_size = 1;
  int64_t lease_steps = 10;
  // The job stops after this step unless an operator stops it earlier.
  int64_t total_steps = 600;
  FreezePolicy policy = FreezePolicy::kStatic;
  int64_t static_freeze_step = 100000;  // kStatic
  // kAutomatic
  double threshold = 0.05;
  int reports_in_a_row = 3;
  int64_t min_warmup = 50;
  int64_t max_warmup = 1000;
  // Checkpoints after every multiple of this step; 0: only those requested.
  int64_t checkpoint_every = 0;
  // A resumed job: steps 1..resume_step are done (every worker starts at resume_step + 1),
  // and the switch as of that checkpoint was resume_freeze_step (< 0: none). A switch
  // already passed (resume_freeze_step < resume_step) stays where it was; otherwise the
  // policy decides again, but never at or before resume_step.
  int64_t resume_step = 0;
  int64_t resume_freeze_step = -1;
};

// OK, or INVALID_ARGUMENT naming the job config key at fault (e.g. "onebit.lease_steps").
absl::Status ValidateStageMachineOptions(const StageMachineOptions& options);

struct LeaseGrant {
  // The worker may run steps up to and including this one. Less than the requested
  // next_step when the job is over (next_step > stop_after_step).
  int64_t through_step = 0;
  int64_t freeze_step = -1;  // < 0: none scheduled
  int64_t stop_after_step = 0;
  // Steps in [next_step, through_step] after which every worker writes a checkpoint part.
  std::vector<int64_t> checkpoint_steps;
};

// Not thread-safe: the owner serialises every call.
class StageMachine {
 public:
  // Fails with INVALID_ARGUMENT if the options do not validate.
  static absl::StatusOr<StageMachine> Create(const StageMachineOptions& options);

  // Worker `rank` asks to run steps from `next_step` on. next_step may repeat or go back
  // (a retry, a rollback) but not skip past the rank's own lease + 1.
  absl::StatusOr<LeaseGrant> Lease(int rank, int64_t next_step);

  // Worker `rank` completed `step` (a heartbeat or a stats report). The step must lie
  // within the rank's lease.
  absl::Status ReportProgress(int rank, int64_t step);

  // A warmup report of the relative variance change ||v_t - v_{t-k}|| / ||v_t|| measured at
  // `step` (NaN counts as "not under the threshold"). Also counts as progress. Ignored for
  // the freeze decision unless the policy is kAutomatic and no freeze is scheduled; a
  // repeated (rank, step) is counted once. A step counts once every worker reported it,
  // with the largest value: the variance is the same on every worker in warmup, so they
  // agree unless something is wrong, and then the cautious value wins.
  absl::Status ReportVarianceChange(int rank, int64_t step, double variance_change);

  // Operator calls.
  absl::Status FreezeAt(int64_t step);
  absl::Status FreezeNow();
  // Postpones the scheduled freeze to `to_step` (>= the current one), or cancels it if
  // to_step < 0.
  absl::Status DelayFreeze(int64_t to_step);
  // Stops the job after `after_step`, or as soon as is safe if after_step < 0.
  absl::Status Stop(int64_t after_step);
  // The workers' training loops ended after `step` (a job without steps): the job stops
  // there, leases past it void (no worker can run a step its script does not compute).
  // FAILED_PRECONDITION if a worker already reported a later step.
  absl::Status EndAfter(int64_t step);
  // Schedules a checkpoint after `at_step`, or (at_step <= 0) after the earliest step no
  // lease has promised yet; returns the step. FAILED_PRECONDITION when that step is already
  // promised (at or before max_lease_step) or past the job's end.
  absl::StatusOr<int64_t> RequestCheckpoint(int64_t at_step);
  // The checkpoint steps in [from, through]: multiples of checkpoint_every and requested ones.
  std::vector<int64_t> CheckpointSteps(int64_t from, int64_t through) const;

  const StageMachineOptions& options() const { return options_; }
  int64_t freeze_step() const { return freeze_step_; }
  int64_t max_lease_step() const { return max_lease_step_; }
  int64_t stop_after_step() const { return stop_after_step_; }
  // The highest completed step any worker reported (0 before any).
  int64_t max_reported_step() const { return max_reported_step_; }
  // Whether `step` is a compression step as of now.
  bool Compresses(int64_t step) const { return freeze_step_ >= 0 && step > freeze_step_; }
  // A scheduled freeze that some lease extends past: it can no longer move.
  bool FreezeFixed() const { return freeze_step_ >= 0 && max_lease_step_ > freeze_step_; }
  // Every worker reported the last step of the job.
  bool Finished() const;
  // Why the current freeze step was scheduled, for logs ("" if none).
  const std::string& freeze_reason() const { return freeze_reason_; }
  // The latest variance change counted (every worker reported it), or -1.
  double last_counted_variance_change() const { return last_counted_variance_change_; }

 private:
  // Reports of one step, until every worker has sent one.
  struct PendingReport {
    std::vector<bool> seen;  // by rank
    int count = 0;
    double max_value = 0.0;
    bool any_nan = false;
  };

  explicit StageMachine(const StageMachineOptions& options);

  absl::Status CheckRankStep(int rank, int64_t step) const;
  absl::Status CheckCanFreeze() const;
  void Schedule(int64_t step, std::string reason);
  void CountReportStep(int64_t step, const PendingReport& report);
  void ForceAtMaxWarmupIfDue();

  StageMachineOptions options_;
  int64_t freeze_step_ = -1;
  int64_t max_lease_step_ = 0;
  int64_t stop_after_step_ = 0;
  int64_t max_reported_step_ = 0;
  std::string freeze_reason_;
  std::vector<int64_t> lease_through_;  // by rank: the furthest step granted
  std::vector<int64_t> last_step_;      // by rank: the last completed step reported
  // kAutomatic bookkeeping.
  std::map<int64_t, PendingReport> pending_;  // by report step
  int64_t last_counted_step_ = 0;
  int streak_ = 0;  // consecutive counted report steps under the threshold
  double last_counted_variance_change_ = -1.0;
  std::set<int64_t> requested_checkpoints_;
};

}  // namespace onebit

#endif  // ONEBIT_COORDINATOR_STAGE_MACHINE_H_
