// The local launcher: runs a whole onebit job on this machine as real processes on
// loopback (one coordinator, the parameter-server shards, the workers), with every
// process's output labelled on the terminal, then, with --compare_adam, the same job with
// plain Adam (full-precision exchange, same data and seed) and a side-by-side summary.
//
//   bazel run //deploy:onebit-launch -- --config=deploy/demo.json
//
// A TRAINING SCRIPT as the workers (the Python package, python/onebit):
//
//   bazel-bin/deploy/onebit-launch --config=job.json -- python3 train.py [ARGS]
//
// starts N copies of the command instead of onebit-worker, with the job in their
// environment (ONEBIT_CONFIG, ONEBIT_COORDINATOR, ONEBIT_RANK, ONEBIT_WORLD_SIZE,
// ONEBIT_LOCAL_RANK, ONEBIT_LOCAL_WORLD_SIZE, ONEBIT_HOST,
// ONEBIT_SUMMARY_FILE, ONEBIT_HISTORY_CSV) and PYTHONPATH finding the package; the script
// evaluates itself (no Adam comparison, no accuracy in the summary).
//
// Exit status: 0 the job succeeded; 78 it FAILED for a reason no restart fixes (a member
// exited 78: coordinator/member.h; the message quotes its last line, which says why);
// 1 another failure; 2 bad flags or config.
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <system_error>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/permanent_error.h"
#include "common/signals.h"
#include "config/job_config.h"
#include "config/optimizer_kind.h"
#include "deploy/local_job.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "common/status_macros.h"

ABSL_FLAG(std::string, config, "deploy/demo.json", "The job config (JSON).");
ABSL_FLAG(std::string, out_dir, "out/demo", "Logs, addresses and summaries go here.");
ABSL_FLAG(bool, compare_adam, true, "Also run the job with plain Adam and compare.");
ABSL_FLAG(int, timeout_s, 900, "Give up on a job after this many seconds.");
ABSL_FLAG(bool, echo_all, true, "Print every process's output (else only worker 0's).");
ABSL_FLAG(std::string, bin_dir, "", "Where the onebit binaries are (default: runfiles).");
ABSL_FLAG(std::string, exchange, "",
          "Override onebit.exchange.mode: peer, ps or hierarchical (with --local_size).");
ABSL_FLAG(int, local_size, 0, "Override onebit.exchange.local_size (workers per node).");
ABSL_FLAG(std::string, inter, "", "Override onebit.exchange.inter: peer or ps.");
ABSL_FLAG(int, servers, -1, "Override onebit.exchange.servers.");
ABSL_FLAG(std::optional<bool>, shard_state, std::nullopt,
          "Override onebit.exchange.shard_state (=true or =false; hierarchical with "
          "local_size >= 2 only). Without it, --exchange and --local_size turn it off where "
          "it no longer applies, never on: the config's zero_optimization.stage was read "
          "before them.");
ABSL_FLAG(int, steps, 0, "Override steps.");
ABSL_FLAG(int, freeze_step, -1, "Override optimizer.params.freeze_step.");
ABSL_FLAG(std::string, fault, "",
          "Fault injection, to watch the job recover: PROCESS:POINT:STEP kills that process "
          "with SIGKILL at POINT of step STEP, once (worker<i>: kill_in_exchange or "
          "kill_before_commit, in onebit-worker or a training script's onebit.torch; "
          "server<i> or coordinator: kill_at_step). The job needs "
          "onebit.checkpoint and onebit.failure.max_restarts >= 1 to resume; only the "
          "first job (not the Adam comparison) gets it.");
ABSL_FLAG(std::string, cluster_control, "",
          "Emulated cluster (tools/emulated_cluster.sh up): NAMESPACE@ADDRESS of the "
          "coordinator and the shards.");
ABSL_FLAG(std::string, cluster_nodes, "",
          "Emulated cluster: NS@ADDR,NS@ADDR,... of the nodes; workers spread over them "
          "node-major.");
