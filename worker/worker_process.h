// One worker of a job, start to end (what onebit-worker does; see worker_main.cc): registers
// with the coordinator (which assigns the rank), builds the workload and the exchange the
// config asks for, trains in the coordinator's leases, serves /metrics and the probes, takes
// part in checkpoints, and writes a summary for launchers.
//
// The workload is the config's, or an outside one (WorkerProcessOptions::workload_factory):
// the Python package's, whose gradients come from PyTorch (python/onebit).
//
// PROCESS-WIDE: a recovery of the job (a newer generation) or its failure ends the process
// from the coordinator session's thread with std::_Exit(75) ("restart me") or (1), since
// the training thread may be blocked in a collective with a dead peer. TLS comes from the
// security flags (security/flags.h) over the config's.
#ifndef ONEBIT_WORKER_WORKER_PROCESS_H_
#define ONEBIT_WORKER_WORKER_PROCESS_H_

#include <functional>
#include <optional>
#include <utility>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "config/job_config.h"
#include "coordinator/coordinator_client.h"
#include "coordinator/member.h"
#include "kernels/kernels.h"
#include "kernels/wire_dtype.h"
#include "worker/optim/optim_checks.h"
#include "worker/trainer.h"
#include "worker/workloads/workload.h"

namespace onebit {

struct WorkerProcessOptions {
  std::string config_path;  // the job config (JSON); required
  std::string coordinator;  // host:port of the coordinator's gRPC service; required
  std::string host = "127.0.0.1";  // this worker's address (gloo, /metrics)
  int metrics_port = -1;           // -1: the config's; 0: a free one
  std::string summary_file;        // a JSON summary at the end ("": none)
  std::string params_out;          // the final parameters (.npy; "": none)
  int rank = -1;                   // the rank to ask for (-1: the next free one)
  // The model's parameter count, told to the coordinator when registering (it checks that
  // every worker agrees); 0: the built-in workload's, from the config.
  size_t num_parameters = 0;
  int cuda_device = 0;             // with onebit.device cuda
  int cpu_threads = -1;            // -1: the config's onebit.cpu_threads
  bool check = false;              // validate flags and config, then return
  // RegisterRequest.job_key: which of a launch's jobs this worker is for ("": any).
  std::string job_key;
  std::string fault;               // kill_in_exchange:STEP or kill_before_commit:STEP
  std::string member_token_file;   // "": $ONEBIT_MEMBER_TOKEN, then the config's
  std::string history_csv;         // every step and evaluation as CSV ("": none)
  // Only warnings and errors on the console: no progress lines and no start-up lines (the
  // Python package's ranks but 0, as DDP scripts print from rank 0 alone).
  bool quiet = false;
  // One CSV line per call of the job's transport (peer mode: worker/transport/
  // traced_transport.h) or per push and result (ps mode: ps_exchange.h), for counting
  // message rounds ("": none).
  std::string transport_trace;
  // Parameter groups with their own lr (a multiple of the job's) and weight decay: a
  // PyTorch script's param groups (worker/optim/optim_checks.h). Empty: the job's for all.
  std::vector<HyperGroup> hyper_groups;
  // The model's parameter format (CommonOptimizerOptions::param_dtype): bf16 or fp16 when
  // every parameter a PyTorch script trains has that type. Only with workload_factory: the
  // built-in workloads read fp32 parameters.
  kernels::WireDtype param_dtype = kernels::WireDtype::kFp32;
  // Whether the trainer evaluates the workload (periodically and at the end, as the config
  // says); off for an outside workload, which evaluates its model itself.
  bool evaluate = true;
  // An outside workload, made once the rank is known (on the backend given); null: the
  // config's workload.
  std::function<absl::StatusOr<std::unique_ptr<Workload>>(const JobConfig& config, int rank,
                                                          int world_size,
                                                          kernels::Backend* backend)>
      workload_factory;
  // A saved state this worker restores itself (onebit.torch's load_state_dict before the
  // first step): its step (0: none) and freeze step go to the coordinator, and when the job
  // starts after that step from its workers' states (RegisterResponse.resume without a
  // checkpoint name), restore_loaded_state puts it into the trainer (the rank the
  // coordinator gave is its argument: the error buffers are this worker's only if the
  // state was saved by the same rank of as many workers).
  int64_t loaded_step = 0;
  int64_t loaded_freeze_step = -1;
  std::function<absl::Status(Trainer& trainer, int rank, int world_size)> restore_loaded_state;
  // Called once the trainer exists (restored, when the job resumes) and before it runs:
  // the Python package takes its parameter and gradient buffers here. An error ends the run.
  std::function<absl::Status(Trainer& trainer)> before_run;
  // Called once the job ended for this worker, before anything is torn down (the Python
  // package copies the final parameters out of the optimizer here).
  std::function<absl::Status(Trainer& trainer)> after_run;
  // Called on every way out once the workload exists, before it and the rest are torn down
  // (the Python package stops using the workload here).
  std::function<void()> before_teardown;
  // The job's word ended this worker's part (the job failed: 78; it recovers: 75; its
  // coordinator is gone), heard by the session or while awaiting the job's end. Unset: the
  // process leaves at once with the verdict's exit code (std::_Exit: the training thread
  // may be blocked in a collective with a dead peer). Set (the Python package: the
  // training script is the process), it is called instead, possibly more than once and
  // from the session's thread, and the worker's run ends with ABORTED.
  std::function<void(const MemberVerdict& verdict)> on_verdict;
};

// What a worker knows of its membership in the job, for the verdict after an error.
// RunWorkerProcess fills it in as it connects and registers (a later run starts it over);
// the caller asks it once the run failed, or while it runs (ReportRestartableExit).
// Thread-safe; the calls to the coordinator hold no lock.
class WorkerMember {
 public:
  // After RunWorkerProcess failed with `error`: 75 when the coordinator says the job
  // recovers in a newer generation (restart this process), 78 when the job failed (a
  // registration it refused because the job is over included), else 1, with the
  // coordinator's word on why (empty where it said nothing: `error` is all there is). Asks
  // the coordinator for up to a heartbeat timeout: a dead peer shows here before the
  // coordinator has noticed. An error no restart fixes (IsPermanent: the training
  // diverged) is reported first, so that the job fails at once, naming this worker.
  MemberVerdict VerdictAfterError(const absl::Status& error);
  // VerdictAfterError's exit code, its reason printed to stderr ("onebit-worker: ...").
  int ExitCodeAfterError(const absl::Status& error);
  // This worker stops for a reason of its own that a restart may fix (`why`: the training
  // script raised) in `step`: the coordinator hears it at once, and a running job
  // recovers, naming this worker and `why` (member.h ReportRestartableFailure). Call it
  // while the worker is still a member (before its workload closes); before it registered,
  // it does nothing.
  void ReportRestartableExit(const std::string& why, int64_t step);

