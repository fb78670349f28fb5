// onebit-chaos: a job under random faults ends as if nothing had happened.
//
// Runs a job twice with the same config: undisturbed, then under a schedule of faults
// (tools/chaos/chaos.h: SIGKILLs of random members, the coordinator among them and at
// times twice within seconds, and random hosts' links cut for a while and healed), with a
// supervisor that restarts what dies (deploy/local_job.h: a process killed or exiting 75
// is restarted; 78, the job failed, is not). Then it checks that every worker's final
// parameters equal the undisturbed run's bit for bit, and reports faults, recoveries and
// time lost.
//
//   tools/emulated_cluster.sh up 4 1gbit        # prints the --cluster_* flags
//   bazel run //tools/chaos:onebit-chaos -- --config=JOB.json --faults=100 \
//       --cluster_control=onebit-ctl@10.213.0.1 --cluster_nodes=... --out_dir=/tmp/chaos
//
// Without --cluster_*, every process runs here on loopback and faults are kills only (a
// link can only be cut between namespaces). Faults stop once a worker has exited 0: a
// worker that ran its last step stays until the job succeeded, so the job is over. Writes
// OUT_DIR/faults.csv, OUT_DIR/report.md and each run's logs under OUT_DIR/{baseline,chaos};
// exits 0 only when the disturbed job succeeded with the undisturbed job's parameters.
#include <signal.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/signals.h"
#include "common/status_macros.h"
#include "common/subprocess.h"
#include "config/job_config.h"
#include "deploy/local_job.h"
#include "tools/chaos/chaos.h"

ABSL_FLAG(std::string, config, "", "The job config (JSON; required).");
ABSL_FLAG(std::string, out_dir, "/tmp/onebit-chaos", "Logs, parameters and the report.");
ABSL_FLAG(std::string, bin_dir, "", "Where the onebit binaries are (default: runfiles).");
ABSL_FLAG(std::string, cluster_control, "",
          "NAMESPACE@ADDRESS of the coordinator and the shards (tools/emulated_cluster.sh).");
ABSL_FLAG(std::string, cluster_nodes, "", "NS@ADDR,NS@ADDR,...: the workers' hosts.");
ABSL_FLAG(int, faults, 100, "Faults to inject.");
ABSL_FLAG(uint64_t, seed, 1, "The schedule's seed (the same seed, the same schedule).");
ABSL_FLAG(std::string, gap_s, "3,8", "MIN,MAX seconds between faults.");
ABSL_FLAG(std::string, cut_s, "2,12", "MIN,MAX seconds a cut link stays down.");
ABSL_FLAG(double, cut_share, 0.3, "Share of the faults that cut a link (with --cluster_*).");
ABSL_FLAG(double, coordinator_share, 0.15, "Share of the faults that kill the coordinator.");
ABSL_FLAG(double, coordinator_twice_share, 0.4,
          "Share of the coordinator's kills followed by a second one 1-4 s later.");
ABSL_FLAG(int, timeout_s, 3600, "Give up on a run after this many seconds.");

namespace onebit::chaos {
namespace {

using launcher::LocalJob;
using launcher::LocalJobOptions;

volatile int g_interrupted = 0;

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

absl::StatusOr<std::pair<absl::Duration, absl::Duration>> Range(const std::string& flag,
                                                                const std::string& text) {
  const std::vector<std::string> parts = absl::StrSplit(text, ',');
  double lo = 0, hi = 0;
  if (parts.size() != 2 || !absl::SimpleAtod(parts[0], &lo) || !absl::SimpleAtod(parts[1], &hi)) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag, "=", text, ": want MIN,MAX seconds"));
  }
  return std::make_pair(absl::Seconds(lo), absl::Seconds(hi));
}

// The faults' effects on a LocalJob: kills through its processes, cuts with `ip`.
class JobTarget final : public ChaosTarget {
 public:
  explicit JobTarget(LocalJob* job) : job_(job) {}
  bool Running(const std::string& process) override { return job_->Running(process); }
  absl::Status Kill(const std::string& process) override {
    return job_->SignalProcess(process, SIGKILL);
  }
  absl::Status SetLink(const std::string& netns, bool up) override {
    ProcessOptions o;
    o.argv = {"/usr/sbin/ip", "-n", netns, "link", "set", "eth0", up ? "up" : "down"};
    o.name = "ip";
    ONEBIT_ASSIGN_OR_RETURN(std::unique_ptr<Process> ip, Process::Start(o));
    ONEBIT_ASSIGN_OR_RETURN(int code, ip->Wait(absl::Seconds(10)));
    if (code != 0) {
      return absl::InternalError(absl::StrCat("ip -n ", netns, " link set eth0 ",
                                              up ? "up" : "down", " exited with ", code));
    }
    return absl::OkStatus();
  }

 private:
  LocalJob* job_;
};

struct RunResult {
  absl::Status status;
  double seconds = 0;
  std::vector<std::string> params;  // each worker's .npy bytes
  std::vector<google::protobuf::Value> summaries;
  std::map<std::string, int> restarts;
  std::vector<Fault> faults;
  std::vector<std::string> heal_errors;
};