ABSL_FLAG(std::string, cluster_shards, "control",
          "Emulated cluster: where the ps shards run, \"control\" (beside the coordinator) "
          "or \"nodes\" (shard s on node s mod nodes: a shard beside each worker).");
ABSL_FLAG(bool, transport_trace, false,
          "Peer and ps modes: each worker writes one CSV line per transport call (ps: per "
          "push and per result) to "
          "OUT_DIR/transport-<i>.csv (tools/bench/rounds.py counts the rounds from them).");

namespace onebit::launcher {
namespace {

using google::protobuf::Value;

volatile int g_interrupted = 0;

constexpr int kJobFailedExit = 78;  // coordinator/member.h's kMemberExitJobFailed

// Paths given on the command line are relative to where `bazel run` was started.
std::string UserPath(const std::string& path) {
  const char* wd = std::getenv("BUILD_WORKING_DIRECTORY");
  if (path.empty() || path[0] == '/' || wd == nullptr) return path;
  return absl::StrCat(wd, "/", path);
}

double Field(const Value& v, const std::string& key) { return NumberField(v, key); }

struct JobResult {
  std::vector<Value> workers;  // each worker's summary file
  double seconds = 0;
};

// The command line's overrides of the config; false when there are none.
absl::StatusOr<bool> ApplyOverrides(JobConfig* c) {
  const JobConfig before = *c;
  ExchangeConfig& x = c->exchange;
  if (!absl::GetFlag(FLAGS_exchange).empty()) {
    x.mode = absl::GetFlag(FLAGS_exchange);
    if (x.mode != "hierarchical") x.local_size = 1, x.inter = "peer";
    if (x.mode == "peer") x.servers = 0;
  }
  if (absl::GetFlag(FLAGS_local_size) > 0) x.local_size = absl::GetFlag(FLAGS_local_size);
  if (!absl::GetFlag(FLAGS_inter).empty()) x.inter = absl::GetFlag(FLAGS_inter);
  if (x.mode == "hierarchical" && x.inter == "peer") x.servers = 0;
  if (absl::GetFlag(FLAGS_servers) >= 0) x.servers = absl::GetFlag(FLAGS_servers);
  // The config's zero_optimization.stage was resolved before these overrides (the JSON
  // below has no such block): a new topology keeps shard_state only where it applies.
  if (absl::GetFlag(FLAGS_shard_state).has_value()) {
    x.shard_state = *absl::GetFlag(FLAGS_shard_state);
  } else if (x.mode != "hierarchical" || x.local_size < 2) {
    x.shard_state = false;
  }
  if (absl::GetFlag(FLAGS_steps) > 0) c->steps = absl::GetFlag(FLAGS_steps);
  if (absl::GetFlag(FLAGS_freeze_step) >= 0) {
    // The type's own warmup-end key (ZeroOneAdam's var_freeze_step).
    *MutableWarmupEndStep(&c->optimizer) = absl::GetFlag(FLAGS_freeze_step);
  }
  const std::string json = JobConfigToJson(*c);
  if (json == JobConfigToJson(before)) return false;
  // The same validation as any config file: errors name the key.
  ONEBIT_ASSIGN_OR_RETURN(*c, ParseJobConfig(json));
  return true;
}

// A training script's command (after `--`), argv[0] found on PATH like a shell would, and
// the PYTHONPATH that finds the onebit package and its extension: <bin>/python (the
// runfiles hold both), the workspace's python/ under `bazel run`, then the caller's.
struct Script {
  std::vector<std::string> argv;
  std::vector<std::string> env;
};

absl::StatusOr<Script> ScriptCommand(std::vector<std::string> argv, const std::string& bin) {
  Script script;
  if (argv.empty()) return script;
  if (argv[0].find('/') == std::string::npos) {
    const char* path = std::getenv("PATH");
    std::string found;
    for (absl::string_view dir : absl::StrSplit(path != nullptr ? path : "", ':')) {
      const std::string candidate = absl::StrCat(dir.empty() ? "." : dir, "/", argv[0]);
      if (access(candidate.c_str(), X_OK) == 0) {
        found = candidate;
        break;
      }
    }
    if (found.empty()) return absl::NotFoundError(absl::StrCat(argv[0], " is not on PATH"));
    argv[0] = found;
  } else {
    argv[0] = UserPath(argv[0]);
  }
  std::string pythonpath = bin + "/python";
  if (const char* ws = std::getenv("BUILD_WORKSPACE_DIRECTORY")) {
    absl::StrAppend(&pythonpath, ":", ws, "/python");
  }
  if (const char* old = std::getenv("PYTHONPATH"); old != nullptr && *old != '\0') {
    absl::StrAppend(&pythonpath, ":", old);
  }
  script.argv = std::move(argv);
  script.env = {"PYTHONPATH=" + pythonpath};
  return script;
}

// --fault's PROCESS:POINT:STEP into the process's --fault flag. The binaries check POINT
// and STEP themselves (and exit with the points they know).
absl::Status ApplyFault(const std::string& text, const JobConfig& config,
                        LocalJobOptions* options) {
  if (text.empty()) return absl::OkStatus();
  const std::vector<std::string> parts = absl::StrSplit(text, absl::MaxSplits(':', 1));
  const auto bad = [&text](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat("--fault=", text, ": ", why));
  };
  if (parts.size() != 2) return bad("want PROCESS:POINT:STEP");
  const std::vector<std::string> flag = {"--fault=" + parts[1]};
  const std::string& process = parts[0];
  if (process == "coordinator") {
    options->coordinator_flags.insert(options->coordinator_flags.end(), flag.begin(), flag.end());
    return absl::OkStatus();
  }
  int index = -1;
  for (const auto& [prefix, count] : {std::pair<std::string, int>{"worker", config.workers},
                                      std::pair<std::string, int>{"server", config.exchange.servers}}) {
    if (!absl::StartsWith(process, prefix)) continue;
    if (!absl::SimpleAtoi(process.substr(prefix.size()), &index) || index < 0 || index >= count) {
      return bad(absl::StrCat(prefix, " index must be 0..", count - 1));
    }
    (prefix == "worker" ? options->flags_of_worker : options->flags_of_server)[index] = flag;
    return absl::OkStatus();
  }
  return bad("PROCESS is worker<i>, server<i> or coordinator");
}

absl::StatusOr<JobResult> RunJob(const std::string& bin, const std::string& dir,
                                 const JobConfig& config, const std::string& config_path,
                                 const Script& script = {}, const std::string& fault = "") {
  const absl::Time start = absl::Now();
  LocalJobOptions options;
  ONEBIT_RETURN_IF_ERROR(SetClusterHosts(absl::GetFlag(FLAGS_cluster_control),
                                         absl::GetFlag(FLAGS_cluster_nodes), &options));
  const std::string shards_on = absl::GetFlag(FLAGS_cluster_shards);
  if (shards_on != "control" && shards_on != "nodes") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--cluster_shards must be \"control\" or \"nodes\", got \"", shards_on, "\""));
  }
  if (shards_on == "nodes" && options.nodes.empty()) {
    return absl::InvalidArgumentError("--cluster_shards=nodes needs --cluster_nodes");
  }
  options.shards_on_nodes = shards_on == "nodes";
  options.bin_dir = bin;
  options.dir = dir;
  options.config_path = config_path;
  options.echo_all = absl::GetFlag(FLAGS_echo_all);
  options.worker_flags = {"--history_csv=" + dir + "/worker-{i}.csv"};
  if (absl::GetFlag(FLAGS_transport_trace)) {
    options.worker_flags.push_back("--transport_trace=" + dir + "/transport-{i}.csv");
  }
  options.worker_command = script.argv;
  options.worker_env = script.env;
  ONEBIT_RETURN_IF_ERROR(ApplyFault(fault, config, &options));
  LocalJob job(options, config);
  absl::Status status = job.Start();
  if (status.ok()) {
    const bool tls = !config.security.tls.cert.empty();
    std::printf("coordinator at %s%s (REST %s%s, metrics http://%s)\n", job.grpc_address().c_str(),
                tls ? (config.security.tls.mutual ? ", mutual TLS" : ", TLS") : "",
                tls ? "https://" : "http://", job.rest_address().c_str(),
                job.metrics_address().c_str());
    status = job.WaitForWorkers(absl::Seconds(absl::GetFlag(FLAGS_timeout_s)), &g_interrupted);
  }
  job.Stop();
  if (!status.ok()) return status;
  JobResult result;
  ONEBIT_ASSIGN_OR_RETURN(result.workers, job.Summaries());
  result.seconds = absl::ToDoubleSeconds(absl::Now() - start);
  return result;
}

