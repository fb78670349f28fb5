// onebit-coordinator-load: how wide one coordinator goes. Plays N
// simulated members, the workers of a peer job, against a real onebit-coordinator process
// over gRPC, each member on a connection of its own as separate processes would be, doing
// what onebit-worker does with the coordinator: register, a heartbeat session (one beat a
// second), step leases, a stats report every log_every steps and a checkpoint part report
// at every checkpoint step. It measures, over a window once every member runs:
//   - the latency of Lease, ReportStats and CommitPart calls as the members see them;
//   - heartbeat and Lease handling time inside the coordinator, from its
//     onebit_coordinator_heartbeat_seconds and _lease_seconds histograms (the bucket bounds
//     the percentile; a heartbeat has no answer to time);
//   - the coordinator process's CPU (utime + stime over the window) and memory (VmHWM);
//   - the generator's own CPU, and how late a thread of it wakes from a 1 ms sleep:
//     every member's thread shares the generator's CPUs, so a late wake-up there is counted
//     in the members' latencies although the coordinator answered in time.
// With --recovery, after the widest run's window a tenth of the members go silent (their
// sessions stop, as a killed process's do), return as new processes once the coordinator
// has noticed, and the tool times how long after the last of them returned the job runs.
//
//   bazel run //tools:onebit-coordinator-load -- --members=64,256,1024 --window_s=30 \
//       --recovery --out_dir=/tmp/load
//
// On a small machine, pin the two apart (--coordinator_cpus=0 --load_cpus=1): the
// coordinator's CPU is then what one core gives it, and the generator cannot steal it.
//
// Writes OUT_DIR/results.csv (one row per N), results.md and latency.png (gnuplot, when
// installed), and prints the same table; per width, OUT_DIR/nN/calls.csv (every call
// timed in the window: when it started, how long it took) and calls.png.
#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "checkpoint/manifest.h"
#include "common/signals.h"
#include "common/subprocess.h"
#include "coordinator/address_file.h"
#include "coordinator/coordinator_client.h"
#include "httplib.h"

ABSL_FLAG(std::string, members, "64,128,256,512,1024", "Widths to run, comma-separated.");
ABSL_FLAG(int, window_s, 30, "Seconds to measure once every member runs.");
ABSL_FLAG(int, step_ms, 1000, "Each simulated member's step time.");
ABSL_FLAG(int, log_every, 10, "A stats report every this many steps (onebit.log_every).");
ABSL_FLAG(int, checkpoint_every, 20, "A checkpoint part report every this many steps.");
ABSL_FLAG(bool, recovery, false,
          "After the widest window, silence a tenth of the members and time the recovery.");
ABSL_FLAG(std::string, coordinator, "",
          "onebit-coordinator binary; default: beside this one in the runfiles.");
ABSL_FLAG(std::string, coordinator_cpus, "",
          "CPUs the coordinator may run on (taskset -c syntax, e.g. 0); default: any.");
ABSL_FLAG(std::string, load_cpus, "",
          "CPUs this generator may run on (e.g. 1), so that it does not take the "
          "coordinator's; default: any.");
ABSL_FLAG(std::string, out_dir, "/tmp/onebit-coordinator-load", "Results and logs.");

namespace onebit {
namespace {

// Latencies in milliseconds, by call, and when each call started.
class Latencies {
 public:
  void Add(const std::string& call, absl::Time start, double ms) {
    absl::MutexLock lock(&mu_);
    calls_.push_back({call, start, ms});
  }
  // Every call as "call,seconds since `origin`,ms", in the order they ended.
  void WriteCsv(const std::string& path, absl::Time origin) {
    absl::MutexLock lock(&mu_);
    std::ofstream out(path);
    out << "call,t_s,ms\n";
    for (const Call& c : calls_) {
      out << c.call << "," << absl::StrFormat("%.4f", absl::ToDoubleSeconds(c.start - origin))
          << "," << absl::StrFormat("%.3f", c.ms) << "\n";
    }
  }
  // The q-quantile (0..1) of `call`'s latencies; -1 when there are none.
  double Quantile(const std::string& call, double q) {
    std::vector<double> v = Of(call);
    if (v.empty()) return -1;
    std::sort(v.begin(), v.end());
    return v[std::min(v.size() - 1, static_cast<size_t>(q * v.size()))];
  }
  size_t Count(const std::string& call) { return Of(call).size(); }

