// The canonical order of whole-tensor reductions: stride 0 (and any stride >= the range's
// end) is one Backend call bit for bit; a cut range is its pieces' Backend calls added in
// order; a worker holding one slice computes its pieces from its own copy and, gathered in
// slice order, they give the unsharded bits. On the scalar and AVX2 CPU kernels, and on the
// simulated device (whose pointers the host cannot read, as on a GPU).
#include "worker/optim/sliced_reductions.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/buffer.h"
#include "kernels/kernels.h"
#include "kernels/simulated_device.h"

namespace onebit {
namespace {

constexpr size_t kBig = 3 * 65536 + 17;  // crosses the CPU backend's 65536-element pieces

uint64_t Bits(double x) {
  uint64_t b;
  std::memcpy(&b, &x, sizeof(b));
  return b;
}

std::vector<float> Values(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> x(n);
  for (float& v : x) v = dist(rng);
  return x;
}

TEST(CutAtStrideTest, CutsAtTheMultiplesInside) {
  using R = ElementRange;
  EXPECT_EQ(CutAtStride({3, 20}, 0), (std::vector<R>{{3, 20}}));
  EXPECT_EQ(CutAtStride({3, 20}, 20), (std::vector<R>{{3, 20}}));
  EXPECT_EQ(CutAtStride({3, 20}, 100), (std::vector<R>{{3, 20}}));
  EXPECT_EQ(CutAtStride({3, 20}, 8), (std::vector<R>{{3, 8}, {8, 16}, {16, 20}}));
  EXPECT_EQ(CutAtStride({8, 16}, 8), (std::vector<R>{{8, 16}}));
  EXPECT_EQ(CutAtStride({0, 17}, 8), (std::vector<R>{{0, 8}, {8, 16}, {16, 17}}));
  EXPECT_EQ(CutAtStride({1, 2}, 1), (std::vector<R>{{1, 2}}));
  EXPECT_TRUE(CutAtStride({5, 5}, 8).empty());
  EXPECT_TRUE(CutAtStride({5, 5}, 0).empty());
  // No overflow near the top of size_t.
  const size_t top = std::numeric_limits<size_t>::max();
  EXPECT_EQ(CutAtStride({top - 5, top}, 4), (std::vector<R>{{top - 5, top - 3}, {top - 3, top}}));
}

TEST(CutAtStrideTest, EachSliceGetsItsOwnPiecesWhole) {
  const size_t stride = 6368;  // fashion_mnist's 12,730 parameters over local_size 2
  const size_t n = 12730;
  for (const ElementRange range : {ElementRange{0, 12544}, ElementRange{12544, 12560},
                                   ElementRange{0, n}, ElementRange{6000, 6400}}) {
    std::vector<ElementRange> gathered;
    for (size_t l = 0; l * stride < n; ++l) {
      const ElementRange slice{l * stride, std::min(n, (l + 1) * stride)};
      for (const ElementRange& p : CutAtStride(range, stride, slice)) gathered.push_back(p);
    }
    EXPECT_EQ(gathered, CutAtStride(range, stride)) << range.begin << " " << range.end;
  }
  EXPECT_TRUE(CutAtStride({0, 100}, 50, {200, 300}).empty());
  EXPECT_EQ(CutAtStride({0, 100}, 0, {20, 30}), (std::vector<ElementRange>{{20, 30}}));
}

TEST(CombineTest, InOrderFromZero) {
  EXPECT_EQ(AddInOrder({}), 0.0);
  EXPECT_EQ(Bits(AddInOrder({0.1})), Bits(0.1));
  // Not associative: the order is the contract.
  EXPECT_EQ(Bits(AddInOrder({1e16, 1.0, 1.0})), Bits((0.0 + 1e16 + 1.0) + 1.0));
  EXPECT_EQ(Bits(AddInOrder({1.0, 1.0, 1e16})), Bits((0.0 + 1.0 + 1.0) + 1e16));
  EXPECT_NE(AddInOrder({1e16, 1.0, 1.0}), AddInOrder({1.0, 1.0, 1e16}));
}

TEST(CombineTest, MaxWithNanWinningAndEmptyPiecesChangingNothing) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  EXPECT_EQ(MaxNanWins({}), 0.0);
  EXPECT_EQ(MaxNanWins({1.5, 3.0, 2.0}), 3.0);
  EXPECT_EQ(MaxNanWins({0.0, 1.5, 0.0}), 1.5);  // empty pieces around one
  EXPECT_TRUE(std::isnan(MaxNanWins({1.5, nan, 2.0})));
  EXPECT_TRUE(std::isnan(MaxNanWins({nan, 0.0})));
  EXPECT_TRUE(std::isnan(MaxNanWins({0.0, 9.0, nan})));
  EXPECT_EQ(Bits(AddInOrder({0.0, 0.25, 0.0, 0.5, 0.0})), Bits(AddInOrder({0.25, 0.5})));
}

struct BackendCase {
  std::string name;
  std::unique_ptr<kernels::Backend> backend;
};

std::vector<BackendCase> Backends() {
  std::vector<BackendCase> out;
  out.push_back({"scalar", kernels::NewCpuBackend(/*allow_simd=*/false, /*threads=*/2)});
  out.push_back({"simd", kernels::NewCpuBackend(/*allow_simd=*/true, /*threads=*/3)});
  auto device = kernels::NewSimulatedDeviceBackend(2);
  EXPECT_TRUE(device.ok()) << device.status();
  if (device.ok()) out.push_back({"simulated_device", std::move(*device)});
  return out;
}

// x, on the backend.
kernels::Buffer<float> OnBackend(kernels::Backend* backend, const std::vector<float>& x) {
  auto b = kernels::Buffer<float>::FromHost(backend, x.data(), x.size());
  EXPECT_TRUE(b.ok()) << b.status();
  return std::move(*b);
}

double WholeSumSquares(kernels::Backend& backend, const float* x, ElementRange r) {
  double s = -1;
  EXPECT_TRUE(backend.SumSquares(x + r.begin, r.size(), &s).ok());
  return s;
}

TEST(SlicedSumSquaresTest, StrideZeroOrPastTheEndIsOneBackendCall) {
  for (BackendCase& b : Backends()) {
    SCOPED_TRACE(b.name);
    const std::vector<float> host = Values(kBig, 1);
    kernels::Buffer<float> x = OnBackend(b.backend.get(), host);
    for (const ElementRange r : {ElementRange{0, kBig}, ElementRange{0, 1}, ElementRange{5, 70001},
                                 ElementRange{65535, kBig}, ElementRange{0, 0}}) {
      const double want = WholeSumSquares(*b.backend, x.data(), r);
      for (size_t stride : {size_t{0}, kBig, kBig + 1, size_t{1} << 40}) {
        auto got = SlicedSumSquares(*b.backend, x.data(), r, stride);
        ASSERT_TRUE(got.ok()) << got.status();
        EXPECT_EQ(Bits(*got), Bits(want)) << r.begin << " " << r.end << " stride " << stride;
      }
    }
  }
}

TEST(SlicedSumSquaresTest, PiecesAreBackendCallsAddedInOrder) {
  const size_t stride = 70001;  // neither a multiple nor a divisor of 65536
  for (BackendCase& b : Backends()) {
    SCOPED_TRACE(b.name);
    const std::vector<float> host = Values(kBig, 2);
    kernels::Buffer<float> x = OnBackend(b.backend.get(), host);
    for (const ElementRange r : {ElementRange{0, kBig}, ElementRange{3, kBig - 5},
                                 ElementRange{70001, 140002}, ElementRange{69990, 70010}}) {
      // By hand: each piece copied into a buffer of its own (the bits do not depend on
      // where a piece lies), summed alone, the sums added in order from 0.0.
      double want = 0.0;
      for (size_t at = r.begin; at < r.end;) {
        const size_t end = std::min(r.end, (at / stride + 1) * stride);
        const std::vector<float> piece(host.begin() + at, host.begin() + end);
        kernels::Buffer<float> alone = OnBackend(b.backend.get(), piece);
        want += WholeSumSquares(*b.backend, alone.data(), {0, piece.size()});
        at = end;
      }
      auto got = SlicedSumSquares(*b.backend, x.data(), r, stride);
      ASSERT_TRUE(got.ok()) << got.status();
      EXPECT_EQ(Bits(*got), Bits(want)) << r.begin << " " << r.end;
      double exact = 0.0;
      for (size_t i = r.begin; i < r.end; ++i) exact += double{host[i]} * host[i];
      EXPECT_NEAR(*got, exact, 1e-9 * exact);
    }
  }
}

// A sharded worker l holds only [l*S, l*S + count_l): its pieces, from its own copy, then
// gathered in slice order, give the bits of the whole tensor's. So does one partial per
// slice with 0.0 where the slice misses the range (a fixed-size gather).
TEST(SlicedSumSquaresTest, ShardsGatheredInSliceOrderGiveTheWholeBits) {
  const size_t n = kBig;
  for (BackendCase& b : Backends()) {
    SCOPED_TRACE(b.name);
    const std::vector<float> host = Values(n, 3);
    kernels::Buffer<float> whole = OnBackend(b.backend.get(), host);
    for (int slices : {1, 2, 3, 4, 7}) {
      const size_t stride = (n + slices - 1) / slices;
      for (const ElementRange r : {ElementRange{0, n}, ElementRange{100, n / 2},
                                   ElementRange{stride - 3, stride + 3}}) {
        auto want = SlicedSumSquares(*b.backend, whole.data(), r, stride);
        ASSERT_TRUE(want.ok()) << want.status();
        std::vector<double> gathered, per_slice;
        for (int l = 0; l < slices; ++l) {
          const ElementRange slice{l * stride, std::min(n, (l + 1) * stride)};
          const std::vector<float> shard(host.begin() + slice.begin, host.begin() + slice.end);
          kernels::Buffer<float> mine = OnBackend(b.backend.get(), shard);
          auto partials = SumSquaresOfPieces(*b.backend, mine.data(), slice.begin,
                                             CutAtStride(r, stride, slice));
          ASSERT_TRUE(partials.ok()) << partials.status();
          ASSERT_LE(partials->size(), 1u);
          gathered.insert(gathered.end(), partials->begin(), partials->end());
          per_slice.push_back(partials->empty() ? 0.0 : (*partials)[0]);
        }
        EXPECT_EQ(Bits(AddInOrder(gathered)), Bits(*want)) << slices << " " << r.begin;
        EXPECT_EQ(Bits(AddInOrder(per_slice)), Bits(*want)) << slices << " " << r.begin;
      }
    }
  }
}

TEST(SlicedMaxDenomRatioTest, AnyCutGivesTheWholeMaxAndNanWins) {
  const size_t n = kBig;
  const float eps = 1e-8f;
  for (BackendCase& b : Backends()) {
    SCOPED_TRACE(b.name);
    std::vector<float> v = Values(n, 4), v_fresh = Values(n, 5);
    for (size_t i = 0; i < n; ++i) {
      v[i] *= v[i];
      v_fresh[i] *= v_fresh[i];
    }
    kernels::Buffer<float> vb = OnBackend(b.backend.get(), v);
    kernels::Buffer<float> fb = OnBackend(b.backend.get(), v_fresh);
    for (const ElementRange r : {ElementRange{0, n}, ElementRange{7, 70100}, ElementRange{0, 0}}) {
      float whole = -1.0f;
      ASSERT_TRUE(b.backend
                      ->MaxDenomRatio(eps, vb.data() + r.begin, fb.data() + r.begin, r.size(),
                                      &whole)
                      .ok());
      for (size_t stride : {size_t{0}, size_t{70001}, size_t{4099}, n}) {
        auto got = SlicedMaxDenomRatio(*b.backend, eps, vb.data(), fb.data(), r, stride);
        ASSERT_TRUE(got.ok()) << got.status();
        EXPECT_EQ(Bits(*got), Bits(double{whole})) << stride;  // a max has no order
      }
    }
    // A NaN ratio in one piece (v < 0: sqrt is NaN) makes the whole a NaN.
    v[140005] = -1.0f;
    kernels::Buffer<float> with_nan = OnBackend(b.backend.get(), v);
    for (size_t stride : {size_t{0}, size_t{70001}}) {
      auto got = SlicedMaxDenomRatio(*b.backend, eps, with_nan.data(), fb.data(), {0, n}, stride);
      ASSERT_TRUE(got.ok()) << got.status();
      EXPECT_TRUE(std::isnan(*got)) << stride;
    }
  }
}

// The trainer's loop before the cut, kept here as the stride-0 contract.
double OldRelativeChange(const std::vector<float>& now, const std::vector<float>& prev) {
  double diff = 0.0, norm = 0.0;
  for (size_t i = 0; i < now.size(); ++i) {
    const double d = double{now[i]} - prev[i];
    diff += d * d;
    norm += double{now[i]} * now[i];
  }
  return norm > 0.0 ? std::sqrt(diff / norm) : 0.0;
}

TEST(RelativeChangeTest, StrideZeroIsTheElementOrderLoopAndSlicesAddInOrder) {
  const size_t n = 12730;
  const std::vector<float> now = Values(n, 6), prev = Values(n, 7);
  for (size_t stride : {size_t{0}, n, n + 8}) {
    EXPECT_EQ(Bits(RelativeChange(RelativeChangePartials(now.data(), prev.data(), 0,
                                                         CutAtStride({0, n}, stride)))),
              Bits(OldRelativeChange(now, prev)));
  }
  const size_t stride = 6368;
  double diff[2] = {0, 0}, norm[2] = {0, 0};
  for (size_t i = 0; i < n; ++i) {
    const double d = double{now[i]} - prev[i];
    diff[i / stride] += d * d;
    norm[i / stride] += double{now[i]} * now[i];
  }
  const double want = std::sqrt((0.0 + diff[0] + diff[1]) / (0.0 + norm[0] + norm[1]));
  const ChangePartials whole =
      RelativeChangePartials(now.data(), prev.data(), 0, CutAtStride({0, n}, stride));
  EXPECT_EQ(Bits(RelativeChange(whole)), Bits(want));
  // Slice 1 alone, from its own host copy.
  const std::vector<float> now1(now.begin() + stride, now.end());
  const std::vector<float> prev1(prev.begin() + stride, prev.end());
  const ChangePartials mine = RelativeChangePartials(now1.data(), prev1.data(), stride,
                                                    CutAtStride({0, n}, stride, {stride, n}));
  ASSERT_EQ(mine.diff.size(), 1u);
  EXPECT_EQ(Bits(mine.diff[0]), Bits(whole.diff[1]));
  EXPECT_EQ(Bits(mine.norm[0]), Bits(whole.norm[1]));
  EXPECT_EQ(RelativeChange({{0.0}, {0.0}}), 0.0);
}

// GatherPartials' rows (rank by rank, k partials each) become one list per reduction, in
// rank order; a ragged answer is an internal error, not a misread.
TEST(PartialsBySliceTest, RowsOfKBecomeKListsInRankOrder) {
  const absl::StatusOr<std::vector<std::vector<double>>> two =
      PartialsBySlice({1.0, 10.0, 2.0, 20.0, 3.0, 30.0}, 2);
  ASSERT_TRUE(two.ok()) << two.status();
  EXPECT_EQ(*two, (std::vector<std::vector<double>>{{1.0, 2.0, 3.0}, {10.0, 20.0, 30.0}}));
  EXPECT_TRUE(PartialsBySlice({}, 0)->empty());
  EXPECT_EQ(PartialsBySlice({1.0, 2.0, 3.0}, 2).status().code(), absl::StatusCode::kInternal);
}

}  // namespace
}  // namespace onebit
