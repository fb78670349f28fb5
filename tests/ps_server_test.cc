// The real onebit-server binary, as separate processes, driven by PsExchange from this
// process: ps mode with S == W shard processes gives the parameters of peer mode bit for bit,
// /metrics tells the truth about steps and bytes, SIGTERM ends a shard cleanly, and a shard
// that is killed or stopped mid-run makes the workers fail with UNAVAILABLE promptly
// instead of hanging.
#include <dirent.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <random>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/subprocess.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "tests/test_paths.h"
#include "kernels/kernels.h"
#include "compression/layout.h"
#include "worker/transport/local_group.h"
#include "worker/optim/onebit_adam.h"
#include "worker/exchange/peer_exchange.h"
#include "worker/exchange/ps_exchange.h"

namespace onebit {
namespace {

using ::testing::HasSubstr;

using testing_paths::Env;

std::string ServerBinary() {
  return testing_paths::Runfile("server/onebit-server");
}

std::string TempPath(const std::string& name) {
  static int counter = 0;
  return absl::StrCat(Env("TEST_TMPDIR", "/tmp"), "/", name, "_", getpid(), "_", counter++);
}

// Starts `argv` with its output in this test's; null (and a failure) if it cannot start.
std::unique_ptr<Process> StartChild(const std::vector<std::string>& argv) {
  ProcessOptions options;
  options.argv = argv;
  absl::StatusOr<std::unique_ptr<Process>> process = Process::Start(options);
  EXPECT_TRUE(process.ok()) << process.status();
  return process.ok() ? *std::move(process) : nullptr;
}

bool AllThreadsStopped(pid_t pid) {
  DIR* dir = opendir(absl::StrCat("/proc/", pid, "/task").c_str());
  if (dir == nullptr) return false;
  bool stopped = true;
  int threads = 0;
  while (dirent* entry = readdir(dir)) {
    if (entry->d_name[0] == '.') continue;
    ++threads;
    std::ifstream stat(absl::StrCat("/proc/", pid, "/task/", entry->d_name, "/stat"));
    std::string line;
    std::getline(stat, line);
    // "pid (comm) S ...": the state follows the last ')'.
    const size_t paren = line.rfind(')');
    if (paren == std::string::npos || paren + 2 >= line.size() || line[paren + 2] != 'T') {
      stopped = false;
    }
  }
  closedir(dir);
  return stopped && threads > 0;
}

// SIGSTOP, then waits until every thread of the child is stopped (kill() returns before
// the signal has taken effect).
bool StopAndWait(Process& child) {
  child.Signal(SIGSTOP);
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (absl::Now() < deadline) {
    if (AllThreadsStopped(child.pid())) return true;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return false;
}

struct ShardProcess {
  std::unique_ptr<Process> child;  // terminated when this goes out of scope
  std::string grpc, metrics, address_file;
};

// Starts shard `s` and waits for its address file.
ShardProcess StartShard(int s, int shards, int workers, size_t n,
                        const Codec* compressor = &OnebitCodec()) {
  ShardProcess shard;
  shard.address_file = TempPath(absl::StrCat("shard", s, ".json"));
  shard.child = StartChild(
      {ServerBinary(), absl::StrCat("--shard=", s), absl::StrCat("--shards=", shards),
       absl::StrCat("--workers=", workers), absl::StrCat("--n=", n), "--port=0",
       "--metrics_port=0", absl::StrCat("--address_file=", shard.address_file),
       absl::StrCat("--compressor=", std::string(compressor->name()))});
  if (shard.child == nullptr) return shard;
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (absl::Now() < deadline) {
    std::ifstream in(shard.address_file);
    if (in) {
      std::stringstream text;
      text << in.rdbuf();
      const std::string json = text.str();
      std::smatch grpc, metrics;
      const std::regex grpc_re("\"grpc\": \"([^\"]+)\""), metrics_re("\"metrics\": \"([^\"]+)\"");
      // The file appears whole (rename), so a partial read means a bug, not a race.
      EXPECT_TRUE(std::regex_search(json, grpc, grpc_re)) << json;
      EXPECT_TRUE(std::regex_search(json, metrics, metrics_re)) << json;
      shard.grpc = grpc[1];
      shard.metrics = metrics[1];
      return shard;
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  ADD_FAILURE() << "no address file from shard " << s;
  return shard;
}

// What an atomic write of `path` may leave behind: "<path>.tmp.*" in its directory.
std::vector<std::string> TemporaryFilesOf(const std::string& path) {
  const size_t slash = path.rfind('/');
  const std::string dir = path.substr(0, slash);
  const std::string prefix = path.substr(slash + 1) + ".tmp";
  std::vector<std::string> found;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) {
      if (std::string(e->d_name).rfind(prefix, 0) == 0) found.push_back(e->d_name);
    }
    closedir(d);
  }
  return found;
}

// GET http://address/metrics.
httplib::Result Scrape(const std::string& address) {
  httplib::Client client("http://" + address);
  client.set_read_timeout(10, 0);
  return client.Get("/metrics");
}

// The value of the sample `series` (name with labels, as exposed) in a scrape.
double Sample(const std::string& scrape, const std::string& series) {
  std::istringstream lines(scrape);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.compare(0, series.size() + 1, series + " ") == 0) {
      double v = 0;
      if (absl::SimpleAtod(line.substr(series.size() + 1), &v)) return v;
    }
  }
  return -1;
}

std::vector<float> Random(uint32_t seed, size_t n, float mean, float stddev) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(mean, stddev);
  std::vector<float> x(n);
  for (float& v : x) v = dist(rng);
  return x;
}