RunResult RunOnce(const std::string& bin, const std::string& dir, const std::string& config_path,
                  const JobConfig& config, const ChaosOptions* chaos_options) {
  RunResult result;
  std::error_code ignored;
  std::filesystem::remove_all(dir, ignored);
  LocalJobOptions options;
  options.bin_dir = bin;
  options.dir = dir;
  options.config_path = config_path;
  options.echo_all = false;
  options.worker_flags = {absl::StrCat("--params_out=", dir, "/params-{i}.npy")};
  options.coordinator_flags = {"--linger=0s"};
  result.status = launcher::SetClusterHosts(absl::GetFlag(FLAGS_cluster_control),
                                            absl::GetFlag(FLAGS_cluster_nodes), &options);
  if (!result.status.ok()) return result;
  // The checkpoint directory is the config's: a fresh one per run.
  if (!config.checkpoint.dir.empty()) std::filesystem::remove_all(config.checkpoint.dir, ignored);

  LocalJob job(options, config);
  const absl::Time start = absl::Now();
  result.status = job.Start();
  if (result.status.ok()) {
    std::unique_ptr<Chaos> chaos;
    JobTarget target(&job);
    if (chaos_options != nullptr) {
      std::vector<Victim> victims;
      for (const auto& [name, host] : job.Hosts()) victims.push_back({name, host.netns});
      chaos = std::make_unique<Chaos>(*chaos_options, victims, absl::Now());
    }
    size_t reported = 0;
    const auto each_poll = [&] {
      if (chaos == nullptr) return;
      // A worker exits 0 once the job succeeded: nothing is left to disturb.
      if (job.workers_done() > 0) {
        chaos->HealAll(target);
        return;
      }
      if (chaos->Done()) return;
      chaos->Tick(absl::Now(), target);
      for (; reported < chaos->faults().size(); ++reported) {
        const Fault& f = chaos->faults()[reported];
        std::printf("[chaos %6.1f s] fault %zu: %s %s%s%s\n", absl::ToDoubleSeconds(f.at - start),
                    reported + 1, f.kind == FaultKind::kCut ? "cut the link of" : "kill",
                    f.target.c_str(),
                    f.kind == FaultKind::kCut
                        ? absl::StrFormat(" for %.1f s", absl::ToDoubleSeconds(f.cut_for)).c_str()
                        : (f.second_kill ? " (again)" : ""),
                    f.outcome.empty() ? "" : absl::StrCat(" (not done: ", f.outcome, ")").c_str());
        std::fflush(stdout);
      }
    };
    result.status = job.WaitForWorkers(absl::Seconds(absl::GetFlag(FLAGS_timeout_s)),
                                       &g_interrupted, each_poll);
    if (chaos != nullptr) {
      chaos->HealAll(target);
      result.faults = chaos->faults();
      result.heal_errors = chaos->errors();
    }
  }
  job.Stop();
  result.seconds = absl::ToDoubleSeconds(absl::Now() - start);
  result.restarts = job.restarts();
  if (!result.status.ok()) return result;
  absl::StatusOr<std::vector<google::protobuf::Value>> summaries = job.Summaries();
  if (summaries.ok()) result.summaries = *summaries;
  for (int i = 0; i < config.workers; ++i) {
    result.params.push_back(ReadAll(absl::StrCat(dir, "/params-", i, ".npy")));
  }
  return result;
}

