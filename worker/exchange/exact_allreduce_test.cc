#include "worker/exchange/exact_allreduce.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/kernels.h"
#include "kernels/kernels_reference.h"
#include "worker/transport/local_group.h"

namespace onebit {
namespace {

using kernels::WireDtype;

std::vector<float> Input(int rank, size_t n, float scale) {
  std::mt19937 rng(rank + 1);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> x(n);
  for (float& v : x) v = dist(rng);
  return x;
}

// The float64 model of the exchange (rounding from kernels_reference, written from the
// formats' definitions): every value rounded to the wire format, summed in rank order from
// 0 with float32 adds (done in float64 and rounded to float32: the same, as float64 has
// more than twice float32's precision), the sum rounded to the wire format.
std::vector<float> ModelSum(int w, size_t n, WireDtype dtype, float scale) {
  std::vector<std::vector<float>> x;
  for (int r = 0; r < w; ++r) x.push_back(Input(r, n, scale));
  std::vector<float> sum(n);
  for (size_t i = 0; i < n; ++i) {
    double s = 0.0;
    for (int j = 0; j < w; ++j) {
      s = static_cast<float>(s + kernels::reference::RoundToWire(dtype, x[j][i]));
    }
    sum[i] = static_cast<float>(kernels::reference::RoundToWire(dtype, s));
  }
  return sum;
}

struct RankResult {
  std::vector<float> sum;
  uint64_t sent = 0, received = 0;
};

std::vector<RankResult> Run(TransportKind kind, int w, size_t n,
                            const ExactAllreduceOptions& options, float scale, int calls = 1) {
  std::vector<RankResult> out(w);
  const absl::Status status = RunLocalGroup(kind, w, [&](Transport& t) -> absl::Status {
    auto backend = kernels::NewCpuBackend();
    auto a = ExactAllreduce::Create(backend.get(), &t, n, options);
    if (!a.ok()) return a.status();
    const std::vector<float> in = Input(t.rank(), n, scale);
    for (int k = 0; k < calls; ++k) {  // a second call must give the same bits
      if (absl::Status s = (*a)->Run(in.data()); !s.ok()) return s;
    }
    out[t.rank()].sum.assign((*a)->result(), (*a)->result() + n);
    out[t.rank()].sent = t.bytes_sent();
    out[t.rank()].received = t.bytes_received();
    return absl::OkStatus();
  });
  EXPECT_TRUE(status.ok()) << status;
  return out;
}

// Small segments cost one SendRecv each (a few ms with gloo on a loaded machine), so
// `max_n` bounds the lengths swept with them, and only some sweeps run over gloo too.
void ExpectModel(WireDtype dtype, size_t segment, float scale, size_t max_n = 10007,
                 bool gloo = false, int max_in_flight = ExactAllreduceOptions().max_in_flight) {
  for (int w : {1, 2, 3, 5, 8}) {
    for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{1000}, size_t{10007}}) {
      if (n > max_n) continue;
      ExactAllreduceOptions options;
      options.wire_dtype = dtype;
      options.segment_elements = segment;
      options.max_in_flight = max_in_flight;
      const std::vector<float> want = ModelSum(w, n, dtype, scale);
      const size_t chunk = (n + w - 1) / w;
      for (TransportKind kind : {TransportKind::kInproc, TransportKind::kGloo}) {
        if (kind == TransportKind::kGloo && !gloo) continue;
        const auto got = Run(kind, w, n, options, scale, /*calls=*/2);
        for (int r = 0; r < w; ++r) {
          const std::string where =
              absl::StrCat(kind == TransportKind::kGloo ? "gloo" : "inproc", " W=", w,
                           " n=", n, " dtype=", kernels::WireDtypeName(dtype),
                           " segment=", segment, " in flight=", max_in_flight,
                           " rank=", r);
          ASSERT_EQ(got[r].sum.size(), n) << where;
          // Bitwise: memcmp, skipped for n = 0 (an empty vector's data() may be null).
          if (n > 0) {
            ASSERT_EQ(0, std::memcmp(got[r].sum.data(), want.data(), n * sizeof(float)))
                << where;
          }
          // Two calls; each sends the other ranks' chunks to them and its own chunk of the
          // sum to the W-1 others, and receives as much.
          const size_t mine = r * chunk >= n ? 0 : std::min(chunk, n - r * chunk);
          const uint64_t wire = ((n - mine) + (w - 1) * mine) * kernels::WireDtypeBytes(dtype);
          EXPECT_EQ(got[r].sent, 2 * wire) << where;
          EXPECT_EQ(got[r].received, 2 * wire) << where;
        }
      }
    }
  }
}

