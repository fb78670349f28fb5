// The local launcher: runs a whole onebit job on this machine as real processes on
// loopback (one coordinator, the parameter-server shards, the workers), with every
// process's output labelled on the terminal, then, with --compare_adam, the same job with
// plain Adam (full-precision exchange, same data and seed) and a side-by-side summary.
//
//   bazel run //deploy:onebit_launch -- --config=deploy/demo.json
#include <signal.h>
#include <sys/stat.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "coordinator/job_config.h"
#include "deploy/process.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "kernels/status_macros.h"

ABSL_FLAG(std::string, config, "deploy/demo.json", "The job config (JSON).");
ABSL_FLAG(std::string, out_dir, "out/demo", "Logs, addresses and summaries go here.");
ABSL_FLAG(bool, compare_adam, true, "Also run the job with plain Adam and compare.");
ABSL_FLAG(int, timeout_s, 900, "Give up on a job after this many seconds.");
ABSL_FLAG(bool, echo_all, true, "Print every process's output (else only worker 0's).");
ABSL_FLAG(std::string, bin_dir, "", "Where the onebit binaries are (default: runfiles).");

namespace onebit::launcher {
namespace {

using google::protobuf::Value;

volatile sig_atomic_t g_interrupted = 0;

// Paths given on the command line are relative to where `bazel run` was started.
std::string UserPath(const std::string& path) {
  const char* wd = std::getenv("BUILD_WORKING_DIRECTORY");
  if (path.empty() || path[0] == '/' || wd == nullptr) return path;
  return absl::StrCat(wd, "/", path);
}

std::string BinDir(const char* argv0) {
  if (!absl::GetFlag(FLAGS_bin_dir).empty()) return UserPath(absl::GetFlag(FLAGS_bin_dir));
  // Under `bazel run` the current directory is this binary's runfiles tree.
  if (const char* dir = std::getenv("RUNFILES_DIR")) return absl::StrCat(dir, "/onebit");
  return absl::StrCat(argv0, ".runfiles/onebit");
}

absl::StatusOr<Value> ParseJson(const std::string& text, const std::string& what) {
  Value v;
  const auto s = google::protobuf::util::JsonStringToMessage(text, &v);
  if (!s.ok()) return absl::InvalidArgumentError(absl::StrCat(what, ": ", s.message().as_string()));
  return v;
}

double Field(const Value& v, const std::string& key) {
  const auto& fields = v.struct_value().fields();
  auto it = fields.find(key);
  return it == fields.end() ? 0.0 : it->second.number_value();
}

std::string Str(const Value& v, const std::string& key) {
  const auto& fields = v.struct_value().fields();
  auto it = fields.find(key);
  return it == fields.end() ? "" : it->second.string_value();
}

struct JobResult {
  std::vector<Value> workers;  // each worker's summary file
  double seconds = 0;
};

class Job {
 public:
  Job(std::string bin_dir, std::string dir, const JobConfig& config, std::string config_path)
      : bin_(std::move(bin_dir)), dir_(std::move(dir)), config_(config),
        config_path_(std::move(config_path)) {}

  absl::StatusOr<JobResult> Run() {
    const absl::Time start = absl::Now();
    mkdir(dir_.c_str(), 0755);
    const bool echo = absl::GetFlag(FLAGS_echo_all);
    ONEBIT_ASSIGN_OR_RETURN(
        Process* coordinator,
        Spawn("coordinator", {bin_ + "/coordinator/onebit_coordinator", "--config=" + config_path_,
                              "--address_file=" + dir_ + "/coordinator.addr"}, echo));
    ONEBIT_ASSIGN_OR_RETURN(std::string addr_text,
                            WaitForFile(dir_ + "/coordinator.addr", absl::Seconds(30), coordinator));
    ONEBIT_ASSIGN_OR_RETURN(Value addr, ParseJson(addr_text, "coordinator.addr"));
    const std::string coordinator_addr = Str(addr, "grpc");
    std::printf("coordinator at %s (REST %s, metrics %s)\n", coordinator_addr.c_str(),
                Str(addr, "rest").c_str(), Str(addr, "metrics").c_str());

    if (config_.exchange.mode == "ps") {
      for (int s = 0; s < config_.exchange.servers; ++s) {
        const std::string file = absl::StrCat(dir_, "/server-", s, ".addr");
        ONEBIT_ASSIGN_OR_RETURN(
            Process* server,
            Spawn(absl::StrCat("server ", s),
                  {bin_ + "/server/onebit_server", "--config=" + config_path_,
                   "--coordinator=" + coordinator_addr, absl::StrCat("--shard=", s),
                   "--address_file=" + file},
                  echo));
        ONEBIT_RETURN_IF_ERROR(WaitForFile(file, absl::Seconds(30), server).status());
      }
    }
    std::vector<Process*> workers;
    for (int i = 0; i < config_.workers; ++i) {
      ONEBIT_ASSIGN_OR_RETURN(
          Process* worker,
          Spawn(absl::StrCat("worker ", i),
                {bin_ + "/worker/onebit_worker", "--config=" + config_path_,
                 "--coordinator=" + coordinator_addr,
                 absl::StrCat("--summary_file=", dir_, "/worker-", i, ".json")},
                echo || i == 0));
      workers.push_back(worker);
    }
    ONEBIT_RETURN_IF_ERROR(WaitAll(workers));
    JobResult result;
    for (int i = 0; i < config_.workers; ++i) {
      ONEBIT_ASSIGN_OR_RETURN(std::string text,
                              WaitForFile(absl::StrCat(dir_, "/worker-", i, ".json"), absl::Seconds(5)));
      ONEBIT_ASSIGN_OR_RETURN(Value v, ParseJson(text, absl::StrCat("worker-", i, ".json")));
      result.workers.push_back(v);
    }
    for (auto& p : processes_) p->Terminate();
    result.seconds = absl::ToDoubleSeconds(absl::Now() - start);
    return result;
  }

