// PsExchange against real shard services on 127.0.0.1 (in this process): with S != W
// compression matches a float64 model of the ps layout; retries after a deadline,
// rejections, a vanished shard, big pushes. (OnebitAdam over PsExchange against peer mode
// is worker/optim:onebit_adam_ps_test.)
#include "worker/exchange/ps_exchange.h"

#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "grpcpp/grpcpp.h"
#include "kernels/kernels.h"
#include "onebit/v1/exchange.grpc.pb.h"
#include "proto/exchange_wire.h"
#include "server/in_process_shards.h"
#include "worker/exchange/compressed_allreduce.h"

namespace onebit {
namespace {

using ::testing::HasSubstr;
using server::InProcessShards;

std::vector<float> Random(uint32_t seed, size_t n, float mean, float stddev) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(mean, stddev);
  std::vector<float> x(n);
  for (float& v : x) v = dist(rng);
  return x;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// CompressedAllreduce with S server chunks in float64 (docs/algorithms.md with S for W on the
// server side), to check PsExchange when S != W.
class PsModel {
 public:
  PsModel(int workers, int shards, size_t n)
      : w_(workers),
        s_(shards),
        n_(n),
        n_pad_(PeerPaddedSize(n, shards)),
        chunk_(n_pad_ / shards),
        worker_error_(workers, std::vector<double>(n_pad_)),
        server_error_(shards, std::vector<double>(chunk_)) {}

  std::vector<double> Run(const std::vector<std::vector<float>>& inputs) {
    std::vector<double> avg(n_pad_, 0.0);
    for (int i = 0; i < w_; ++i) {
      std::vector<double> x(n_pad_);
      double sumsq = 0;
      for (size_t j = 0; j < n_pad_; ++j) {
        x[j] = (j < n_ ? inputs[i][j] : 0.0) + worker_error_[i][j];
        sumsq += x[j] * x[j];
      }
      const double scale = std::sqrt(sumsq / n_pad_);
      for (size_t j = 0; j < n_pad_; ++j) {
        const double q = x[j] >= 0 ? scale : -scale;
        worker_error_[i][j] = x[j] - q;
        avg[j] += q / w_;
      }
    }
    std::vector<double> out(n_);
    for (int r = 0; r < s_; ++r) {
      std::vector<double> y(chunk_);
      double sumsq = 0;
      for (size_t j = 0; j < chunk_; ++j) {
        y[j] = avg[r * chunk_ + j] + server_error_[r][j];
        sumsq += y[j] * y[j];
      }
      const double scale = std::sqrt(sumsq / chunk_);
      for (size_t j = 0; j < chunk_; ++j) {
        const double q = y[j] >= 0 ? scale : -scale;
        server_error_[r][j] = y[j] - q;
        if (r * chunk_ + j < n_) out[r * chunk_ + j] = q;
      }
    }
    return out;
  }