TEST(ExactAllreduceTest, Fp32MatchesTheRankOrderModelOverEveryTransport) {
  ExpectModel(WireDtype::kFp32, ExactAllreduceOptions().segment_elements, 1.0f, 10007,
              /*gloo=*/true);
  ExpectModel(WireDtype::kFp32, 97, 1.0f, 10007, /*gloo=*/true);  // the last segment short
  ExpectModel(WireDtype::kFp32, 3, 1.0f, /*max_n=*/1000);
}

// Over gloo the calls really are in flight together: a segment is summed while later ones
// move, and its all-gather waits only for that sum. Any depth gives the same bits.
TEST(ExactAllreduceTest, PipelineDepthChangesNoBit) {
  for (int depth : {1, 3, 16}) {
    ExpectModel(WireDtype::kFp32, 97, 1.0f, 10007, /*gloo=*/true, depth);
  }
  ExpectModel(WireDtype::kBf16, 13, 1.0f, 1000, /*gloo=*/true, 5);
}

// Ring order: chunk v summed from 0.0f in the order v+1, v+2, ..., v (mod W), float32
// adds, on every rank and transport; bytes as a ring allreduce moves them.
TEST(ExactAllreduceTest, RingOrderMatchesItsModelOverEveryTransport) {
  for (int w : {1, 2, 3, 4, 5}) {
    for (size_t n : {size_t{1}, size_t{7}, size_t{1000}, size_t{10007}}) {
      std::vector<std::vector<float>> x;
      for (int r = 0; r < w; ++r) x.push_back(Input(r, n, 1.0f));
      x[0][0] = -0.0f;  // -0 from one rank and +0 sums agree with the model's 0.0f start
      const size_t chunk = (n + w - 1) / w;
      std::vector<float> want(n);
      for (size_t i = 0; i < n; ++i) {
        const int v = static_cast<int>(i / chunk);
        float sum = 0.0f;
        for (int j = 1; j <= w; ++j) sum += x[(v + j) % w][i];
        want[i] = sum;
      }
      for (auto [segment, depth] : {std::pair<size_t, int>{1 << 20, 2}, {97, 1}, {13, 5}}) {
        ExactAllreduceOptions options;
        options.order = SumOrder::kRing;
        options.segment_elements = segment;
        options.max_in_flight = depth;
        for (TransportKind kind : {TransportKind::kInproc, TransportKind::kGloo}) {
          std::vector<std::vector<float>> got(w);
          std::vector<uint64_t> sent(w), received(w);
          const absl::Status status = RunLocalGroup(kind, w, [&](Transport& t) -> absl::Status {
            auto backend = kernels::NewCpuBackend();
            auto a = ExactAllreduce::Create(backend.get(), &t, n, options);
            if (!a.ok()) return a.status();
            for (int call = 0; call < 2; ++call) {
              if (absl::Status s = (*a)->Run(x[t.rank()].data()); !s.ok()) return s;
            }
            got[t.rank()].assign((*a)->result(), (*a)->result() + n);
            sent[t.rank()] = t.bytes_sent();
            received[t.rank()] = t.bytes_received();
            return absl::OkStatus();
          });
          ASSERT_TRUE(status.ok()) << status;
          for (int r = 0; r < w; ++r) {
            const std::string where =
                absl::StrCat(kind == TransportKind::kGloo ? "gloo" : "inproc", " W=", w,
                             " n=", n, " segment=", segment, " depth=", depth, " rank=", r);
            ASSERT_EQ(0, std::memcmp(got[r].data(), want.data(), n * sizeof(float))) << where;
            // Sends every chunk but its own, then every chunk but rank r+1's; receives every
            // chunk but rank r-1's, then every chunk but its own (two calls).
            auto count = [&](int c) {
              const size_t b = c * chunk;
              return b >= n ? size_t{0} : std::min(chunk, n - b);
            };
            const uint64_t out = w == 1 ? 0 : 2 * n - count(r) - count((r + 1) % w);
            const uint64_t in = w == 1 ? 0 : 2 * n - count((r + w - 1) % w) - count(r);
            EXPECT_EQ(sent[r], 2 * out * sizeof(float)) << where;
            EXPECT_EQ(received[r], 2 * in * sizeof(float)) << where;
          }
        }
      }
    }
  }
}