std::vector<float> Grad(int rank, int64_t step, size_t n) {
  return Random(static_cast<uint32_t>(7919 * step + rank), n, 0.05f * rank, 1.0f + 0.5f * rank);
}

OnebitAdamOptions Options(int64_t freeze_step) {
  OnebitAdamOptions options;
  options.hyper.lr = 1e-2f;
  options.freeze_step = freeze_step;
  return options;
}

// One worker over PsExchange for `steps` steps; returns the final parameters. Failures are
// returned, with the time the failing step took in *failed_after.
absl::StatusOr<std::vector<float>> RunPsWorker(
    int rank, int workers, size_t n, int steps, int64_t freeze_step,
    const std::vector<std::string>& addresses, const PsExchangeOptions& exchange_options,
    uint64_t* bytes_sent = nullptr, absl::Duration* failed_after = nullptr,
    const std::function<void(int64_t)>& before_step = {}) {
  auto backend = kernels::NewCpuBackend();
  auto exchange = PsExchange::Create(backend.get(), rank, workers, n, addresses, exchange_options);
  if (!exchange.ok()) return exchange.status();
  const std::vector<float> p0 = Random(1, n, 0.0f, 1.0f);
  auto adam =
      OnebitAdam::Create(Options(freeze_step), backend.get(), exchange->get(), p0.data(), n);
  if (!adam.ok()) return adam.status();
  for (int64_t step = 1; step <= steps; ++step) {
    if (before_step) before_step(step);
    const std::vector<float> g = Grad(rank, step, n);
    const absl::Time start = absl::Now();
    if (absl::Status s = (*adam)->Step(g.data()); !s.ok()) {
      if (failed_after != nullptr) *failed_after = absl::Now() - start;
      return s;
    }
  }
  if (bytes_sent != nullptr) *bytes_sent = (*exchange)->bytes_sent();
  return (*adam)->ParamsToHost();
}

// Both compressors (job config exchange.compressor): the shards learn theirs from a flag.
class PsServerCompressorTest : public ::testing::TestWithParam<const Codec*> {};

