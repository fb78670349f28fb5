// onebit-coordinator: the control plane of one job (DESIGN.md). Serves gRPC, the REST
// mirror and /metrics until SIGTERM/SIGINT, or until the job is over (every worker reported
// its last step) plus --linger, so that clients can still read the final status.
//
//   onebit-coordinator --config=job.json [--host=127.0.0.1] [--port=N] [--rest_port=N]
//       [--metrics_port=N] [--address_file=PATH] [--job_id=ID] [--heartbeat_timeout=10s]
//       [--state_file=PATH] [--tls_ca=PEM --tls_cert=PEM --tls_key=PEM]
//       [--admin_token_file=F] [--member_token_file=F]
//
// Security (README "Security"): TLS on the gRPC port and HTTPS on the REST mirror with the
// --tls_* flags or the config's onebit.security.tls (mutual by default: clients need a
// certificate of the same CA). Tokens come from files or the environment, never the
// command line: --admin_token_file, $ONEBIT_ADMIN_TOKEN or onebit.security.admin_token_file;
// --member_token_file, $ONEBIT_MEMBER_TOKEN or onebit.security.member_token_file.
//
// Exit status: 0 after a clean shutdown or a job that succeeded, 1 for a job that failed
// (the reason is logged), a bad config or a port that cannot be bound (the message names
// the key or the port), 2 for bad flags.
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <iterator>
#include <cstdio>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/fault.h"
#include "common/signals.h"
#include "common/atomic_file.h"
#include "coordinator/address_file.h"
#include "proto/proto_json.h"
#include "checkpoint/manifest.h"
#include "config/model_spec.h"
#include "coordinator/coordinator_server.h"
#include "config/job_config.h"
#include "coordinator/log.h"
#include "security/auth.h"
#include "security/flags.h"

ABSL_FLAG(std::string, config, "", "The job config (JSON). Required.");
ABSL_FLAG(std::string, host, "127.0.0.1", "Address to bind every port on.");
ABSL_FLAG(int, port, -1, "gRPC port; -1: the config's onebit.ports.coordinator; 0: any free.");
ABSL_FLAG(int, rest_port, -1,
          "REST mirror port; -1: the config's onebit.ports.coordinator_rest; 0: any free.");
ABSL_FLAG(int, metrics_port, -1,
          "Prometheus /metrics port; -1: the config's onebit.ports.metrics; 0: any free.");
ABSL_FLAG(std::string, address_file, "",
          "If set, write {\"grpc\": host:port, \"rest\": ..., \"metrics\": ...} here once "
          "every port is bound (atomically); removed at exit.");
ABSL_FLAG(std::string, job_id, "", "Job id reported to every process; default: generated.");
ABSL_FLAG(absl::Duration, heartbeat_timeout, absl::ZeroDuration(),
          "A member is dead after this long without a heartbeat; 0: the config's "
          "onebit.failure.heartbeat_timeout_s.");
ABSL_FLAG(std::string, fault, "",
          "Fault injection for tests: kill_at_step:STEP (SIGKILL once a worker reported STEP).");
ABSL_FLAG(std::string, state_file, "",
          "The coordinator's state on disk (job id, generation); default: "
          "coordinator-state.json in onebit.checkpoint.dir, if set. A coordinator that finds "
          "the state of a job that is not over recovers it in the next generation.");
ABSL_FLAG(std::string, admin_token_file, "",
          "File holding the admin token (Freeze, DelayFreeze, Stop, Checkpoint); default: "
          "$ONEBIT_ADMIN_TOKEN, then onebit.security.admin_token_file; none: admin calls open.");
ABSL_FLAG(std::string, member_token_file, "",
          "File holding the member token (the job's processes and reads); default: "
          "$ONEBIT_MEMBER_TOKEN, then onebit.security.member_token_file; none: open.");