 private:
  absl::StatusOr<Process*> Spawn(const std::string& name, const std::vector<std::string>& argv,
                                 bool echo) {
    const std::string log = absl::StrCat(dir_, "/", name, ".log");
    ONEBIT_ASSIGN_OR_RETURN(std::unique_ptr<Process> p, Process::Start(name, argv, log, echo));
    processes_.push_back(std::move(p));
    return processes_.back().get();
  }

  // Waits for every worker to exit 0; stops at the first failure, or any other process
  // dying, or the timeout, or ^C.
  absl::Status WaitAll(const std::vector<Process*>& workers) {
    const absl::Time deadline = absl::Now() + absl::Seconds(absl::GetFlag(FLAGS_timeout_s));
    for (;;) {
      size_t done = 0;
      for (auto& p : processes_) {
        int code = 0;
        const bool is_worker = std::find(workers.begin(), workers.end(), p.get()) != workers.end();
        if (!p->Exited(&code)) continue;
        if (code != 0 || !is_worker) {
          return absl::AbortedError(absl::StrCat(p->name(), " exited with code ", code,
                                                 "; its log is in ", dir_, "/", p->name(), ".log"));
        }
        ++done;
      }
      if (done == workers.size()) return absl::OkStatus();
      if (g_interrupted) return absl::CancelledError("interrupted");
      if (absl::Now() > deadline) return absl::DeadlineExceededError("the job took too long");
      absl::SleepFor(absl::Milliseconds(50));
    }
  }