std::string Bytes(double b) {
  if (b >= 1e9) return absl::StrFormat("%.2f GB", b / 1e9);
  if (b >= 1e6) return absl::StrFormat("%.2f MB", b / 1e6);
  if (b >= 1e3) return absl::StrFormat("%.1f kB", b / 1e3);
  return absl::StrFormat("%.0f B", b);
}

// How often the job recovered and after which steps (a worker's summary): "none", or
// "2 (resumed after steps 40, 0)"; "-" when the worker could not ask.
std::string Recoveries(const Value& worker) {
  const double n = Field(worker, "recoveries");
  if (n <= 0) return n < 0 ? "-" : "none";
  return absl::StrFormat("%.0f (resumed after steps %s)", n,
                         absl::StrJoin(IntegerListField(worker, "resumed_after_steps"), ", "));
}

// Mean of a summary field over the workers.
double Mean(const JobResult& r, const std::string& key) {
  double sum = 0;
  for (const Value& w : r.workers) sum += Field(w, key);
  return r.workers.empty() ? 0 : sum / r.workers.size();
}

std::string PerStep(const JobResult& r, const std::string& stage) {
  const double steps = Mean(r, stage + "_steps");
  if (steps == 0) return "-";
  return absl::StrFormat("%.0f x %s", steps, Bytes(Mean(r, "bytes_sent_" + stage) / steps));
}