ABSL_FLAG(absl::Duration, kv_max_wait, absl::Seconds(30), "Longest a waiting KvGet may block.");
ABSL_FLAG(bool, check, false,
          "Validate the flags and the config (and the TLS files and tokens they name), say "
          "so and exit 0, without binding a port or writing a file (deployment checks).");
ABSL_FLAG(absl::Duration, linger, absl::Seconds(3),
          "Time to keep serving after the job is over, so clients can read the final status.");

namespace onebit {
namespace {

absl::StatusOr<std::string> ReadSmallFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::string text(std::istreambuf_iterator<char>(in), {});
  if (text.size() > (1 << 20)) return absl::DataLossError("too large for a state file");
  return text;
}

int Fail(int code, const std::string& message) {
  std::fprintf(stderr, "onebit-coordinator: %s\n", message.c_str());
  return code;
}

std::string NewJobId() {
  absl::BitGen gen;
  return absl::StrFormat("job-%s-%04x",
                         absl::FormatTime("%Y%m%d-%H%M%S", absl::Now(), absl::UTCTimeZone()),
                         absl::Uniform<uint32_t>(gen, 0, 0x10000));
}

int Run(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "onebit-coordinator --config=JOB.json [--port=N --rest_port=N --metrics_port=N] "
      "[--address_file=PATH]");
  // Block the stop signals before any thread exists, so that every thread inherits the
  // mask and the main thread alone takes them, with sigtimedwait.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  std::vector<char*> positional = absl::ParseCommandLine(argc, argv);
  if (positional.size() > 1) {
    return Fail(2, absl::StrCat("unexpected argument '", positional[1], "'"));
  }
  const std::string config_path = absl::GetFlag(FLAGS_config);
  if (config_path.empty()) return Fail(2, "--config=JOB.json is required");
  absl::StatusOr<JobConfig> config = LoadJobConfig(config_path);
  if (!config.ok()) return Fail(1, std::string(config.status().message()));
  // The job's one coordinator says once what the config accepted without effect.
  for (const std::string& notice : config->notices) {
    std::fprintf(stderr, "onebit-coordinator: config notice: %s\n", notice.c_str());
  }

