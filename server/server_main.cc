// onebit-server: one parameter-server shard (ps mode, docs/design.md).
//
//   onebit-server --shard=0 --shards=2 --workers=4 --n=1000000 --port=0 --metrics_port=0
//       --address_file=/run/onebit/shard0.json         (one command line)
//   onebit-server --config=job.json --coordinator=HOST:PORT --shard=0
//
// With --config, shards, workers and n come from the job config (flags given explicitly
// win). In hierarchical mode over ps, --shard is the job-wide index: the shard serves its
// slice's group of servers/local_size shards, one push per node. With --coordinator, the shard registers under its index once it serves, so that
// workers find its address, and keeps a heartbeat session.
//
// TLS (--tls_ca/--tls_cert/--tls_key, or the config's onebit.security.tls) secures both the
// shard's own gRPC port (mutual TLS: only holders of a certificate of the job's CA can push)
// and its channel to the coordinator; the member token (--member_token_file,
// $ONEBIT_MEMBER_TOKEN or onebit.security.member_token_file) goes with its coordinator calls.
//
// It serves onebit.v1.ParameterServer over gRPC and Prometheus metrics at /metrics (with
// the probes /healthz and /readyz, ready once registered with the job), writes
// the bound addresses to --address_file ({"grpc": "host:port", "metrics": "host:port"},
// atomically) and runs until SIGTERM or SIGINT, then shuts down gracefully (exit 0).
// Exit status (coordinator/member.h): 0 the job succeeded or a signal; 75 restart me (the
// job recovers in a newer generation, or the coordinator restarted and no longer knows this
// shard); 78 the job failed (do not restart); 1 a failure to start, or a coordinator out of
// reach for onebit.failure.coordinator_retry_s; 2 a bad flag value (absl exits 1 on unknown
// flags).
#include <pthread.h>
#include <unistd.h>
#include <signal.h>

#include <algorithm>
#include <cstdlib>
#include <atomic>
#include <cstdint>
#include <optional>
#include <iostream>
#include <string>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "common/fault.h"
#include "common/parallel.h"
#include "common/net.h"
#include "common/signals.h"
#include "coordinator/coordinator_client.h"
#include "coordinator/coordinator_handler.h"
#include "coordinator/member.h"
#include "config/job_config.h"
#include "compression/codec_registry.h"
#include "compression/layout.h"
#include "config/model_spec.h"
#include "config/optimizer_kind.h"
#include "server/server_process.h"
#include "server/shard_checkpointer.h"
#include "checkpoint/manifest.h"
#include "security/auth.h"
#include "security/flags.h"

ABSL_FLAG(int, shard, -1, "This shard's index, in [0, --shards) (required).");
ABSL_FLAG(int, shards, 0, "Number of shards S (required, >= 1).");
ABSL_FLAG(int, workers, 0, "Number of workers W (required, >= 1).");
ABSL_FLAG(int64_t, n, 0, "Parameters in the whole tensor (required, >= 1).");
ABSL_FLAG(std::string, compressor, "",
          "Compressed blocks' format, \"onebit\" or \"int8\"; default: the config's "
          "onebit.exchange.compressor, else onebit. Must match the workers'.");
ABSL_FLAG(std::string, host, "127.0.0.1", "Address to listen on (gRPC and /metrics).");
ABSL_FLAG(int, port, 0, "gRPC port; 0 picks a free one.");
ABSL_FLAG(int, metrics_port, 0, "Port of /metrics; 0 picks a free one.");
ABSL_FLAG(std::string, address_file, "", "Where to write the bound addresses as JSON.");
ABSL_FLAG(std::string, advertise_host, "",
          "Host name or address the workers reach this shard by, registered with the "
          "coordinator (a container's service name when --host=0.0.0.0); default: --host.");
ABSL_FLAG(std::string, config, "", "Job config: shards, workers and n from it (flags win).");
ABSL_FLAG(std::string, coordinator, "", "host:port of the coordinator: register and heartbeat.");
ABSL_FLAG(int, cpu_threads, -1,
          "Threads of the CPU kernels; -1: the config's onebit.cpu_threads (0, or no config: "
          "every usable CPU).");
ABSL_FLAG(int, retained_steps, 2, "Finished steps whose results are kept for retries (>= 2).");
ABSL_FLAG(std::string, member_token_file, "",
          "File holding the member token for the coordinator's calls; default: "
          "$ONEBIT_MEMBER_TOKEN, then onebit.security.member_token_file.");