void PrintSummary(const JobConfig& c, const JobResult& onebit, const JobResult* adam) {
  const std::string name = Traits(c.optimizer.kind).display_name;
  std::string exchange = c.exchange.mode;
  if (c.exchange.mode == "hierarchical") {
    absl::StrAppend(&exchange, " (", c.workers / c.exchange.local_size, " nodes x ",
                    c.exchange.local_size, ", between nodes: ", c.exchange.inter, ")");
  }
  if (UsesServers(c.exchange)) absl::StrAppend(&exchange, " over ", c.exchange.servers, " shards");
  std::printf("\n== Summary: %s, %d workers, %s exchange, %lld steps x %lld samples per worker\n",
              c.workload.type.c_str(), c.workers, exchange.c_str(),
              static_cast<long long>(c.steps), static_cast<long long>(c.micro_batch));
  std::printf("%-34s %-22s %s\n", "", name.c_str(), adam ? "Adam (fp32 exchange)" : "");
  auto row = [&](const char* name, const std::string& a, const std::string& b) {
    std::printf("%-34s %-22s %s\n", name, a.c_str(), adam ? b.c_str() : "");
  };
  // A training script evaluates its model itself: its summary has no test accuracy.
  auto pct = [](double x) { return x < 0 ? std::string("-") : absl::StrFormat("%.2f%%", 100 * x); };
  row("test accuracy (worker 0)", pct(Field(onebit.workers[0], "test_accuracy")),
      adam ? pct(Field(adam->workers[0], "test_accuracy")) : "");
  auto loss = [](double x) { return x < 0 ? std::string("-") : absl::StrFormat("%.4f", x); };
  row("test loss", loss(Field(onebit.workers[0], "test_loss")),
      adam ? loss(Field(adam->workers[0], "test_loss")) : "");
  row("bytes sent per worker, total", Bytes(Mean(onebit, "bytes_sent_warmup") + Mean(onebit, "bytes_sent_compression")),
      adam ? Bytes(Mean(*adam, "bytes_sent_warmup") + Mean(*adam, "bytes_sent_compression")) : "");
  row("  warmup steps x bytes/step", PerStep(onebit, "warmup"), adam ? PerStep(*adam, "warmup") : "");
  row("  compression steps x bytes/step", PerStep(onebit, "compression"),
      adam ? PerStep(*adam, "compression") : "");
  auto communicated = [](const JobResult& r) {
    return absl::StrFormat("%.0f of %.0f", Mean(r, "steps_communicated_warmup") +
                                               Mean(r, "steps_communicated_compression"),
                           Mean(r, "warmup_steps") + Mean(r, "compression_steps"));
  };
  row("steps that communicated", communicated(onebit), adam ? communicated(*adam) : "");
  row("recoveries", Recoveries(onebit.workers[0]), adam ? Recoveries(adam->workers[0]) : "");
  if (Mean(onebit, "masked_elements") > 0) {
    row("momentum mask: masked elements", absl::StrFormat("%.0f", Mean(onebit, "masked_elements")),
        "");
  }
  if (c.exchange.mode == "hierarchical") {
    auto inter = [](const JobResult& r) {
      return Bytes(Mean(r, "inter_node_bytes_sent_warmup") +
                   Mean(r, "inter_node_bytes_sent_compression"));
    };
    row("  of which between nodes", inter(onebit), adam ? inter(*adam) : "");
  }
  row("bytes received per worker, total",
      Bytes(Mean(onebit, "bytes_received_warmup") + Mean(onebit, "bytes_received_compression")),
      adam ? Bytes(Mean(*adam, "bytes_received_warmup") + Mean(*adam, "bytes_received_compression")) : "");
  row("wall time of the job", absl::StrFormat("%.1f s", onebit.seconds),
      adam ? absl::StrFormat("%.1f s", adam->seconds) : "");

  const double warm = Mean(onebit, "warmup_steps"), comp = Mean(onebit, "compression_steps");
  if (Traits(c.optimizer.kind).has_local_steps && warm > 0 && comp > 0) {
    // Its warmup mixes full-precision and 1-bit steps and its later steps mostly send
    // nothing: per-step ratios against the warmup would mislead.
    std::printf("\n%s: %.0f of %.0f variance-stage steps and %.0f of %.0f later steps "
                "communicated (the rest sent nothing)\n",
                Traits(c.optimizer.kind).display_name, Mean(onebit, "steps_communicated_warmup"),
                warm,
                Mean(onebit, "steps_communicated_compression"), comp);
  } else if (c.workers == 1) {
    std::printf("\none worker: nothing is exchanged, so there are no bytes to compare\n");
  } else if (warm > 0 && comp > 0) {
    // Hierarchical: what crosses nodes is what the compression is for; the fp32 traffic
    // inside a node is not compressed.
    const std::string prefix = c.exchange.mode == "hierarchical" ? "inter_node_" : "";
    const char* what = c.exchange.mode == "hierarchical" ? " between nodes" : "";
    const double fp32_step = Mean(onebit, prefix + "bytes_sent_warmup") / warm;
    const double onebit_step = Mean(onebit, prefix + "bytes_sent_compression") / comp;
    std::printf("\ncompression stage, bytes sent%s per worker per step (measured): %s\n", what,
                Bytes(onebit_step).c_str());
    std::printf("  vs the same exchange carrying fp32 (warmup steps, measured): %s, %.1fx fewer\n",
                Bytes(fp32_step).c_str(), fp32_step / onebit_step);
    std::printf("  vs fp16 (half the measured fp32; no fp16 exchange exists to measure): %.1fx fewer\n",
                fp32_step / 2 / onebit_step);
  }
  if (adam && c.workers > 1) {
    const std::string prefix = c.exchange.mode == "hierarchical" ? "inter_node_" : "";
    auto total = [&](const JobResult& r) {
      return Mean(r, prefix + "bytes_sent_warmup") + Mean(r, prefix + "bytes_sent_compression");
    };
    std::printf("whole run: Adam sends %.1fx the bytes of %s%s\n", total(*adam) / total(onebit),
                name.c_str(), prefix.empty() ? "" : " between nodes");
  }
  if (adam) {
    const double diff = 100 * (Field(onebit.workers[0], "test_accuracy") - Field(adam->workers[0], "test_accuracy"));
    std::printf("accuracy: %s %+.2f points vs Adam at an equal number of samples (target: within 1)\n",
                name.c_str(), diff);
  }
}