TEST_P(PsServerCompressorTest, ShardProcessesGiveThePeerResultAndHonestMetrics) {
  const Codec* compressor = GetParam();
  constexpr int kW = 2;
  constexpr size_t kN = 10007;
  constexpr int kSteps = 12;
  constexpr int64_t kFreeze = 5;
  std::vector<ShardProcess> shards;
  std::vector<std::string> addresses;
  for (int s = 0; s < kW; ++s) {
    shards.push_back(StartShard(s, kW, kW, kN, compressor));
    ASSERT_FALSE(shards.back().grpc.empty());
    addresses.push_back(shards.back().grpc);
  }

  std::vector<std::vector<float>> ps(kW);
  std::vector<uint64_t> sent(kW);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < kW; ++rank) {
    threads.emplace_back([&, rank] {
      PsExchangeOptions options;
      options.codec = compressor;
      auto params = RunPsWorker(rank, kW, kN, kSteps, kFreeze, addresses, options, &sent[rank]);
      ASSERT_TRUE(params.ok()) << params.status();
      ps[rank] = *params;
    });
  }
  for (auto& t : threads) t.join();

  std::vector<std::vector<float>> peer(kW);
  ASSERT_TRUE(RunLocalGroup(TransportKind::kInproc, kW, [&](Transport& transport) -> absl::Status {
                auto backend = kernels::NewCpuBackend();
                const std::vector<float> p0 = Random(1, kN, 0.0f, 1.0f);
                auto exchange = PeerExchange::Create(backend.get(), &transport, kN,
                                                     ExactAllreduceOptions(), *compressor);
                if (!exchange.ok()) return exchange.status();
                auto adam = OnebitAdam::Create(Options(kFreeze), backend.get(), exchange->get(),
                                               p0.data(), kN);
                if (!adam.ok()) return adam.status();
                for (int64_t step = 1; step <= kSteps; ++step) {
                  const std::vector<float> g = Grad(transport.rank(), step, kN);
                  if (absl::Status s = (*adam)->Step(g.data()); !s.ok()) return s;
                }
                peer[transport.rank()] = *(*adam)->ParamsToHost();
                return absl::OkStatus();
              }).ok());
  for (int rank = 0; rank < kW; ++rank) {
    ASSERT_EQ(ps[rank].size(), kN);
    EXPECT_EQ(std::memcmp(ps[rank].data(), peer[rank].data(), kN * sizeof(float)), 0)
        << "rank " << rank;
  }

  const auto layout = *PsLayout::Create(kN, kW, *compressor);
  uint64_t total_sent = 0;
  for (int s = 0; s < kW; ++s) {
    SCOPED_TRACE(testing::Message() << "shard " << s);
    const httplib::Result response = Scrape(shards[s].metrics);
    ASSERT_TRUE(response) << httplib::to_string(response.error());
    EXPECT_EQ(response->status, 200);
    const std::string& scrape = response->body;
    EXPECT_EQ(Sample(scrape, "onebit_server_steps_total{kind=\"fp32\"}"), kFreeze);
    EXPECT_EQ(Sample(scrape, "onebit_server_steps_total{kind=\"onebit\"}"), kSteps - kFreeze);
    EXPECT_EQ(Sample(scrape, "onebit_server_step"), kSteps);
    EXPECT_GT(Sample(scrape, "onebit_server_error_norm"), 0.0);
    EXPECT_EQ(Sample(scrape, "onebit_server_step_seconds_count"), kSteps);
    EXPECT_EQ(Sample(scrape, "onebit_server_rejected_pushes_total{reason=\"wrong_size\"}"), 0);
    const double per_worker =
        kFreeze * layout.fp32_count(s) * 4.0 + (kSteps - kFreeze) * layout.block_bytes();
    EXPECT_EQ(Sample(scrape, "onebit_server_bytes_received_total"), kW * per_worker);
    EXPECT_EQ(Sample(scrape, "onebit_server_bytes_sent_total"), kW * per_worker);
    total_sent += static_cast<uint64_t>(per_worker);
  }
  for (int rank = 0; rank < kW; ++rank) EXPECT_EQ(sent[rank], total_sent);

  for (auto& shard : shards) shard.child->Signal(SIGTERM);
  for (auto& shard : shards) {
    const absl::StatusOr<int> code = shard.child->Wait(absl::Seconds(10));
    ASSERT_TRUE(code.ok()) << "no exit after SIGTERM";
    EXPECT_EQ(*code, 0);
    EXPECT_THAT(TemporaryFilesOf(shard.address_file), testing::IsEmpty());
  }
}

// Every registered codec: peer mode is the reference, no model needed.
INSTANTIATE_TEST_SUITE_P(Compressors, PsServerCompressorTest, ::testing::ValuesIn(AllCodecs()),
                         [](const ::testing::TestParamInfo<const Codec*>& info) {
                           return std::string(info.param->name());
                         });

// A worker whose compressor differs from the shard's gets a clear rejection naming the
// mismatch at the first compressed step, not garbage.
TEST(PsServerTest, AWorkerWithAnotherCompressorIsRejectedByName) {
  constexpr size_t kN = 1000;
  ShardProcess shard = StartShard(0, 1, 1, kN, &OnebitCodec());
  ASSERT_FALSE(shard.grpc.empty());
  PsExchangeOptions options;
  options.codec = &Int8Codec();
  auto backend = kernels::NewCpuBackend();
  auto exchange = PsExchange::Create(backend.get(), 0, 1, kN, {shard.grpc}, options);
  ASSERT_TRUE(exchange.ok()) << exchange.status();
  const std::vector<float> m = Random(3, kN, 0.0f, 1.0f);
  auto r = (*exchange)->AverageMomentum(1, m.data(), nullptr, 0.0f);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("block size of compressor int8, but this shard's job compresses with onebit"));
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("onebit.exchange.compressor"));
}