  CoordinatorOptions options;
  options.config = *config;
  // The state of an earlier run of this coordinator: a job that is not over is recovered.
  std::string state_file = absl::GetFlag(FLAGS_state_file);
  if (state_file.empty() && !config->checkpoint.dir.empty()) {
    state_file = checkpoint::JoinPath(config->checkpoint.dir, "coordinator-state.json");
  }
  v1::CoordinatorState saved;
  bool restarted = false;
  if (!state_file.empty() && access(state_file.c_str(), F_OK) == 0) {
    absl::StatusOr<std::string> text = ReadSmallFile(state_file);
    absl::Status parsed = text.ok() ? FromJson(*text, &saved) : text.status();
    if (!parsed.ok()) {
      return Fail(1, absl::StrCat(state_file, ": ", parsed.message(),
                                  " (remove it to start a new job)"));
    }
    restarted = !saved.over();
  }
  options.job_id = !absl::GetFlag(FLAGS_job_id).empty() ? absl::GetFlag(FLAGS_job_id)
                   : restarted                           ? saved.job_id()
                                                         : NewJobId();
  if (restarted) {
    options.generation = saved.generation() + 1;
    options.recoveries = saved.recoveries() + 1;
    options.recovering = true;
    LogLine(absl::StrCat("restarted: job ", options.job_id, " was in generation ",
                         saved.generation(), "; recovering in generation ", options.generation));
  }
  auto save_state = [state_file, job_id = options.job_id](int64_t generation, int recoveries,
                                                         bool over) -> absl::Status {
    if (state_file.empty()) return absl::OkStatus();
    v1::CoordinatorState state;
    state.set_job_id(job_id);
    state.set_generation(generation);
    state.set_recoveries(recoveries);
    state.set_over(over);
    return WriteFileAtomically(state_file, ToJson(state, /*pretty=*/true));
  };
  options.persist = [save_state](int64_t generation, int recoveries) {
    return save_state(generation, recoveries, false);
  };
  options.heartbeat_timeout = absl::GetFlag(FLAGS_heartbeat_timeout) > absl::ZeroDuration()
                                  ? absl::GetFlag(FLAGS_heartbeat_timeout)
                                  : absl::Seconds(config->failure.heartbeat_timeout_s);
  options.kv_limits.max_wait = absl::GetFlag(FLAGS_kv_max_wait);
  if (absl::GetFlag(FLAGS_heartbeat_timeout) < absl::ZeroDuration()) {
    return Fail(2, "--heartbeat_timeout must be positive");
  }
  CoordinatorServerOptions server_options;
  server_options.host = absl::GetFlag(FLAGS_host);
  auto port = [](int flag, int from_config) { return flag >= 0 ? flag : from_config; };
  server_options.grpc_port = port(absl::GetFlag(FLAGS_port), config->ports.coordinator);
  server_options.rest_port = port(absl::GetFlag(FLAGS_rest_port), config->ports.coordinator_rest);
  server_options.metrics_port = port(absl::GetFlag(FLAGS_metrics_port), config->ports.metrics);
  for (int p : {server_options.grpc_port, server_options.rest_port, server_options.metrics_port}) {
    if (p > 65535) return Fail(2, absl::StrCat("port ", p, " is out of range"));
  }
  absl::StatusOr<security::TlsOptions> tls = security::TlsFromFlags(config->security.tls);
  if (!tls.ok()) return Fail(2, std::string(tls.status().message()));
  server_options.tls = *tls;
  absl::StatusOr<std::string> admin_token =
      security::ResolveToken(absl::GetFlag(FLAGS_admin_token_file), "ONEBIT_ADMIN_TOKEN",
                             config->security.admin_token_file);
  if (!admin_token.ok()) return Fail(1, std::string(admin_token.status().message()));
  absl::StatusOr<std::string> member_token =
      security::ResolveToken(absl::GetFlag(FLAGS_member_token_file), "ONEBIT_MEMBER_TOKEN",
                             config->security.member_token_file);
  if (!member_token.ok()) return Fail(1, std::string(member_token.status().message()));
  if (!admin_token->empty() && *admin_token == *member_token) {
    return Fail(1, "the admin and member tokens must differ (a member could act as admin)");
  }
  server_options.tokens = {*admin_token, *member_token};
  // The heartbeat timeout is seconds; a tick well under it keeps liveness fresh.
  server_options.tick = std::min(absl::Milliseconds(200), options.heartbeat_timeout / 4);
  absl::StatusOr<std::optional<Fault>> fault = ParseFault(absl::GetFlag(FLAGS_fault), {"kill_at_step"});
  if (!fault.ok()) return Fail(2, std::string(fault.status().message()));
  if (absl::GetFlag(FLAGS_check)) {
    // Everything above is read-only: no state file, no checkpoint clean-up, no port.
    std::printf("onebit-coordinator: flags and config OK (job of %d workers, %s exchange)\n",
                config->workers, config->exchange.mode.c_str());
    return 0;
  }
  if (!config->checkpoint.dir.empty()) {
    absl::StatusOr<size_t> n = WorkloadParameterCount(config->workload);
    if (!n.ok()) return Fail(1, std::string(n.status().message()));
    options.num_parameters = *n;
    JobConfig resume_config = *config;
    if (restarted) resume_config.checkpoint.resume = true;  // a recovery always resumes
    absl::StatusOr<checkpoint::ResumePlan> plan = checkpoint::PlanResume(resume_config, *n);
    if (!plan.ok()) return Fail(1, std::string(plan.status().message()));
    for (const std::string& line : plan->log) LogLine(line);
    options.resume = plan->resume;
    options.resume_freeze_step = plan->freeze_step;
    options.committed = plan->committed;
    // Directories of checkpoints that never committed (a crash between the parts and the
    // manifest) do not exist: clean them up.
    for (const std::string& name : checkpoint::RemoveUncommitted(config->checkpoint.dir, INT64_MAX)) {
      LogLine(absl::StrCat("removed uncommitted checkpoint directory ", name));
    }
    const std::string root = config->checkpoint.dir;
    const int keep = config->checkpoint.keep;
    options.commit_checkpoint = [root, keep](const v1::CheckpointManifest& manifest) {
      return checkpoint::CommitCheckpoint(root, manifest, keep);
    };
    // A recovery resumes from the newest committed checkpoint at that moment.
    resume_config.checkpoint.resume = true;
    options.plan_resume = [resume_config, n = *n]() { return checkpoint::PlanResume(resume_config, n); };
  }
  {
    const absl::Status saved_now = save_state(options.generation, options.recoveries, false);
    if (!saved_now.ok()) return Fail(1, std::string(saved_now.message()));
  }