// Loss curves of worker 0 (training loss per step, smoothed, and test accuracy) for the
// runs in `dirs`, drawn by gnuplot into out/loss.png when gnuplot is installed.
void PlotLossCurves(const std::string& out, const std::vector<std::pair<std::string, std::string>>& runs,
                    int64_t freeze_step, bool with_accuracy) {
  if (system("command -v gnuplot > /dev/null 2>&1") != 0) {
    std::printf("(no gnuplot: apt-get install gnuplot-nox to get %s/loss.png)\n", out.c_str());
    return;
  }
  const std::string script = out + "/loss.gp";
  std::ofstream gp(script);
  gp << "set terminal pngcairo size 1100,450 font ',10'\n"
     << "set output '" << out << "/loss.png'\n"
     << "set datafile separator ','\n"
     << (with_accuracy ? "set multiplot layout 1,2\n" : "")
     << "set title 'training loss (worker 0, mean of 20 steps)'\nset xlabel 'step'\n"
     << "set grid\nset key top right\n";
  if (freeze_step > 0) {
    gp << "set arrow from " << freeze_step << ", graph 0 to " << freeze_step
       << ", graph 1 nohead dt 2 lc rgb 'gray'\n"
       << "set label 'switch to 1-bit' at " << freeze_step << ", graph 0.95 offset 1,0\n";
  }
  // A running mean over 20 steps, in gnuplot: sum the last 20 values kept in an array.
  gp << "array w[20]\nsm(x, n) = (w[int(n)%20+1] = x, n < 19 ? x : (sum [i=1:20] w[i]) / 20.0)\n";
  gp << "plot ";
  for (size_t i = 0; i < runs.size(); ++i) {
    gp << (i ? ", " : "") << "'" << runs[i].second << "' using 1:(stringcolumn(2) eq 'step' ? sm($4, $1) : 1/0)"
       << " with lines lw 2 title '" << runs[i].first << "'";
  }
  if (!with_accuracy) {  // a training script evaluates itself: no accuracy in the history
    gp << "\n";
    gp.close();
    if (system(("gnuplot '" + script + "' 2> '" + out + "/gnuplot.log'").c_str()) == 0) {
      std::printf("loss curve: %s/loss.png\n", out.c_str());
    } else {
      std::printf("gnuplot failed; see %s/gnuplot.log\n", out.c_str());
    }
    return;
  }
  gp << "\nunset arrow\nunset label\n"
     << "set title 'test accuracy (worker 0)'\nset key bottom right\nset format y '%.1f%%'\n"
     << "plot ";
  for (size_t i = 0; i < runs.size(); ++i) {
    gp << (i ? ", " : "") << "'" << runs[i].second
       << "' using 1:(stringcolumn(2) eq 'eval' ? 100*$8 : 1/0) with linespoints lw 2 title '"
       << runs[i].first << "'";
  }
  gp << "\nunset multiplot\n";
  gp.close();
  if (system(("gnuplot '" + script + "' 2> '" + out + "/gnuplot.log'").c_str()) == 0) {
    std::printf("loss curves: %s/loss.png\n", out.c_str());
  } else {
    std::printf("gnuplot failed; see %s/gnuplot.log\n", out.c_str());
  }
}