 private:
  struct Call {
    std::string call;
    absl::Time start;
    double ms;
  };
  std::vector<double> Of(const std::string& call) {
    absl::MutexLock lock(&mu_);
    std::vector<double> v;
    for (const Call& c : calls_) {
      if (c.call == call) v.push_back(c.ms);
    }
    return v;
  }
  absl::Mutex mu_;
  std::vector<Call> calls_ ABSL_GUARDED_BY(mu_);
};

// Times one call into `latencies` (when measuring) and returns its result.
template <typename F>
auto Timed(Latencies* latencies, const std::atomic<bool>& measuring, const std::string& call,
           F&& f) {
  const absl::Time start = absl::Now();
  auto result = f();
  if (measuring.load()) latencies->Add(call, start, absl::ToDoubleMilliseconds(absl::Now() - start));
  return result;
}

struct Shared {
  std::string address;
  std::string checkpoint_dir;  // where members put their parts, as real ones do
  Latencies latencies;
  std::atomic<bool> measuring{false};
  std::atomic<bool> stop{false};
  std::atomic<int> errors{0};
  absl::Mutex error_mu;
  std::string first_error ABSL_GUARDED_BY(error_mu);
  void Error(const std::string& what, const absl::Status& status) {
    if (errors.fetch_add(1) > 0) return;
    absl::MutexLock lock(&error_mu);
    first_error = absl::StrCat(what, ": ", status.ToString());
  }
};

// One simulated worker: a thread that steps every step_ms, as a process of the job would,
// and re-registers as a new process when its generation ends (a recovery) or when told it
// was killed and is back.
class Member {
 public:
  Member(Shared* shared, int rank, int step_ms, int log_every)
      : shared_(shared), rank_(rank), step_ms_(step_ms), log_every_(log_every) {}
  ~Member() { Join(); }

  void Start() { thread_ = std::thread([this] { Run(); }); }
  void Join() {
    if (thread_.joinable()) thread_.join();
  }
  // Silent from now on, as a killed process (its session ends without a goodbye).
  void Kill() { killed_ = true; }
  // Back as a new process.
  void Return() { killed_ = false; }
  bool registered() const { return registered_.load(); }

 private:
  absl::Status Register(int64_t* next_step) {
    GrpcClientOptions options;
    options.address = shared_->address;
    options.own_connection = true;
    options.retry_for = absl::Seconds(30);
    // As onebit-worker does with the job's 10 s heartbeat timeout: pings every 2.5 s.
    options.keepalive = absl::Milliseconds(2500);
    absl::StatusOr<std::unique_ptr<CoordinatorClient>> client = NewGrpcCoordinatorClient(options);
    if (!client.ok()) return client.status();
    client_ = *std::move(client);
    instance_ = absl::StrCat("load-", rank_, "-", ++incarnation_);
    v1::RegisterRequest request;
    request.set_role(v1::ROLE_WORKER);
    request.set_instance_id(instance_);
    request.set_requested_rank(rank_);
    request.set_address("127.0.0.1");
    absl::StatusOr<v1::RegisterResponse> reg =
        Timed(&shared_->latencies, shared_->measuring, "Register", [&] {
          return RegisterReplacing(*client_, request, absl::Seconds(60));
        });
    if (!reg.ok()) return reg.status();
    generation_ = reg->generation();
    *next_step = reg->has_resume() ? reg->resume().step() + 1 : 1;
    through_ = *next_step - 1;
    checkpoint_steps_.clear();
    SessionOptions session;
    session.rank = rank_;
    session.instance_id = instance_;
    session.heartbeat_interval = absl::Seconds(1);
    session.silence_limit = absl::Seconds(5);
    const int64_t generation = generation_;
    absl::StatusOr<std::unique_ptr<CoordinatorSession>> started = client_->StartSession(
        session, [this, generation](const v1::JobEvent& e) {
          if (e.job().generation() > generation) recover_ = true;
        });
    if (!started.ok()) return started.status();
    session_ = *std::move(started);
    recover_ = false;
    registered_ = true;
    return absl::OkStatus();
  }

  void Leave() {
    registered_ = false;
    if (session_) (void)session_->Stop();
    session_.reset();
    client_.reset();
  }

