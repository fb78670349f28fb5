// The coordinator's state and the one implementation of CoordinatorHandler: membership, the
// rendezvous store, the stage machine with its leases, stats, and the admin calls. The
// checkpoints' two-phase commit is CheckpointCommits'. No I/O besides log lines; the clock
// is injected. Served by CoordinatorServer (gRPC, REST, metrics); tests may also call it
// directly.
//
// Thread-safe. One mutex guards the job state (every call is short); the rendezvous store
// has its own, so that waiting KvGets hold nothing the rest needs. Every call validates
// its whole input before changing anything: an error leaves the state as it was.
#ifndef ONEBIT_COORDINATOR_COORDINATOR_H_
#define ONEBIT_COORDINATOR_COORDINATOR_H_

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <vector>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "checkpoint/manifest.h"
#include "coordinator/checkpoint_commits.h"
#include "coordinator/clock.h"
#include "coordinator/coordinator_handler.h"
#include "config/job_config.h"
#include "coordinator/kv_store.h"
#include "coordinator/membership.h"
#include "coordinator/metrics.h"
#include "config/zero_one_schedule.h"
#include "coordinator/stage_machine.h"

namespace onebit {

struct CoordinatorOptions {
  JobConfig config;
  std::string job_id = "onebit-job";
  // Which of a launch's jobs this is, where one launch runs several in turn (onebit.torch:
  // the script's n-th optimizer); "": any. A member with another key is answered
  // UNAVAILABLE (RegisterRequest.job_key).
  std::string job_key;
  // A member is dead after this long without a heartbeat (registering counts as one).
  absl::Duration heartbeat_timeout = absl::Seconds(10);
  KvLimits kv_limits;

  // Checkpoints (config.checkpoint). `commit_checkpoint` makes a checkpoint exist once every
  // part is in: it writes the manifest atomically and applies retention (onebit-coordinator
  // uses checkpoint::CommitCheckpoint on checkpoint.dir). Null: the job takes no
  // checkpoints, and CommitPart / Checkpoint fail with FAILED_PRECONDITION.
  std::function<absl::Status(const v1::CheckpointManifest&)> commit_checkpoint;
  // Committed checkpoints found at start, oldest first (listed, and the retention baseline).
  std::vector<v1::CheckpointManifest> committed;
  // Set when this run resumes: registering members are told, and the stage machine starts
  // after resume->step() with the manifest's switch.
  std::optional<v1::ResumeFrom> resume;
  int64_t resume_freeze_step = -1;
  // Recorded in manifests: a checkpoint of another model cannot be resumed.
  uint64_t num_parameters = 0;

  // FAILURES (config.failure). A registered member whose heartbeats stop for
  // heartbeat_timeout starts a recovery: the generation goes up, every member of the old
  // one is told (JobEvent) to exit with code 75 and be restarted, the membership and the
  // stage machine start over from the checkpoint `plan_resume` names (null: from step 0),
  // and once the whole membership registered again the job runs on. After
  // config.failure.max_restarts recoveries, or when the membership is not complete within
  // rejoin_timeout (at the start too), the job is FAILED. Members that hit an error no
  // restart fixes report it (ReportFailure) and the job is FAILED at once; a member that
  // stops for a reason a restart may fix reports it as restartable, and a running job
  // recovers at once, naming it.
  std::function<absl::StatusOr<checkpoint::ResumePlan>()> plan_resume;
  // The generation to start in, and the recoveries so far: a coordinator restarted from its
  // state file starts recovering in the next generation.
  int64_t generation = 1;
  int recoveries = 0;
  bool recovering = false;
  // The coordinator before this one stopped while recovering: this start goes on with that
  // recovery (recoveries is not one more). Else a restart past config.failure.max_restarts
  // recoveries fails the job.
  bool recovery_goes_on = false;
  // The recoveries before this start (the state file's), oldest first; a restart of the
  // coordinator (recovering) adds its own.
  std::vector<v1::Recovery> recovery_log;
  // Set when the state file says this job FAILED, for this reason, with this config: the
  // job stays FAILED (a restart cannot fix it); members are refused with the reason.
  std::string failed;
  // Called whenever the durable state changes (a recovery, a failure) with job_id,
  // generation, recoveries, over, failure_reason and recovery_log set, to keep it on disk.
  std::function<absl::Status(const v1::CoordinatorState& state)> persist;
};

// The stage machine's options for a job config; INVALID_ARGUMENT names the config key.
absl::StatusOr<StageMachineOptions> StageMachineOptionsFromConfig(const JobConfig& config);

class Coordinator final : public CoordinatorHandler {
 public:
  // `clock` and `metrics` are not owned and must outlive the coordinator; metrics may be
  // null. INVALID_ARGUMENT if the config does not make a job.
  static absl::StatusOr<std::unique_ptr<Coordinator>> Create(const CoordinatorOptions& options,
                                                             Clock* clock,
                                                             CoordinatorMetrics* metrics);

