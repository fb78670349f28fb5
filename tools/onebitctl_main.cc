// onebitctl: the command-line client of onebit-coordinator (gRPC).
//
//   onebitctl --coordinator=HOST:PORT status
//   onebitctl --coordinator=HOST:PORT members
//   onebitctl --coordinator=HOST:PORT freeze --at STEP | freeze --now
//   onebitctl --coordinator=HOST:PORT delay --to STEP | delay --cancel
//   onebitctl --coordinator=HOST:PORT stop [--at STEP]
//   onebitctl --coordinator=HOST:PORT watch [--interval=1s]
//
// --json prints the coordinator's answer as protobuf JSON (one object per line; for watch,
// one per change) instead of text. The coordinator address may also come from
// $ONEBIT_COORDINATOR. Exit status: 0 on success, 1 when the coordinator refuses or cannot
// be reached (the message gives its status code and reason), 2 for a bad command line.
//
// A secured coordinator (docs/security.md): --tls_ca=CA.pem verifies it; with mutual TLS
// --tls_cert/--tls_key are this client's certificate. The bearer token comes from
// --token_file or $ONEBIT_ADMIN_TOKEN (the admin token for freeze, delay, stop and
// checkpoint; the admin or member token for the rest).
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/signals.h"
#include "coordinator/coordinator_client.h"
#include "coordinator/member.h"
#include "proto/proto_json.h"
#include "security/auth.h"
#include "security/flags.h"

ABSL_FLAG(std::string, coordinator, "",
          "The coordinator's gRPC address, HOST:PORT (default: $ONEBIT_COORDINATOR).");
ABSL_FLAG(bool, json, false, "Print protobuf JSON instead of text.");
ABSL_FLAG(absl::Duration, timeout, absl::Seconds(10), "Deadline of each call.");
ABSL_FLAG(std::optional<int64_t>, at, std::nullopt,
          "freeze: the last warmup step; stop: the last step.");
ABSL_FLAG(bool, now, false, "freeze: as soon as is safe (after the furthest leased step).");
ABSL_FLAG(std::optional<int64_t>, to, std::nullopt,
          "delay: postpone the switch to after this step.");
ABSL_FLAG(bool, cancel, false, "delay: cancel the scheduled switch.");
ABSL_FLAG(absl::Duration, interval, absl::Seconds(1), "watch: how often to ask.");
ABSL_FLAG(std::string, token_file, "",
          "File holding the bearer token sent with every call (default: $ONEBIT_ADMIN_TOKEN).");