TEST(ExactAllreduceTest, Bf16MatchesTheFloat64Model) {
  ExpectModel(WireDtype::kBf16, ExactAllreduceOptions().segment_elements, 1.0f, 10007,
              /*gloo=*/true);
  ExpectModel(WireDtype::kBf16, 5, 1.0f, /*max_n=*/1000);
}

TEST(ExactAllreduceTest, Fp16MatchesTheFloat64ModelWithSubnormalsAndOverflow) {
  ExpectModel(WireDtype::kFp16, ExactAllreduceOptions().segment_elements, 1.0f, 10007,
              /*gloo=*/true);
  ExpectModel(WireDtype::kFp16, 7, 1e-6f, 1000);  // values among fp16's subnormals
  ExpectModel(WireDtype::kFp16, 500, 3e4f);       // sums past 65504 become inf
}

// The parameter-server shards' warmup sum (rank order from 0.0f, compression/layout.h),
// written out: peer and ps mode must give the same bits. -0 from every rank sums to +0.
TEST(ExactAllreduceTest, GivesTheShardsRankOrderSum) {
  const size_t n = 10007;
  const int w = 3;
  std::vector<std::vector<float>> in;
  for (int r = 0; r < w; ++r) in.push_back(Input(r, n, 1.0f));
  for (int r = 0; r < w; ++r) in[r][5] = -0.0f;
  std::vector<std::vector<float>> got(w);
  const absl::Status status =
      RunLocalGroup(TransportKind::kGloo, w, [&](Transport& t) -> absl::Status {
        auto backend = kernels::NewCpuBackend();
        auto a = ExactAllreduce::Create(backend.get(), &t, n);
        if (!a.ok()) return a.status();
        if (absl::Status s = (*a)->Run(in[t.rank()].data()); !s.ok()) return s;
        got[t.rank()].assign((*a)->result(), (*a)->result() + n);
        return absl::OkStatus();
      });
  ASSERT_TRUE(status.ok()) << status;
  std::vector<float> want(n, 0.0f);
  for (int r = 0; r < w; ++r) {
    for (size_t i = 0; i < n; ++i) want[i] += in[r][i];
  }
  EXPECT_FALSE(std::signbit(want[5]));
  for (int r = 0; r < w; ++r) {
    ASSERT_EQ(0, std::memcmp(got[r].data(), want.data(), n * sizeof(float))) << "rank " << r;
  }
}

TEST(ExactAllreduceTest, RejectsBadOptions) {
  const absl::Status status = RunLocalGroup(TransportKind::kInproc, 1, [](Transport& t) {
    auto backend = kernels::NewCpuBackend();
    ExactAllreduceOptions options;
    options.segment_elements = 0;
    auto a = ExactAllreduce::Create(backend.get(), &t, 10, options);
    EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument);
    options = ExactAllreduceOptions();
    options.max_in_flight = 0;
    a = ExactAllreduce::Create(backend.get(), &t, 10, options);
    EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument);
    return absl::OkStatus();
  });
  EXPECT_TRUE(status.ok()) << status;
  EXPECT_EQ(ParseWireDtype("bf16").value(), WireDtype::kBf16);
  EXPECT_EQ(ParseWireDtype("fp16").value(), WireDtype::kFp16);
  EXPECT_EQ(ParseWireDtype("fp32").value(), WireDtype::kFp32);
  EXPECT_EQ(ParseWireDtype("fp8").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseSumOrder("ring").value(), SumOrder::kRing);
  EXPECT_EQ(ParseSumOrder("rank").value(), SumOrder::kRank);
  EXPECT_EQ(ParseSumOrder("tree").status().code(), absl::StatusCode::kInvalidArgument);
  // The ring sums on the wire: fp32 only.
  const absl::Status ring = RunLocalGroup(TransportKind::kInproc, 1, [](Transport& t) {
    auto backend = kernels::NewCpuBackend();
    ExactAllreduceOptions options;
    options.order = SumOrder::kRing;
    options.wire_dtype = WireDtype::kBf16;
    EXPECT_EQ(ExactAllreduce::Create(backend.get(), &t, 10, options).status().code(),
              absl::StatusCode::kInvalidArgument);
    return absl::OkStatus();
  });
  EXPECT_TRUE(ring.ok()) << ring;
}

}  // namespace
}  // namespace onebit
