// One conformance suite for every host-memory Transport, gloo style: each rank is a thread
// with its own transport, swept over transport x world size x length. Lengths include 0
// and values that are not multiples of 4, 8 or W (the bit-packing edge cases of the
// compressed exchange). Then the failure behaviour each transport promises: deadlines,
// mismatched calls and aborts for in-process, a vanished or silent peer for gloo.
#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/transport/gloo_transport.h"
#include "worker/transport/inproc_transport.h"
#include "worker/transport/transport.h"

namespace onebit {
namespace {

using ::testing::AnyOf;
using ::testing::HasSubstr;

enum class Kind { kInproc, kGloo };

std::string KindName(Kind kind) { return kind == Kind::kInproc ? "Inproc" : "Gloo"; }

// Makes the transports of one group. Connect(rank) runs in rank's own thread: creating a
// gloo transport is collective and blocks until every rank has joined.
class GroupFactory {
 public:
  virtual ~GroupFactory() = default;
  virtual absl::StatusOr<std::unique_ptr<Transport>> Connect(int rank) = 0;
};

class InprocFactory : public GroupFactory {
 public:
  InprocFactory(int world_size, absl::Duration deadline)
      : hub_(InprocHub::Create(world_size, deadline).value()) {}
  absl::StatusOr<std::unique_ptr<Transport>> Connect(int rank) override {
    absl::StatusOr<std::unique_ptr<InprocTransport>> t = hub_->Connect(rank);
    if (!t.ok()) return t.status();
    return std::unique_ptr<Transport>(std::move(*t));
  }

 private:
  std::shared_ptr<InprocHub> hub_;
};

class GlooFactory : public GroupFactory {
 public:
  GlooFactory(int world_size, absl::Duration timeout)
      : store_(NewInMemoryStore()), world_size_(world_size) {
    options_.timeout = timeout;
  }
  absl::StatusOr<std::unique_ptr<Transport>> Connect(int rank) override {
    absl::StatusOr<std::unique_ptr<GlooTransport>> t =
        GlooTransport::Create(store_, rank, world_size_, options_);
    if (!t.ok()) return t.status();
    return std::unique_ptr<Transport>(std::move(*t));
  }

