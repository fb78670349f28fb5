// onebit-coordinator: the control plane of one job (DESIGN.md). Serves gRPC, the REST
// mirror and /metrics until SIGTERM/SIGINT, or until the job is over (every worker reported
// its last step) plus --linger, so that clients can still read the final status.
//
//   onebit-coordinator --config=job.json [--host=127.0.0.1] [--port=N] [--rest_port=N]
//       [--metrics_port=N] [--address_file=PATH] [--job_id=ID] [--heartbeat_timeout=10s]
//
// Exit status: 0 after a clean shutdown, 1 for a bad config or a port that cannot be bound
// (the message names the key or the port), 2 for bad flags.
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdint>
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
#include "common/signals.h"
#include "coordinator/address_file.h"
#include "checkpoint/manifest.h"
#include "config/model_spec.h"
#include "coordinator/coordinator_server.h"
#include "config/job_config.h"
#include "coordinator/log.h"

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
ABSL_FLAG(absl::Duration, heartbeat_timeout, absl::Seconds(10),
          "A member is dead after this long without a heartbeat.");
ABSL_FLAG(absl::Duration, kv_max_wait, absl::Seconds(30), "Longest a waiting KvGet may block.");
ABSL_FLAG(absl::Duration, linger, absl::Seconds(3),
          "Time to keep serving after the job is over, so clients can read the final status.");

namespace onebit {
namespace {

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

  CoordinatorOptions options;
  options.config = *config;
  options.job_id = absl::GetFlag(FLAGS_job_id).empty() ? NewJobId() : absl::GetFlag(FLAGS_job_id);
  options.heartbeat_timeout = absl::GetFlag(FLAGS_heartbeat_timeout);
  options.kv_limits.max_wait = absl::GetFlag(FLAGS_kv_max_wait);
  if (options.heartbeat_timeout <= absl::ZeroDuration()) {
    return Fail(2, "--heartbeat_timeout must be positive");
  }
  if (!config->checkpoint.dir.empty()) {
    absl::StatusOr<size_t> n = WorkloadParameterCount(config->workload);
    if (!n.ok()) return Fail(1, std::string(n.status().message()));
    options.num_parameters = *n;
    absl::StatusOr<checkpoint::ResumePlan> plan = checkpoint::PlanResume(*config, *n);
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
  // The heartbeat timeout is seconds; a tick well under it keeps liveness fresh.
  server_options.tick = std::min(absl::Milliseconds(200), options.heartbeat_timeout / 4);

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
  while (true) {
    const timespec poll = {0, 100 * 1000 * 1000};
    const int sig = sigtimedwait(&stop_signals, nullptr, &poll);
    if (sig > 0) {
      LogLine(absl::StrCat("received ", sig == SIGTERM ? "SIGTERM" : "SIGINT", "; shutting down"));
      break;
    }
    if (finished_at == absl::InfiniteFuture() && (*server)->coordinator()->Finished()) {
      finished_at = absl::Now();
      LogLine(absl::StrCat("job over: every worker reported its last step; exiting in ",
                           absl::FormatDuration(linger)));
    }
    if (absl::Now() >= finished_at + linger) break;
  }
  (*server)->Shutdown();
  if (!address_file.empty()) unlink(address_file.c_str());
  LogLine("stopped");
  return 0;
}

}  // namespace
}  // namespace onebit

int main(int argc, char** argv) {
  onebit::IgnoreSigpipe();
  return onebit::Run(argc, argv);
}