  absl::StatusOr<v1::RegisterResponse> Register(const v1::RegisterRequest& request) override;
  absl::StatusOr<v1::KvSetResponse> KvSet(const v1::KvSetRequest& request) override;
  absl::StatusOr<v1::KvGetResponse> KvGet(const v1::KvGetRequest& request) override;
  absl::StatusOr<v1::LeaseResponse> Lease(const v1::LeaseRequest& request) override;
  absl::StatusOr<v1::StatsReportResponse> ReportStats(const v1::StatsReport& report) override;
  absl::StatusOr<v1::JobStatus> ReportFailure(const v1::FailureReport& report) override;
  absl::Status Heartbeat(const v1::Heartbeat& heartbeat) override;
  uint64_t WaitForJobChange(uint64_t seen_version, absl::Duration timeout) override;
  absl::StatusOr<v1::JobStatus> GetJob(const v1::GetJobRequest& request) override;
  absl::StatusOr<v1::ListMembersResponse> ListMembers(
      const v1::ListMembersRequest& request) override;
  absl::StatusOr<v1::JobStatus> Freeze(const v1::FreezeRequest& request) override;
  absl::StatusOr<v1::JobStatus> DelayFreeze(const v1::DelayFreezeRequest& request) override;
  absl::StatusOr<v1::JobStatus> Stop(const v1::StopRequest& request) override;
  absl::StatusOr<v1::CommitPartResponse> CommitPart(const v1::CommitPartRequest& request) override;
  absl::StatusOr<v1::CheckpointInfo> Checkpoint(const v1::CheckpointRequest& request) override;
  absl::StatusOr<v1::ListCheckpointsResponse> ListCheckpoints(
      const v1::ListCheckpointsRequest& request) override;

  // Re-evaluates liveness against the clock (call it periodically): a member that went
  // silent changes the job's version, so sessions hear of it.
  void Tick() ABSL_LOCKS_EXCLUDED(mu_);

  // Every worker registered and reported the job's last step, and no checkpoint waits for
  // parts: nothing is left to do.
  bool Finished() const ABSL_LOCKS_EXCLUDED(mu_);
  // The job cannot continue; the reason is in GetJob's failure_reason.
  bool Failed() const ABSL_LOCKS_EXCLUDED(mu_);
  // Fails a job that is not over, with `reason` (every member hears it on its session):
  // the process that runs an embedded coordinator is leaving before the job's end.
  void Abandon(const std::string& reason) ABSL_LOCKS_EXCLUDED(mu_);
  // Starts a recovery of a running job, as a lost member does (within max_restarts; from
  // the last committed checkpoint): the process that runs an embedded coordinator is leaving
  // for a reason a restart may fix (its script raised), and the launcher that restarts it
  // resumes the job from the state file. A job that is not running is left as it is.
  void Recover(const std::string& what_failed) ABSL_LOCKS_EXCLUDED(mu_);
  // Saves the state (Options::persist) as over: a later start with it is a new job, or the
  // same FAILED one. For the end of a process whose job is over.
  void PersistOver() ABSL_LOCKS_EXCLUDED(mu_);

  // Wakes blocked KvGet and WaitForJobChange calls; they return at once from now on.
  void Shutdown() ABSL_LOCKS_EXCLUDED(mu_);

  const std::string& job_id() const { return options_.job_id; }

 private:
  // The parts of the status whose change is pushed to sessions.
  struct Digest {
    v1::JobState state;
    int64_t generation;
    v1::Stage stage;
    int64_t freeze_step, stop_after_step;
    int workers_registered, workers_alive, servers_registered, servers_alive;
    bool operator==(const Digest& o) const;
  };

  Coordinator(const CoordinatorOptions& options, Clock* clock, CoordinatorMetrics* metrics,
              StageMachine stage_machine);