ABSL_FLAG(std::string, job_key, "",
          "Which of a launch's jobs this shard is for (onebit.torch's per-node shard: the "
          "script's n-th optimizer); a coordinator of another key is waited out.");
ABSL_FLAG(bool, check, false,
          "Validate the flags and the config (and the TLS files and token they name), say so "
          "and exit 0, without binding a port or writing a file (deployment checks).");
ABSL_FLAG(std::string, fault, "",
          "Fault injection for tests: kill_at_step:STEP (SIGKILL once step STEP completes).");

namespace {

constexpr int kExitRuntime = onebit::kMemberExitFailed;
constexpr int kExitUsage = 2;

// Set by the session callback before it raises SIGTERM at this process: the exit code that
// the job's end (0), failure (1) or recovery (75) asks for.
std::atomic<int> g_exit_code{0};
// Set once the shard serves the job (main then waits for a signal to shut down gracefully).
std::atomic<bool> g_serving{false};

// `bound` (host:port) with --advertise_host for the host, if given.
std::string Advertised(const std::string& bound) {
  const std::string host = absl::GetFlag(FLAGS_advertise_host);
  if (host.empty() || bound.empty()) return bound;
  return onebit::JoinHostPort(host, std::stoi(bound.substr(bound.rfind(':') + 1)));
}

// Leaves with `verdict`: the main thread shuts down gracefully on the SIGTERM.
void Leave(int shard, const onebit::MemberVerdict& verdict) {
  std::cerr << "onebit-server: shard " << shard << ": " << verdict.reason << std::endl;
  g_exit_code = verdict.exit_code;
  kill(getpid(), SIGTERM);
}

// Registers the shard and starts its heartbeat session; *reg gets the coordinator's answer
// and *instance this process's id. The session leaves (Leave) when the job ends or
// recovers in a newer generation, and when the coordinator no longer knows this shard (it
// restarted since: the shard exits 75 and its new process registers with it), when it hears
// nothing for `silence_limit` (cut off: 75), or stays out of reach for `give_up_after`.
absl::StatusOr<std::unique_ptr<onebit::CoordinatorSession>> JoinJob(
    onebit::CoordinatorClient& client, int shard, const onebit::server::ServerProcess& process,
    absl::Duration heartbeat_interval, absl::Duration give_up_after,
    absl::Duration silence_limit, const std::string& job_terms,
    onebit::v1::RegisterResponse* reg_out, std::string* instance) {
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  onebit::v1::RegisterRequest request;
  request.set_role(onebit::v1::ROLE_SERVER);
  request.set_instance_id(absl::StrCat(host, ":", getpid(), ":shard", shard));
  request.set_address(Advertised(process.grpc_address()));
  request.set_metrics_address(Advertised(process.metrics_address()));
  request.set_requested_rank(shard);
  request.set_job_terms(job_terms);
  request.set_job_key(absl::GetFlag(FLAGS_job_key));
  absl::StatusOr<onebit::v1::RegisterResponse> reg =
      onebit::RegisterReplacing(client, request, heartbeat_interval * 4 + absl::Seconds(10));
  if (!reg.ok()) return reg.status();
  *reg_out = *reg;
  *instance = request.instance_id();
  if (reg->rank() != shard) {
    return absl::FailedPreconditionError(
        absl::StrCat("asked to be shard ", shard, ", the coordinator assigned ", reg->rank()));
  }
  const onebit::MemberIdentity me{reg->job_id(), reg->generation(), /*leave_on_success=*/true};
  onebit::SessionOptions session;
  session.heartbeat_interval = heartbeat_interval;
  session.role = onebit::v1::ROLE_SERVER;
  session.rank = shard;
  session.instance_id = request.instance_id();
  session.give_up_after = give_up_after;
  session.silence_limit = silence_limit;
  session.on_end = [&client, me, shard](const absl::Status& why) {
    Leave(shard, onebit::VerdictAfterSessionEnd(client, me, why));
  };
  return client.StartSession(session, [me, shard](const onebit::v1::JobEvent& e) {
    if (std::optional<onebit::MemberVerdict> verdict = onebit::VerdictFor(e.job(), me)) {
      Leave(shard, *verdict);
    }
  });
}

// The model's size of a job whose config leaves it to the workers: the coordinator's
// JobStatus.num_parameters, known once the first worker registered. Waits up to `patience`.
absl::StatusOr<size_t> LearnModelSize(const onebit::GrpcClientOptions& options,
                                      absl::Duration patience) {
  absl::StatusOr<std::unique_ptr<onebit::CoordinatorClient>> client =
      onebit::NewGrpcCoordinatorClient(options);
  if (!client.ok()) return client.status();
  const absl::Time deadline = absl::Now() + patience;
  bool said = false;
  while (true) {
    absl::StatusOr<onebit::v1::JobStatus> job = (*client)->GetJob({});
    // A coordinator of another of the launch's jobs (the one before) is not this job's.
    const bool ours = job.ok() && onebit::SameJobKey(absl::GetFlag(FLAGS_job_key), job->job_key());
    if (ours && job->num_parameters() > 0) {
      std::cerr << "onebit-server: the workers' model has " << job->num_parameters()
                << " parameters" << std::endl;
      return static_cast<size_t>(job->num_parameters());
    }
    if (ours && job->state() == onebit::v1::JOB_STATE_FAILED) {
      return absl::FailedPreconditionError(absl::StrCat("the job failed: ", job->failure_reason()));
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "the job's model size (onebit.workload.parameters 0: the workers' model decides) was "
          "not known after ", absl::FormatDuration(patience), ": no worker registered with ",
          options.address, job.ok() ? "" : absl::StrCat(" (", job.status().message(), ")")));
    }
    if (!said) {
      std::cerr << "onebit-server: waiting for the first worker to register (the job's model "
                   "size comes from it)" << std::endl;
      said = true;
    }
    absl::SleepFor(absl::Milliseconds(200));
  }
}

