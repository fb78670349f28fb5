#include "coordinator/job_coordinator.h"

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "checkpoint/manifest.h"
#include "checkpoint/part.h"
#include "common/atomic_file.h"
#include "common/status_macros.h"
#include "config/model_spec.h"
#include "coordinator/log.h"
#include "proto/proto_json.h"
#include "security/auth.h"

namespace onebit {
namespace {

absl::StatusOr<std::string> ReadSmallFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::string text(std::istreambuf_iterator<char>(in), {});
  if (text.size() > (1 << 20)) return absl::DataLossError("too large for a state file");
  return text;
}

std::string NewJobId() {
  absl::BitGen gen;
  return absl::StrFormat("job-%s-%04x",
                         absl::FormatTime("%Y%m%d-%H%M%S", absl::Now(), absl::UTCTimeZone()),
                         absl::Uniform<uint32_t>(gen, 0, 0x10000));
}

// The state file's mark of what a failed job ran (CoordinatorState.config_crc32): its
// config, and the code's digest where the caller knows one (JobCoordinatorOptions).
uint32_t JobCrc(const JobConfig& config, const std::string& code_digest) {
  std::string what = JobConfigToJson(config);
  if (!code_digest.empty()) absl::StrAppend(&what, "\ncode ", code_digest);
  return checkpoint::Crc32(what);
}

absl::Status WriteState(const std::string& state_file, v1::CoordinatorState state, uint32_t crc) {
  if (state_file.empty()) return absl::OkStatus();
  state.set_config_crc32(crc);
  return WriteFileAtomically(state_file, ToJson(state, /*pretty=*/true));
}

}  // namespace

absl::StatusOr<PreparedJob> JobCoordinator::Prepare(const JobCoordinatorOptions& options) {
  if (options.config_path.empty()) return absl::InvalidArgumentError("a job config is required");
  if (options.heartbeat_timeout < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("the heartbeat timeout must be positive");
  }
  PreparedJob job;
  job.options = options;
  ONEBIT_ASSIGN_OR_RETURN(job.config, LoadJobConfig(options.config_path));
  const JobConfig& config = job.config;

  // The state of an earlier run of this coordinator: a job that is not over is recovered.
  job.state_file = options.state_file;
  if (job.state_file.empty() && !config.checkpoint.dir.empty()) {
    job.state_file = checkpoint::JoinPath(config.checkpoint.dir, "coordinator-state.json");
  }
  job.crc = JobCrc(config, options.code_digest);
  v1::CoordinatorState saved;
  if (!job.state_file.empty() && access(job.state_file.c_str(), F_OK) == 0) {
    absl::StatusOr<std::string> text = ReadSmallFile(job.state_file);
    absl::Status parsed = text.ok() ? FromJson(*text, &saved) : text.status();
    if (!parsed.ok()) {
      return absl::FailedPreconditionError(absl::StrCat(
          job.state_file, ": ", parsed.message(), " (remove it to start a new job)"));
    }
    job.restarted = !saved.over();
    // A job that failed stays failed when started again as it was: a restart cannot fix
    // what failed it. Another config or code (the fix) is a new job.
    if (saved.over() && !saved.failure_reason().empty()) {
      if (saved.config_crc32() == job.crc) {
        job.failed = saved.failure_reason();
      } else {
        job.replaces_failed = absl::StrCat(saved.job_id(), " failed (", saved.failure_reason(), ")");
      }
    }
  }
  CoordinatorOptions& c = job.coordinator;
  c.config = config;
  c.job_key = options.job_key;
  c.job_id = !options.job_id.empty() ? options.job_id
             : job.restarted         ? saved.job_id()
                                     : NewJobId();
  if (job.restarted) {
    job.saved_generation = saved.generation();
    c.generation = saved.generation() + 1;
    // A restart while recovering goes on with that recovery; any other is one more.
    c.recovery_goes_on = saved.recovering();
    c.recoveries = saved.recoveries() + (saved.recovering() ? 0 : 1);
    c.recovering = true;
  }
  if (job.restarted || !job.failed.empty()) {
    c.recovery_log.assign(saved.recovery_log().begin(), saved.recovery_log().end());
  }
  if (!job.failed.empty()) {
    c.job_id = saved.job_id();
    c.generation = saved.generation();
    c.recoveries = saved.recoveries();
    c.failed = job.failed;
  }
  c.persist = [state_file = job.state_file, crc = job.crc](const v1::CoordinatorState& state) {
    return WriteState(state_file, state, crc);
  };
  c.heartbeat_timeout = options.heartbeat_timeout > absl::ZeroDuration()
                            ? options.heartbeat_timeout
                            : absl::Seconds(config.failure.heartbeat_timeout_s);
  c.kv_limits.max_wait = options.kv_max_wait;

  CoordinatorServerOptions& s = job.server;
  s.host = options.host;
  auto port = [](int option, int from_config) { return option >= 0 ? option : from_config; };
  s.grpc_port = port(options.grpc_port, config.ports.coordinator);
  s.rest_port = port(options.rest_port, config.ports.coordinator_rest);
  s.metrics_port = port(options.metrics_port, config.ports.metrics);
  for (int p : {s.grpc_port, s.rest_port, s.metrics_port}) {
    if (p > 65535) return absl::InvalidArgumentError(absl::StrCat("port ", p, " is out of range"));
  }
  s.tls = options.tls;
  ONEBIT_ASSIGN_OR_RETURN(const std::string admin_token,
                          security::ResolveToken(options.admin_token_file, "ONEBIT_ADMIN_TOKEN",
                                                 config.security.admin_token_file));
  ONEBIT_ASSIGN_OR_RETURN(const std::string member_token,
                          security::ResolveToken(options.member_token_file, "ONEBIT_MEMBER_TOKEN",
                                                 config.security.member_token_file));
  if (!admin_token.empty() && admin_token == member_token) {
    return absl::FailedPreconditionError(
        "the admin and member tokens must differ (a member could act as admin)");
  }
  s.tokens = {admin_token, member_token};
  // The heartbeat timeout is seconds; a tick well under it keeps liveness fresh.
  s.tick = std::min(absl::Milliseconds(200), c.heartbeat_timeout / 4);
  // The model's size: manifests record it, and every registering worker must agree.
  absl::StatusOr<size_t> n = WorkloadParameterCount(config.workload);
  if (n.ok()) {
    c.num_parameters = *n;
  } else if (!config.checkpoint.dir.empty()) {
    return n.status();
  }
  return job;
}