// A shard killed between steps: the next step fails with UNAVAILABLE within seconds on
// every worker, although the step deadline is a minute.
TEST(PsServerTest, AKilledShardMakesTheNextStepUnavailableQuickly) {
  constexpr int kW = 2;
  constexpr size_t kN = 1000;
  std::vector<ShardProcess> shards;
  std::vector<std::string> addresses;
  for (int s = 0; s < kW; ++s) {
    shards.push_back(StartShard(s, kW, kW, kN));
    ASSERT_FALSE(shards.back().grpc.empty());
    addresses.push_back(shards.back().grpc);
  }
  PsExchangeOptions options;
  options.step_deadline = absl::Seconds(60);
  options.retry_backoff = absl::Milliseconds(50);
  std::atomic<int> ready{0};
  std::atomic<bool> killed{false};
  std::vector<absl::Status> results(kW);
  std::vector<absl::Duration> failed_after(kW, absl::InfiniteDuration());
  std::vector<std::thread> threads;
  for (int rank = 0; rank < kW; ++rank) {
    threads.emplace_back([&, rank] {
      results[rank] =
          RunPsWorker(rank, kW, kN, 10, 3, addresses, options, nullptr, &failed_after[rank],
                      [&](int64_t step) {
                        if (step != 6) return;
                        // Both workers finished step 5: kill shard 1 now.
                        if (++ready == kW) {
                          shards[1].child->Signal(SIGKILL);
                          (void)shards[1].child->Wait(absl::Seconds(10));
                          killed = true;
                        }
                        while (!killed) absl::SleepFor(absl::Milliseconds(5));
                      })
              .status();
    });
  }
  for (auto& t : threads) t.join();
  for (int rank = 0; rank < kW; ++rank) {
    SCOPED_TRACE(testing::Message() << "rank " << rank);
    EXPECT_EQ(results[rank].code(), absl::StatusCode::kUnavailable) << results[rank];
    EXPECT_THAT(std::string(results[rank].message()), HasSubstr(shards[1].grpc));
    EXPECT_LT(failed_after[rank], absl::Seconds(5));
  }
}

// A shard that stops answering (SIGSTOP: the connection stays up) is only noticed by the
// step deadline; the call still ends with UNAVAILABLE, close to it.
TEST(PsServerTest, AStoppedShardIsUnavailableAtTheStepDeadline) {
  constexpr size_t kN = 1000;
  ShardProcess shard = StartShard(0, 1, 1, kN);
  ASSERT_FALSE(shard.grpc.empty());
  PsExchangeOptions options;
  options.step_deadline = absl::Seconds(1);
  auto backend = kernels::NewCpuBackend();
  auto exchange = PsExchange::Create(backend.get(), 0, 1, kN, {shard.grpc}, options);
  ASSERT_TRUE(exchange.ok());
  const std::vector<float> g = Random(5, kN, 0, 1);
  ASSERT_TRUE((*exchange)->SumGradients(1, g.data()).ok());  // the stream is open

  ASSERT_TRUE(StopAndWait(*shard.child));
  const absl::Time start = absl::Now();
  auto sum = (*exchange)->SumGradients(2, g.data());
  const absl::Duration took = absl::Now() - start;
  EXPECT_EQ(sum.status().code(), absl::StatusCode::kUnavailable) << sum.status();
  EXPECT_THAT(std::string(sum.status().message()), HasSubstr("no result for step 2 within 1s"));
  EXPECT_GE(took, absl::Milliseconds(900));
  EXPECT_LT(took, absl::Seconds(4));
  // Once it runs again, the same step goes through on a new stream.
  shard.child->Signal(SIGCONT);
  auto again = (*exchange)->SumGradients(2, g.data());
  EXPECT_TRUE(again.ok()) << again.status();
}

TEST(PsServerTest, BadFlagsAndFailedStartsExitNonZero) {
  const std::string bin = ServerBinary();
  struct Case {
    std::vector<std::string> args;
    int exit_code;
  };
  const std::vector<Case> cases = {
      {{bin, "--shard=0", "--shards=0", "--workers=2", "--n=10"}, 2},
      {{bin, "--shard=2", "--shards=2", "--workers=2", "--n=10"}, 2},
      {{bin, "--shard=0", "--shards=2", "--workers=0", "--n=10"}, 2},
      {{bin, "--shard=0", "--shards=2", "--workers=2", "--n=0"}, 2},
      {{bin, "--shard=0", "--shards=2", "--workers=2", "--n=10", "--port=70000"}, 2},
      // An address of no local interface (TEST-NET-3): binding fails.
      {{bin, "--shard=0", "--shards=2", "--workers=2", "--n=10", "--host=203.0.113.7"}, 1},
      {{bin, "--shard=0", "--shards=2", "--workers=2", "--n=10",
        "--address_file=/nonexistent-dir/x.json"},
       1},
  };
  for (const Case& c : cases) {
    std::unique_ptr<Process> child = StartChild(c.args);
    ASSERT_NE(child, nullptr);
    const absl::StatusOr<int> code = child->Wait(absl::Seconds(20));
    ASSERT_TRUE(code.ok()) << c.args.back();
    EXPECT_EQ(*code, c.exit_code) << c.args.back();  // 128+N if a signal ended it
  }
}

}  // namespace
}  // namespace onebit