 private:
  std::shared_ptr<gloo::rendezvous::Store> store_;
  const int world_size_;
  GlooOptions options_;
};

std::unique_ptr<GroupFactory> MakeFactory(Kind kind, int world_size, absl::Duration timeout) {
  if (kind == Kind::kInproc) return std::make_unique<InprocFactory>(world_size, timeout);
  return std::make_unique<GlooFactory>(world_size, timeout);
}

// Runs body(transport) for every rank of a fresh group, one thread per rank, and joins.
// The timeout only bounds a broken run; a passing one never waits for it.
void RunGroup(Kind kind, int world_size, const std::function<void(Transport&)>& body,
              absl::Duration timeout = absl::Seconds(20)) {
  std::unique_ptr<GroupFactory> factory = MakeFactory(kind, world_size, timeout);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world_size; ++rank) {
    threads.emplace_back([&factory, &body, rank] {
      absl::StatusOr<std::unique_ptr<Transport>> transport = factory->Connect(rank);
      ASSERT_TRUE(transport.ok()) << "rank " << rank << ": " << transport.status();
      ASSERT_EQ((*transport)->rank(), rank);
      body(**transport);
    });
  }
  for (std::thread& t : threads) t.join();
}

// Lengths of the sweep (bytes per block, or floats for AllReduceSum). The full sweep runs
// for every world size, gloo at W=11 included: the whole suite takes about 10 s on 2 cores.
const std::vector<size_t>& Lengths() {
  static const auto* lengths = new std::vector<size_t>{0, 1, 4, 7, 100, 1000, 10000};
  return *lengths;
}

// Distinct per (sender, receiver, offset), so a misrouted block is caught.
uint8_t PatternByte(int from, int to, size_t i) {
  return static_cast<uint8_t>(from * 37 + to * 11 + i * 7 + 1);
}

// Small integers: their float sums over at most 11 ranks are exact in any order.
int PatternInt(int rank, size_t i) { return static_cast<int>((i * 7 + rank * 3) % 19) - 9; }

template <typename T>
std::string FirstDifference(const std::vector<T>& actual, const std::vector<T>& expected) {
  if (actual.size() != expected.size()) {
    return absl::StrCat("sizes differ: ", actual.size(), " vs ", expected.size());
  }
  for (size_t i = 0; i < actual.size(); ++i) {
    if (!(actual[i] == expected[i])) {
      return absl::StrCat("first difference at ", i, ": ", +actual[i], " vs ", +expected[i]);
    }
  }
  return "equal";
}

// Bytes of a ring allreduce of `bytes` over w ranks, each way, as transport.h defines it.
uint64_t RingBytes(uint64_t bytes, int w) { return 2 * (w - 1) * bytes / w; }

// The shared formula, against values worked out by hand.
TEST(RingAllReduceWireBytesTest, CountsTwoTimesWMinusOneOverWRoundedDownOnce) {
  EXPECT_EQ(RingAllReduceWireBytes(28, 1), 0u);   // alone: nothing moves
  EXPECT_EQ(RingAllReduceWireBytes(28, 2), 28u);  // 2 * 1/2
  EXPECT_EQ(RingAllReduceWireBytes(28, 3), 37u);  // 112/3 = 37.33: once, not 2 * 18
  EXPECT_EQ(RingAllReduceWireBytes(0, 5), 0u);
  // 10 GB over 8 ranks: no 32-bit overflow in the product.
  EXPECT_EQ(RingAllReduceWireBytes(10'000'000'000ull, 8), 17'500'000'000ull);
}

// ---- Conformance suite: both transports x world size ----

class TransportConformance : public ::testing::TestWithParam<std::tuple<Kind, int>> {
 protected:
  Kind kind() const { return std::get<0>(GetParam()); }
  int world_size() const { return std::get<1>(GetParam()); }
};

TEST_P(TransportConformance, AllToAllRoutesEveryBlock) {
  RunGroup(kind(), world_size(), [&](Transport& t) {
    const int w = t.world_size();
    const int r = t.rank();
    // Both sides of gloo's limit between every shift at once and one at a time.
    std::vector<size_t> blocks = Lengths();
    blocks.push_back(GlooTransport::kAllInFlightMaxBlockBytes);
    blocks.push_back(GlooTransport::kAllInFlightMaxBlockBytes + 3);
    uint64_t sent = t.bytes_sent();
    for (size_t block : blocks) {
      SCOPED_TRACE(absl::StrCat("rank ", r, " block_bytes ", block));
      std::vector<uint8_t> send(w * block), recv(w * block, 0xEE), expected(w * block);
      for (int j = 0; j < w; ++j) {
        for (size_t i = 0; i < block; ++i) {
          send[j * block + i] = PatternByte(r, j, i);
          expected[j * block + i] = PatternByte(j, r, i);
        }
      }
      ASSERT_TRUE(t.AllToAll(send.data(), recv.data(), block).ok());
      ASSERT_TRUE(recv == expected) << FirstDifference(recv, expected);
      sent += static_cast<uint64_t>(w - 1) * block;
      EXPECT_EQ(t.bytes_sent(), sent);
      EXPECT_EQ(t.bytes_received(), sent);
    }
  });
}

TEST_P(TransportConformance, AllGatherCollectsEveryRank) {
  RunGroup(kind(), world_size(), [&](Transport& t) {
    const int w = t.world_size();
    const int r = t.rank();
    // gloo posts every shift at once for blocks up to its limit and one at a time above it:
    // both sides of the limit.
    std::vector<size_t> blocks = Lengths();
    blocks.push_back(GlooTransport::kAllInFlightMaxBlockBytes);
    blocks.push_back(GlooTransport::kAllInFlightMaxBlockBytes + 3);
    uint64_t sent = t.bytes_sent();
    for (size_t block : blocks) {
      SCOPED_TRACE(absl::StrCat("rank ", r, " block_bytes ", block));
      std::vector<uint8_t> send(block), recv(w * block, 0xEE), expected(w * block);
      for (size_t i = 0; i < block; ++i) send[i] = PatternByte(r, 0, i);
      for (int j = 0; j < w; ++j) {
        for (size_t i = 0; i < block; ++i) expected[j * block + i] = PatternByte(j, 0, i);
      }
      ASSERT_TRUE(t.AllGather(send.data(), recv.data(), block).ok());
      ASSERT_TRUE(recv == expected) << FirstDifference(recv, expected);
      sent += static_cast<uint64_t>(w - 1) * block;
      EXPECT_EQ(t.bytes_sent(), sent);
      EXPECT_EQ(t.bytes_received(), sent);
    }
  });
}

TEST_P(TransportConformance, AllReduceSumIsExact) {
  RunGroup(kind(), world_size(), [&](Transport& t) {
    const int w = t.world_size();
    const int r = t.rank();
    for (size_t count : Lengths()) {
      SCOPED_TRACE(absl::StrCat("rank ", r, " count ", count));
      std::vector<float> data(count), expected(count);
      for (size_t i = 0; i < count; ++i) {
        data[i] = static_cast<float>(PatternInt(r, i));
        int sum = 0;
        for (int j = 0; j < w; ++j) sum += PatternInt(j, i);
        expected[i] = static_cast<float>(sum);
      }
      ASSERT_TRUE(t.AllReduceSum(data.data(), count).ok());
      ASSERT_TRUE(data == expected) << FirstDifference(data, expected);
    }
  });
}

TEST_P(TransportConformance, BarrierHoldsEveryoneBack) {
  std::atomic<int> arrivals{0};
  RunGroup(kind(), world_size(), [&](Transport& t) {
    const int w = t.world_size();
    for (int round = 1; round <= 3; ++round) {
      arrivals.fetch_add(1);
      ASSERT_TRUE(t.Barrier().ok());
      // Nobody leaves the barrier before everyone has counted this round...
      EXPECT_GE(arrivals.load(), round * w) << "rank " << t.rank() << " round " << round;
      // ...and nobody counts the next round before everyone has checked.
      ASSERT_TRUE(t.Barrier().ok());
    }
  });
}

TEST_P(TransportConformance, ByteCountersFollowTheContract) {
  RunGroup(kind(), world_size(), [&](Transport& t) {
    const int w = t.world_size();
    EXPECT_EQ(t.bytes_sent(), 0u);
    EXPECT_EQ(t.bytes_received(), 0u);
    std::vector<uint8_t> send(w * 100), recv(w * 100);
    ASSERT_TRUE(t.AllToAll(send.data(), recv.data(), 100).ok());
    ASSERT_TRUE(t.AllGather(send.data(), recv.data(), 10).ok());
    std::vector<float> data(7);  // 28 bytes: (W-1)/W of it is fractional for most W
    ASSERT_TRUE(t.AllReduceSum(data.data(), data.size()).ok());
    ASSERT_TRUE(t.Barrier().ok());
    ASSERT_TRUE(t.AllToAll(nullptr, nullptr, 0).ok());
    // Copies to self are free; the barrier carries no payload.
    const uint64_t expected = (w - 1) * 100 + (w - 1) * 10 + RingBytes(28, w);
    EXPECT_EQ(t.bytes_sent(), expected) << "rank " << t.rank();
    EXPECT_EQ(t.bytes_received(), expected) << "rank " << t.rank();
  });
}

TEST_P(TransportConformance, SizesMayChangeFromCallToCall) {
  // Interleaves collectives of different kinds and sizes, as the compressed exchange does.
  RunGroup(kind(), world_size(), [&](Transport& t) {
    const int w = t.world_size();
    const int r = t.rank();
    for (size_t n : {8u, 0u, 3u, 64u}) {
      std::vector<uint8_t> send(w * n), recv(w * n);
      for (int j = 0; j < w; ++j) {
        for (size_t i = 0; i < n; ++i) send[j * n + i] = PatternByte(r, j, i);
      }
      ASSERT_TRUE(t.AllToAll(send.data(), recv.data(), n).ok());
      for (int j = 0; j < w; ++j) {
        for (size_t i = 0; i < n; ++i) ASSERT_EQ(recv[j * n + i], PatternByte(j, r, i));
      }
      std::vector<float> data(n, 1.0f);
      ASSERT_TRUE(t.AllReduceSum(data.data(), n).ok());
      for (float x : data) ASSERT_EQ(x, static_cast<float>(w));
      ASSERT_TRUE(t.AllGather(send.data(), recv.data(), n / 2).ok());
    }
  });
}

// A ring shift in both directions (the exact allreduce's pattern) and a pairwise swap
// (r <-> r^1 where that rank exists, else itself), with sizes that differ per pair.
TEST_P(TransportConformance, SendRecvDeliversAndCountsEachSide) {
  RunGroup(kind(), world_size(), [&](Transport& t) {
    const int w = t.world_size();
    const int r = t.rank();
    uint64_t sent = 0, received = 0;
    for (size_t len : Lengths()) {
      SCOPED_TRACE(absl::StrCat("rank ", r, " bytes ", len));
      for (int shift : {1, w - 1}) {
        const int to = (r + shift) % w, from = (r + w - shift) % w;
        std::vector<uint8_t> send(len), recv(len, 0xEE), expected(len);
        for (size_t i = 0; i < len; ++i) {
          send[i] = PatternByte(r, to, i);
          expected[i] = PatternByte(from, r, i);
        }
        ASSERT_TRUE(t.SendRecv(send.data(), len, to, recv.data(), len, from).ok());
        ASSERT_TRUE(recv == expected) << FirstDifference(recv, expected);
        if (to != r) {
          sent += len;
          received += len;
        }
      }
      // Pairs (0,1), (2,3), ...; the last rank of an odd world pairs with itself. Rank r
      // sends len + r bytes, so the two sides of a pair differ.
      const int peer = (r ^ 1) < w ? (r ^ 1) : r;
      const size_t out_len = len + r, in_len = len + peer;
      std::vector<uint8_t> send(out_len), recv(in_len, 0xEE), expected(in_len);
      for (size_t i = 0; i < out_len; ++i) send[i] = PatternByte(r, peer, i);
      for (size_t i = 0; i < in_len; ++i) expected[i] = PatternByte(peer, r, i);
      ASSERT_TRUE(t.SendRecv(send.data(), out_len, peer, recv.data(), in_len, peer).ok());
      ASSERT_TRUE(recv == expected) << FirstDifference(recv, expected);
      if (peer != r) {
        sent += out_len;
        received += in_len;
      }
    }
    EXPECT_EQ(t.bytes_sent(), sent);
    EXPECT_EQ(t.bytes_received(), received);
  });
}

// Several SendRecv calls in flight at once (gloo posts them; the others run each at once):
// every shift of a ring, all started before any is waited for, then waited in order.
TEST_P(TransportConformance, StartedSendRecvsDeliverInAnyNumberInFlight) {
  RunGroup(kind(), world_size(), [&](Transport& t) {
    const int w = t.world_size();
    const int r = t.rank();
    const size_t len = 1000;
    std::vector<std::vector<uint8_t>> send(w), recv(w);
    std::vector<std::unique_ptr<Transport::PendingSendRecv>> pending;
    uint64_t sent = 0;
    for (int shift = 0; shift < w; ++shift) {
      const int to = (r + shift) % w, from = (r + w - shift) % w;
      send[shift].resize(len + shift);  // sizes differ per shift, agree per pair
      recv[shift].assign(len + shift, 0xEE);
      for (size_t i = 0; i < send[shift].size(); ++i) send[shift][i] = PatternByte(r, to, i);
      auto p = t.StartSendRecv(send[shift].data(), send[shift].size(), to, recv[shift].data(),
                               recv[shift].size(), from);
      ASSERT_TRUE(p.ok()) << p.status();
      pending.push_back(std::move(*p));
      if (to != r) sent += len + shift;
    }
    for (auto& p : pending) ASSERT_TRUE(p->Wait().ok());
    for (auto& p : pending) ASSERT_TRUE(p->Wait().ok());  // again: the same status at once
    for (int shift = 0; shift < w; ++shift) {
      const int from = (r + w - shift) % w;
      std::vector<uint8_t> expected(len + shift);
      for (size_t i = 0; i < expected.size(); ++i) expected[i] = PatternByte(from, r, i);
      ASSERT_TRUE(recv[shift] == expected) << "shift " << shift << ": "
                                           << FirstDifference(recv[shift], expected);
    }
    EXPECT_EQ(t.bytes_sent(), sent);
    EXPECT_EQ(t.bytes_received(), sent);
  });
}

INSTANTIATE_TEST_SUITE_P(
    All, TransportConformance,
    ::testing::Combine(::testing::Values(Kind::kInproc, Kind::kGloo),
                       // 11: a wide group (10 shifts a call, tags in step across ranks).
                       ::testing::Values(1, 2, 3, 4, 5, 8, 11)),
    [](const ::testing::TestParamInfo<std::tuple<Kind, int>>& info) {
      return absl::StrCat(KindName(std::get<0>(info.param)), "_W",
                          std::get<1>(info.param));
    });

// ---- In-process transport: failure behaviour ----

TEST(InprocHubTest, RejectsBadArguments) {
  EXPECT_EQ(InprocHub::Create(0).status().code(), absl::StatusCode::kInvalidArgument);
  std::shared_ptr<InprocHub> hub = InprocHub::Create(2).value();
  EXPECT_EQ(hub->Connect(2).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(hub->Connect(-1).status().code(), absl::StatusCode::kInvalidArgument);
  auto first = hub->Connect(1);
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(hub->Connect(1).status().code(), absl::StatusCode::kAlreadyExists);
}

TEST(InprocTransportTest, MissingRankMakesOthersFailWithDeadlineExceeded) {
  std::shared_ptr<InprocHub> hub = InprocHub::Create(3, absl::Milliseconds(200)).value();
  std::vector<std::unique_ptr<InprocTransport>> t = hub->ConnectAll().value();
  std::vector<absl::Status> status(2);
  const absl::Time start = absl::Now();
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      std::vector<uint8_t> send(4), recv(12);
      status[r] = t[r]->AllGather(send.data(), recv.data(), 4);
    });
  }
  for (std::thread& th : threads) th.join();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  for (const absl::Status& s : status) {
    EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("AllGather"));
    EXPECT_THAT(std::string(s.message()), HasSubstr("ranks [2]"));
  }
  // The latecomer fails at once instead of waiting for ranks that have left.
  const absl::Time late = absl::Now();
  EXPECT_EQ(t[2]->Barrier().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_LT(absl::Now() - late, absl::Milliseconds(100));
}

