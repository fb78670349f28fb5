// The coordinator of one job as a component: the job config, the durable state file, the
// checkpoint plan and clean-up, and a CoordinatorServer (gRPC, REST, /metrics) around one
// Coordinator. onebit-coordinator runs one in its own process; onebit.torch runs one inside
// rank 0 of a torchrun/srun job when no coordinator is named (the embedded default).
//
//   auto job = JobCoordinator::Prepare(options);   // validates; no file, no port
//   auto started = JobCoordinator::Start(*job);    // state file, checkpoints, ports
//   while ((*started)->Check() == JobCoordinator::kRunning) ...;
//   (*started)->Shutdown();                        // saves the state; stops serving
//
// Thread safety: Check() and Shutdown() from one thread; the server's accessors from any.
#ifndef ONEBIT_COORDINATOR_JOB_COORDINATOR_H_
#define ONEBIT_COORDINATOR_JOB_COORDINATOR_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "config/job_config.h"
#include "coordinator/coordinator.h"
#include "coordinator/coordinator_server.h"
#include "security/tls_options.h"

namespace onebit {

struct JobCoordinatorOptions {
  std::string config_path;  // the job config (JSON); required
  std::string host = "127.0.0.1";
  // -1: the config's onebit.ports (coordinator, coordinator_rest, metrics); 0: any free.
  int grpc_port = -1;
  int rest_port = -1;
  int metrics_port = -1;
  std::string job_id;  // empty: the state file's (a restart), else a new one
  absl::Duration heartbeat_timeout = absl::ZeroDuration();  // 0: the config's
  // Empty: coordinator-state.json in onebit.checkpoint.dir, if set.
  std::string state_file;
  // Token files; empty: $ONEBIT_ADMIN_TOKEN / $ONEBIT_MEMBER_TOKEN, then the config's.
  std::string admin_token_file;
  std::string member_token_file;
  security::TlsOptions tls;  // security::TlsFromFlags(config.security.tls) in the binary
  absl::Duration kv_max_wait = absl::Seconds(30);
  // A digest of the job's code, where the caller knows it (onebit.torch: the training
  // script's and that of the modules it imported from its own directory). A job that FAILED
  // stays failed when started again with the same config and code; edited code, like
  // another config, is the fix and a new job.
  std::string code_digest;
  // CoordinatorOptions.job_key: which of a launch's jobs this is ("": any).
  std::string job_key;
};

// Everything Start needs, checked: what --check validates.
struct PreparedJob {
  JobConfig config;
  JobCoordinatorOptions options;
  CoordinatorOptions coordinator;
  CoordinatorServerOptions server;
  std::string state_file;
  bool restarted = false;  // the state file holds a job that is not over
  int64_t saved_generation = 0;
  // The state file holds a job that FAILED with this config: why (it stays FAILED).
  std::string failed;
  // The state file holds a job that FAILED with another config or code: "<id> failed (why)".
  std::string replaces_failed;
  uint32_t crc = 0;  // the config's and code's mark (CoordinatorState.config_crc32)
};

class JobCoordinator {
 public:
  enum Outcome { kRunning, kSucceeded, kFailed };

  // Reads the config and the state file and resolves ports and tokens; writes nothing.
  // INVALID_ARGUMENT for a bad option (a port out of range), other codes for a config,
  // state file or token that does not load (the message names it).
  static absl::StatusOr<PreparedJob> Prepare(const JobCoordinatorOptions& options);
  // Saves the state, plans the resume from the checkpoints (and removes uncommitted
  // ones), binds every port and serves.
  static absl::StatusOr<std::unique_ptr<JobCoordinator>> Start(PreparedJob job);

  ~JobCoordinator();

  // Whether the job is over; the first time it is, logs it.
  Outcome Check();
  Coordinator* coordinator() { return server_->coordinator(); }
  // Members connected now (their Session streams).
  int open_sessions() const { return server_->open_sessions(); }
  const CoordinatorAddresses& addresses() const { return server_->addresses(); }
  // Stops serving; a job that is over is saved as over (a later start is a new job,
  // unless it failed and starts with the same config: then it is the same failed job).
  // Idempotent.
  void Shutdown();

 private:
  JobCoordinator(PreparedJob job, std::unique_ptr<CoordinatorServer> server)
      : job_(std::move(job)), server_(std::move(server)) {}

  const PreparedJob job_;
  std::unique_ptr<CoordinatorServer> server_;
  Outcome outcome_ = kRunning;
  bool shut_down_ = false;
};

}  // namespace onebit

#endif  // ONEBIT_COORDINATOR_JOB_COORDINATOR_H_