  // RunWorkerProcess's: the clients (`once`: one attempt a call, for the verdicts), then
  // the identity the coordinator gave, then a verdict decided while the session still beat.
  void Connected(std::shared_ptr<CoordinatorClient> client,
                 std::shared_ptr<CoordinatorClient> once, const std::string& instance_id);
  void Registered(const MemberIdentity& me, int rank, absl::Duration wait_for_verdict);
  void Decide(const MemberVerdict& verdict);

 private:
  // The members below, copied under mu_: the calls to the coordinator wait, and hold no lock.
  struct State {
    std::shared_ptr<CoordinatorClient> client, once;
    std::string instance_id;
    MemberIdentity me;
    int rank;
    absl::Duration wait_for_verdict;
    std::optional<MemberVerdict> decided;
  };
  State Snapshot() ABSL_LOCKS_EXCLUDED(mu_);

  absl::Mutex mu_;
  std::shared_ptr<CoordinatorClient> client_ ABSL_GUARDED_BY(mu_);
  // The verdicts and the restartable report are best effort within wait_for_verdict_, never
  // client_'s whole retry budget (failure.coordinator_retry_s) a call, which a coordinator
  // that died with rank 0's process would turn into minutes.
  std::shared_ptr<CoordinatorClient> once_ ABSL_GUARDED_BY(mu_);
  std::string instance_id_ ABSL_GUARDED_BY(mu_);
  MemberIdentity me_ ABSL_GUARDED_BY(mu_);  // job_id "" until registered
  int rank_ ABSL_GUARDED_BY(mu_) = -1;
  absl::Duration wait_for_verdict_ ABSL_GUARDED_BY(mu_) = absl::Seconds(15);
  std::optional<MemberVerdict> decided_ ABSL_GUARDED_BY(mu_);
};

// Runs the worker until the job ends for it, keeping `member` (not null) up to date.
// INVALID_ARGUMENT for bad options or config (exit code 2 in onebit-worker); other errors:
// member->ExitCodeAfterError says what to exit with.
absl::Status RunWorkerProcess(const WorkerProcessOptions& options, WorkerMember* member);

// SIGTERM/SIGINT (for common/signals.h's TerminationWatcher): /readyz turns 503, output is
// flushed, and the process exits 0 at once.
void LeaveOnSignal(int sig);

}  // namespace onebit

#endif  // ONEBIT_WORKER_WORKER_PROCESS_H_
