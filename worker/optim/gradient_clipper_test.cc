// Clipping by global norm: the factor's norm is cut at the stride it is given (the exact
// sum's, in slice order) and the Clip of a worker's own gradient is one SumSquares.
#include "worker/optim/gradient_clipper.h"

#include <cmath>
#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/buffer.h"
#include "kernels/kernels.h"
#include "worker/optim/sliced_reductions.h"

namespace onebit {
namespace {

std::vector<float> Ramp(size_t n) {
  std::vector<float> g(n);
  for (size_t i = 0; i < n; ++i) g[i] = std::sin(0.37f * static_cast<float>(i)) + 0.1f;
  return g;
}

TEST(GradientClipperTest, FactorNormIsCutAtTheStride) {
  auto backend = kernels::NewCpuBackend();
  const size_t n = 200003;
  const std::vector<float> host = Ramp(n);
  auto g = kernels::Buffer<float>::FromHost(backend.get(), host.data(), n);
  ASSERT_TRUE(g.ok());
  auto clipper = GradientClipper::Create(backend.get(), /*max_norm=*/1.0, n);
  ASSERT_TRUE(clipper.ok());
  for (size_t stride : {size_t{0}, size_t{70001}, size_t{50008}, n}) {
    auto sumsq = SlicedSumSquares(*backend, g->data(), {0, n}, stride);
    ASSERT_TRUE(sumsq.ok());
    auto factor = clipper->Factor(g->data(), 0.25, stride);
    ASSERT_TRUE(factor.ok());
    const double norm = std::sqrt(*sumsq) * 0.25;
    EXPECT_EQ(clipper->last_norm(), norm) << stride;
    EXPECT_EQ(*factor, 1.0 / (norm + 1e-6)) << stride;
    EXPECT_EQ(clipper->FactorOf(*sumsq, 0.25), *factor) << stride;
  }
  // Stride 0 is one Backend call, as before strides existed.
  double whole = 0;
  ASSERT_TRUE(backend->SumSquares(g->data(), n, &whole).ok());
  ASSERT_TRUE(clipper->Factor(g->data(), 1.0, 0).ok());
  EXPECT_EQ(clipper->last_norm(), std::sqrt(whole));
}

TEST(GradientClipperTest, ClipScalesItsOwnWholeGradient) {
  auto backend = kernels::NewCpuBackend();
  const size_t n = 1001;
  const std::vector<float> host = Ramp(n);
  auto g = kernels::Buffer<float>::FromHost(backend.get(), host.data(), n);
  ASSERT_TRUE(g.ok());
  double whole = 0;
  ASSERT_TRUE(backend->SumSquares(g->data(), n, &whole).ok());
  auto clipper = GradientClipper::Create(backend.get(), /*max_norm=*/0.5, n);
  ASSERT_TRUE(clipper.ok());
  auto clipped = clipper->Clip(g->data());
  ASSERT_TRUE(clipped.ok());
  EXPECT_NE(*clipped, g->data());
  EXPECT_EQ(clipper->last_norm(), std::sqrt(whole));
  const float f = static_cast<float>(0.5 / (std::sqrt(whole) + 1e-6));
  std::vector<float> out(n);
  ASSERT_TRUE(backend->CopyToHost(out.data(), *clipped, n * sizeof(float)).ok());
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(out[i], host[i] * f) << i;
  // Within the norm (or off): g itself, and a factor of exactly 1.
  auto loose = GradientClipper::Create(backend.get(), /*max_norm=*/1e9, n);
  ASSERT_TRUE(loose.ok());
  EXPECT_EQ(*loose->Clip(g->data()), g->data());
  EXPECT_EQ(*loose->Factor(g->data(), 1.0, 100), 1.0);
  auto off = GradientClipper::Create(backend.get(), /*max_norm=*/0.0, n);
  ASSERT_TRUE(off.ok());
  EXPECT_EQ(*off->Factor(g->data(), 1.0, 100), 1.0);
  EXPECT_EQ(off->FactorOf(1e30, 1.0), 1.0);
}

// ClipScale is the multiplier Clip applies; without the copy (Create(copy = false)) the
// clipper holds nothing until a Clip needs it.
TEST(GradientClipperTest, ClipScaleIsClipsMultiplierAndNeedsNoCopy) {
  auto backend = kernels::NewCpuBackend();
  const size_t n = 1001;
  const std::vector<float> host = Ramp(n);
  auto g = kernels::Buffer<float>::FromHost(backend.get(), host.data(), n);
  ASSERT_TRUE(g.ok());
  auto with_copy = GradientClipper::Create(backend.get(), /*max_norm=*/0.5, n);
  auto no_copy = GradientClipper::Create(backend.get(), /*max_norm=*/0.5, n, /*copy=*/false);
  ASSERT_TRUE(with_copy.ok());
  ASSERT_TRUE(no_copy.ok());
  EXPECT_EQ(with_copy->bytes(), n * sizeof(float));
  EXPECT_EQ(no_copy->bytes(), 0u);
  auto scale = no_copy->ClipScale(g->data());
  ASSERT_TRUE(scale.ok());
  EXPECT_EQ(*scale, static_cast<float>(*with_copy->Factor(g->data(), 1.0, 0)));
  EXPECT_EQ(no_copy->bytes(), 0u);
  // A Clip without the copy makes it, with the bits of the one that had it.
  auto a = with_copy->Clip(g->data());
  ASSERT_TRUE(a.ok());
  std::vector<float> want(n), got(n);
  ASSERT_TRUE(backend->CopyToHost(want.data(), *a, n * sizeof(float)).ok());
  auto b = no_copy->Clip(g->data());
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(no_copy->bytes(), n * sizeof(float));
  ASSERT_TRUE(backend->CopyToHost(got.data(), *b, n * sizeof(float)).ok());
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(got[i], host[i] * *scale) << i;
  EXPECT_EQ(got, want);
  // Within the norm: exactly 1.
  auto loose = GradientClipper::Create(backend.get(), /*max_norm=*/1e9, n, /*copy=*/false);
  ASSERT_TRUE(loose.ok());
  EXPECT_EQ(*loose->ClipScale(g->data()), 1.0f);
  // Turned on later: the copy follows `copy`.
  auto later = GradientClipper::Create(backend.get(), /*max_norm=*/0.0, n, /*copy=*/false);
  ASSERT_TRUE(later.ok());
  ASSERT_TRUE(later->SetMaxNorm(0.5).ok());
  EXPECT_EQ(later->bytes(), 0u);
}

}  // namespace
}  // namespace onebit