TEST(InprocTransportTest, MismatchedSizesFailOnEveryRank) {
  std::shared_ptr<InprocHub> hub = InprocHub::Create(3).value();
  std::vector<std::unique_ptr<InprocTransport>> t = hub->ConnectAll().value();
  std::vector<absl::Status> status(3);
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r) {
    threads.emplace_back([&, r] {
      const size_t block = r == 1 ? 8 : 4;  // rank 1 disagrees
      std::vector<uint8_t> send(3 * block), recv(3 * block);
      status[r] = t[r]->AllToAll(send.data(), recv.data(), block);
    });
  }
  for (std::thread& th : threads) th.join();
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(status[r].code(), absl::StatusCode::kInvalidArgument) << status[r];
    EXPECT_THAT(std::string(status[r].message()), HasSubstr("AllToAll"));
    // The transport is unusable after an error (transport.h).
    EXPECT_EQ(t[r]->Barrier(), status[r]);
    EXPECT_EQ(t[r]->bytes_sent(), 0u);
  }
}

TEST(InprocTransportTest, MismatchedCollectivesFailOnEveryRank) {
  std::shared_ptr<InprocHub> hub = InprocHub::Create(2).value();
  std::vector<std::unique_ptr<InprocTransport>> t = hub->ConnectAll().value();
  absl::Status s0, s1;
  std::thread rank0([&] { s0 = t[0]->Barrier(); });
  std::thread rank1([&] { s1 = t[1]->AllReduceSum(nullptr, 0); });
  rank0.join();
  rank1.join();
  EXPECT_EQ(s0.code(), absl::StatusCode::kInvalidArgument) << s0;
  EXPECT_EQ(s1, s0);
}