int UsageError(const std::string& message) {
  std::cerr << "onebit-server: error: " << message << "\nRun with --help for the flags."
            << std::endl;
  return kExitUsage;
}

// What the flags and the job config make of this shard.
struct ShardSetup {
  onebit::server::ServerProcessOptions options;
  absl::StatusOr<onebit::JobConfig> config = absl::NotFoundError("no --config");
  onebit::GrpcClientOptions client_options;  // address "": no coordinator
  int64_t n = 0;
  int group_offset = 0;  // hierarchical over ps: the first shard of this shard's slice
  std::string checkpoint_dir, topology;
  double retry_s = 120, heartbeat_s = 10;
  std::vector<std::string> notices;  // printed by --check; a job's by its coordinator
  // --check of a job whose model size the workers decide: nothing more to check.
  bool size_decided_later = false;
};

// The flags over the job config (--config), checked. INVALID_ARGUMENT for a usage error
// (exit 2); UNAVAILABLE when the model's size could not be learned from the coordinator.
absl::StatusOr<ShardSetup> SetupFromFlags() {
  ShardSetup setup;
  onebit::server::ServerProcessOptions& options = setup.options;
  options.shard.shard = absl::GetFlag(FLAGS_shard);
  options.shard.num_shards = absl::GetFlag(FLAGS_shards);
  options.shard.num_workers = absl::GetFlag(FLAGS_workers);
  options.shard.retained_steps = absl::GetFlag(FLAGS_retained_steps);
  int64_t& n = setup.n;
  n = absl::GetFlag(FLAGS_n);
  std::string compressor = absl::GetFlag(FLAGS_compressor);
  // 0/1 Adam's local steps push nothing, nor do steps skipped for an fp16 overflow.
  bool allow_step_gaps = false;
  onebit::SecurityConfig security;
  int config_cpu_threads = 0;
  absl::StatusOr<onebit::JobConfig>& config = setup.config;
  if (!absl::GetFlag(FLAGS_config).empty()) {
    config = onebit::LoadJobConfig(absl::GetFlag(FLAGS_config));
    if (!config.ok()) return absl::InvalidArgumentError(config.status().message());
    security = config->security;
  }
  // The coordinator's channel (TLS, the member token) also serves to learn the model's size.
  absl::StatusOr<onebit::security::TlsOptions> tls = onebit::security::TlsFromFlags(security.tls);
  if (!tls.ok()) return absl::InvalidArgumentError(tls.status().message());
  options.tls = *tls;
  onebit::GrpcClientOptions& client_options = setup.client_options;
  absl::StatusOr<std::string> token = onebit::security::ResolveToken(
      absl::GetFlag(FLAGS_member_token_file), "ONEBIT_MEMBER_TOKEN", security.member_token_file);
  if (!token.ok()) return absl::InvalidArgumentError(token.status().message());
  client_options.token = *token;
  client_options.address = absl::GetFlag(FLAGS_coordinator);
  client_options.tls = options.tls;
  if (config.ok()) {
    config_cpu_threads = config->cpu_threads;
    setup.notices = config->notices;
    setup.checkpoint_dir = config->checkpoint.dir;
    setup.retry_s = config->failure.coordinator_retry_s;
    setup.heartbeat_s = config->failure.heartbeat_timeout_s;
    client_options.retry_for = absl::Seconds(setup.retry_s);
    setup.topology = onebit::checkpoint::TopologyKey(*config);
    absl::StatusOr<size_t> count = onebit::WorkloadParameterCount(config->workload);
    if (!count.ok()) return absl::InvalidArgumentError(count.status().message());
    if (*count == 0 && n == 0) {
      // A PyTorch model whose size the config leaves to the workers (workload.parameters 0).
      if (absl::GetFlag(FLAGS_check)) {
        setup.size_decided_later = true;
        return setup;
      }
      if (client_options.address.empty()) {
        return absl::InvalidArgumentError(
            "onebit.workload.parameters is 0 (the workers' model decides): give --coordinator "
            "(the shard learns it there) or --n");
      }
      count = LearnModelSize(client_options, absl::Seconds(setup.retry_s));
      if (!count.ok()) return absl::UnavailableError(count.status().message());
    }
    const onebit::ExchangeConfig& x = config->exchange;
    if (compressor.empty()) compressor = x.compressor;
    // Steps that push nothing to the shards: 0/1 Adam's local steps, steps skipped for an
    // fp16 overflow, and a warmup that goes between the workers (the first push is the
    // first compressed step).
    allow_step_gaps = onebit::Traits(config->optimizer.kind).has_local_steps ||
                      onebit::ScalesLoss(*config) || onebit::ShardsSkipWarmup(x);
    if (x.mode == "hierarchical") {
      // Hierarchical over ps: local rank l of every node (one worker per node) exchanges
      // slice l with its own K = servers / local_size shards; this is shard --shard % K of
      // slice --shard / K, and its tensor is one slice.
      const int k = x.servers / x.local_size;
      if (options.shard.shard < 0 || options.shard.shard >= x.servers) {
        return absl::InvalidArgumentError("--shard must be in [0, onebit.exchange.servers)");
      }
      absl::StatusOr<onebit::HierarchicalLayout> layout =
          onebit::HierarchicalLayout::Create(*count, x.local_size, k);
      if (!layout.ok()) return absl::InvalidArgumentError(layout.status().message());
      setup.group_offset = options.shard.shard - options.shard.shard % k;
      options.shard.shard %= k;
      if (options.shard.num_shards == 0) options.shard.num_shards = k;
      if (options.shard.num_workers == 0) {
        options.shard.num_workers = config->workers / x.local_size;
      }
      if (n == 0) n = static_cast<int64_t>(layout->slice());
    }
    if (options.shard.num_shards == 0) options.shard.num_shards = config->exchange.servers;
    if (options.shard.num_workers == 0) options.shard.num_workers = config->workers;
    if (n == 0) n = static_cast<int64_t>(*count);
    if (options.metrics_port == 0) options.metrics_port = config->ports.metrics;
  }
  int cpu_threads = absl::GetFlag(FLAGS_cpu_threads);
  if (cpu_threads < 0) cpu_threads = config_cpu_threads;
  options.cpu_threads = cpu_threads > 0 ? cpu_threads : onebit::UsableCpus();
  options.host = absl::GetFlag(FLAGS_host);
  options.port = absl::GetFlag(FLAGS_port);
  if (absl::GetFlag(FLAGS_metrics_port) != 0) {
    options.metrics_port = absl::GetFlag(FLAGS_metrics_port);
  }
  options.address_file = absl::GetFlag(FLAGS_address_file);
  if (options.shard.num_shards < 1) return absl::InvalidArgumentError("--shards must be >= 1");
  if (options.shard.shard < 0 || options.shard.shard >= options.shard.num_shards) {
    return absl::InvalidArgumentError("--shard must be in [0, --shards)");
  }
  if (options.shard.num_workers < 1) return absl::InvalidArgumentError("--workers must be >= 1");
  if (n < 1) return absl::InvalidArgumentError("--n must be >= 1");
  options.shard.n = static_cast<size_t>(n);
  absl::StatusOr<const onebit::Codec*> codec =
      onebit::FindCodec(compressor.empty() ? "onebit" : compressor);
  if (!codec.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--compressor: ", codec.status().message()));
  }
  options.shard.codec = *codec;
  options.shard.allow_step_gaps = allow_step_gaps;
  if (options.port < 0 || options.port > 65535) {
    return absl::InvalidArgumentError("--port must be in [0, 65535]");
  }
  if (options.metrics_port < 0 || options.metrics_port > 65535) {
    return absl::InvalidArgumentError("--metrics_port must be in [0, 65535]");
  }
  if (options.shard.retained_steps < 2) {
    return absl::InvalidArgumentError("--retained_steps must be >= 2");
  }
  return setup;
}