namespace onebit {
namespace {

constexpr char kUsage[] =
    "onebitctl --coordinator=HOST:PORT [--json] [--tls_ca=PEM [--tls_cert=PEM --tls_key=PEM]]\n"
    "          [--token_file=F] COMMAND\n"
    "commands:\n"
    "  status                      the job: stage, step, switch, leases, members alive\n"
    "  members                     workers and servers, liveness, addresses\n"
    "  freeze --at STEP | --now    switch to compression after STEP, or as soon as safe\n"
    "  delay --to STEP | --cancel  postpone the scheduled switch, or cancel it\n"
    "  stop [--at STEP]            end the job after STEP (default: as soon as safe)\n"
    "  checkpoint [--at STEP]      take a checkpoint after STEP (default: the earliest step\n"
    "                              every worker can still agree on)\n"
    "  checkpoints                 committed checkpoints and the one in progress\n"
    "  watch [--interval=1s]       print a line whenever the job changes, until it ends";

int Usage(const std::string& problem) {
  std::fprintf(stderr, "onebitctl: %s\n%s\n", problem.c_str(), kUsage);
  return 2;
}

int Failed(const std::string& command, const absl::Status& status) {
  std::fprintf(stderr, "onebitctl: %s: %s: %s\n", command.c_str(),
               absl::StatusCodeToString(status.code()).c_str(),
               std::string(status.message()).c_str());
  return 1;
}

void Print(const std::string& text) { std::printf("%s\n", text.c_str()); }

std::string Stage(v1::Stage stage) {
  return stage == v1::STAGE_COMPRESSION ? "compression" : "warmup";
}

std::string SwitchText(const v1::JobStatus& job) {
  std::string mode;
  switch (job.freeze_mode()) {
    case v1::FREEZE_MODE_STATIC:
      mode = "static";
      break;
    case v1::FREEZE_MODE_AUTOMATIC:
      mode = "automatic";
      break;
    default:
      return "never (optimizer Adam)";
  }
  if (job.freeze_step() < 0) return absl::StrCat("not scheduled (", mode, ")");
  return absl::StrCat("after step ", job.freeze_step(), " (", mode, ")");
}

std::string JobStateText(const v1::JobStatus& job) {
  std::string state;
  switch (job.state()) {
    case v1::JOB_STATE_STARTING: state = "starting"; break;
    case v1::JOB_STATE_RUNNING: state = "running"; break;
    case v1::JOB_STATE_RECOVERING: state = "recovering"; break;
    case v1::JOB_STATE_SUCCEEDED: state = "succeeded"; break;
    case v1::JOB_STATE_FAILED: state = "FAILED"; break;
    default: state = "unknown"; break;
  }
  absl::StrAppend(&state, " (generation ", job.generation(), ", ", job.recoveries(), " recoveries)");
  if (!job.failure_reason().empty()) absl::StrAppend(&state, ": ", job.failure_reason());
  return state;
}

std::string CheckpointsText(const v1::ListCheckpointsResponse& response) {
  if (response.checkpoints().empty()) return "no checkpoints";
  std::string text = absl::StrFormat("%10s  %-10s %-7s %-16s %s", "AFTER STEP", "STATE", "PARTS",
                                     "DIRECTORY", "REASON");
  for (const v1::CheckpointInfo& c : response.checkpoints()) {
    absl::StrAppend(&text, "\n",
                    absl::StrFormat("%10d  %-10s %3d/%-3d %-16s %s", c.step(),
                                    c.committed() ? "committed" : "pending", c.parts_done(),
                                    c.parts_expected(), c.name(), c.reason()));
  }
  return text;
}

std::string StatusText(const v1::JobStatus& job) {
  std::string text;
  auto line = [&text](const char* key, const std::string& value) {
    absl::StrAppend(&text, absl::StrFormat("%-10s %s\n", key, value));
  };
  line("job", job.job_id());
  line("state", JobStateText(job));
  line("stage", absl::StrCat(Stage(job.stage()), " (step ", job.step(), ")"));
  line("switch", SwitchText(job));
  line("leases", absl::StrCat("through step ", job.max_lease_step()));
  line("stop", absl::StrCat("after step ", job.stop_after_step()));
  line("workers", absl::StrCat(job.workers_registered(), "/", job.world_size(), " registered, ",
                               job.workers_alive(), " alive"));
  line("servers", job.num_servers() == 0
                      ? absl::StrCat("none (", job.exchange_mode(), " exchange)")
                      : absl::StrCat(job.servers_registered(), "/", job.num_servers(),
                                     " registered (", job.exchange_mode(), " exchange)"));
  line("loss", absl::StrCat(job.last_loss()));
  line("checkpoint", job.last_checkpoint_step() > 0
                         ? absl::StrCat("after step ", job.last_checkpoint_step(),
                                        job.resumed_from_step() > 0
                                            ? absl::StrCat(" (resumed from step ", job.resumed_from_step(), ")")
                                            : std::string())
                         : std::string("none"));
  line("recovered", RecoveriesText(job));
  line("variance", job.last_variance_change() < 0
                       ? std::string("not measured")
                       : absl::StrCat(job.last_variance_change(), " (relative change)"));
  text.pop_back();
  return text;
}

std::string MembersText(const v1::ListMembersResponse& response) {
  if (response.members().empty()) return "no members registered";
  std::string text =
      absl::StrFormat("%-7s %5s %-5s %8s %9s  %-20s %-21s %s", "ROLE", "RANK", "ALIVE", "STEP",
                      "HEARTBEAT", "INSTANCE", "ADDRESS", "METRICS");
  const int64_t now_ms = absl::ToUnixMillis(absl::Now());
  for (const v1::Member& m : response.members()) {
    const double age = (now_ms - m.last_heartbeat_unix_ms()) / 1000.0;
    absl::StrAppend(&text, "\n",
                    absl::StrFormat("%-7s %5d %-5s %8d %8.1fs  %-20s %-21s %s",
                                    m.role() == v1::ROLE_SERVER ? "server" : "worker", m.rank(),
                                    m.alive() ? "yes" : "no", m.last_step(), age, m.instance_id(),
                                    m.address().empty() ? "-" : m.address(),
                                    m.metrics_address().empty() ? "-" : m.metrics_address()));
  }
  return text;
}

std::string WatchLine(const v1::JobStatus& job) {
  return absl::StrCat(absl::FormatTime("%H:%M:%S", absl::Now(), absl::LocalTimeZone()), " step ",
                      job.step(), " ", Stage(job.stage()), ", switch ", SwitchText(job),
                      ", leases through ", job.max_lease_step(), ", stop after ",
                      job.stop_after_step(), ", workers ", job.workers_alive(), "/",
                      job.world_size(), " alive, loss ", job.last_loss());
}

// What watch compares: everything but the loss, which changes with every report.
std::string WatchKey(v1::JobStatus job) {
  job.clear_last_loss();
  job.clear_last_variance_change();
  return job.SerializeAsString();
}

// Prints an admin answer: the new status (JSON), or `summary` then the status (text).
int PrintJob(const v1::JobStatus& job, const std::string& summary) {
  if (absl::GetFlag(FLAGS_json)) {
    Print(ToJson(job));
  } else {
    if (!summary.empty()) Print(summary);
    Print(StatusText(job));
  }
  return 0;
}

// Polls the job and prints it when it changes; returns once the job is over.
int Watch(CoordinatorClient& client) {
  const absl::Duration interval = absl::GetFlag(FLAGS_interval);
  if (interval <= absl::ZeroDuration()) return Usage("--interval must be positive");
  std::string last_key;
  while (true) {
    absl::StatusOr<v1::JobStatus> job = client.GetJob(v1::GetJobRequest());
    if (!job.ok()) return Failed("watch", job.status());
    const std::string key = WatchKey(*job);
    if (key != last_key) {
      Print(absl::GetFlag(FLAGS_json) ? ToJson(*job) : WatchLine(*job));
      std::fflush(stdout);
      last_key = key;
    }
    if (job->step() >= job->stop_after_step()) {
      if (!absl::GetFlag(FLAGS_json)) Print(absl::StrCat("job over after step ", job->step()));
      return 0;
    }
    absl::SleepFor(interval);
  }
}

int Run(int argc, char** argv) {
  absl::SetProgramUsageMessage(kUsage);
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  if (args.size() < 2) return Usage("no command");
  if (args.size() > 2) return Usage(absl::StrCat("unexpected argument '", args[2], "'"));
  const std::string command = args[1];

  std::string address = absl::GetFlag(FLAGS_coordinator);
  if (address.empty() && std::getenv("ONEBIT_COORDINATOR") != nullptr) {
    address = std::getenv("ONEBIT_COORDINATOR");
  }
  if (address.empty()) return Usage("--coordinator=HOST:PORT (or $ONEBIT_COORDINATOR) is required");
  GrpcClientOptions options;
  options.address = address;
  options.rpc_timeout = absl::GetFlag(FLAGS_timeout);
  options.max_attempts = 3;
  absl::StatusOr<security::TlsOptions> tls = security::TlsFromFlags();
  if (!tls.ok()) return Usage(std::string(tls.status().message()));
  options.tls = *tls;
  absl::StatusOr<std::string> token =
      security::ResolveToken(absl::GetFlag(FLAGS_token_file), "ONEBIT_ADMIN_TOKEN", "");
  if (!token.ok()) return Usage(std::string(token.status().message()));
  options.token = *token;
  absl::StatusOr<std::unique_ptr<CoordinatorClient>> client = NewGrpcCoordinatorClient(options);
  if (!client.ok()) return Usage(std::string(client.status().message()));

  // Optional flags: a negative --at still reaches the coordinator, which says what is wrong.
  const std::optional<int64_t> at = absl::GetFlag(FLAGS_at);
  if (command == "status") {
    absl::StatusOr<v1::JobStatus> job = (*client)->GetJob(v1::GetJobRequest());
    if (!job.ok()) return Failed(command, job.status());
    return PrintJob(*job, "");
  }
  if (command == "members") {
    absl::StatusOr<v1::ListMembersResponse> members =
        (*client)->ListMembers(v1::ListMembersRequest());
    if (!members.ok()) return Failed(command, members.status());
    Print(absl::GetFlag(FLAGS_json) ? ToJson(*members) : MembersText(*members));
    return 0;
  }
  if (command == "freeze") {
    const bool now = absl::GetFlag(FLAGS_now);
    if (now == at.has_value()) return Usage("freeze needs exactly one of --at STEP or --now");
    v1::FreezeRequest request;
    if (now) {
      request.set_now(true);
    } else {
      request.set_at_step(*at);
    }
    absl::StatusOr<v1::JobStatus> job = (*client)->Freeze(request);
    if (!job.ok()) return Failed(command, job.status());
    return PrintJob(
        *job, absl::StrCat("switch to compression scheduled after step ", job->freeze_step()));
  }
  if (command == "delay") {
    const bool cancel = absl::GetFlag(FLAGS_cancel);
    const std::optional<int64_t> to = absl::GetFlag(FLAGS_to);
    if (cancel == to.has_value()) return Usage("delay needs exactly one of --to STEP or --cancel");
    v1::DelayFreezeRequest request;
    request.set_to_step(cancel ? -1 : *to);
    absl::StatusOr<v1::JobStatus> job = (*client)->DelayFreeze(request);
    if (!job.ok()) return Failed(command, job.status());
    return PrintJob(*job, job->freeze_step() < 0
                              ? std::string("no switch scheduled")
                              : absl::StrCat("switch to compression scheduled after step ",
                                             job->freeze_step()));
  }
  if (command == "stop") {
    v1::StopRequest request;
    if (at.has_value()) {
      if (*at <= 0)
        return Usage("stop --at needs a step >= 1 (leave it out to stop as soon as safe)");
      request.set_after_step(*at);
    } else {
      request.set_now(true);
    }
    absl::StatusOr<v1::JobStatus> job = (*client)->Stop(request);
    if (!job.ok()) return Failed(command, job.status());
    return PrintJob(*job, absl::StrCat("the job stops after step ", job->stop_after_step()));
  }
  if (command == "checkpoint") {
    v1::CheckpointRequest request;
    if (at.has_value()) {
      if (*at <= 0) return Usage("checkpoint --at needs a step >= 1 (leave it out for the earliest)");
      request.set_at_step(*at);
    }
    absl::StatusOr<v1::CheckpointInfo> info = (*client)->Checkpoint(request);
    if (!info.ok()) return Failed(command, info.status());
    Print(absl::GetFlag(FLAGS_json) ? ToJson(*info)
                                    : absl::StrCat("checkpoint scheduled after step ", info->step(),
                                                   " (", info->name(), ")"));
    return 0;
  }
  if (command == "checkpoints") {
    absl::StatusOr<v1::ListCheckpointsResponse> list = (*client)->ListCheckpoints({});
    if (!list.ok()) return Failed(command, list.status());
    Print(absl::GetFlag(FLAGS_json) ? ToJson(*list) : CheckpointsText(*list));
    return 0;
  }
  if (command == "watch") return Watch(**client);
  return Usage(absl::StrCat("unknown command '", command, "'"));
}

}  // namespace
}  // namespace onebit

int main(int argc, char** argv) {
  onebit::IgnoreSigpipe();
  return onebit::Run(argc, argv);
}