 private:
  int w_, s_;
  size_t n_, n_pad_, chunk_;
  std::vector<std::vector<double>> worker_error_, server_error_;
};

TEST(PsExchangeTest, CompressionMatchesTheFloat64ModelWhenShardsDifferFromWorkers) {
  constexpr int kRounds = 3;
  for (auto [w, s] : {std::pair{4, 2}, std::pair{2, 3}, std::pair{3, 8}}) {
    for (size_t n : {size_t{7}, size_t{1000}, size_t{10007}}) {
      SCOPED_TRACE(testing::Message() << "W " << w << " S " << s << " n " << n);
      InProcessShards shards(s, w, n);
      // outputs[round][rank]
      std::vector<std::vector<std::vector<float>>> outputs(
          kRounds, std::vector<std::vector<float>>(w, std::vector<float>(n)));
      std::vector<std::thread> threads;
      for (int rank = 0; rank < w; ++rank) {
        threads.emplace_back([&, rank] {
          auto backend = kernels::NewCpuBackend();
          auto exchange = PsExchange::Create(backend.get(), rank, w, n, shards.addresses);
          ASSERT_TRUE(exchange.ok()) << exchange.status();
          // buffer_bytes: at least the worker error (n, padded).
          EXPECT_GE((*exchange)->buffer_bytes(), n * sizeof(float));
          for (int round = 0; round < kRounds; ++round) {
            const std::vector<float> m = Random(100 * round + rank, n, 0.1f * rank, 1.0f + rank);
            auto r = (*exchange)->AverageMomentum(round + 1, m.data(), nullptr, 0.0f);
            ASSERT_TRUE(r.ok()) << r.status();
            ASSERT_TRUE(
                backend
                    ->Decompress(r->blocks, r->num_chunks, r->chunk, n, outputs[round][rank].data())
                    .ok());
          }
        });
      }
      for (auto& t : threads) t.join();

      PsModel model(w, s, n);
      for (int round = 0; round < kRounds; ++round) {
        std::vector<std::vector<float>> inputs;
        for (int rank = 0; rank < w; ++rank) {
          inputs.push_back(Random(100 * round + rank, n, 0.1f * rank, 1.0f + rank));
        }
        const std::vector<double> want = model.Run(inputs);
        double diff = 0, norm = 0;
        for (size_t j = 0; j < n; ++j) {
          diff += (outputs[round][0][j] - want[j]) * (outputs[round][0][j] - want[j]);
          norm += want[j] * want[j];
        }
        EXPECT_LT(std::sqrt(diff / norm), 1e-5) << "round " << round;
        for (int rank = 1; rank < w; ++rank) {
          EXPECT_TRUE(SameBits(outputs[round][rank], outputs[round][0])) << "rank " << rank;
        }
      }
    }
  }
}

// Warmup sums with the pushes staggered (one shard after another: runs over the limit)
// and all at once, starting at shard 0 on every worker or after each worker's "own" shard:
// the same bits, the rank-order sum, on every worker.
TEST(PsExchangeTest, StaggeredPushesGiveTheRankOrderSum) {
  constexpr int kWorkers = 3, kShards = 3, kRounds = 2;
  const size_t n = 3 * 100003;  // runs of 400 kB, over the default stagger_min_bytes
  for (auto [stagger, rotated] : {std::pair{size_t{0}, false},
                                  std::pair{PsExchangeOptions().stagger_min_bytes, false},
                                  std::pair{size_t{1}, false},
                                  std::pair{PsExchangeOptions().stagger_min_bytes, true}}) {
    SCOPED_TRACE(testing::Message() << "stagger_min_bytes " << stagger << ", rotated " << rotated);
    InProcessShards shards(kShards, kWorkers, n);
    std::vector<std::vector<std::vector<float>>> sums(
        kRounds, std::vector<std::vector<float>>(kWorkers));
    std::vector<std::thread> threads;
    for (int rank = 0; rank < kWorkers; ++rank) {
      threads.emplace_back([&, rank] {
        auto backend = kernels::NewCpuBackend();
        PsExchangeOptions options;
        options.stagger_min_bytes = stagger;
        if (rotated) {
          for (int k = 1; k <= kShards; ++k) options.push_order.push_back((rank + k) % kShards);
        }
        auto exchange =
            PsExchange::Create(backend.get(), rank, kWorkers, n, shards.addresses, options);
        ASSERT_TRUE(exchange.ok()) << exchange.status();
        EXPECT_EQ((*exchange)->push_order()[0], rotated ? (rank + 1) % kShards : 0);
        for (int round = 0; round < kRounds; ++round) {
          const std::vector<float> g = Random(10 * round + rank, n, 0, 1);
          auto sum = (*exchange)->SumGradients(round + 1, g.data());
          ASSERT_TRUE(sum.ok()) << sum.status();
          sums[round][rank].assign(*sum, *sum + n);
        }
      });
    }
    for (auto& t : threads) t.join();
    for (int round = 0; round < kRounds; ++round) {
      std::vector<float> want(n, 0.0f);
      for (int rank = 0; rank < kWorkers; ++rank) {
        const std::vector<float> g = Random(10 * round + rank, n, 0, 1);
        for (size_t i = 0; i < n; ++i) want[i] += g[i];
      }
      for (int rank = 0; rank < kWorkers; ++rank) {
        EXPECT_TRUE(SameBits(sums[round][rank], want)) << "round " << round << " rank " << rank;
      }
    }
  }
}

// One worker over 3 real shards with runs of 400 kB (staggered), every push and result
// traced; `local_shards` as PlanPushes would give them.
struct TracedPs {
  static constexpr int kShards = 3;
  static constexpr size_t kN = 3 * 100003;