absl::StatusOr<std::unique_ptr<JobCoordinator>> JobCoordinator::Start(PreparedJob job) {
  CoordinatorOptions& c = job.coordinator;
  if (job.restarted) {
    LogLine(absl::StrCat("restarted: job ", c.job_id, " was in generation ", job.saved_generation,
                         "; recovering in generation ", c.generation));
  }
  const bool script = !job.options.code_digest.empty();
  if (!job.failed.empty()) {
    LogLine(absl::StrCat(job.state_file, " says job ", c.job_id, " failed with this ",
                         script ? "config and script" : "config",
                         ": it stays failed (remove that file, or change the ",
                         script ? "config or the script" : "config", ", to start a new job)"));
  }
  if (!job.replaces_failed.empty()) {
    LogLine(absl::StrCat("job ", job.replaces_failed, "; with another ",
                         script ? "config or script" : "config", " this is a new job, ",
                         c.job_id));
  }
  const JobConfig& config = job.config;
  if (!config.checkpoint.dir.empty()) {
    // A new job's directory may not exist yet (the state file goes there first).
    std::error_code made;
    std::filesystem::create_directories(config.checkpoint.dir, made);
    if (made) {
      return absl::FailedPreconditionError(absl::StrCat(
          "cannot create onebit.checkpoint.dir ", config.checkpoint.dir, ": ", made.message()));
    }
    JobConfig resume_config = config;
    if (job.restarted) resume_config.checkpoint.resume = true;  // a recovery always resumes
    ONEBIT_ASSIGN_OR_RETURN(checkpoint::ResumePlan plan,
                            checkpoint::PlanResume(resume_config, c.num_parameters));
    for (const std::string& line : plan.log) LogLine(line);
    c.resume = plan.resume;
    c.resume_freeze_step = plan.freeze_step;
    c.committed = plan.committed;
    // Directories of checkpoints that never committed (a crash between the parts and the
    // manifest) do not exist: clean them up.
    for (const std::string& name : checkpoint::RemoveUncommitted(config.checkpoint.dir, INT64_MAX)) {
      LogLine(absl::StrCat("removed uncommitted checkpoint directory ", name));
    }
    c.commit_checkpoint = [root = config.checkpoint.dir,
                           keep = config.checkpoint.keep](const v1::CheckpointManifest& manifest) {
      return checkpoint::CommitCheckpoint(root, manifest, keep);
    };
    // A recovery resumes from the newest committed checkpoint at that moment.
    resume_config.checkpoint.resume = true;
    c.plan_resume = [resume_config, n = c.num_parameters]() {
      return checkpoint::PlanResume(resume_config, n);
    };
  }
  if (job.failed.empty()) {
    v1::CoordinatorState state;
    state.set_job_id(c.job_id);
    state.set_generation(c.generation);
    state.set_recoveries(c.recoveries);
    state.set_recovering(c.recovering);  // a crash before the coordinator runs counts once
    for (const v1::Recovery& r : c.recovery_log) *state.add_recovery_log() = r;
    ONEBIT_RETURN_IF_ERROR(WriteState(job.state_file, state, job.crc));
  }
  ONEBIT_ASSIGN_OR_RETURN(std::unique_ptr<CoordinatorServer> server,
                          CoordinatorServer::Start(c, job.server));
  return std::unique_ptr<JobCoordinator>(new JobCoordinator(std::move(job), std::move(server)));
}

JobCoordinator::~JobCoordinator() { Shutdown(); }

JobCoordinator::Outcome JobCoordinator::Check() {
  if (outcome_ != kRunning || shut_down_) return outcome_;
  if (coordinator()->Finished()) {
    outcome_ = kSucceeded;
    LogLine("job over: every worker reported its last step");
  } else if (coordinator()->Failed()) {
    outcome_ = kFailed;
    LogLine(absl::StrCat("job failed: ", coordinator()->GetJob({})->failure_reason()));
  }
  return outcome_;
}

void JobCoordinator::Shutdown() {
  if (shut_down_) return;
  shut_down_ = true;
  // The job is over: a later start with this state file is a new job.
  if (outcome_ != kRunning) coordinator()->PersistOver();
  server_->Shutdown();
}

}  // namespace onebit