  absl::Status CheckWorker(int rank) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  v1::JobStatus JobLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool FinishedLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Liveness and deadlines: starts a recovery, completes one, or fails the job.
  void CheckFailuresLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RecoverLocked(const std::string& what_failed) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FailLocked(const std::string& reason) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // FAILED_PRECONDITION, and the job FAILED, when `report`'s hyper_digest differs from
  // another worker's of the same step.
  absl::Status CheckHypersLocked(const v1::StatsReport& report) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A worker's training loop ended after `last` (LeaseRequest.ended).
  absl::StatusOr<v1::LeaseResponse> EndedLocked(int rank, int64_t last)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::map<int, int64_t> ended_after_ ABSL_GUARDED_BY(mu_);  // this generation's
  // The first worker's model size, when the config does not give one.
  uint64_t learned_num_parameters_ ABSL_GUARDED_BY(mu_) = 0;
  // The config terms of the first member of each role that said them (RegisterRequest.
  // job_terms), and who it was: every other member of that role must agree. Not the
  // coordinator's own file: a training script amends the launch's config for its workers
  // (onebit.torch's keyword arguments, the overlap it decides), alike on every rank.
  struct FirstTerms {
    std::string terms;
    std::string name;      // "worker 0"
    std::string instance;  // its instance id
  };
  std::map<int, FirstTerms> first_terms_ ABSL_GUARDED_BY(mu_);  // by v1::Role
  // Whether a registering member can train in this job at all: its model's size, and its
  // config's terms against the first of its role's. One that cannot fails the job (however
  // often it restarts, it could not train here): FAILED_PRECONDITION naming what differs.
  absl::Status CheckFitsLocked(const v1::RegisterRequest& request)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The step of the saved states the first worker of this generation loaded (0: none) and
  // who it was; the others must agree (RegisterRequest.loaded_step).
  std::optional<std::pair<int64_t, std::string>> first_loaded_ ABSL_GUARDED_BY(mu_);
  // Checks a registering worker's loaded state; the first one with a state moves the
  // job's start after its step (resume_ with no checkpoint name).
  absl::Status LoadedStateLocked(const v1::RegisterRequest& request)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The model's size: the config's, else the first registered worker's (0: not yet known).
  uint64_t NumParametersLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return options_.num_parameters > 0 ? options_.num_parameters : learned_num_parameters_;
  }
  // After every change: bump the version if sessions should hear of it, log what moved,
  // refresh the gauges.
  void ChangedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // An admin call that changed the stage machine: log and answer with the new status.
  v1::JobStatus AdminDoneLocked(const std::string& what) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // The job's facts a checkpoint depends on, now.
  CheckpointFacts CheckpointFactsLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const CoordinatorOptions options_;
  Clock* const clock_;
  CoordinatorMetrics* const metrics_;  // may be null
  KvStore kv_;

  mutable absl::Mutex mu_;
  StageMachine stage_machine_ ABSL_GUARDED_BY(mu_);
  // 0/1 Adam: its schedule after the steps before the last lease's first, and the
  // var_freeze_step it was advanced with (rebuilt when that moves).
  std::optional<ZeroOneSchedule> schedule_ ABSL_GUARDED_BY(mu_);
  int64_t schedule_freeze_step_ ABSL_GUARDED_BY(mu_) = -1;
  Membership membership_ ABSL_GUARDED_BY(mu_);
  double last_loss_ ABSL_GUARDED_BY(mu_) = 0.0;
  int64_t last_loss_step_ ABSL_GUARDED_BY(mu_) = -1;
  double last_variance_change_ ABSL_GUARDED_BY(mu_) = -1.0;
  int64_t last_variance_step_ ABSL_GUARDED_BY(mu_) = -1;
  // The first worker's StatsReport::hyper_digest (and lr) of each recently reported step,
  // which every other worker's report of that step must match (this generation's; at most
  // kHyperStepsKept steps).
  struct StepHypers {
    int rank = 0;
    double lr = 0.0;
    uint64_t digest = 0;
  };
  std::map<int64_t, StepHypers> step_hypers_ ABSL_GUARDED_BY(mu_);
  uint64_t version_ ABSL_GUARDED_BY(mu_) = 1;
  absl::CondVar changed_;  // signalled when version_ moves, and at Shutdown
  Digest digest_ ABSL_GUARDED_BY(mu_);
  int64_t logged_freeze_step_ ABSL_GUARDED_BY(mu_) = -1;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  CheckpointCommits checkpoints_ ABSL_GUARDED_BY(mu_);
  std::optional<v1::ResumeFrom> resume_ ABSL_GUARDED_BY(mu_);
  v1::JobState state_ ABSL_GUARDED_BY(mu_) = v1::JOB_STATE_STARTING;
  std::string failure_reason_ ABSL_GUARDED_BY(mu_);
  int64_t generation_ ABSL_GUARDED_BY(mu_) = 1;
  int recoveries_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<v1::Recovery> recovery_log_ ABSL_GUARDED_BY(mu_);  // oldest first
  // A recovery into generation_ after `what_failed`, resuming after `resume_step`: logged
  // in recovery_log_ and saved (persist).
  void RecordRecoveryLocked(const std::string& what_failed, int64_t resume_step)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void PersistLocked(bool over) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Time membership_deadline_ ABSL_GUARDED_BY(mu_);  // STARTING / RECOVERING
};

}  // namespace onebit

#endif  // ONEBIT_COORDINATOR_COORDINATOR_H_