  std::string bin_, dir_;
  JobConfig config_;
  std::string config_path_;
  std::vector<std::unique_ptr<Process>> processes_;
};

std::string Bytes(double b) {
  if (b >= 1e9) return absl::StrFormat("%.2f GB", b / 1e9);
  if (b >= 1e6) return absl::StrFormat("%.2f MB", b / 1e6);
  if (b >= 1e3) return absl::StrFormat("%.1f kB", b / 1e3);
  return absl::StrFormat("%.0f B", b);
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
  std::printf("\n== Summary: %s, %d workers, %s exchange%s, %lld steps x %lld samples per worker\n",
              c.workload.type.c_str(), c.workers, c.exchange.mode.c_str(),
              c.exchange.mode == "ps" ? absl::StrCat(" over ", c.exchange.servers, " shards").c_str() : "",
              static_cast<long long>(c.steps), static_cast<long long>(c.micro_batch));
  std::printf("%-34s %-22s %s\n", "", "1-bit Adam", adam ? "Adam (fp32 exchange)" : "");
  auto row = [&](const char* name, const std::string& a, const std::string& b) {
    std::printf("%-34s %-22s %s\n", name, a.c_str(), adam ? b.c_str() : "");
  };
  auto pct = [](double x) { return absl::StrFormat("%.2f%%", 100 * x); };
  row("test accuracy (worker 0)", pct(Field(onebit.workers[0], "test_accuracy")),
      adam ? pct(Field(adam->workers[0], "test_accuracy")) : "");
  row("test loss", absl::StrFormat("%.4f", Field(onebit.workers[0], "test_loss")),
      adam ? absl::StrFormat("%.4f", Field(adam->workers[0], "test_loss")) : "");
  row("bytes sent per worker, total", Bytes(Mean(onebit, "bytes_sent_warmup") + Mean(onebit, "bytes_sent_compression")),
      adam ? Bytes(Mean(*adam, "bytes_sent_warmup") + Mean(*adam, "bytes_sent_compression")) : "");
  row("  warmup steps x bytes/step", PerStep(onebit, "warmup"), adam ? PerStep(*adam, "warmup") : "");
  row("  compression steps x bytes/step", PerStep(onebit, "compression"),
      adam ? PerStep(*adam, "compression") : "");
  row("bytes received per worker, total",
      Bytes(Mean(onebit, "bytes_received_warmup") + Mean(onebit, "bytes_received_compression")),
      adam ? Bytes(Mean(*adam, "bytes_received_warmup") + Mean(*adam, "bytes_received_compression")) : "");
  row("wall time of the job", absl::StrFormat("%.1f s", onebit.seconds),
      adam ? absl::StrFormat("%.1f s", adam->seconds) : "");

  const double warm = Mean(onebit, "warmup_steps"), comp = Mean(onebit, "compression_steps");
  if (warm > 0 && comp > 0) {
    const double fp32_step = Mean(onebit, "bytes_sent_warmup") / warm;
    const double onebit_step = Mean(onebit, "bytes_sent_compression") / comp;
    std::printf("\ncompression stage, bytes sent per worker per step (measured): %s\n", Bytes(onebit_step).c_str());
    std::printf("  vs the same exchange carrying fp32 (warmup steps, measured): %s, %.1fx fewer\n",
                Bytes(fp32_step).c_str(), fp32_step / onebit_step);
    std::printf("  vs fp16 (half the measured fp32; no fp16 exchange exists to measure): %.1fx fewer\n",
                fp32_step / 2 / onebit_step);
  }
  if (adam) {
    const double total_a = Mean(*adam, "bytes_sent_warmup") + Mean(*adam, "bytes_sent_compression");
    const double total_o = Mean(onebit, "bytes_sent_warmup") + Mean(onebit, "bytes_sent_compression");
    std::printf("whole run: Adam sends %.1fx the bytes of 1-bit Adam\n", total_a / total_o);
    const double diff = 100 * (Field(onebit.workers[0], "test_accuracy") - Field(adam->workers[0], "test_accuracy"));
    std::printf("accuracy: 1-bit Adam %+.2f points vs Adam at an equal number of samples (target: within 1)\n", diff);
  }
}

int Main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  signal(SIGINT, [](int) { g_interrupted = 1; });
  signal(SIGTERM, [](int) { g_interrupted = 1; });
  const std::string config_path = UserPath(absl::GetFlag(FLAGS_config));
  absl::StatusOr<JobConfig> config = LoadJobConfig(config_path);
  if (!config.ok()) {
    std::fprintf(stderr, "error: %s\n", std::string(config.status().message()).c_str());
    return 2;
  }
  const std::string out = UserPath(absl::GetFlag(FLAGS_out_dir));
  mkdir(out.c_str(), 0755);
  const std::string bin = BinDir(argv[0]);

  std::printf("== 1-bit Adam: %s\n", config_path.c_str());
  Job onebit_job(bin, out + "/onebit_adam", *config, config_path);
  absl::StatusOr<JobResult> onebit = onebit_job.Run();
  if (!onebit.ok()) {
    std::fprintf(stderr, "error: %s\n", std::string(onebit.status().message()).c_str());
    return 1;
  }
  std::unique_ptr<JobResult> adam;
  if (absl::GetFlag(FLAGS_compare_adam)) {
    JobConfig adam_config = *config;
    adam_config.optimizer.type = "Adam";
    const std::string adam_path = out + "/adam.json";
    std::ofstream(adam_path) << JobConfigToJson(adam_config);
    std::printf("\n== Adam, same job with a full-precision exchange: %s\n", adam_path.c_str());
    Job adam_job(bin, out + "/adam", adam_config, adam_path);
    absl::StatusOr<JobResult> r = adam_job.Run();
    if (!r.ok()) {
      std::fprintf(stderr, "error: %s\n", std::string(r.status().message()).c_str());
      return 1;
    }
    adam = std::make_unique<JobResult>(*std::move(r));
  }
  PrintSummary(*config, *onebit, adam.get());
  return 0;
}

}  // namespace
}  // namespace onebit::launcher

int main(int argc, char** argv) { return onebit::launcher::Main(argc, argv); }