TEST(InprocTransportTest, SendRecvThatDoesNotPairUpFailsOnEveryRank) {
  std::shared_ptr<InprocHub> hub = InprocHub::Create(3).value();
  std::vector<std::unique_ptr<InprocTransport>> t = hub->ConnectAll().value();
  std::vector<absl::Status> status(3);
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r) {
    threads.emplace_back([&, r] {
      // A ring shift, except that rank 2 expects 8 bytes where rank 1 sends 4.
      std::vector<uint8_t> send(4), recv(8);
      status[r] = t[r]->SendRecv(send.data(), 4, (r + 1) % 3, recv.data(), r == 2 ? 8 : 4,
                                 (r + 2) % 3);
    });
  }
  for (std::thread& th : threads) th.join();
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(status[r].code(), absl::StatusCode::kInvalidArgument) << status[r];
    EXPECT_THAT(std::string(status[r].message()), HasSubstr("SendRecv"));
    EXPECT_EQ(t[r]->bytes_sent(), 0u);
  }
}

TEST(InprocTransportTest, AbortFailsPendingAndLaterCalls) {
  std::shared_ptr<InprocHub> hub = InprocHub::Create(3).value();  // 60 s deadline
  std::vector<std::unique_ptr<InprocTransport>> t = hub->ConnectAll().value();
  std::vector<absl::Status> status(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] { status[r] = t[r]->Barrier(); });
  }
  absl::SleepFor(absl::Milliseconds(50));
  const absl::Time start = absl::Now();
  hub->Abort(absl::CancelledError("operator stop"));
  for (std::thread& th : threads) th.join();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  for (const absl::Status& s : status) EXPECT_EQ(s, absl::CancelledError("operator stop"));
  EXPECT_EQ(t[2]->Barrier(), absl::CancelledError("operator stop"));
}

