// OnebitAdam over the parameter-server exchange against real shard services on 127.0.0.1
// (in this process):
//  - S == W: it equals OnebitAdam over PeerExchange bit for bit (parameters, momentum,
//    worker and server errors) across the freeze, W = 1..4, with the bytes on the wire;
//  - S != W: warmup is still bit-identical;
//  - the warmup between the workers (exchange.warmup_over "workers"): the same bits as
//    the warmup through the shards, which see only the compressed steps.
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "compression/layout.h"
#include "kernels/kernels.h"
#include "server/in_process_shards.h"
#include "worker/exchange/peer_exchange.h"
#include "worker/exchange/ps_exchange.h"
#include "worker/exchange/workers_warmup_exchange.h"
#include "worker/optim/optimizer_factory.h"
#include "worker/transport/local_group.h"

namespace onebit {
namespace {

using server::InProcessShards;

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

// What one worker ends with.
struct WorkerEnd {
  std::vector<float> params, momentum, worker_error;
  uint64_t bytes_sent = 0, bytes_received = 0;
};

absl::Status RunWorker(const OptimizerSpec& options, Exchange* exchange,
                       kernels::Backend* backend, int rank, int steps, size_t n,
                       const std::vector<float>& p0, WorkerEnd* end) {
  auto adam = CreateOptimizer(options, backend, exchange, p0.data(), n);
  if (!adam.ok()) return adam.status();
  for (int64_t step = 1; step <= steps; ++step) {
    const std::vector<float> g = Grad(rank, step, n);
    if (absl::Status s = (*adam)->Step(g.data()); !s.ok()) return s;
  }
  end->params = *(*adam)->ParamsToHost();
  end->momentum = *(*adam)->StateToHost("exp_avg", 0, n);
  end->worker_error = *exchange->worker_compressor().error().ToHost();
  end->bytes_sent = exchange->bytes_sent();
  end->bytes_received = exchange->bytes_received();
  return absl::OkStatus();
}

// OnebitAdam over PsExchange: W workers as threads against `shards`.
std::vector<WorkerEnd> RunPs(const OptimizerSpec& options, int workers, int steps, size_t n,
                             const std::vector<std::string>& addresses) {
  const std::vector<float> p0 = Random(1, n, 0.0f, 1.0f);
  std::vector<WorkerEnd> ends(workers);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < workers; ++rank) {
    threads.emplace_back([&, rank] {
      auto backend = kernels::NewCpuBackend();
      auto exchange = PsExchange::Create(backend.get(), rank, workers, n, addresses);
      ASSERT_TRUE(exchange.ok()) << exchange.status();
      const absl::Status s =
          RunWorker(options, exchange->get(), backend.get(), rank, steps, n, p0, &ends[rank]);
      EXPECT_TRUE(s.ok()) << "rank " << rank << ": " << s;
    });
  }
  for (auto& t : threads) t.join();
  return ends;
}

// The same over PeerExchange (inproc transport); also returns every rank's server error.
std::vector<WorkerEnd> RunPeer(const OptimizerSpec& options, int workers, int steps, size_t n,
                               std::vector<std::vector<float>>* server_errors) {
  const std::vector<float> p0 = Random(1, n, 0.0f, 1.0f);
  std::vector<WorkerEnd> ends(workers);
  server_errors->assign(workers, {});
  const absl::Status status =
      RunLocalGroup(TransportKind::kInproc, workers, [&](Transport& transport) -> absl::Status {
        auto backend = kernels::NewCpuBackend();
        auto exchange = PeerExchange::Create(backend.get(), &transport, n);
        if (!exchange.ok()) return exchange.status();
        const int rank = transport.rank();
        if (absl::Status s =
                RunWorker(options, exchange->get(), backend.get(), rank, steps, n, p0, &ends[rank]);
            !s.ok()) {
          return s;
        }
        (*server_errors)[rank] = *(*exchange)->compressed().server().error().ToHost();
        return absl::OkStatus();
      });
  EXPECT_TRUE(status.ok()) << status;
  return ends;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

class PsEqualsPeerTest : public ::testing::TestWithParam<int> {};

// 12 steps with the freeze after step 5: both stages and the switch between them.
TEST_P(PsEqualsPeerTest, BitIdenticalWhenShardsEqualWorkers) {
  const int w = GetParam();
  const size_t n = 1003;  // not a multiple of 8: the padding is exercised
  constexpr int kSteps = 12;
  constexpr int64_t kFreeze = 5;
  OptimizerSpec options;
  options.hyper.lr = 1e-2f;
  options.hyper.weight_decay = 0.01f;
  options.freeze_step = kFreeze;

  std::vector<std::vector<float>> peer_server_errors;
  const std::vector<WorkerEnd> peer = RunPeer(options, w, kSteps, n, &peer_server_errors);
  InProcessShards shards(w, w, n);
  ASSERT_EQ(shards.addresses.size(), static_cast<size_t>(w));
  const std::vector<WorkerEnd> ps = RunPs(options, w, kSteps, n, shards.addresses);

  for (int rank = 0; rank < w; ++rank) {
    SCOPED_TRACE(testing::Message() << "rank " << rank);
    EXPECT_TRUE(SameBits(ps[rank].params, peer[rank].params));
    EXPECT_TRUE(SameBits(ps[rank].momentum, peer[rank].momentum));
    EXPECT_TRUE(SameBits(ps[rank].worker_error, peer[rank].worker_error));
    // Shard r holds exactly what peer rank r held as the server of chunk r.
    if (w > 1) {
      EXPECT_TRUE(
          SameBits(*shards.processes[rank]->state().ServerErrorToHost(), peer_server_errors[rank]));
      EXPECT_GT(*shards.processes[rank]->state().ServerErrorNorm(), 0.0);
      EXPECT_EQ(shards.processes[rank]->state().last_completed_step(), kSteps);
    }
  }
  if (w == 1) return;  // one worker never exchanges
  // Bytes: a warmup step sends and receives the n floats once; a compression step one
  // block per shard each way.
  const auto layout = *PsLayout::Create(n, w);
  const uint64_t want = kFreeze * n * 4 + (kSteps - kFreeze) * w * layout.block_bytes();
  for (int rank = 0; rank < w; ++rank) {
    EXPECT_EQ(ps[rank].bytes_sent, want) << "rank " << rank;
    EXPECT_EQ(ps[rank].bytes_received, want) << "rank " << rank;
  }
}

// 0/1 Adam (its error reset before the first local step reaches the shards with the
// pushes) and 1-bit LAMB: ps equals peer bit for bit too.
class PsEqualsPeerFamilyTest : public ::testing::TestWithParam<std::string> {};

TEST_P(PsEqualsPeerFamilyTest, BitIdenticalWhenShardsEqualWorkers) {
  const size_t n = 1003;
  for (int w : {2, 3}) {
    SCOPED_TRACE(testing::Message() << "W " << w);
    OptimizerSpec options;
    options.kind = ParseOptimizerKind(GetParam()).value();
    options.hyper.lr = 1e-2f;
    options.hyper.weight_decay = 0.01f;
    options.freeze_step = 5;
    options.zero_one = ZeroOneScheduleParams{2, 2, 4};
    options.group_offsets = {0, 400, 1003};
    std::vector<std::vector<float>> peer_server_errors;
    const std::vector<WorkerEnd> peer = RunPeer(options, w, 14, n, &peer_server_errors);
    InProcessShards shards(w, w, n, OnebitCodec(),
                           /*allow_step_gaps=*/options.kind == OptimizerKind::kZeroOneAdam);
    const std::vector<WorkerEnd> ps = RunPs(options, w, 14, n, shards.addresses);
    for (int rank = 0; rank < w; ++rank) {
      SCOPED_TRACE(testing::Message() << "rank " << rank);
      EXPECT_TRUE(SameBits(ps[rank].params, peer[rank].params));
      EXPECT_TRUE(SameBits(ps[rank].momentum, peer[rank].momentum));
      EXPECT_TRUE(SameBits(ps[rank].worker_error, peer[rank].worker_error));
      EXPECT_TRUE(
          SameBits(*shards.processes[rank]->state().ServerErrorToHost(), peer_server_errors[rank]));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Optimizers, PsEqualsPeerFamilyTest,
                         ::testing::Values("ZeroOneAdam", "OneBitLamb"));

INSTANTIATE_TEST_SUITE_P(Workers, PsEqualsPeerTest, ::testing::Values(1, 2, 3, 4),
                         [](const auto& info) { return "W" + std::to_string(info.param); });

// S != W: warmup sums are elementwise in rank order whatever the split, so pure warmup
// matches peer mode bit for bit.
TEST(PsExchangeTest, WarmupIsBitIdenticalForAnyShardCount) {
  const size_t n = 1003;
  OptimizerSpec options;
  options.freeze_step = 1000;  // never compresses
  std::vector<std::vector<float>> unused;
  for (auto [w, s] : {std::pair{4, 2}, std::pair{3, 5}, std::pair{2, 1}}) {
    SCOPED_TRACE(testing::Message() << "W " << w << " S " << s);
    const std::vector<WorkerEnd> peer = RunPeer(options, w, 4, n, &unused);
    InProcessShards shards(s, w, n);
    const std::vector<WorkerEnd> ps = RunPs(options, w, 4, n, shards.addresses);
    for (int rank = 0; rank < w; ++rank) EXPECT_TRUE(SameBits(ps[rank].params, peer[rank].params));
  }
}

// ps with the warmup between the workers (WorkersWarmupExchange over the inproc transport
// in `order`), W workers against `shards`; also returns the shards' bytes per worker.
std::vector<WorkerEnd> RunPsWorkersWarmup(const OptimizerSpec& options, int workers, int steps,
                                          size_t n, const std::vector<std::string>& addresses,
                                          SumOrder order, std::vector<uint64_t>* shard_bytes) {
  const std::vector<float> p0 = Random(1, n, 0.0f, 1.0f);
  std::vector<WorkerEnd> ends(workers);
  shard_bytes->assign(workers, 0);
  const absl::Status status =
      RunLocalGroup(TransportKind::kInproc, workers, [&](Transport& transport) -> absl::Status {
        auto backend = kernels::NewCpuBackend();
        const int rank = transport.rank();
        auto ps = PsExchange::Create(backend.get(), rank, workers, n, addresses);
        if (!ps.ok()) return ps.status();
        ExactAllreduceOptions exact;
        exact.order = order;
        auto exchange =
            WorkersWarmupExchange::Create(backend.get(), &transport, n, exact, *std::move(ps));
        if (!exchange.ok()) return exchange.status();
        if (absl::Status s =
                RunWorker(options, exchange->get(), backend.get(), rank, steps, n, p0, &ends[rank]);
            !s.ok()) {
          return s;
        }
        (*shard_bytes)[rank] = (*exchange)->compressed().bytes_sent();
        return absl::OkStatus();
      });
  EXPECT_TRUE(status.ok()) << status;
  return ends;
}

class WorkersWarmupTest : public ::testing::TestWithParam<std::string> {};

// 12 steps, the freeze after step 5, W = 2..4 over 2 shards: in rank order the warmup
// between the workers gives the bits of the warmup through the shards (parameters,
// momentum, worker and server errors), and the shards only ever see compressed steps.
TEST_P(WorkersWarmupTest, SameBitsAsTheWarmupThroughTheShards) {
  const size_t n = 1003;
  constexpr int kSteps = 12, kShards = 2;
  constexpr int64_t kFreeze = 5;
  OptimizerSpec options;
  options.kind = ParseOptimizerKind(GetParam()).value();
  options.hyper.lr = 1e-2f;
  options.hyper.weight_decay = 0.01f;
  options.freeze_step = kFreeze;
  for (int w : {2, 3, 4}) {
    SCOPED_TRACE(testing::Message() << "W " << w);
    InProcessShards through(kShards, w, n);
    const std::vector<WorkerEnd> want = RunPs(options, w, kSteps, n, through.addresses);
    InProcessShards shards(kShards, w, n, OnebitCodec(), /*allow_step_gaps=*/true);
    std::vector<uint64_t> shard_bytes;
    const std::vector<WorkerEnd> got =
        RunPsWorkersWarmup(options, w, kSteps, n, shards.addresses, SumOrder::kRank, &shard_bytes);
    const auto layout = *PsLayout::Create(n, kShards);
    for (int rank = 0; rank < w; ++rank) {
      SCOPED_TRACE(testing::Message() << "rank " << rank);
      EXPECT_TRUE(SameBits(got[rank].params, want[rank].params));
      EXPECT_TRUE(SameBits(got[rank].momentum, want[rank].momentum));
      EXPECT_TRUE(SameBits(got[rank].worker_error, want[rank].worker_error));
      // The shards' bytes: one block per shard and compressed step, no warmup run.
      EXPECT_EQ(shard_bytes[rank], (kSteps - kFreeze) * kShards * layout.block_bytes());
      // The warmup's bytes went over the transport.
      EXPECT_GT(got[rank].bytes_sent, shard_bytes[rank] + kFreeze * n * 4 / 2);
    }
    for (int s = 0; s < kShards; ++s) {
      EXPECT_TRUE(SameBits(*shards.processes[s]->state().ServerErrorToHost(),
                           *through.processes[s]->state().ServerErrorToHost()));
      EXPECT_EQ(shards.processes[s]->state().last_completed_step(), kSteps);
    }
  }
}

// The ring order: its own fixed bits, the same on every worker.
TEST_P(WorkersWarmupTest, RingOrderAgreesAcrossWorkers) {
  const size_t n = 1003;
  OptimizerSpec options;
  options.kind = ParseOptimizerKind(GetParam()).value();
  options.hyper.lr = 1e-2f;
  options.freeze_step = 4;
  InProcessShards shards(2, 3, n, OnebitCodec(), /*allow_step_gaps=*/true);
  std::vector<uint64_t> shard_bytes;
  const std::vector<WorkerEnd> got =
      RunPsWorkersWarmup(options, 3, 8, n, shards.addresses, SumOrder::kRing, &shard_bytes);
  for (int rank = 1; rank < 3; ++rank) EXPECT_TRUE(SameBits(got[rank].params, got[0].params));
  EXPECT_EQ(shards.processes[0]->state().last_completed_step(), 8);
}

INSTANTIATE_TEST_SUITE_P(Optimizers, WorkersWarmupTest,
                         ::testing::Values("OneBitAdam", "OneBitLamb"));

}  // namespace
}  // namespace onebit