// Registers with the coordinator, opens the shard at the job's first step and restores the
// server error from the checkpoint the job resumes from. *client and *session are set on
// success; otherwise the exit code the job's verdict asks for (or kExitRuntime) is returned.
std::optional<int> JoinAndRestore(const ShardSetup& setup, onebit::server::ServerProcess& process,
                                  onebit::server::ShardCheckpointer* checkpointer,
                                  std::unique_ptr<onebit::CoordinatorClient>* client,
                                  std::unique_ptr<onebit::CoordinatorSession>* session) {
  onebit::GrpcClientOptions client_options = setup.client_options;
  client_options.retry_for = absl::Seconds(setup.retry_s);
  // A silent link breaks the connection within half the heartbeat timeout, and the
  // session ends after the other half (JoinJob's silence_limit): exit 75.
  client_options.keepalive = absl::Seconds(setup.heartbeat_s) / 4;
  auto made = onebit::NewGrpcCoordinatorClient(client_options);
  onebit::v1::RegisterResponse reg;
  std::string instance;
  const int index = setup.group_offset + setup.options.shard.shard;
  auto joined =
      made.ok()
          ? JoinJob(**made, index, process,
                    std::min(absl::Seconds(1), absl::Seconds(setup.heartbeat_s) / 4),
                    absl::Seconds(setup.retry_s), absl::Seconds(setup.heartbeat_s) / 2,
                    setup.config.ok() ? onebit::JobTerms(*setup.config) : std::string(), &reg,
                    &instance)
          : absl::StatusOr<std::unique_ptr<onebit::CoordinatorSession>>(made.status());
  if (joined.ok()) {
    const absl::Status opened =
        process.state().SetFirstStep(reg.has_resume() ? reg.resume().step() + 1 : 1);
    if (!opened.ok()) joined = opened;
  }
  if (joined.ok() && reg.has_resume()) {
    if (reg.resume().reset_errors()) {
      std::cerr << "onebit-server: resuming from step " << reg.resume().step()
                << " with the server error reset: " << reg.resume().reason() << std::endl;
    } else if (reg.resume().servers_start_empty()) {
      std::cerr << "onebit-server: resuming from step " << reg.resume().step()
                << " with a zero server error: the checkpoint is of a warmup between the "
                   "workers, which the shards took no part in" << std::endl;
    } else {
      const absl::Status restored = onebit::server::ShardCheckpointer::Restore(
          setup.checkpoint_dir, reg.resume(), index, process.state());
      if (!restored.ok()) {
        joined = restored;
      } else {
        std::cerr << "onebit-server: resumed from the checkpoint of step " << reg.resume().step()
                  << std::endl;
      }
    }
  }
  if (!joined.ok()) {
    std::cerr << "onebit-server: cannot join the job: " << joined.status() << std::endl;
    process.Shutdown();
    const std::optional<onebit::MemberVerdict> verdict =
        made.ok() ? onebit::VerdictAfterRegisterError(**made, joined.status()) : std::nullopt;
    if (verdict.has_value()) {
      std::cerr << "onebit-server: " << verdict->reason << std::endl;
      return verdict->exit_code;
    }
    return kExitRuntime;
  }
  *client = *std::move(made);
  *session = *std::move(joined);
  if (checkpointer != nullptr) checkpointer->Start(client->get(), instance);
  return std::nullopt;
}

}  // namespace