  explicit TracedPs(std::vector<int> local_shards = {}) : shards(kShards, 1, kN), trace(&out) {
    PsExchangeOptions options;
    options.trace = &trace;
    options.push_order = {1, 2, 0};
    options.local_shards = std::move(local_shards);
    auto made = PsExchange::Create(backend.get(), 0, 1, kN, shards.addresses, options);
    EXPECT_TRUE(made.ok()) << made.status();
    if (made.ok()) exchange = *std::move(made);
  }

  struct Line {
    std::string op;
    int to, from;
    uint64_t sent, received;
    double start, end;
  };
  // The trace's lines after its header (which must be CallTrace's).
  std::vector<Line> Lines() const {
    std::vector<Line> lines;
    std::istringstream in(out.str());
    std::string row;
    std::getline(in, row);
    EXPECT_EQ(row, "op,to,from,block_bytes,sent,received,start_unix,end_unix");
    while (std::getline(in, row)) {
      std::vector<std::string> f = absl::StrSplit(row, ',');
      EXPECT_EQ(f.size(), 8u) << row;
      if (f.size() != 8) continue;
      lines.push_back(Line{f[0], std::stoi(f[1]), std::stoi(f[2]), std::stoull(f[4]),
                           std::stoull(f[5]), std::stod(f[6]), std::stod(f[7])});
    }
    return lines;
  }