  absl::StatusOr<std::unique_ptr<CoordinatorServer>> server =
      CoordinatorServer::Start(options, server_options);
  if (!server.ok()) return Fail(1, std::string(server.status().message()));

  const std::string address_file = absl::GetFlag(FLAGS_address_file);
  if (!address_file.empty()) {
    absl::Status written = WriteAddressFile(address_file, (*server)->addresses());
    if (!written.ok()) return Fail(1, std::string(written.message()));
  }

  const absl::Duration linger = absl::GetFlag(FLAGS_linger);
  absl::Time finished_at = absl::InfiniteFuture();
  int exit_code = 0;
  while (true) {
    // With a fault armed, poll every 2 ms: a small job runs a step a millisecond, and the
    // fault must fire while it runs, not after it ended.
    const timespec poll = {0, (fault->has_value() ? 2 : 100) * 1000 * 1000};
    const int sig = sigtimedwait(&stop_signals, nullptr, &poll);
    if (sig > 0) {
      LogLine(absl::StrCat("received ", sig == SIGTERM ? "SIGTERM" : "SIGINT", "; shutting down"));
      break;
    }
    if (fault->has_value() && finished_at == absl::InfiniteFuture()) {
      const int64_t step = (*server)->coordinator()->GetJob({})->step();
      if (step >= (*fault)->step) {
        KillSelf("the coordinator", absl::StrCat("step ", step, " (a worker reported it)"));
      }
    }
    if (finished_at == absl::InfiniteFuture() && (*server)->coordinator()->Finished()) {
      finished_at = absl::Now();
      LogLine(absl::StrCat("job over: every worker reported its last step; exiting in ",
                           absl::FormatDuration(linger)));
    }
    if (finished_at == absl::InfiniteFuture() && (*server)->coordinator()->Failed()) {
      finished_at = absl::Now();
      exit_code = 1;
      LogLine(absl::StrCat("job failed: ", (*server)->coordinator()->GetJob({})->failure_reason(),
                           "; exiting in ", absl::FormatDuration(linger)));
    }
    if (absl::Now() >= finished_at + linger) break;
  }
  if (finished_at != absl::InfiniteFuture()) {
    // The job is over: a later start with this state file is a new job.
    const v1::JobStatus job = *(*server)->coordinator()->GetJob({});
    const absl::Status saved_now = save_state(job.generation(), job.recoveries(), true);
    if (!saved_now.ok()) LogLine(absl::StrCat("cannot save the coordinator state: ", saved_now.message()));
  }
  (*server)->Shutdown();
  if (!address_file.empty()) unlink(address_file.c_str());
  LogLine("stopped");
  return exit_code;
}

}  // namespace
}  // namespace onebit

int main(int argc, char** argv) {
  onebit::IgnoreSigpipe();
  return onebit::Run(argc, argv);
}