  void Run() {
    std::mt19937 rng(rank_);
    // Members do not step in lockstep: each starts at its own phase of the step.
    absl::SleepFor(absl::Milliseconds(std::uniform_int_distribution<int>(0, step_ms_)(rng)));
    int64_t step = 0;
    while (!shared_->stop.load()) {
      if (killed_.load()) {
        if (registered_.load()) Leave();
        absl::SleepFor(absl::Milliseconds(50));
        continue;
      }
      if (!registered_.load() || recover_.load()) {
        Leave();  // a recovery ends this process's generation: exit 75, restarted
        if (absl::Status joined = Register(&step); !joined.ok()) {
          shared_->Error(absl::StrCat("worker ", rank_, " registering"), joined);
          absl::SleepFor(absl::Milliseconds(500));
          continue;
        }
      }
      const absl::Time step_end = absl::Now() + absl::Milliseconds(step_ms_);
      const absl::Status s = Step(step);
      if (s.ok()) {
        ++step;
      } else if (absl::IsFailedPrecondition(s)) {
        recover_ = true;  // the coordinator no longer knows this generation: restart
      } else if (!shared_->stop.load()) {
        shared_->Error(absl::StrCat("worker ", rank_, " step ", step), s);
      }
      absl::SleepFor(step_end - absl::Now());
    }
    Leave();
  }

  absl::Status Step(int64_t step) {
    if (step > through_) {
      v1::LeaseRequest lease;
      lease.set_rank(rank_);
      lease.set_next_step(step);
      absl::StatusOr<v1::LeaseResponse> granted = Timed(
          &shared_->latencies, shared_->measuring, "Lease", [&] { return client_->Lease(lease); });
      if (!granted.ok()) return granted.status();
      if (granted->through_step() < step) return absl::OutOfRangeError("the job stops");
      through_ = granted->through_step();
      checkpoint_steps_.assign(granted->checkpoint_steps().begin(),
                               granted->checkpoint_steps().end());
    }
    session_->SetStep(step);
    if (step % log_every_ == 0) {
      v1::StatsReport stats;
      stats.set_rank(rank_);
      stats.set_step(step);
      stats.set_stage(v1::STAGE_WARMUP);
      stats.set_loss(1.0 / static_cast<double>(step));
      stats.set_variance_change(-1);
      stats.set_step_seconds(step_ms_ / 1000.0);
      absl::Status reported = Timed(&shared_->latencies, shared_->measuring, "ReportStats",
                                    [&] { return client_->ReportStats(stats).status(); });
      if (!reported.ok()) return reported;
    }
    if (std::find(checkpoint_steps_.begin(), checkpoint_steps_.end(), step) !=
        checkpoint_steps_.end()) {
      // The part itself, as a worker writes it before reporting it (4 KiB here): the
      // coordinator writes the manifest beside the parts.
      const std::string step_dir =
          absl::StrCat(shared_->checkpoint_dir, "/", checkpoint::StepDirName(step));
      std::filesystem::create_directories(step_dir);
      std::ofstream(absl::StrCat(step_dir, "/", checkpoint::PartFileName(v1::ROLE_WORKER, rank_)))
          << std::string(4096, '\0');
      v1::CommitPartRequest commit;
      commit.set_instance_id(instance_);
      commit.set_step(step);
      v1::CheckpointPart* part = commit.mutable_part();
      part->set_role(v1::ROLE_WORKER);
      part->set_rank(rank_);
      part->set_file(checkpoint::PartFileName(v1::ROLE_WORKER, rank_));
      part->set_bytes(4096);
      part->set_crc32(static_cast<uint32_t>(step * 7919 + rank_));
      absl::Status committed = Timed(&shared_->latencies, shared_->measuring, "CommitPart",
                                     [&] { return client_->CommitPart(commit).status(); });
      if (!committed.ok()) return committed;
    }
    return absl::OkStatus();
  }

