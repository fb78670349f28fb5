// onebit-coordinator: the control plane of one job (docs/design.md). Serves gRPC, the REST
// mirror and /metrics until SIGTERM/SIGINT, or until the job is over (every worker reported
// its last step) plus --linger, so that clients can still read the final status.
//
//   onebit-coordinator --config=job.json [--host=127.0.0.1] [--port=N] [--rest_port=N]
//       [--metrics_port=N] [--address_file=PATH] [--job_id=ID] [--heartbeat_timeout=10s]
//       [--state_file=PATH] [--tls_ca=PEM --tls_cert=PEM --tls_key=PEM]
//       [--admin_token_file=F] [--member_token_file=F]
//   onebit-coordinator --config_reference   (the job config's keys as Markdown: docs/config.md)
//
// Security (docs/security.md): TLS on the gRPC port and HTTPS on the REST mirror with the
// --tls_* flags or the config's onebit.security.tls (mutual by default: clients need a
// certificate of the same CA). Tokens come from files or the environment, never the
// command line: --admin_token_file, $ONEBIT_ADMIN_TOKEN or onebit.security.admin_token_file;
// --member_token_file, $ONEBIT_MEMBER_TOKEN or onebit.security.member_token_file.
//
// Exit status: 0 after a clean shutdown or a job that succeeded; 78 for a job that failed
// (the reason is logged, and kept in the state file: started again with the same config,
// the coordinator reports the same failure and exits 78 again; coordinator/member.h);
// 1 for a bad config or a port that cannot be bound (the message names the key or the
// port); 2 for bad flags.
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/fault.h"
#include "common/signals.h"
#include "config/config_reference.h"
#include "coordinator/address_file.h"
#include "coordinator/job_coordinator.h"
#include "coordinator/log.h"
#include "coordinator/member.h"
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
ABSL_FLAG(bool, config_reference, false,
          "Print the job config's reference (Markdown, docs/config.md) to stdout and exit 0.");
ABSL_FLAG(absl::Duration, linger, absl::Seconds(3),
          "Time to keep serving after the job is over, so clients can read the final status.");

namespace onebit {
namespace {

int Fail(int code, const std::string& message) {
  std::fprintf(stderr, "onebit-coordinator: %s\n", message.c_str());
  return code;
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
  if (absl::GetFlag(FLAGS_config_reference)) {
    std::fputs(ConfigReferenceMarkdown().c_str(), stdout);
    return 0;
  }
  JobCoordinatorOptions options;
  options.config_path = absl::GetFlag(FLAGS_config);
  if (options.config_path.empty()) return Fail(2, "--config=JOB.json is required");
  if (absl::GetFlag(FLAGS_heartbeat_timeout) < absl::ZeroDuration()) {
    return Fail(2, "--heartbeat_timeout must be positive");
  }
  for (int p : {absl::GetFlag(FLAGS_port), absl::GetFlag(FLAGS_rest_port),
                absl::GetFlag(FLAGS_metrics_port)}) {
    if (p > 65535) return Fail(2, absl::StrCat("port ", p, " is out of range"));
  }
  {
    // The TLS flags win over the config's: read the config for them first.
    absl::StatusOr<JobConfig> config = LoadJobConfig(options.config_path);
    if (!config.ok()) return Fail(1, std::string(config.status().message()));
    // The job's one coordinator says once what the config accepted without effect.
    for (const std::string& notice : config->notices) {
      std::fprintf(stderr, "onebit-coordinator: config notice: %s\n", notice.c_str());
    }
    absl::StatusOr<security::TlsOptions> tls = security::TlsFromFlags(config->security.tls);
    if (!tls.ok()) return Fail(2, std::string(tls.status().message()));
    options.tls = *tls;
  }
  options.host = absl::GetFlag(FLAGS_host);
  options.grpc_port = absl::GetFlag(FLAGS_port);
  options.rest_port = absl::GetFlag(FLAGS_rest_port);
  options.metrics_port = absl::GetFlag(FLAGS_metrics_port);
  options.job_id = absl::GetFlag(FLAGS_job_id);
  options.heartbeat_timeout = absl::GetFlag(FLAGS_heartbeat_timeout);
  options.state_file = absl::GetFlag(FLAGS_state_file);
  options.admin_token_file = absl::GetFlag(FLAGS_admin_token_file);
  options.member_token_file = absl::GetFlag(FLAGS_member_token_file);
  options.kv_max_wait = absl::GetFlag(FLAGS_kv_max_wait);
  absl::StatusOr<PreparedJob> job = JobCoordinator::Prepare(options);
  if (!job.ok()) return Fail(1, std::string(job.status().message()));
  absl::StatusOr<std::optional<Fault>> fault = ParseFault(absl::GetFlag(FLAGS_fault), {"kill_at_step"});
  if (!fault.ok()) return Fail(2, std::string(fault.status().message()));
  if (absl::GetFlag(FLAGS_check)) {
    // Everything above is read-only: no state file, no checkpoint clean-up, no port.
    // deploy/slurm/onebit.sbatch reads the job's shape from this line.
    std::printf("onebit-coordinator: flags and config OK (job of %d workers, %d servers, %s "
                "exchange)\n",
                job->config.workers, ServerCount(job->config), job->config.exchange.mode.c_str());
    return 0;
  }
  absl::StatusOr<std::unique_ptr<JobCoordinator>> server = JobCoordinator::Start(*std::move(job));
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
    if (finished_at == absl::InfiniteFuture()) {
      const JobCoordinator::Outcome outcome = (*server)->Check();
      if (outcome != JobCoordinator::kRunning) {
        finished_at = absl::Now();
        exit_code = outcome == JobCoordinator::kFailed ? kMemberExitJobFailed : 0;
        LogLine(absl::StrCat("exiting in ", absl::FormatDuration(linger)));
      }
    }
    if (absl::Now() >= finished_at + linger) break;
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