int Main(const char* argv0) {
  const std::string config_path = absl::GetFlag(FLAGS_config);
  if (config_path.empty()) {
    std::fprintf(stderr, "onebit-chaos: --config is required\n");
    return 2;
  }
  absl::StatusOr<JobConfig> config = LoadJobConfig(config_path);
  if (!config.ok()) {
    std::fprintf(stderr, "onebit-chaos: %s\n", config.status().ToString().c_str());
    return 2;
  }
  ChaosOptions options;
  options.seed = absl::GetFlag(FLAGS_seed);
  options.faults = absl::GetFlag(FLAGS_faults);
  options.cut_share = absl::GetFlag(FLAGS_cut_share);
  options.coordinator_share = absl::GetFlag(FLAGS_coordinator_share);
  options.coordinator_twice_share = absl::GetFlag(FLAGS_coordinator_twice_share);
  auto gap = Range("gap_s", absl::GetFlag(FLAGS_gap_s));
  auto cut = Range("cut_s", absl::GetFlag(FLAGS_cut_s));
  absl::Status valid = !gap.ok() ? gap.status() : !cut.ok() ? cut.status() : absl::OkStatus();
  if (valid.ok()) {
    std::tie(options.min_gap, options.max_gap) = *gap;
    std::tie(options.min_cut, options.max_cut) = *cut;
    valid = ValidateOptions(options);
  }
  if (valid.ok() && config->checkpoint.dir.empty()) {
    valid = absl::InvalidArgumentError(
        "the job needs onebit.checkpoint (dir, every_steps) to recover without starting over");
  }
  if (!valid.ok()) {
    std::fprintf(stderr, "onebit-chaos: %s\n", valid.ToString().c_str());
    return 2;
  }
  const std::string out = absl::GetFlag(FLAGS_out_dir);
  std::filesystem::create_directories(out);
  const std::string bin = launcher::BinDir(absl::GetFlag(FLAGS_bin_dir), argv0);

  std::printf("== the undisturbed run\n");
  std::fflush(stdout);
  const RunResult baseline = RunOnce(bin, out + "/baseline", config_path, *config, nullptr);
  if (!baseline.status.ok()) {
    std::fprintf(stderr, "onebit-chaos: the undisturbed run failed: %s\n",
                 baseline.status.ToString().c_str());
    return 1;
  }
  std::printf("   %.1f s\n== the run under %d faults (seed %llu)\n", baseline.seconds,
              options.faults, static_cast<unsigned long long>(options.seed));
  std::fflush(stdout);
  const RunResult chaos = RunOnce(bin, out + "/chaos", config_path, *config, &options);

  // The report.
  std::ofstream csv(out + "/faults.csv");
  csv << "n,at_s,kind,target,cut_s,second_kill,outcome\n";
  int kills = 0, cuts = 0, coordinator = 0, twice = 0, not_done = 0;
  const absl::Time t0 = chaos.faults.empty() ? absl::Now() : chaos.faults.front().at;
  for (size_t i = 0; i < chaos.faults.size(); ++i) {
    const Fault& f = chaos.faults[i];
    csv << absl::StrFormat("%d,%.2f,%s,%s,%.1f,%d,%s\n", i + 1, absl::ToDoubleSeconds(f.at - t0),
                           f.kind == FaultKind::kCut ? "cut" : "kill", f.target,
                           absl::ToDoubleSeconds(f.cut_for), f.second_kill ? 1 : 0, f.outcome);
    if (!f.outcome.empty()) {
      ++not_done;
      continue;
    }
    (f.kind == FaultKind::kCut ? cuts : kills) += 1;
    if (f.target == "coordinator") ++coordinator;
    if (f.second_kill) ++twice;
  }
  bool identical = chaos.status.ok() && chaos.params.size() == baseline.params.size();
  for (size_t i = 0; identical && i < chaos.params.size(); ++i) {
    identical = !chaos.params[i].empty() && chaos.params[i] == baseline.params[0] &&
                baseline.params[i] == baseline.params[0];
  }
  int64_t recoveries = -1;
  std::vector<int64_t> resumed;
  if (!chaos.summaries.empty()) {
    recoveries = static_cast<int64_t>(launcher::NumberField(chaos.summaries[0], "recoveries"));
    resumed = launcher::IntegerListField(chaos.summaries[0], "resumed_after_steps");
  }
  std::vector<std::string> restarts;
  int total_restarts = 0;
  for (const auto& [name, n] : chaos.restarts) {
    restarts.push_back(absl::StrCat(name, " ", n));
    total_restarts += n;
  }
  std::string report = absl::StrFormat(
      "# onebit-chaos: %s\n\n"
      "| | |\n|---|---|\n"
      "| faults injected | %d (%d kills, %d of the coordinator, %d of them a second kill "
      "within 1-4 s; %d link cuts); %d not done (the victim was between exit and restart) |\n"
      "| job | %s |\n"
      "| recoveries (worker 0's summary) | %d |\n"
      "| resumed after steps | %s |\n"
      "| process restarts | %d (%s) |\n"
      "| undisturbed run | %.1f s |\n"
      "| disturbed run | %.1f s (%.1f s lost, %.1f s per fault) |\n"
      "| final parameters | %s |\n"
      "| links left down | %s |\n",
      config_path, kills + cuts, kills, coordinator, twice, cuts, not_done,
      chaos.status.ok() ? "succeeded" : chaos.status.ToString(), recoveries,
      absl::StrJoin(resumed, ", "), total_restarts, absl::StrJoin(restarts, ", "),
      baseline.seconds, chaos.seconds, chaos.seconds - baseline.seconds,
      kills + cuts > 0 ? (chaos.seconds - baseline.seconds) / (kills + cuts) : 0.0,
      identical ? "bit-identical to the undisturbed run's, every worker"
                : "DIFFERENT from the undisturbed run's (or missing)",
      chaos.heal_errors.empty() ? "none" : absl::StrJoin(chaos.heal_errors, "; "));
  std::ofstream(out + "/report.md") << report;
  std::printf("\n%s\n", report.c_str());
  return identical && chaos.heal_errors.empty() ? 0 : 1;
}

}  // namespace
}  // namespace onebit::chaos

int main(int argc, char** argv) {
  onebit::IgnoreSigpipe();
  absl::ParseCommandLine(argc, argv);
  // ^C or SIGTERM: the run ends, its cut links are healed, its processes stopped.
  signal(SIGINT, [](int) { onebit::chaos::g_interrupted = 1; });
  signal(SIGTERM, [](int) { onebit::chaos::g_interrupted = 1; });
  return onebit::chaos::Main(argv[0]);
}