int Main(int argc, char** argv) {
  // After `--`: a training script to run as each worker (see LocalJobOptions::worker_command).
  const std::vector<char*> positional = absl::ParseCommandLine(argc, argv);
  const std::vector<std::string> command(positional.begin() + 1, positional.end());
  signal(SIGINT, [](int) { g_interrupted = 1; });
  signal(SIGTERM, [](int) { g_interrupted = 1; });
  std::string config_path = UserPath(absl::GetFlag(FLAGS_config));
  absl::StatusOr<JobConfig> config = LoadJobConfig(config_path);
  const std::vector<std::string> notices = config.ok() ? config->notices : std::vector<std::string>{};
  const bool shard_state = config.ok() && config->exchange.shard_state;
  absl::StatusOr<bool> overridden = config.ok() ? ApplyOverrides(&*config) : false;
  if (!config.ok() || !overridden.ok()) {
    const absl::Status& s = config.ok() ? overridden.status() : config.status();
    std::fprintf(stderr, "error: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  // The coordinator prints the config's notices; its output is echoed unless --noecho_all.
  if (!absl::GetFlag(FLAGS_echo_all)) {
    for (const std::string& notice : notices) {
      std::fprintf(stderr, "config notice: %s\n", notice.c_str());
    }
  }
  if (config->exchange.shard_state != shard_state) {  // a zero_optimization notice may say otherwise
    std::fprintf(stderr, "config notice: onebit.exchange.shard_state: %s with the command line's "
                 "overrides (the config's: %s)\n", shard_state ? "false" : "true",
                 shard_state ? "true" : "false");
  }
  const std::string out = UserPath(absl::GetFlag(FLAGS_out_dir));
  std::error_code error;
  std::filesystem::create_directories(out, error);
  if (error) {
    std::fprintf(stderr, "error: cannot create %s: %s\n", out.c_str(), error.message().c_str());
    return 1;
  }
  if (*overridden) {  // the processes read the config with the command line's overrides
    config_path = out + "/job.json";
    std::ofstream(config_path) << JobConfigToJson(*config);
  }
  const std::string bin = BinDir(UserPath(absl::GetFlag(FLAGS_bin_dir)), argv[0]);
  absl::StatusOr<Script> script = ScriptCommand(command, bin);
  if (!script.ok()) {
    std::fprintf(stderr, "error: %s\n", std::string(script.status().message()).c_str());
    return 2;
  }

  std::printf("== %s: %s%s\n", Traits(config->optimizer.kind).display_name, config_path.c_str(),
              command.empty() ? "" : absl::StrCat(", workers: ", absl::StrJoin(command, " ")).c_str());
  absl::StatusOr<JobResult> onebit =
      RunJob(bin, out + "/onebit_adam", *config, config_path, *script, absl::GetFlag(FLAGS_fault));
  if (!onebit.ok()) {
    std::fprintf(stderr, "error: %s\n", std::string(onebit.status().message()).c_str());
    return IsPermanent(onebit.status()) ? kJobFailedExit : 1;
  }
  std::unique_ptr<JobResult> adam;
  // A script compares itself (the examples run Adam over DDP).
  if (absl::GetFlag(FLAGS_compare_adam) && command.empty()) {
    JobConfig adam_config = *config;
    adam_config.optimizer.kind = OptimizerKind::kAdam;
    const std::string adam_path = out + "/adam.json";
    std::ofstream(adam_path) << JobConfigToJson(adam_config);
    std::printf("\n== Adam, same job with a full-precision exchange: %s\n", adam_path.c_str());
    absl::StatusOr<JobResult> r = RunJob(bin, out + "/adam", adam_config, adam_path);
    if (!r.ok()) {
      std::fprintf(stderr, "error: %s\n", std::string(r.status().message()).c_str());
      return 1;
    }
    adam = std::make_unique<JobResult>(*std::move(r));
  }
  PrintSummary(*config, *onebit, adam.get());
  std::vector<std::pair<std::string, std::string>> runs = {
      {Traits(config->optimizer.kind).display_name, out + "/onebit_adam/worker-0.csv"}};
  if (adam) runs.push_back({"Adam", out + "/adam/worker-0.csv"});
  PlotLossCurves(out, runs,
                 !Traits(config->optimizer.kind).compresses ? -1 : WarmupEndStep(config->optimizer),
                 /*with_accuracy=*/command.empty());
  return 0;
}

}  // namespace
}  // namespace onebit::launcher

int main(int argc, char** argv) {
  onebit::IgnoreSigpipe();
  return onebit::launcher::Main(argc, argv);
}