int main(int argc, char** argv) {
  onebit::IgnoreSigpipe();
  absl::SetProgramUsageMessage("A parameter-server shard of a onebit job.");
  absl::ParseCommandLine(argc, argv);

  // SIGTERM/SIGINT are taken on the watcher's thread (gRPC's and civetweb's threads inherit
  // the mask it sets). While the shard is still joining the job (registration retries for
  // up to onebit.failure.coordinator_retry_s) there is nothing to drain: leave at once;
  // once it serves, main shuts down gracefully below. Before any thread starts (the model's
  // size may be learned from the coordinator first).
  onebit::TerminationWatcher signals([](int sig) {
    if (g_serving.load()) return;
    std::cerr << "onebit-server: signal " << sig << " while starting; exiting" << std::endl;
    std::_Exit(g_exit_code.load());  // 0, or what the job's verdict asked for
  });

  absl::StatusOr<ShardSetup> made_setup = SetupFromFlags();
  if (!made_setup.ok()) {
    if (absl::IsInvalidArgument(made_setup.status())) {
      return UsageError(std::string(made_setup.status().message()));
    }
    std::cerr << "onebit-server: " << made_setup.status().message() << std::endl;
    return kExitRuntime;
  }
  ShardSetup& setup = *made_setup;
  onebit::server::ServerProcessOptions& options = setup.options;
  if (setup.size_decided_later) {
    std::cout << "onebit-server: flags and config OK (shard " << options.shard.shard
              << "; the model's size is learned from the workers when the job starts)"
              << std::endl;
    return 0;
  }
  absl::StatusOr<std::optional<onebit::Fault>> fault =
      onebit::ParseFault(absl::GetFlag(FLAGS_fault), {"kill_at_step"});
  if (!fault.ok()) return UsageError(std::string(fault.status().message()));
  if (absl::GetFlag(FLAGS_check)) {
    for (const std::string& notice : setup.notices) {
      std::cerr << "onebit-server: config notice: " << notice << std::endl;
    }
    std::cout << "onebit-server: flags and config OK (shard " << options.shard.shard << " of "
              << options.shard.num_shards << ", " << options.shard.num_workers
              << " workers, n = " << setup.n << ", " << options.shard.codec->name() << ")"
              << std::endl;
    return 0;
  }

  // Checkpoints need the coordinator (it commits them) and a directory.
  const bool in_a_job = !setup.client_options.address.empty();
  std::unique_ptr<onebit::server::ShardCheckpointer> checkpointer;
  if (!setup.checkpoint_dir.empty() && in_a_job) {
    checkpointer = std::make_unique<onebit::server::ShardCheckpointer>(
        setup.checkpoint_dir, setup.group_offset + options.shard.shard, setup.topology);
    options.shard.on_checkpoint = [c = checkpointer.get()](int64_t step, std::vector<float> e) {
      c->Enqueue(step, std::move(e));
    };
  }
  // A shard of a job opens once the coordinator said where the job starts.
  if (in_a_job) options.shard.first_step = -1;
  if (fault->has_value()) {
    options.shard.on_step_completed = [f = **fault, shard = options.shard.shard](int64_t step) {
      if (f.At("kill_at_step", step)) {
        onebit::KillSelf(absl::StrCat("shard ", shard), absl::StrCat("the end of step ", step));
      }
    };
  }
  auto process = onebit::server::ServerProcess::Start(options);
  if (!process.ok()) {
    std::cerr << "onebit-server: " << process.status() << std::endl;
    return kExitRuntime;
  }
  std::cerr << "onebit-server: shard " << options.shard.shard << " of " << options.shard.num_shards
            << ", " << options.shard.num_workers << " workers, n = " << setup.n << "; gRPC"
            << (options.tls.enabled() ? (options.tls.mutual ? " (mutual TLS)" : " (TLS)") : "")
            << " on " << (*process)->grpc_address() << ", /metrics on "
            << (*process)->metrics_address() << std::endl;

  std::unique_ptr<onebit::CoordinatorClient> client;
  std::unique_ptr<onebit::CoordinatorSession> session;
  if (in_a_job) {
    if (std::optional<int> exit_code =
            JoinAndRestore(setup, **process, checkpointer.get(), &client, &session)) {
      return *exit_code;
    }
  }
  // Open for pushes (registered with the job, where there is one): /readyz says so.
  if ((*process)->metrics_server() != nullptr) (*process)->metrics_server()->SetReady();

  g_serving = true;
  const int signal = signals.Wait();
  std::cerr << "onebit-server: signal " << signal << ", shutting down" << std::endl;
  // Queued checkpoint parts are written and reported while the client is still alive, for
  // at most ShardCheckpointer::kFinishBudget, beside gRPC's grace for the calls in flight: a
  // coordinator that is gone (stopped first, its pod's address silent) must not hold the
  // shard past an orchestrator's stop grace period (exit within 5 s).
  std::thread drain([&checkpointer] {
    if (checkpointer) checkpointer->Finish(onebit::server::ShardCheckpointer::kFinishBudget);
  });
  if (session) (void)session->Stop();
  (*process)->Shutdown();
  process->reset();
  drain.join();
  checkpointer.reset();
  return g_exit_code.load();
}