  InProcessShards shards;
  std::unique_ptr<kernels::Backend> backend = kernels::NewCpuBackend();
  std::ostringstream out;
  CallTrace trace;
  std::unique_ptr<PsExchange> exchange;
};

// --transport_trace in ps mode: a Push and a Result line per shard and call, with the
// payload bytes each way; staggered pushes one after another, each result after its push.
TEST(PsExchangeTest, TheTraceHasAPushAndAResultPerShard) {
  TracedPs ps;
  ASSERT_NE(ps.exchange, nullptr);
  constexpr int kShards = TracedPs::kShards;
  constexpr size_t n = TracedPs::kN;
  const std::vector<float> g = Random(5, n, 0, 1);
  ASSERT_TRUE(ps.exchange->SumGradients(1, g.data()).ok());
  ASSERT_TRUE(ps.exchange->CompressedAverage(2, g.data()).ok());
  const std::vector<TracedPs::Line> lines = ps.Lines();
  ASSERT_EQ(lines.size(), 4u * kShards);  // two calls, a push and a result per shard each
  const PsLayout& layout = ps.exchange->layout();
  uint64_t sent = 0, received = 0;
  std::vector<int> pushed;  // the fp32 pushes' shards, in the order they were written
  double last_push_end = 0;
  for (size_t i = 0; i < 2u * kShards; ++i) {  // the warmup's lines
    const TracedPs::Line& l = lines[i];
    sent += l.sent;
    received += l.received;
    EXPECT_LE(l.start, l.end) << i;
    if (l.op == "Push") {
      EXPECT_EQ(l.sent, layout.payload_bytes(ChunkKind::kFp32, l.to));
      EXPECT_GE(l.start, last_push_end) << "staggered: each push after the one before";
      last_push_end = l.end;
      pushed.push_back(l.to);
    } else {
      ASSERT_EQ(l.op, "Result");
      EXPECT_EQ(l.received, layout.payload_bytes(ChunkKind::kFp32, l.from));
    }
  }
  EXPECT_EQ(pushed, (std::vector<int>{1, 2, 0}));
  EXPECT_EQ(sent, n * sizeof(float));
  EXPECT_EQ(received, n * sizeof(float));
  for (size_t i = 2u * kShards; i < lines.size(); ++i) {  // compression: the blocks
    EXPECT_EQ(lines[i].sent + lines[i].received, layout.block_bytes()) << lines[i].op;
  }
  EXPECT_EQ(ps.exchange->bytes_sent(), n * sizeof(float) + kShards * layout.block_bytes());
}

// A shard on the worker's own host takes no link: its push goes at once, beside the first
// staggered one, not after the others.
TEST(PsExchangeTest, ALocalShardsPushGoesAtOnce) {
  TracedPs ps(/*local_shards=*/{0});
  ASSERT_NE(ps.exchange, nullptr);
  const std::vector<float> g = Random(6, TracedPs::kN, 0, 1);
  ASSERT_TRUE(ps.exchange->SumGradients(1, g.data()).ok());
  std::map<int, std::pair<double, double>> push;  // shard -> (start, end)
  for (const TracedPs::Line& l : ps.Lines()) {
    if (l.op == "Push") push[l.to] = {l.start, l.end};
  }
  ASSERT_EQ(push.size(), 3u);
  EXPECT_LT(push[0].first, push[1].second) << "the local push waited for the first one";
  EXPECT_GE(push[2].first, push[1].second) << "shard 2's push did not wait for shard 1's";
}

TEST(PsExchangeTest, PlanPushesGoesPartByPartStartingAfterTheOwnHost) {
  // Shards apart: in index order, none local.
  const std::vector<std::string> apart = {"10.0.0.9:7000", "10.0.0.9:7001", "10.0.0.9:7002"};
  EXPECT_EQ(PlanPushes("10.0.0.1", apart).order, (std::vector<int>{0, 1, 2}));
  EXPECT_TRUE(PlanPushes("10.0.0.1", apart).local.empty());
  EXPECT_EQ(PlanPushes("", apart).order, (std::vector<int>{0, 1, 2}));
  // One shard beside each of 4 workers (an IPv6 one among them): after the own host.
  const std::vector<std::string> one = {"10.0.0.11:7000", "10.0.0.12:7000", "[fd00::3]:7001",
                                        "10.0.0.14:7000"};
  PushPlan plan = PlanPushes("10.0.0.12", one);
  EXPECT_EQ(plan.order, (std::vector<int>{2, 3, 0, 1}));
  EXPECT_EQ(plan.local, (std::vector<int>{1}));
  EXPECT_EQ(PlanPushes("fd00::3", one).order, (std::vector<int>{3, 0, 1, 2}));
  EXPECT_EQ(PlanPushes("10.0.0.1", one).order, (std::vector<int>{0, 1, 2, 3}));  // a prefix is not the host
  // Two shards on each of 3 hosts (shard s on host s % 3, as the launcher places them):
  // part 0 of the hosts after the own one, then part 1.
  const std::vector<std::string> two = {"a:1", "b:1", "c:1", "a:2", "b:2", "c:2"};
  plan = PlanPushes("b", two);
  EXPECT_EQ(plan.order, (std::vector<int>{2, 0, 1, 5, 3, 4}));
  EXPECT_EQ(plan.local, (std::vector<int>{1, 4}));
  // Uneven: a host with fewer parts is skipped in the parts it lacks.
  EXPECT_EQ(PlanPushes("a", {"a:1", "b:1", "b:2"}).order, (std::vector<int>{1, 0, 2}));
  EXPECT_TRUE(PlanPushes("a", {}).order.empty());
}

TEST(PsExchangeTest, CreateRejectsAPushOrderThatIsNotAPermutation) {
  auto backend = kernels::NewCpuBackend();
  const std::vector<std::string> two = {"127.0.0.1:1", "127.0.0.1:2"};
  for (const std::vector<int>& order : {std::vector<int>{0}, std::vector<int>{0, 0},
                                        std::vector<int>{1, 2}}) {
    PsExchangeOptions options;
    options.push_order = order;
    EXPECT_EQ(PsExchange::Create(backend.get(), 0, 1, 10, two, options).status().code(),
              absl::StatusCode::kInvalidArgument);
  }
  PsExchangeOptions options;
  options.local_shards = {2};
  EXPECT_EQ(PsExchange::Create(backend.get(), 0, 1, 10, two, options).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// fp16's overflow agreement through shard 0: every worker gets whether any overflowed,
// steps interleaved with real exchanges (a skipped step is never pushed: a gap), and the
// shards keep their order.
TEST(PsExchangeTest, EveryWorkerLearnsWhetherAnyGradientOverflowed) {
  constexpr int kWorkers = 3;
  const size_t n = 101;
  InProcessShards shards(2, kWorkers, n, OnebitCodec(), /*allow_step_gaps=*/true);
  // Step 2: worker 1 overflowed; step 4: workers 0 and 2.
  const auto overflowed = [](int64_t step, int rank) {
    return (step == 2 && rank == 1) || (step == 4 && rank != 1);
  };
  std::vector<std::vector<int>> answers(kWorkers);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < kWorkers; ++rank) {
    threads.emplace_back([&, rank] {
      auto backend = kernels::NewCpuBackend();
      auto exchange = PsExchange::Create(backend.get(), rank, kWorkers, n, shards.addresses);
      ASSERT_TRUE(exchange.ok()) << exchange.status();
      for (int64_t step = 1; step <= 5; ++step) {
        absl::StatusOr<bool> any = (*exchange)->AnyOverflow(step, overflowed(step, rank));
        ASSERT_TRUE(any.ok()) << any.status();
        answers[rank].push_back(*any);
        if (*any) continue;  // skipped by everyone: nothing pushed
        const std::vector<float> g = Random(step + rank, n, 0, 1);
        ASSERT_TRUE((*exchange)->SumGradients(step, g.data()).ok());
      }
      // A changed vote on a decided step is refused as the shard said.
      absl::StatusOr<bool> changed = (*exchange)->AnyOverflow(5, true);
      EXPECT_EQ(changed.status().code(), absl::StatusCode::kAlreadyExists) << changed.status();
    });
  }
  for (auto& t : threads) t.join();
  for (int rank = 0; rank < kWorkers; ++rank) {
    EXPECT_EQ(answers[rank], (std::vector<int>{0, 1, 0, 1, 0})) << "rank " << rank;
  }
}

TEST(PsExchangeTest, AnOverflowVoteWithoutTheOtherWorkersIsUnavailableAtTheDeadline) {
  InProcessShards shards(1, 2, 10);
  auto backend = kernels::NewCpuBackend();
  PsExchangeOptions options;
  options.step_deadline = absl::Milliseconds(300);
  auto exchange = PsExchange::Create(backend.get(), 0, 2, 10, shards.addresses, options);
  ASSERT_TRUE(exchange.ok());
  absl::StatusOr<bool> any = (*exchange)->AnyOverflow(1, false);
  EXPECT_EQ(any.status().code(), absl::StatusCode::kUnavailable) << any.status();
  EXPECT_THAT(std::string(any.status().message()), HasSubstr("shard 0"));
}

TEST(PsExchangeTest, CreateValidates) {
  auto backend = kernels::NewCpuBackend();
  const std::vector<std::string> one = {"127.0.0.1:1"};
  EXPECT_EQ(PsExchange::Create(backend.get(), 2, 2, 10, one).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PsExchange::Create(backend.get(), 0, 2, 10, std::vector<std::string>{}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PsExchange::Create(backend.get(), 0, 2, 0, one).status().code(),
            absl::StatusCode::kInvalidArgument);
  PsExchangeOptions bad;
  bad.max_attempts = 0;
  EXPECT_EQ(PsExchange::Create(backend.get(), 0, 2, 10, one, bad).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(PsExchangeTest, AShardThatIsNotThereIsUnavailableQuickly) {
  // A port that was free a moment ago: nothing listens there.
  std::string address;
  {
    InProcessShards gone(1, 2, 64);
    address = gone.addresses[0];
  }
  auto backend = kernels::NewCpuBackend();
  PsExchangeOptions options;
  options.retry_backoff = absl::Milliseconds(20);
  auto exchange = PsExchange::Create(backend.get(), 0, 2, 64, {address}, options);
  ASSERT_TRUE(exchange.ok());
  const std::vector<float> g(64, 1.0f);
  const absl::Time start = absl::Now();
  auto sum = (*exchange)->SumGradients(1, g.data());
  EXPECT_EQ(sum.status().code(), absl::StatusCode::kUnavailable) << sum.status();
  EXPECT_THAT(std::string(sum.status().message()), HasSubstr("after 3 attempts"));
  EXPECT_THAT(std::string(sum.status().message()), HasSubstr(address));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_EQ((*exchange)->bytes_received(), 0u);
}

// Worker 1 is late: worker 0 runs into its deadline (UNAVAILABLE, its push stays on the
// shard), retries the same step later, and both get the same result.
TEST(PsExchangeTest, ARetryAfterTheDeadlineGetsTheSameStep) {
  const size_t n = 100;
  InProcessShards shards(2, 2, n);
  auto backend = kernels::NewCpuBackend();
  PsExchangeOptions short_deadline;
  short_deadline.step_deadline = absl::Milliseconds(300);
  auto w0 = PsExchange::Create(backend.get(), 0, 2, n, shards.addresses, short_deadline);
  auto w1 = PsExchange::Create(backend.get(), 1, 2, n, shards.addresses);
  ASSERT_TRUE(w0.ok() && w1.ok());
  const std::vector<float> m0 = Random(1, n, 0, 1), m1 = Random(2, n, 0, 1);

  const absl::Time start = absl::Now();
  auto late = (*w0)->AverageMomentum(1, m0.data(), nullptr, 0.0f);
  EXPECT_EQ(late.status().code(), absl::StatusCode::kUnavailable) << late.status();
  EXPECT_THAT(std::string(late.status().message()), HasSubstr("no result for step 1"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
  const std::vector<float> error_after_first_try = *(*w0)->worker_compressor().error().ToHost();

  std::vector<uint8_t> r0, r1;
  std::thread t1([&] {
    auto r = (*w1)->AverageMomentum(1, m1.data(), nullptr, 0.0f);
    ASSERT_TRUE(r.ok()) << r.status();
    r1.assign(r->blocks, r->blocks + 2 * (4 + r->chunk / 8));
  });
  // The retry pushes the same blocks (the shards accept it as a duplicate) and does not
  // compress again; on a loaded machine worker 1 may need more than one 300 ms window.
  auto w0_until_done = [&](int64_t step) {
    absl::StatusOr<CompressedResult> r;
    for (int attempt = 0; attempt < 50; ++attempt) {
      r = (*w0)->AverageMomentum(step, m0.data(), nullptr, 0.0f);
      if (r.status().code() != absl::StatusCode::kUnavailable) break;
    }
    return r;
  };
  auto retry = w0_until_done(1);
  ASSERT_TRUE(retry.ok()) << retry.status();
  r0.assign(retry->blocks, retry->blocks + 2 * (4 + retry->chunk / 8));
  t1.join();
  EXPECT_EQ(r0, r1);
  EXPECT_TRUE(SameBits(*(*w0)->worker_compressor().error().ToHost(), error_after_first_try));
  for (auto& p : shards.processes) EXPECT_EQ(p->state().last_completed_step(), 1);
  // Step 2 runs normally on the reopened streams.
  std::thread t2([&] { ASSERT_TRUE(w0_until_done(2).ok()); });
  EXPECT_TRUE((*w1)->AverageMomentum(2, m1.data(), nullptr, 0.0f).ok());
  t2.join();
}

TEST(PsExchangeTest, ARejectionComesBackAsItIsWithoutRetries) {
  InProcessShards shards(1, 2, 100);
  auto backend = kernels::NewCpuBackend();
  // The worker thinks the tensor has 101 elements: its fp32 run has the wrong size.
  auto exchange = PsExchange::Create(backend.get(), 0, 2, 101, shards.addresses);
  ASSERT_TRUE(exchange.ok());
  const std::vector<float> g(101, 1.0f);
  auto sum = (*exchange)->SumGradients(1, g.data());
  EXPECT_EQ(sum.status().code(), absl::StatusCode::kInvalidArgument) << sum.status();
  EXPECT_THAT(std::string(sum.status().message()),
              HasSubstr("fp32 payload for shard 0 must be 400 bytes, got 404"));
  EXPECT_THAT(std::string(sum.status().message()), HasSubstr(shards.addresses[0]));
  EXPECT_EQ(shards.processes[0]->metrics().rejected(server::RejectReason::kWrongSize), 1.0);
  EXPECT_EQ(shards.processes[0]->state().open_step(), 0);
}

TEST(PsExchangeTest, AShardShuttingDownMidStepIsUnavailable) {
  InProcessShards shards(2, 2, 100);
  auto backend = kernels::NewCpuBackend();
  PsExchangeOptions options;
  options.retry_backoff = absl::Milliseconds(20);
  auto exchange = PsExchange::Create(backend.get(), 0, 2, 100, shards.addresses, options);
  ASSERT_TRUE(exchange.ok());
  const std::vector<float> g(100, 1.0f);
  std::thread stopper([&] {
    absl::SleepFor(absl::Milliseconds(200));  // worker 0 is waiting for worker 1 by now
    shards.processes[1]->Shutdown();
  });
  const absl::Time start = absl::Now();
  auto sum = (*exchange)->SumGradients(1, g.data());
  stopper.join();
  EXPECT_EQ(sum.status().code(), absl::StatusCode::kUnavailable) << sum.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

TEST(PsExchangeTest, PushesLargerThanGrpcsDefaultLimitGoThrough) {
  const size_t n = 3 << 20;  // 12 MiB of fp32 for one shard; gRPC's default limit is 4 MiB
  InProcessShards shards(1, 1, n);
  auto backend = kernels::NewCpuBackend();
  auto exchange = PsExchange::Create(backend.get(), 0, 1, n, shards.addresses);
  ASSERT_TRUE(exchange.ok());
  const std::vector<float> g = Random(3, n, 0, 1);
  auto sum = (*exchange)->SumGradients(1, g.data());
  ASSERT_TRUE(sum.ok()) << sum.status();
  EXPECT_EQ(std::memcmp(*sum, g.data(), n * sizeof(float)), 0);  // 0.0f + g == g
  EXPECT_EQ((*exchange)->bytes_sent(), n * 4);
}

}  // namespace
}  // namespace onebit

namespace onebit {
namespace {

// A real gRPC server that answers every push with the bytes `reply` returns for it: a
// shard gone wrong (or an impostor) on the network.
class RawReplyShard : public v1::ParameterServer::Service {
 public:
  explicit RawReplyShard(std::function<std::string(const wire::PushFields&)> reply)
      : reply_(std::move(reply)) {
    MarkMethodStreamed(
        0, new grpc::internal::BidiStreamingHandler<RawReplyShard, grpc::ByteBuffer,
                                                    grpc::ByteBuffer>(
               [](RawReplyShard* self, grpc::ServerContext*,
                  grpc::ServerReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>* stream) {
                 grpc::ByteBuffer message;
                 while (stream->Read(&message)) {
                   absl::StatusOr<wire::PushFields> push = wire::ParsePush(wire::ToCord(message));
                   if (!push.ok()) return grpc::Status(grpc::INVALID_ARGUMENT, "bad push");
                   const std::string bytes = self->reply_(*push);
                   grpc::Slice slice(bytes.data(), bytes.size());
                   if (!stream->Write(grpc::ByteBuffer(&slice, 1))) break;
                 }
                 return grpc::Status::OK;
               },
               this));
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(this);
    server_ = builder.BuildAndStart();
  }
  ~RawReplyShard() override { server_->Shutdown(absl::ToChronoTime(absl::Now())); }
  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }

 private:
  std::function<std::string(const wire::PushFields&)> reply_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

TEST(PsExchangeTest, MalformedResultsAreInternalErrorsNotCrashes) {
  constexpr size_t kN = 64;  // one shard: a 256-byte fp32 result
  auto result_of = [](const wire::PushFields& push, const std::string& payload) {
    v1::ChunkResult r;
    r.set_step(push.step);
    r.set_chunk(push.chunk);
    r.set_kind(static_cast<v1::ChunkKind>(push.kind));
    r.set_payload(payload);
    return r.SerializeAsString();
  };
  struct Case {
    std::function<std::string(const wire::PushFields&)> reply;
    std::string message;
  };
  const std::vector<Case> cases = {
      {[](const wire::PushFields&) { return std::string("\xff\xff\xff\xff\x0f junk"); },
       "malformed ChunkResult at byte 0 of 10: wire type 7 is invalid"},
      {[&](const wire::PushFields& p) {
         const std::string whole = result_of(p, std::string(kN * 4, 'a'));
         return whole.substr(0, whole.size() - 1);  // the payload's last byte is missing
       },
       "malformed ChunkResult at byte"},
      {[&](const wire::PushFields& p) { return result_of(p, std::string(kN * 4 - 4, 'a')); },
       "result of 252 bytes, expected 256"},
      {[&](const wire::PushFields& p) {
         wire::PushFields other = p;
         other.step += 1;
         return result_of(other, std::string(kN * 4, 'a'));
       },
       "answered step 2"},
  };
  auto backend = kernels::NewCpuBackend();
  const std::vector<float> g(kN, 1.0f);
  for (const Case& c : cases) {
    RawReplyShard shard(c.reply);
    auto exchange = PsExchange::Create(backend.get(), 0, 1, kN, {shard.address()});
    ASSERT_TRUE(exchange.ok()) << exchange.status();
    auto sum = (*exchange)->SumGradients(1, g.data());
    EXPECT_EQ(sum.status().code(), absl::StatusCode::kInternal) << sum.status();
    EXPECT_THAT(std::string(sum.status().message()), HasSubstr(c.message)) << sum.status();
    EXPECT_THAT(std::string(sum.status().message()), HasSubstr(shard.address()));
    EXPECT_EQ((*exchange)->bytes_sent(), kN * 4);
  }
  // A well-formed answer with the right shape is taken as the sum, byte for byte.
  RawReplyShard echo([&](const wire::PushFields& p) {
    return result_of(p, std::string(p.payload));
  });
  auto exchange = PsExchange::Create(backend.get(), 0, 1, kN, {echo.address()});
  ASSERT_TRUE(exchange.ok()) << exchange.status();
  const std::vector<float> x = Random(5, kN, 0.0f, 1.0f);
  auto sum = (*exchange)->SumGradients(1, x.data());
  ASSERT_TRUE(sum.ok()) << sum.status();
  EXPECT_EQ(std::memcmp(*sum, x.data(), kN * 4), 0);
  EXPECT_EQ((*exchange)->bytes_received(), kN * 4);
}

}  // namespace
}  // namespace onebit
