// The overlapped warmup sum (overlapped_warmup.h) of PeerExchange and of
// WorkersWarmupExchange (ps with warmup_over "workers"): bucket by bucket on its exchange
// thread, against one sum of the whole buffer, over real transports.
#include "worker/exchange/peer_exchange.h"

#include <random>
#include <thread>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/kernels.h"
#include "worker/exchange/workers_warmup_exchange.h"
#include "worker/transport/local_group.h"

namespace onebit {
namespace {

using ::testing::HasSubstr;
using Buckets = std::vector<std::pair<size_t, size_t>>;

constexpr size_t kN = 1000;
// As the MLP announces them: the end of the buffer first. Uneven, one shorter than W.
const Buckets kBuckets = {{700, 1000}, {3, 700}, {0, 3}};

std::vector<float> Gradient(int rank, int64_t step) {
  std::mt19937 rng(static_cast<unsigned>(rank * 1000 + step));
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> g(kN);
  for (float& v : g) v = dist(rng);
  return g;
}

// The exchange whose overlapped sum is tested: a PeerExchange, or a WorkersWarmupExchange
// (a PeerExchange stands in for its shards' compressed stage, which the warmup never uses).
enum class Overlapping { kPeer, kWorkersWarmup };

struct Overlapped {
  std::unique_ptr<Exchange> exchange;
  OverlappedWarmup* overlap = nullptr;
};

absl::StatusOr<Overlapped> MakeOverlapped(Overlapping which, kernels::Backend* backend,
                                          Transport* t, const ExactAllreduceOptions& exact) {
  absl::StatusOr<std::unique_ptr<PeerExchange>> peer =
      PeerExchange::Create(backend, t, kN, exact);
  if (!peer.ok()) return peer.status();
  Overlapped o;
  if (which == Overlapping::kPeer) {
    o.overlap = &(*peer)->overlap();
    o.exchange = *std::move(peer);
    return o;
  }
  absl::StatusOr<std::unique_ptr<WorkersWarmupExchange>> workers =
      WorkersWarmupExchange::Create(backend, t, kN, exact, *std::move(peer));
  if (!workers.ok()) return workers.status();
  o.overlap = &(*workers)->overlap();
  o.exchange = *std::move(workers);
  return o;
}

// For every step: the overlapped sum (the first `announced` buckets announced from another
// thread while this one waits, the rest taken by SumGradients) equals, bit for bit, the
// plain sum of a PeerExchange on the same transport.
void ExpectSameBits(TransportKind kind, int w, kernels::WireDtype dtype,
                    Overlapping which = Overlapping::kPeer) {
  const absl::Status status = RunLocalGroup(kind, w, [&](Transport& t) -> absl::Status {
    auto backend = kernels::NewCpuBackend();
    ExactAllreduceOptions exact;
    exact.wire_dtype = dtype;
    absl::StatusOr<Overlapped> made = MakeOverlapped(which, backend.get(), &t, exact);
    auto plain = PeerExchange::Create(backend.get(), &t, kN, exact);
    if (!made.ok()) return made.status();
    if (!plain.ok()) return plain.status();
    Exchange* overlapped = made->exchange.get();
    OverlappedWarmup& overlap = *made->overlap;
    if (absl::Status s = overlap.Enable(kBuckets); !s.ok()) return s;
    for (int64_t step = 1; step <= 4; ++step) {
      const size_t announced = static_cast<size_t>(step - 1);  // 0..3 buckets announced
      const std::vector<float> g = Gradient(t.rank(), step);
      if (absl::Status s = overlap.Begin(step, g.data()); !s.ok()) return s;
      std::thread compute([&] {
        for (size_t b = 0; b < announced; ++b) {
          overlap.BucketReady(kBuckets[b].first, kBuckets[b].second);
        }
      });
      compute.join();
      auto sum = overlapped->SumGradients(step, g.data());
      if (!sum.ok()) return sum.status();
      const std::vector<float> got(*sum, *sum + kN);
      auto expected = (*plain)->SumGradients(step, g.data());
      if (!expected.ok()) return expected.status();
      EXPECT_EQ(got, std::vector<float>(*expected, *expected + kN))
          << "rank " << t.rank() << " step " << step;
    }
    EXPECT_GT(overlap.busy_seconds(), 0.0);
    return absl::OkStatus();
  });
  EXPECT_TRUE(status.ok()) << status;
}

TEST(PeerExchangeOverlapTest, BucketsGiveTheBitsOfOneSum) {
  for (const int w : {2, 3, 4}) {
    SCOPED_TRACE(absl::StrCat("inproc W=", w));
    ExpectSameBits(TransportKind::kInproc, w, kernels::WireDtype::kFp32);
  }
  SCOPED_TRACE("gloo W=3");
  ExpectSameBits(TransportKind::kGloo, 3, kernels::WireDtype::kFp32);
}

TEST(PeerExchangeOverlapTest, AWarmupBetweenTheWorkersOfAPsJobOverlapsToo) {
  for (const int w : {2, 3}) {
    SCOPED_TRACE(absl::StrCat("inproc W=", w));
    ExpectSameBits(TransportKind::kInproc, w, kernels::WireDtype::kFp32,
                   Overlapping::kWorkersWarmup);
  }
  SCOPED_TRACE("gloo W=3");
  ExpectSameBits(TransportKind::kGloo, 3, kernels::WireDtype::kFp32, Overlapping::kWorkersWarmup);
}

TEST(PeerExchangeOverlapTest, BucketsGiveTheBitsOfOneSumOnA16BitWire) {
  ExpectSameBits(TransportKind::kInproc, 3, kernels::WireDtype::kBf16);
  ExpectSameBits(TransportKind::kInproc, 2, kernels::WireDtype::kFp16);
}

TEST(PeerExchangeOverlapTest, BucketsMustPartitionTheGradient) {
  const absl::Status status = RunLocalGroup(TransportKind::kInproc, 1, [&](Transport& t) {
    auto backend = kernels::NewCpuBackend();
    auto e = PeerExchange::Create(backend.get(), &t, kN);
    EXPECT_TRUE(e.ok()) << e.status();
    const float g[1] = {0.0f};
    EXPECT_EQ((*e)->overlap().Begin(1, g).code(), absl::StatusCode::kFailedPrecondition);
    for (const Buckets& bad : {Buckets{}, Buckets{{0, 500}}, Buckets{{0, 500}, {501, 1000}},
                               Buckets{{0, 600}, {500, 1000}}, Buckets{{0, 0}, {0, 1000}},
                               Buckets{{0, 1000}, {1000, 1001}}}) {
      const absl::Status s = (*e)->overlap().Enable(bad);
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
      EXPECT_FALSE((*e)->overlap().enabled());
    }
    EXPECT_TRUE((*e)->overlap().Enable(kBuckets).ok());
    EXPECT_EQ((*e)->overlap().Enable(kBuckets).code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_TRUE((*e)->overlap().Begin(1, g).ok());
    EXPECT_EQ((*e)->overlap().Begin(1, g).code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_TRUE((*e)->overlap().End().ok());
    return absl::OkStatus();
  });
  EXPECT_TRUE(status.ok()) << status;
}

// A workload that announces out of order fails the step on every rank (no bucket moves),
// and the next step works.
TEST(PeerExchangeOverlapTest, AnOutOfOrderAnnouncementFailsTheStep) {
  const absl::Status status = RunLocalGroup(TransportKind::kInproc, 2, [&](Transport& t) {
    auto backend = kernels::NewCpuBackend();
    auto e = PeerExchange::Create(backend.get(), &t, kN);
    EXPECT_TRUE(e.ok()) << e.status();
    EXPECT_TRUE((*e)->overlap().Enable(kBuckets).ok());
    const std::vector<float> g = Gradient(t.rank(), 1);
    EXPECT_TRUE((*e)->overlap().Begin(1, g.data()).ok());
    (*e)->overlap().BucketReady(0, 3);
    auto sum = (*e)->SumGradients(1, g.data());
    EXPECT_EQ(sum.status().code(), absl::StatusCode::kInternal);
    EXPECT_THAT(std::string(sum.status().message()), HasSubstr("expected [700, 1000)"));
    EXPECT_EQ(t.bytes_sent(), 0u);
    // A sum for another step than the open one is refused too.
    EXPECT_TRUE((*e)->overlap().Begin(2, g.data()).ok());
    EXPECT_EQ((*e)->SumGradients(3, g.data()).status().code(),
              absl::StatusCode::kFailedPrecondition);
    EXPECT_TRUE((*e)->overlap().Begin(4, g.data()).ok());
    for (const auto& [begin, end] : kBuckets) (*e)->overlap().BucketReady(begin, end);
    EXPECT_TRUE((*e)->SumGradients(4, g.data()).ok());
    EXPECT_GT(t.bytes_sent(), 0u);
    return absl::OkStatus();
  });
  EXPECT_TRUE(status.ok()) << status;
}

// A peer that vanishes mid-step: the exchange thread's error comes back from SumGradients
// (the transport ends the bucket's exchange), nothing hangs.
TEST(PeerExchangeOverlapTest, AVanishedPeerEndsTheStepWithAnError) {
  absl::Status survivor;
  const absl::Status status = RunLocalGroup(TransportKind::kGloo, 2, [&](Transport& t) {
    auto backend = kernels::NewCpuBackend();
    auto e = PeerExchange::Create(backend.get(), &t, kN);
    if (!e.ok()) return e.status();
    if (absl::Status s = (*e)->overlap().Enable(kBuckets); !s.ok()) return s;
    if (t.rank() == 1) return absl::AbortedError("rank 1 vanishes");
    const std::vector<float> g = Gradient(0, 1);
    if (absl::Status s = (*e)->overlap().Begin(1, g.data()); !s.ok()) return s;
    for (const auto& [begin, end] : kBuckets) (*e)->overlap().BucketReady(begin, end);
    survivor = (*e)->SumGradients(1, g.data()).status();
    return survivor;
  });
  EXPECT_FALSE(status.ok());
  EXPECT_FALSE(survivor.ok());
  EXPECT_THAT(std::string(survivor.message()), HasSubstr("overlapped exchange of gradient [700, 1000)"));
}

}  // namespace
}  // namespace onebit

namespace onebit {
namespace {

// fp16's overflow agreement over a real transport: any rank's overflow reaches every rank.
TEST(PeerExchangeTest, EveryRankLearnsWhetherAnyGradientOverflowed) {
  for (TransportKind kind : {TransportKind::kInproc, TransportKind::kGloo}) {
    constexpr int kW = 3;
    std::vector<std::vector<int>> answers(kW);
    const absl::Status status = RunLocalGroup(kind, kW, [&](Transport& t) -> absl::Status {
      auto backend = kernels::NewCpuBackend();
      auto e = PeerExchange::Create(backend.get(), &t, kN);
      if (!e.ok()) return e.status();
      for (int64_t step = 1; step <= 4; ++step) {
        // Steps 1-3: rank step-1 alone overflows; step 4: none.
        absl::StatusOr<bool> any = (*e)->AnyOverflow(step, t.rank() == step - 1);
        if (!any.ok()) return any.status();
        answers[t.rank()].push_back(*any);
      }
      return absl::OkStatus();
    });
    ASSERT_TRUE(status.ok()) << status;
    for (int r = 0; r < kW; ++r) EXPECT_EQ(answers[r], (std::vector<int>{1, 1, 1, 0})) << r;
  }
}

// buffer_bytes (metrics): at least the worker error (padded n) and the warmup's whole sum
// (n); the overlapped warmup's n-element sum once enabled; a WorkersWarmupExchange counts
// its own warmup beside the compressed exchange it wraps.
TEST(PeerExchangeTest, BufferBytesCountTheBuffers) {
  constexpr int kW = 2;
  const absl::Status status = RunLocalGroup(TransportKind::kInproc, kW, [&](Transport& t) {
    auto backend = kernels::NewCpuBackend();
    absl::StatusOr<Overlapped> peer =
        MakeOverlapped(Overlapping::kPeer, backend.get(), &t, ExactAllreduceOptions());
    if (!peer.ok()) return peer.status();
    const uint64_t before = peer->exchange->buffer_bytes();
    EXPECT_GE(before, 2 * kN * sizeof(float));
    if (absl::Status s = peer->overlap->Enable(kBuckets); !s.ok()) return s;
    EXPECT_GE(peer->exchange->buffer_bytes(), before + kN * sizeof(float));

    absl::StatusOr<Overlapped> workers =
        MakeOverlapped(Overlapping::kWorkersWarmup, backend.get(), &t, ExactAllreduceOptions());
    if (!workers.ok()) return workers.status();
    EXPECT_GE(workers->exchange->buffer_bytes(), before + kN * sizeof(float));
    return absl::OkStatus();
  });
  EXPECT_TRUE(status.ok()) << status;
}

}  // namespace
}  // namespace onebit