  Shared* const shared_;
  const int rank_;
  const int step_ms_;
  const int log_every_;
  std::thread thread_;
  std::atomic<bool> killed_{false};
  std::atomic<bool> recover_{false};
  std::atomic<bool> registered_{false};
  // The member thread's own state.
  std::unique_ptr<CoordinatorClient> client_;
  std::unique_ptr<CoordinatorSession> session_;
  std::string instance_;
  int incarnation_ = 0;
  int64_t generation_ = 0;
  int64_t through_ = 0;
  std::vector<int64_t> checkpoint_steps_;
};

// The coordinator process's CPU seconds (utime + stime) and peak resident memory (MB).
struct ProcessUsage {
  double cpu_seconds = -1;
  double peak_rss_mb = -1;
};

ProcessUsage Usage(pid_t pid) {
  ProcessUsage usage;
  std::ifstream stat(absl::StrCat("/proc/", pid, "/stat"));
  std::string text((std::istreambuf_iterator<char>(stat)), {});
  // Fields after the command (which may hold spaces) follow its closing parenthesis.
  const size_t close = text.rfind(')');
  if (close != std::string::npos) {
    std::vector<std::string> fields = absl::StrSplit(text.substr(close + 2), ' ');
    double utime = 0, stime = 0;
    // utime and stime are fields 14 and 15 of the line: 12 and 13 after the command.
    if (fields.size() > 13 && absl::SimpleAtod(fields[11], &utime) &&
        absl::SimpleAtod(fields[12], &stime)) {
      usage.cpu_seconds = (utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
    }
  }
  std::ifstream status(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(status, line)) {
    double kb = 0;
    if (absl::StartsWith(line, "VmHWM:") &&
        absl::SimpleAtod(absl::StripAsciiWhitespace(absl::StripSuffix(line.substr(6), "kB")), &kb)) {
      usage.peak_rss_mb = kb / 1024.0;
    }
  }
  return usage;
}

// Bucket counts of a Prometheus histogram on /metrics: (upper bound, cumulative count).
std::vector<std::pair<double, double>> HistogramBuckets(const std::string& metrics_address,
                                                        const std::string& name) {
  std::vector<std::pair<double, double>> buckets;
  const size_t colon = metrics_address.rfind(':');
  httplib::Client client(metrics_address.substr(0, colon),
                         std::stoi(metrics_address.substr(colon + 1)));
  client.set_read_timeout(10, 0);
  httplib::Result result = client.Get("/metrics");
  if (!result || result->status != 200) return buckets;
  std::istringstream lines(result->body);
  std::string line;
  const std::string prefix = name + "_bucket{le=\"";
  while (std::getline(lines, line)) {
    if (!absl::StartsWith(line, prefix)) continue;
    const size_t end = line.find('"', prefix.size());
    const std::string le = line.substr(prefix.size(), end - prefix.size());
    double bound = 0, count = 0;
    if (le == "+Inf") {
      bound = INFINITY;
    } else if (!absl::SimpleAtod(le, &bound)) {
      continue;
    }
    if (!absl::SimpleAtod(line.substr(line.rfind(' ') + 1), &count)) continue;
    buckets.emplace_back(bound, count);
  }
  return buckets;
}

// The smallest bucket bound under which a fraction q of the observations since `before`
// fall (ms); -1 when none.
double HistogramQuantileMs(const std::vector<std::pair<double, double>>& before,
                           const std::vector<std::pair<double, double>>& after, double q) {
  if (after.empty() || before.size() != after.size()) return -1;
  const double total = after.back().second - before.back().second;
  if (total <= 0) return -1;
  for (size_t i = 0; i < after.size(); ++i) {
    if (after[i].second - before[i].second >= q * total) return after[i].first * 1000.0;
  }
  return -1;
}

// How late a thread of this generator wakes: it sleeps 1 ms at a time for the window, on
// the main thread (which has nothing else to do then). Each sleep's overshoot goes into
// `latencies` as the call "wake-up lag", so that calls.png shows it beside the calls.
void MeasureWakeLag(absl::Duration window, Latencies* latencies) {
  const absl::Time end = absl::Now() + window;
  while (absl::Now() < end) {
    const absl::Time before = absl::Now();
    absl::SleepFor(absl::Milliseconds(1));
    latencies->Add("wake-up lag", before, absl::ToDoubleMilliseconds(absl::Now() - before) - 1.0);
  }
}

struct Coordinator {
  std::unique_ptr<Process> process;
  CoordinatorAddresses addresses;
};

absl::StatusOr<Coordinator> StartCoordinator(const std::string& binary, const std::string& dir,
                                             int members, int log_every, int checkpoint_every) {
  const std::string config = absl::StrCat(dir, "/job.json");
  std::filesystem::create_directories(absl::StrCat(dir, "/ckpt"));
  std::ofstream(config) << absl::StrFormat(
      R"({"steps": 1000000000, "optimizer": {"type": "OneBitAdam", "params": {"freeze_step": 100000}},
 "onebit": {"workers": %d, "exchange": {"mode": "peer"}, "lease_steps": 10, "log_every": %d,
            "workload": {"type": "synthetic", "parameters": 1000},
            "checkpoint": {"dir": "%s/ckpt", "every_steps": %d, "keep": 2},
            "failure": {"heartbeat_timeout_s": 10, "rejoin_timeout_s": 300, "max_restarts": 100}}})",
      members, log_every, dir, checkpoint_every);
  const std::string address_file = absl::StrCat(dir, "/coordinator.json");
  ProcessOptions options;
  options.argv = {binary,           absl::StrCat("--config=", config), "--port=0",
                  "--rest_port=0",  "--metrics_port=0",
                  absl::StrCat("--address_file=", address_file)};
  if (const std::string cpus = absl::GetFlag(FLAGS_coordinator_cpus); !cpus.empty()) {
    options.argv.insert(options.argv.begin(), {"/usr/bin/taskset", "-c", cpus});
  }
  options.name = "coordinator";
  options.log_path = absl::StrCat(dir, "/coordinator.log");
  Coordinator c;
  absl::StatusOr<std::unique_ptr<Process>> process = Process::Start(options);
  if (!process.ok()) return process.status();
  c.process = *std::move(process);
  const absl::Time give_up = absl::Now() + absl::Seconds(30);
  while (true) {
    absl::StatusOr<CoordinatorAddresses> read = ReadAddressFile(address_file);
    if (read.ok()) {
      c.addresses = *read;
      return c;
    }
    if (c.process->Exited(nullptr) || absl::Now() > give_up) {
      return absl::UnavailableError(absl::StrCat("the coordinator did not start; its log is ",
                                                 options.log_path));
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
}

absl::StatusOr<v1::JobStatus> GetJob(const std::string& address) {
  GrpcClientOptions options;
  options.address = address;
  absl::StatusOr<std::unique_ptr<CoordinatorClient>> client = NewGrpcCoordinatorClient(options);
  if (!client.ok()) return client.status();
  return (*client)->GetJob({});
}

// Waits until the job is RUNNING in a generation >= `generation`; the time it took.
absl::StatusOr<absl::Duration> AwaitRunning(const std::string& address, int64_t generation,
                                            absl::Duration timeout) {
  const absl::Time start = absl::Now();
  while (absl::Now() - start < timeout) {
    absl::StatusOr<v1::JobStatus> job = GetJob(address);
    if (job.ok() && job->state() == v1::JOB_STATE_RUNNING && job->generation() >= generation) {
      return absl::Now() - start;
    }
    if (job.ok() && job->state() == v1::JOB_STATE_FAILED) {
      return absl::AbortedError(absl::StrCat("the job failed: ", job->failure_reason()));
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  return absl::DeadlineExceededError("the job is not running");
}

struct Row {
  int members = 0;
  double register_s = 0;  // until every member registered and the job ran
  std::map<std::string, std::pair<double, double>> p50_p99;  // call -> ms
  std::map<std::string, size_t> calls;
  double heartbeat_p50 = -1, heartbeat_p99 = -1;  // bucket bounds, ms
  double lease_in_p50 = -1, lease_in_p99 = -1;    // inside the coordinator: bucket bounds, ms
  double load_cpu_cores = -1;                      // this generator's
  double wake_lag_p999 = -1, wake_lag_max = -1;    // ms, of a 1 ms sleep on the generator
  double cpu_cores = -1, peak_rss_mb = -1;
  int errors = 0;
  std::string recovery;  // --recovery at this width: what happened
};

// DIR/calls.png: each call's latency against its start in the window (gnuplot, when
// installed), where a pause shows as a column of slow calls across every kind.
void PlotCalls(const std::string& dir, int n) {
  if (std::system("command -v gnuplot > /dev/null") != 0) return;
  const std::string plot = absl::StrCat(
      "set terminal pngcairo size 1000,520; set output '", dir, "/calls.png'; ",
      "set datafile separator ','; set logscale y; set grid; set key top left; ",
      "set xlabel 'seconds into the window'; set ylabel 'latency as the member saw it (ms)'; ",
      "set title 'Every call of ", n, " members'; ",
      "plot for [c in 'Lease ReportStats CommitPart'] '", dir,
      "/calls.csv' using 2:(strcol(1) eq c ? $3 : 1/0) with points pt 7 ps 0.3 title c, '", dir,
      "/calls.csv' using 2:(strcol(1) eq 'wake-up lag' && $3 > 0.1 ? $3 : 1/0) with points pt 1 "
      "ps 0.6 lc rgb 'black' title 'the generator waking late from 1 ms (over 0.1 ms)'");
  std::ofstream(dir + "/calls.gp") << plot << "\n";
  if (std::system(absl::StrCat("gnuplot '", dir, "/calls.gp' 2> /dev/null").c_str()) != 0) {
    std::fprintf(stderr, "gnuplot failed on %s/calls.gp\n", dir.c_str());
  }
}

absl::StatusOr<Row> RunWidth(const std::string& binary, const std::string& dir, int n,
                             bool recovery) {
  std::printf("== %d members\n", n);
  std::fflush(stdout);
  const int step_ms = absl::GetFlag(FLAGS_step_ms);
  const int log_every = absl::GetFlag(FLAGS_log_every);
  absl::StatusOr<Coordinator> c =
      StartCoordinator(binary, dir, n, log_every, absl::GetFlag(FLAGS_checkpoint_every));
  if (!c.ok()) return c.status();
  Shared shared;
  shared.address = c->addresses.grpc;
  shared.checkpoint_dir = absl::StrCat(dir, "/ckpt");
  std::vector<std::unique_ptr<Member>> members;
  const absl::Time start = absl::Now();
  for (int i = 0; i < n; ++i) {
    members.push_back(std::make_unique<Member>(&shared, i, step_ms, log_every));
    members.back()->Start();
  }
  Row row;
  row.members = n;
  absl::StatusOr<absl::Duration> up = AwaitRunning(shared.address, 1, absl::Seconds(300));
  if (!up.ok()) {
    shared.stop = true;
    return up.status();
  }
  row.register_s = absl::ToDoubleSeconds(absl::Now() - start);
  std::printf("   every member registered after %.1f s; measuring for %d s\n", row.register_s,
              absl::GetFlag(FLAGS_window_s));
  std::fflush(stdout);
  absl::SleepFor(absl::Seconds(3));  // past the first leases
  const std::string heartbeat = "onebit_coordinator_heartbeat_seconds";
  const std::string lease = "onebit_coordinator_lease_seconds";
  const auto hb_before = HistogramBuckets(c->addresses.metrics, heartbeat);
  const auto lease_before = HistogramBuckets(c->addresses.metrics, lease);
  const ProcessUsage usage_before = Usage(c->process->pid());
  const ProcessUsage load_before = Usage(getpid());
  const absl::Time window_start = absl::Now();
  shared.measuring = true;
  MeasureWakeLag(absl::Seconds(absl::GetFlag(FLAGS_window_s)), &shared.latencies);
  shared.measuring = false;
  const double window = absl::ToDoubleSeconds(absl::Now() - window_start);
  const ProcessUsage usage_after = Usage(c->process->pid());
  const ProcessUsage load_after = Usage(getpid());
  const auto hb_after = HistogramBuckets(c->addresses.metrics, heartbeat);
  const auto lease_after = HistogramBuckets(c->addresses.metrics, lease);
  row.cpu_cores = (usage_after.cpu_seconds - usage_before.cpu_seconds) / window;
  row.load_cpu_cores = (load_after.cpu_seconds - load_before.cpu_seconds) / window;
  row.wake_lag_p999 = shared.latencies.Quantile("wake-up lag", 0.999);
  row.wake_lag_max = shared.latencies.Quantile("wake-up lag", 1.0);
  row.peak_rss_mb = usage_after.peak_rss_mb;
  row.heartbeat_p50 = HistogramQuantileMs(hb_before, hb_after, 0.50);
  row.heartbeat_p99 = HistogramQuantileMs(hb_before, hb_after, 0.99);
  row.lease_in_p50 = HistogramQuantileMs(lease_before, lease_after, 0.50);
  row.lease_in_p99 = HistogramQuantileMs(lease_before, lease_after, 0.99);
  for (const std::string call : {"Lease", "ReportStats", "CommitPart"}) {
    row.p50_p99[call] = {shared.latencies.Quantile(call, 0.50), shared.latencies.Quantile(call, 0.99)};
    row.calls[call] = shared.latencies.Count(call);
  }
  shared.latencies.WriteCsv(absl::StrCat(dir, "/calls.csv"), window_start);
  PlotCalls(dir, n);

  if (recovery) {
    // A tenth of the members die; once the coordinator has started the recovery they come
    // back as new processes (the others restart on the job's word, as exit 75 asks).
    const int victims = std::max(1, n / 10);
    absl::StatusOr<v1::JobStatus> before = GetJob(shared.address);
    const int64_t generation = before.ok() ? before->generation() : 1;
    for (int i = 0; i < victims; ++i) members[(i * 10 + 3) % n]->Kill();
    const absl::Time killed = absl::Now();
    absl::Time noticed = absl::InfiniteFuture();
    while (absl::Now() - killed < absl::Seconds(60)) {
      absl::StatusOr<v1::JobStatus> job = GetJob(shared.address);
      if (job.ok() && job->generation() > generation) {
        noticed = absl::Now();
        break;
      }
      absl::SleepFor(absl::Milliseconds(50));
    }
    for (int i = 0; i < victims; ++i) members[(i * 10 + 3) % n]->Return();
    // The last of them registered again: the members' return.
    while (absl::Now() - killed < absl::Seconds(120)) {
      bool all = true;
      for (int i = 0; i < victims; ++i) all = all && members[(i * 10 + 3) % n]->registered();
      if (all) break;
      absl::SleepFor(absl::Milliseconds(10));
    }
    const absl::Time returned = absl::Now();
    absl::StatusOr<absl::Duration> running =
        AwaitRunning(shared.address, generation + 1, absl::Seconds(120));
    row.recovery = absl::StrFormat(
        "%d of %d silenced: noticed after %.1f s; RUNNING %s after the last returned", victims,
        n, absl::ToDoubleSeconds(noticed - killed),
        running.ok() ? absl::StrFormat("%.2f s", absl::ToDoubleSeconds(*running))
                     : std::string(running.status().message()));
    (void)returned;
    std::printf("   recovery: %s\n", row.recovery.c_str());
  }
  shared.stop = true;
  for (auto& m : members) m->Join();
  row.errors = shared.errors.load();
  if (row.errors > 0) {
    absl::MutexLock lock(&shared.error_mu);
    std::printf("   %d member errors; the first: %s\n", row.errors, shared.first_error.c_str());
  }
  c->process->Terminate(absl::Seconds(5));
  return row;
}

std::string Ms(double ms) { return ms < 0 ? "-" : absl::StrFormat("%.2f", ms); }

}  // namespace
}  // namespace onebit

int main(int argc, char** argv) {
  onebit::IgnoreSigpipe();
  absl::ParseCommandLine(argc, argv);
  using namespace onebit;  // NOLINT: a main
  std::string binary = absl::GetFlag(FLAGS_coordinator);
  if (binary.empty()) binary = absl::StrCat(argv[0], ".runfiles/onebit/coordinator/onebit-coordinator");
  if (const std::string cpus = absl::GetFlag(FLAGS_load_cpus); !cpus.empty()) {
    // Before any thread starts: they inherit the mask.
    cpu_set_t set;
    CPU_ZERO(&set);
    for (absl::string_view part : absl::StrSplit(cpus, ',')) {
      std::pair<std::string, std::string> range = absl::StrSplit(part, absl::MaxSplits('-', 1));
      int first = 0, last = 0;
      if (range.second.empty()) range.second = range.first;
      if (!absl::SimpleAtoi(range.first, &first) || !absl::SimpleAtoi(range.second, &last) ||
          first < 0 || last < first || last >= CPU_SETSIZE) {
        std::fprintf(stderr, "--load_cpus: '%s' is not a CPU list such as 1 or 1-3\n",
                     cpus.c_str());
        return 2;
      }
      for (int cpu = first; cpu <= last; ++cpu) CPU_SET(cpu, &set);
    }
    if (sched_setaffinity(0, sizeof(set), &set) != 0) {
      std::fprintf(stderr, "--load_cpus=%s: %s\n", cpus.c_str(), std::strerror(errno));
      return 2;
    }
  }
  const std::string out = absl::GetFlag(FLAGS_out_dir);
  std::vector<int> widths;
  for (absl::string_view w : absl::StrSplit(absl::GetFlag(FLAGS_members), ',')) {
    int n = 0;
    if (!absl::SimpleAtoi(w, &n) || n < 1) {
      std::fprintf(stderr, "--members: '%s' is not a positive count\n", std::string(w).c_str());
      return 2;
    }
    widths.push_back(n);
  }
  std::vector<Row> rows;
  for (size_t i = 0; i < widths.size(); ++i) {
    const std::string dir = absl::StrCat(out, "/n", widths[i]);
    // A fresh job each time: an earlier run's state file would make this a restart.
    std::error_code ignored;
    std::filesystem::remove_all(dir, ignored);
    std::filesystem::create_directories(dir);
    const bool recovery = absl::GetFlag(FLAGS_recovery) && i + 1 == widths.size();
    absl::StatusOr<Row> row = RunWidth(binary, dir, widths[i], recovery);
    if (!row.ok()) {
      std::fprintf(stderr, "%d members: %s\n", widths[i], row.status().ToString().c_str());
      return 1;
    }
    rows.push_back(*row);
  }
  std::ofstream csv(out + "/results.csv");
  csv << "members,register_s,lease_p50_ms,lease_p99_ms,stats_p50_ms,stats_p99_ms,commit_p50_ms,"
         "commit_p99_ms,heartbeat_p50_ms,heartbeat_p99_ms,cpu_cores,peak_rss_mb,errors,"
         "lease_in_p50_ms,lease_in_p99_ms,load_cpu_cores,wake_lag_p999_ms,wake_lag_max_ms\n";
  std::string md =
      "| members | all registered | Lease p50 / p99 (ms) | ReportStats p50 / p99 | CommitPart p50 / "
      "p99 | heartbeat p50 / p99 (bucket, ms) | coordinator CPU (cores) | peak RSS (MB) | "
      "errors | Lease inside the coordinator p50 / p99 (bucket, ms) | generator CPU (cores) | "
      "generator wake-up lag p99.9 / max (ms) |\n|---:|---:|---|---|---|---|---:|---:|---:|---|---:|---|\n";
  for (const Row& r : rows) {
    const auto& l = r.p50_p99.at("Lease");
    const auto& s = r.p50_p99.at("ReportStats");
    const auto& k = r.p50_p99.at("CommitPart");
    csv << absl::StrJoin(std::vector<std::string>{absl::StrCat(r.members),
                                                  absl::StrFormat("%.2f", r.register_s), Ms(l.first),
                                                  Ms(l.second), Ms(s.first), Ms(s.second),
                                                  Ms(k.first), Ms(k.second), Ms(r.heartbeat_p50),
                                                  Ms(r.heartbeat_p99),
                                                  absl::StrFormat("%.3f", r.cpu_cores),
                                                  absl::StrFormat("%.1f", r.peak_rss_mb),
                                                  absl::StrCat(r.errors), Ms(r.lease_in_p50),
                                                  Ms(r.lease_in_p99),
                                                  absl::StrFormat("%.3f", r.load_cpu_cores),
                                                  Ms(r.wake_lag_p999), Ms(r.wake_lag_max)},
                         ",")
        << "\n";
    absl::StrAppend(&md, absl::StrFormat("| %d | %.1f s | %s / %s | %s / %s | %s / %s | %s / %s | "
                                         "%.3f | %.1f | %d | %s / %s | %.3f | %s / %s |\n",
                                         r.members, r.register_s, Ms(l.first), Ms(l.second),
                                         Ms(s.first), Ms(s.second), Ms(k.first), Ms(k.second),
                                         Ms(r.heartbeat_p50), Ms(r.heartbeat_p99), r.cpu_cores,
                                         r.peak_rss_mb, r.errors, Ms(r.lease_in_p50),
                                         Ms(r.lease_in_p99), r.load_cpu_cores,
                                         Ms(r.wake_lag_p999), Ms(r.wake_lag_max)));
    if (!r.recovery.empty()) absl::StrAppend(&md, "\nRecovery at ", r.members, ": ", r.recovery, "\n");
  }
  csv.close();
  std::ofstream(out + "/results.md") << md;
  std::printf("\n%s", md.c_str());
  // The plot: p99 latencies against the width (log-log).
  const std::string plot = absl::StrCat(
      "set terminal pngcairo size 900,560; set output '", out, "/latency.png'; ",
      "set datafile separator ','; set logscale xy; set key top left; set grid; ",
      "set xlabel 'members'; set ylabel 'p99 latency (ms)'; ",
      "set title 'One coordinator against N simulated members (p99)'; ",
      "plot '", out, "/results.csv' every ::1 using 1:4 with linespoints title 'Lease', ",
      "'' every ::1 using 1:6 with linespoints title 'ReportStats', ",
      "'' every ::1 using 1:8 with linespoints title 'CommitPart', ",
      "'' every ::1 using 1:10 with linespoints title 'heartbeat (bucket bound)', ",
      "10 with lines dashtype 2 title 'target 10 ms'");
  if (std::system("command -v gnuplot > /dev/null") == 0) {
    std::ofstream(out + "/latency.gp") << plot << "\n";
    if (std::system(absl::StrCat("gnuplot '", out, "/latency.gp'").c_str()) != 0) {
      std::fprintf(stderr, "gnuplot failed; the table is in %s/results.md\n", out.c_str());
    }
  }
  return 0;
}