TEST(InprocTransportTest, DestroyedPeerMakesOthersUnavailable) {
  std::shared_ptr<InprocHub> hub = InprocHub::Create(2).value();
  std::vector<std::unique_ptr<InprocTransport>> t = hub->ConnectAll().value();
  t[1].reset();
  const absl::Status s = t[0]->Barrier();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("rank 1"));
}

// ---- gloo transport: failure behaviour ----

GlooOptions ShortTimeout(absl::Duration timeout) {
  GlooOptions options;
  options.timeout = timeout;
  return options;
}

TEST(GlooTransportTest, CreateRejectsBadArguments) {
  EXPECT_EQ(GlooTransport::Create(nullptr, 0, 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(GlooTransport::Create(NewInMemoryStore(), 2, 2).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(GlooTransport::Create(NewInMemoryStore(), 0, 1, ShortTimeout(absl::ZeroDuration()))
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(GlooTransportTest, CreateTimesOutWhenPeersNeverJoin) {
  const absl::Time start = absl::Now();
  auto t = GlooTransport::Create(NewInMemoryStore(), 0, 2, ShortTimeout(absl::Milliseconds(300)));
  EXPECT_EQ(t.status().code(), absl::StatusCode::kDeadlineExceeded) << t.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
}

TEST(GlooTransportTest, DestroyedPeerMakesOthersFailNotHang) {
  constexpr int kWorld = 3;
  constexpr int kVictim = 2;
  std::vector<absl::Status> second(kWorld), third(kWorld);
  absl::Time start;
  RunGroup(
      Kind::kGloo, kWorld,
      [&](Transport& t) {
        std::vector<float> data(1000, 1.0f);
        ASSERT_TRUE(t.AllReduceSum(data.data(), data.size()).ok());
        if (t.rank() == kVictim) return;  // RunGroup destroys its transport now
        if (t.rank() == 0) start = absl::Now();
        second[t.rank()] = t.AllReduceSum(data.data(), data.size());
        third[t.rank()] = t.Barrier();
      },
      absl::Seconds(2));
  for (int r = 0; r < kWorld; ++r) {
    if (r == kVictim) continue;
    EXPECT_THAT(second[r].code(),
                AnyOf(absl::StatusCode::kUnavailable, absl::StatusCode::kDeadlineExceeded))
        << "rank " << r << ": " << second[r];
    // Unusable after the error: the same status, without touching the network.
    EXPECT_EQ(third[r], second[r]) << "rank " << r;
  }
  EXPECT_LT(absl::Now() - start, absl::Seconds(15));
}

// A peer that vanishes while SendRecv calls are in flight: every Wait returns an error in
// bounded time, later calls fail the same way, and nothing waits on freed buffers.
TEST(GlooTransportTest, VanishedPeerFailsStartedSendRecvs) {
  constexpr int kWorld = 3;
  constexpr int kVictim = 1;
  std::vector<absl::Status> waited(kWorld), later(kWorld);
  absl::Time start;
  RunGroup(
      Kind::kGloo, kWorld,
      [&](Transport& t) {
        ASSERT_TRUE(t.Barrier().ok());
        if (t.rank() == kVictim) return;  // RunGroup destroys its transport now
        if (t.rank() == 0) start = absl::Now();
        const int w = t.world_size(), r = t.rank();
        std::vector<uint8_t> out(1 << 20, 1), in(2 << 20);
        std::vector<std::unique_ptr<Transport::PendingSendRecv>> pending;
        for (int shift = 1; shift < w; ++shift) {
          auto p = t.StartSendRecv(out.data(), out.size(), (r + shift) % w,
                                   in.data() + (shift - 1) * out.size(), out.size(),
                                   (r + w - shift) % w);
          if (!p.ok()) {
            waited[r] = p.status();
            break;
          }
          pending.push_back(std::move(*p));
        }
        for (auto& p : pending) {
          const absl::Status s = p->Wait();
          if (waited[r].ok()) waited[r] = s;
        }
        later[r] = t.Barrier();
      },
      absl::Seconds(2));
  for (int r = 0; r < kWorld; ++r) {
    if (r == kVictim) continue;
    EXPECT_THAT(waited[r].code(),
                AnyOf(absl::StatusCode::kUnavailable, absl::StatusCode::kDeadlineExceeded))
        << "rank " << r << ": " << waited[r];
    EXPECT_FALSE(later[r].ok()) << "rank " << r;
  }
  EXPECT_LT(absl::Now() - start, absl::Seconds(15));
}

TEST(GlooTransportTest, SilentPeerMakesOthersTimeOut) {
  absl::Notification rank0_done;
  absl::Status waited, late;
  RunGroup(
      Kind::kGloo, 2,
      [&](Transport& t) {
        if (t.rank() == 0) {
          waited = t.Barrier();
          rank0_done.Notify();
        } else {
          rank0_done.WaitForNotification();  // connected but silent
          late = t.Barrier();
        }
      },
      absl::Milliseconds(300));
  EXPECT_EQ(waited.code(), absl::StatusCode::kDeadlineExceeded) << waited;
  // Rank 0 closed its connections on the error, so the latecomer fails too.
  EXPECT_FALSE(late.ok());
}

}  // namespace
}  // namespace onebit
