// Every CPU kernel (scalar and, where the CPU has it, AVX2) against the float64 models in
// kernels_reference.h, at lengths chosen around the 8-, 32- and chunk boundaries.
#include <algorithm>
#include <cmath>
#include <iostream>
#include <limits>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/kernels.h"
#include "kernels/kernels_reference.h"

namespace onebit::kernels {
namespace {

namespace ref = reference;

// The last two span several of the backend's 65536-element pieces (and end mid-piece).
constexpr size_t kLengths[] = {0, 1, 7, 8, 9, 31, 32, 33, 1000, 10007, 65536, 200003};

std::vector<float> Normal(size_t n, uint32_t seed, float stddev = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, stddev);
  std::vector<float> x(n);
  for (float& v : x) v = dist(rng);
  return x;
}

std::vector<double> ToDouble(const std::vector<float>& x) { return {x.begin(), x.end()}; }

// |got - want| <= rel * (|want| + floor). A float result carries rounding relative to
// the terms it was computed from, not to itself, so `floor` is the size of those terms.
void ExpectNear(const std::vector<float>& got, const std::vector<double>& want, double rel,
                double floor, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_LE(std::abs(got[i] - want[i]), rel * (std::abs(want[i]) + floor))
        << what << " at " << i << ": got " << got[i] << " want " << want[i];
  }
}

size_t RoundUp(size_t n, size_t multiple) { return (n + multiple - 1) / multiple * multiple; }

// Signs must agree except where float rounding can flip a value the reference puts within
// `tie` of zero.
void ExpectSigns(const ref::SignTensor& got, const ref::SignTensor& want,
                 const std::vector<double>& x_ref, double tie, const std::string& what) {
  ASSERT_EQ(got.signs.size(), want.signs.size()) << what;
  for (size_t i = 0; i < got.signs.size(); ++i) {
    if (std::abs(x_ref[i]) <= tie) continue;
    ASSERT_EQ(got.signs[i], want.signs[i]) << what << " sign at " << i << " x=" << x_ref[i];
  }
}

// Int8 codes must agree except where float rounding can move a value that the reference
// puts within `tie` code units of a rounding boundary (k + 1/2); there they may differ by
// one. Where they agree, the errors must agree to float rounding.
void ExpectInt8(const ref::Int8Tensor& got, const std::vector<float>& err,
                const ref::Int8Tensor& want, const std::vector<double>& x_ref,
                const std::vector<double>& err_ref, size_t chunk, const std::string& what) {
  ASSERT_EQ(got.codes.size(), want.codes.size()) << what;
  for (size_t r = 0; r < want.scales.size(); ++r) {
    EXPECT_NEAR(got.scales[r], want.scales[r], 1e-6 * want.scales[r]) << what << " chunk " << r;
    EXPECT_NEAR(got.offsets[r], want.offsets[r], 1e-6 * std::abs(want.offsets[r]))
        << what << " chunk " << r;
  }
  size_t near_ties = 0;
  for (size_t i = 0; i < want.codes.size(); ++i) {
    const size_t r = i / chunk;
    const double code = want.scales[r] > 0 ? (x_ref[i] - want.offsets[r]) / want.scales[r] : 0;
    const double frac = code - std::floor(code);
    if (std::abs(frac - 0.5) <= 1e-3) {
      ++near_ties;
      ASSERT_LE(std::abs(got.codes[i] - want.codes[i]), 1) << what << " code at " << i;
      if (got.codes[i] != want.codes[i]) continue;
    }
    ASSERT_EQ(got.codes[i], want.codes[i]) << what << " code at " << i << " x=" << x_ref[i];
    // Rounding relative to the terms: x, the offset and q * scale.
    const double terms = std::abs(x_ref[i]) + std::abs(want.offsets[r]) + 255 * want.scales[r];
    ASSERT_LE(std::abs(err[i] - err_ref[i]), 1e-6 * terms)
        << what << " err at " << i;
  }
  EXPECT_LE(near_ties, want.codes.size() / 100 + 2) << what;  // the tie band stays narrow
}

// (SIMD, length, threads).
class CpuKernelsTest : public ::testing::TestWithParam<std::tuple<bool, size_t, int>> {
 protected:
  void SetUp() override {
    const bool simd = std::get<0>(GetParam());
    if (simd && !CpuHasAvx2()) GTEST_SKIP() << "this CPU has no AVX2+FMA; the scalar run covers it";
    backend_ = NewCpuBackend(simd, std::get<2>(GetParam()));
    n_ = std::get<1>(GetParam());
  }
  std::unique_ptr<Backend> backend_;
  size_t n_ = 0;
};

TEST_P(CpuKernelsTest, MomentumUpdate) {
  std::vector<float> g = Normal(n_, 1), m = Normal(n_, 2);
  std::vector<double> m_ref = ToDouble(m);
  ASSERT_TRUE(backend_->MomentumUpdate(0.9f, g.data(), m.data(), n_).ok());
  ref::Momentum(0.9f, g.data(), &m_ref);
  ExpectNear(m, m_ref, 1e-6, 1.0, "m");
}

TEST_P(CpuKernelsTest, CompressWorker) {
  for (size_t num_chunks : {1, 3, 4}) {
    for (bool fused : {false, true}) {
      const size_t chunk = RoundUp((n_ + num_chunks - 1) / num_chunks, 8);
      const size_t n_pad = num_chunks * chunk;
      const std::string what = "chunks=" + std::to_string(num_chunks) + (fused ? " fused" : "");
      std::vector<float> m = Normal(n_, 3), g = Normal(n_, 4);
      std::vector<float> err = Normal(n_pad, 5, 0.1f);  // includes a nonzero padded tail
      std::vector<double> err_ref = ToDouble(err);
      std::vector<uint8_t> out(num_chunks * CompressedBlockBytes(chunk), 0xAB);
      ASSERT_TRUE(backend_
                      ->CompressWorker(m.data(), fused ? g.data() : nullptr, 0.9f, n_, num_chunks,
                                       chunk, err.data(), out.data())
                      .ok());
      std::vector<double> x_ref = err_ref;  // recompute x for the tie check
      for (size_t i = 0; i < n_; ++i) x_ref[i] += fused ? 0.9f * m[i] + (1 - 0.9f) * g[i] : m[i];
      const ref::SignTensor want = ref::CompressWorker(m.data(), fused ? g.data() : nullptr, 0.9f,
                                                       n_, num_chunks, chunk, &err_ref);
      const ref::SignTensor got = ref::DecodeBlocks(out.data(), num_chunks, chunk);
      for (size_t r = 0; r < num_chunks; ++r) {
        EXPECT_NEAR(got.scales[r], want.scales[r], 1e-6 * want.scales[r]) << what;
      }
      ExpectSigns(got, want, x_ref, 1e-6, what);
      ExpectNear(err, err_ref, 1e-5, want.scales.empty() ? 0 : want.scales[0], what + " err");
    }
  }
}

TEST_P(CpuKernelsTest, ServerAggregate) {
  const size_t chunk = RoundUp(n_, 8);
  for (int w : {1, 2, 3, 8}) {
    std::vector<ref::SignTensor> workers(w);
    std::vector<uint8_t> blocks;
    std::mt19937 rng(7 + w);
    for (int j = 0; j < w; ++j) {
      workers[j].scales = {0.5 + 0.1 * j};
      for (size_t i = 0; i < chunk; ++i) workers[j].signs.push_back(rng() % 2 ? 1 : -1);
      std::vector<uint8_t> b = ref::EncodeBlocks(workers[j], chunk);
      blocks.insert(blocks.end(), b.begin(), b.end());
    }
    std::vector<float> err = Normal(chunk, 8, 0.05f);
    std::vector<double> err_ref = ToDouble(err);
    std::vector<uint8_t> out(CompressedBlockBytes(chunk));
    ASSERT_TRUE(backend_->ServerAggregate(blocks.data(), w, chunk, err.data(), out.data()).ok());
    std::vector<double> y_ref(chunk);
    for (size_t i = 0; i < chunk; ++i) {
      for (int j = 0; j < w; ++j) y_ref[i] += static_cast<float>(workers[j].scales[0]) * workers[j].signs[i];
      y_ref[i] = y_ref[i] / w + err_ref[i];
    }
    for (auto& wk : workers) wk.scales[0] = static_cast<float>(wk.scales[0]);  // as on the wire
    const ref::SignTensor want = ref::ServerAggregate(workers, &err_ref);
    const ref::SignTensor got = ref::DecodeBlocks(out.data(), 1, chunk);
    const std::string what = "W=" + std::to_string(w);
    EXPECT_NEAR(got.scales[0], want.scales[0], 1e-6 * want.scales[0]) << what;
    ExpectSigns(got, want, y_ref, 1e-6, what);
    ExpectNear(err, err_ref, 1e-5, want.scales[0], what + " err");
  }
}

TEST_P(CpuKernelsTest, Decompress) {
  for (size_t num_chunks : {1, 3, 4}) {
    const size_t chunk = RoundUp((n_ + num_chunks - 1) / num_chunks, 8);
    ref::SignTensor t;
    std::mt19937 rng(9);
    for (size_t r = 0; r < num_chunks; ++r) t.scales.push_back(0.25f * (r + 1));
    for (size_t i = 0; i < num_chunks * chunk; ++i) t.signs.push_back(rng() % 2 ? 1 : -1);
    const std::vector<uint8_t> blocks = ref::EncodeBlocks(t, chunk);
    std::vector<float> out(n_, 0.0f);
    ASSERT_TRUE(backend_->Decompress(blocks.data(), num_chunks, chunk, n_, out.data()).ok());
    ExpectNear(out, ref::Decode(t, chunk, n_), 0.0, 0.0, "decoded");  // exact
  }
}

TEST_P(CpuKernelsTest, SumRows) {
  for (int rows : {1, 2, 5}) {
    const std::vector<float> x = Normal(rows * n_, 30 + rows);
    std::vector<double> want(n_, 0.0);
    for (int j = 0; j < rows; ++j) {
      for (size_t i = 0; i < n_; ++i) want[i] += x[j * n_ + i];
    }
    std::vector<float> out(n_);
    ASSERT_TRUE(backend_->SumRows(x.data(), rows, n_, out.data()).ok());
    ExpectNear(out, want, 1e-6, 1.0, "sum");
  }
}

TEST_P(CpuKernelsTest, AverageRows) {
  for (int rows : {1, 2, 3, 5}) {
    const std::vector<float> x = Normal(rows * n_, 40 + rows);
    std::vector<double> want(n_, 0.0);
    for (int j = 0; j < rows; ++j) {
      for (size_t i = 0; i < n_; ++i) want[i] += x[j * n_ + i] / static_cast<double>(rows);
    }
    std::vector<float> out(n_), sum(n_);
    ASSERT_TRUE(backend_->AverageRows(x.data(), rows, n_, out.data()).ok());
    ExpectNear(out, want, 1e-6, 1.0, "average");
    // Exactly the sum in row order, then one product with 1/rows.
    ASSERT_TRUE(backend_->SumRows(x.data(), rows, n_, sum.data()).ok());
    for (size_t i = 0; i < n_; ++i) {
      ASSERT_EQ(out[i], sum[i] * (1.0f / static_cast<float>(rows))) << "element " << i;
    }
  }
  std::vector<float> out(n_);
  EXPECT_EQ(backend_->AverageRows(nullptr, 0, n_, out.data()).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_P(CpuKernelsTest, AdamWarmupUpdate) {
  for (float wd : {0.0f, 0.01f}) {
    AdamHyper h;
    h.lr = 0.01f;
    h.weight_decay = wd;
    std::vector<float> g = Normal(n_, 10), m = Normal(n_, 11, 0.1f), p = Normal(n_, 13);
    std::vector<float> v = Normal(n_, 12, 0.1f);
    for (float& x : v) x = x * x;
    std::vector<double> m_ref = ToDouble(m), v_ref = ToDouble(v), p_ref = ToDouble(p);
    ASSERT_TRUE(backend_->AdamWarmupUpdate(h, g.data(), 0.25f, m.data(), v.data(), p.data(), n_).ok());
    ref::AdamWarmup(h, g.data(), 0.25f, &m_ref, &v_ref, &p_ref);
    ExpectNear(m, m_ref, 1e-6, 1.0, "m");
    ExpectNear(v, v_ref, 1e-6, 1.0, "v");
    ExpectNear(p, p_ref, 1e-6, 1.0, "p");
  }
}

TEST_P(CpuKernelsTest, FrozenAdamUpdate) {
  for (bool masked : {false, true}) {
    AdamHyper h;
    h.lr = 0.01f;
    h.weight_decay = masked ? 0.01f : 0.0f;
    h.update_clip = masked ? 2.0f : 0.0f;  // |m|/sqrt(v) of these often exceeds 2
    std::vector<float> m = Normal(n_, 14, 0.1f), p = Normal(n_, 15), v = Normal(n_, 16, 0.1f);
    for (float& x : v) x = x * x;
    std::vector<float> mask(n_);
    for (size_t i = 0; i < n_; ++i) mask[i] = i % 3 == 0 ? 0.0f : 1.0f;
    std::vector<double> m_ref = ToDouble(m), p_ref = ToDouble(p);
    const float* mask_ptr = masked ? mask.data() : nullptr;
    ASSERT_TRUE(backend_->FrozenAdamUpdate(h, v.data(), mask_ptr, m.data(), p.data(), n_).ok());
    ref::FrozenUpdate(h, ToDouble(v), mask_ptr, &m_ref, &p_ref);
    ExpectNear(m, m_ref, 0.0, 0.0, "m");  // a multiply by 0 or 1 is exact
    ExpectNear(p, p_ref, 1e-6, 1.0, "p");
  }
}

// 0/1 Adam's three kernels against float64 evaluations of kernels.h's formulas.
TEST_P(CpuKernelsTest, ZeroOneLocalUpdate) {
  for (float wd : {0.0f, 0.01f}) {
    AdamHyper h;
    h.lr = 0.01f;
    h.weight_decay = wd;
    std::vector<float> g = Normal(n_, 30), m = Normal(n_, 31, 0.1f), p = Normal(n_, 32);
    std::vector<float> v = Normal(n_, 33, 0.1f), acc = Normal(n_, 34, 0.01f);
    for (float& x : v) x = x * x;
    std::vector<double> m_ref(n_), p_ref(n_), acc_ref(n_);
    for (size_t i = 0; i < n_; ++i) {
      m_ref[i] = double{h.beta1} * m[i] + (1.0 - double{h.beta1}) * g[i];
      double u = m_ref[i] / (std::sqrt(double{v[i]}) + h.eps);
      if (wd > 0) u += double{wd} * p[i];
      p_ref[i] = p[i] - double{h.lr} * u;
      acc_ref[i] = acc[i] - double{h.lr} * u;
    }
    ASSERT_TRUE(backend_->ZeroOneLocalUpdate(h, g.data(), v.data(), m.data(), p.data(),
                                             acc.data(), n_).ok());
    ExpectNear(m, m_ref, 1e-6, 1.0, "m");
    ExpectNear(p, p_ref, 1e-6, 1.0, "p");
    ExpectNear(acc, acc_ref, 1e-5, 0.1, "acc");
  }
}

TEST_P(CpuKernelsTest, ZeroOneSyncPrepareAndApply) {
  for (bool masked : {false, true}) {
    const float eps = 1e-8f, lrs = 0.07f;
    std::vector<float> v = Normal(n_, 40, 0.1f), acc = Normal(n_, 41, 0.01f);
    std::vector<float> p = Normal(n_, 42), m = Normal(n_, 43);
    for (float& x : v) x = x * x;
    std::vector<float> mask(n_);
    for (size_t i = 0; i < n_; ++i) mask[i] = i % 3 == 0 ? 0.0f : 1.0f;
    std::vector<double> p_ref(n_), acc_ref(n_);
    for (size_t i = 0; i < n_; ++i) acc_ref[i] = double{acc[i]} * (std::sqrt(double{v[i]}) + eps);
    ASSERT_TRUE(backend_->ZeroOneSyncPrepare(eps, v.data(), acc.data(), n_).ok());
    ExpectNear(acc, acc_ref, 1e-6, 0.0, "prepared acc");
    std::vector<float> anchor = Normal(n_, 44);
    // The exchanged average: the prepared accumulator, perturbed as an exchange would.
    std::vector<float> avg = acc;
    for (size_t i = 0; i < n_; ++i) avg[i] *= i % 2 ? 0.9f : 1.1f;
    std::vector<double> m_ref(n_);
    for (size_t i = 0; i < n_; ++i) {
      m_ref[i] = -double{avg[i]} / lrs * (masked ? mask[i] : 1.0);
      p_ref[i] = double{anchor[i]} + avg[i] / (std::sqrt(double{v[i]}) + eps);
    }
    const float* mask_ptr = masked ? mask.data() : nullptr;
    ASSERT_TRUE(backend_->ZeroOneSyncApply(eps, lrs, v.data(), mask_ptr, avg.data(), m.data(),
                                           anchor.data(), p.data(), n_).ok());
    ExpectNear(m, m_ref, 1e-6, 0.0, "m");
    ExpectNear(p, p_ref, 1e-6, 1.0, "p");
    EXPECT_EQ(0, n_ ? std::memcmp(anchor.data(), p.data(), n_ * sizeof(float)) : 0);
    // lrs == 0 (the learning rate was 0 since the last sync) leaves m alone.
    const std::vector<float> m_before = m;
    ASSERT_TRUE(backend_->ZeroOneSyncApply(eps, 0.0f, v.data(), mask_ptr, avg.data(), m.data(),
                                           anchor.data(), p.data(), n_).ok());
    EXPECT_EQ(0, n_ ? std::memcmp(m.data(), m_before.data(), n_ * sizeof(float)) : 0);
  }
}

// 1-bit LAMB's element-wise steps against float64 evaluations of kernels.h's formulas.
TEST_P(CpuKernelsTest, LambSteps) {
  AdamHyper h;
  h.weight_decay = 0.01f;
  std::vector<float> g = Normal(n_, 50), m = Normal(n_, 51, 0.1f), v = Normal(n_, 52, 0.1f);
  std::vector<float> p = Normal(n_, 53), u(n_), m_last = Normal(n_, 54, 0.1f);
  std::vector<float> v_fresh = Normal(n_, 55, 0.1f);
  for (float& x : v) x = x * x;
  for (float& x : v_fresh) x = x * x;
  std::vector<double> m_ref(n_), v_ref(n_);
  for (size_t i = 0; i < n_; ++i) {
    const double gi = double{g[i]} * 0.5;
    m_ref[i] = double{h.beta1} * m[i] + (1 - double{h.beta1}) * gi;
    v_ref[i] = double{h.beta2} * v[i] + (1 - double{h.beta2}) * gi * gi;
  }
  ASSERT_TRUE(backend_->AdamMomentsUpdate(h, g.data(), 0.5f, m.data(), v.data(), n_).ok());
  ExpectNear(m, m_ref, 1e-6, 1.0, "moments m");
  ExpectNear(v, v_ref, 1e-6, 1.0, "moments v");

  std::vector<double> u_ref(n_);
  for (size_t i = 0; i < n_; ++i) {
    u_ref[i] = m[i] / (std::sqrt(double{v[i]}) + h.eps) + double{h.weight_decay} * p[i];
  }
  ASSERT_TRUE(backend_->AdamDirectionInto(h, m.data(), v.data(), p.data(), u.data(), n_).ok());
  ExpectNear(u, u_ref, 1e-6, 1.0, "direction");

  std::vector<double> y_ref(n_);
  for (size_t i = 0; i < n_; ++i) y_ref[i] = -0.3 * u[i] + p[i];
  ASSERT_TRUE(backend_->Axpy(-0.3f, u.data(), p.data(), n_).ok());
  ExpectNear(p, y_ref, 1e-6, 1.0, "axpy");
  for (size_t i = 0; i < n_; ++i) y_ref[i] = double{p[i]} * 1.75;
  ASSERT_TRUE(backend_->Scale(1.75f, p.data(), n_).ok());
  ExpectNear(p, y_ref, 1e-7, 0.0, "scale");
  std::vector<float> mask(n_);
  for (size_t i = 0; i < n_; ++i) {
    mask[i] = i % 3 == 0 ? 0.0f : 1.0f;
    y_ref[i] = double{p[i]} * mask[i];
  }
  ASSERT_TRUE(backend_->ApplyMask(mask.data(), p.data(), n_).ok());
  ExpectNear(p, y_ref, 0.0, 0.0, "mask");
  // MarkNonzero over two gradients: zero in both only where i % 4 == 0; -0 counts as zero.
  std::vector<float> seen(n_, 0.0f), g1(n_), g2(n_);
  for (size_t i = 0; i < n_; ++i) {
    g1[i] = i % 2 == 0 ? (i % 8 == 0 ? -0.0f : 0.0f) : 1.5f;
    g2[i] = i % 4 == 2 ? -2.0f : 0.0f;
  }
  ASSERT_TRUE(backend_->MarkNonzero(g1.data(), seen.data(), n_).ok());
  ASSERT_TRUE(backend_->MarkNonzero(g2.data(), seen.data(), n_).ok());
  for (size_t i = 0; i < n_; ++i) ASSERT_EQ(seen[i], i % 4 == 0 ? 0.0f : 1.0f) << i;
}

TEST_P(CpuKernelsTest, FreshVarianceAndMaxDenomRatio) {
  const float b1 = 0.9f, b2 = 0.999f, eps = 1e-8f;
  std::vector<float> m = Normal(n_, 60, 0.1f), m_last = Normal(n_, 61, 0.1f);
  std::vector<float> v = Normal(n_, 62, 0.1f), v_fresh = Normal(n_, 63, 0.1f);
  for (float& x : v) x = x * x;
  for (float& x : v_fresh) x = x * x;
  std::vector<double> vf_ref(n_);
  for (size_t i = 0; i < n_; ++i) {
    const double g = (double{m[i]} - double{b1} * m_last[i]) / (1 - double{b1});
    vf_ref[i] = double{b2} * v_fresh[i] + (1 - double{b2}) * g * g;
  }
  ASSERT_TRUE(backend_->FreshVarianceUpdate(b1, b2, m.data(), m_last.data(), v_fresh.data(), n_).ok());
  ExpectNear(v_fresh, vf_ref, 1e-5, 1e-3, "fresh variance");
  double want = 0;
  for (size_t i = 0; i < n_; ++i) {
    want = std::max(want, (std::sqrt(double{v[i]}) + eps) / (std::sqrt(double{v_fresh[i]}) + eps));
  }
  float got = -1;
  ASSERT_TRUE(backend_->MaxDenomRatio(eps, v.data(), v_fresh.data(), n_, &got).ok());
  EXPECT_NEAR(got, want, 1e-6 * want);
  if (n_ > 0) {  // a NaN anywhere makes the result a NaN
    v[n_ / 2] = -1.0f;
    ASSERT_TRUE(backend_->MaxDenomRatio(eps, v.data(), v_fresh.data(), n_, &got).ok());
    EXPECT_TRUE(std::isnan(got));
  }
}

TEST_P(CpuKernelsTest, DecompressFrozenAdamUpdate) {
  for (bool masked : {false, true}) {
    const size_t num_chunks = 3;
    const size_t chunk = RoundUp((n_ + num_chunks - 1) / num_chunks, 8);
    ref::SignTensor t;
    std::mt19937 rng(17);
    for (size_t r = 0; r < num_chunks; ++r) t.scales.push_back(0.01f * (r + 1));
    for (size_t i = 0; i < num_chunks * chunk; ++i) t.signs.push_back(rng() % 2 ? 1 : -1);
    const std::vector<uint8_t> blocks = ref::EncodeBlocks(t, chunk);
    AdamHyper h;
    h.lr = 0.01f;
    h.weight_decay = 0.001f;
    std::vector<float> m(n_, 123.0f), p = Normal(n_, 18), v = Normal(n_, 19, 0.1f);
    for (float& x : v) x = x * x;
    std::vector<float> mask(n_);
    for (size_t i = 0; i < n_; ++i) mask[i] = i % 5 == 1 ? 0.0f : 1.0f;
    const float* mask_ptr = masked ? mask.data() : nullptr;
    ASSERT_TRUE(backend_
                    ->DecompressFrozenAdamUpdate(blocks.data(), num_chunks, chunk, h, v.data(),
                                                 mask_ptr, m.data(), p.data(), n_)
                    .ok());
    std::vector<double> m_ref = ref::Decode(t, chunk, n_), p_ref = ToDouble(p);
    // p was overwritten: rebuild the input.
    p_ref = ToDouble(Normal(n_, 18));
    ref::FrozenUpdate(h, ToDouble(v), mask_ptr, &m_ref, &p_ref);
    ExpectNear(m, m_ref, 0.0, 0.0, "m");
    ExpectNear(p, p_ref, 1e-6, 1.0, "p");
  }
}

TEST_P(CpuKernelsTest, SumSquares) {
  const std::vector<float> x = Normal(n_, 20);
  double want = 0;
  for (float v : x) want += static_cast<double>(v) * v;
  double got = -1;
  ASSERT_TRUE(backend_->SumSquares(x.data(), n_, &got).ok());
  EXPECT_NEAR(got, want, 1e-12 * (want + 1));
}

TEST_P(CpuKernelsTest, CompressWorkerInt8) {
  for (size_t num_chunks : {1, 3, 4}) {
    for (bool fused : {false, true}) {
      const size_t chunk = RoundUp((n_ + num_chunks - 1) / num_chunks, 8);
      const size_t n_pad = num_chunks * chunk;
      const std::string what = "chunks=" + std::to_string(num_chunks) + (fused ? " fused" : "");
      std::vector<float> m = Normal(n_, 3), g = Normal(n_, 4);
      std::vector<float> err = Normal(n_pad, 5, 0.1f);  // includes a nonzero padded tail
      std::vector<double> err_ref = ToDouble(err);
      std::vector<uint8_t> out(num_chunks * Int8BlockBytes(chunk), 0xAB);
      ASSERT_TRUE(backend_
                      ->CompressWorkerInt8(m.data(), fused ? g.data() : nullptr, 0.9f, n_,
                                           num_chunks, chunk, err.data(), out.data())
                      .ok());
      std::vector<double> x_ref = err_ref;
      for (size_t i = 0; i < n_; ++i) x_ref[i] += fused ? 0.9f * m[i] + (1 - 0.9f) * g[i] : m[i];
      const ref::Int8Tensor want = ref::CompressWorkerInt8(
          m.data(), fused ? g.data() : nullptr, 0.9f, n_, num_chunks, chunk, &err_ref);
      const ref::Int8Tensor got = ref::DecodeInt8Blocks(out.data(), num_chunks, chunk);
      ExpectInt8(got, err, want, x_ref, err_ref, chunk, what);
    }
  }
}

TEST_P(CpuKernelsTest, ServerAggregateInt8) {
  const size_t chunk = RoundUp(n_, 8);
  for (int w : {1, 2, 3, 8}) {
    std::vector<ref::Int8Tensor> workers(w);
    std::vector<uint8_t> blocks;
    std::mt19937 rng(7 + w);
    for (int j = 0; j < w; ++j) {
      // As on the wire: float32 scale and offset.
      workers[j].scales = {static_cast<float>(0.01 + 0.003 * j)};
      workers[j].offsets = {static_cast<float>(-1.3 + 0.2 * j)};
      for (size_t i = 0; i < chunk; ++i) workers[j].codes.push_back(static_cast<int>(rng() % 256));
      std::vector<uint8_t> b = ref::EncodeInt8Blocks(workers[j], chunk);
      blocks.insert(blocks.end(), b.begin(), b.end());
    }
    std::vector<float> err = Normal(chunk, 8, 0.05f);
    std::vector<double> err_ref = ToDouble(err);
    std::vector<uint8_t> out(Int8BlockBytes(chunk));
    ASSERT_TRUE(
        backend_->ServerAggregateInt8(blocks.data(), w, chunk, err.data(), out.data()).ok());
    std::vector<double> y_ref(chunk);
    for (size_t i = 0; i < chunk; ++i) {
      for (const auto& k : workers) y_ref[i] += k.offsets[0] + k.codes[i] * k.scales[0];
      y_ref[i] = y_ref[i] / w + err_ref[i];
    }
    const ref::Int8Tensor want = ref::ServerAggregateInt8(workers, &err_ref);
    const ref::Int8Tensor got = ref::DecodeInt8Blocks(out.data(), 1, chunk);
    ExpectInt8(got, err, want, y_ref, err_ref, chunk, "W=" + std::to_string(w));
  }
}

TEST_P(CpuKernelsTest, DecompressInt8) {
  for (size_t num_chunks : {1, 3, 4}) {
    const size_t chunk = RoundUp((n_ + num_chunks - 1) / num_chunks, 8);
    ref::Int8Tensor t;
    std::mt19937 rng(9);
    for (size_t r = 0; r < num_chunks; ++r) {
      t.scales.push_back(static_cast<float>(0.02 * (r + 1)));
      t.offsets.push_back(static_cast<float>(-2.5 + r));
    }
    for (size_t i = 0; i < num_chunks * chunk; ++i) t.codes.push_back(static_cast<int>(rng() % 256));
    const std::vector<uint8_t> blocks = ref::EncodeInt8Blocks(t, chunk);
    std::vector<float> out(n_ + 1, 1234.0f);  // one past n: must stay untouched
    ASSERT_TRUE(backend_->DecompressInt8(blocks.data(), num_chunks, chunk, n_, out.data()).ok());
    EXPECT_EQ(out[n_], 1234.0f);
    out.resize(n_);
    ExpectNear(out, ref::DecodeInt8(t, chunk, n_), 1e-6, 1.0, "decoded");
  }
}

INSTANTIATE_TEST_SUITE_P(
    Lengths, CpuKernelsTest,
    ::testing::Combine(::testing::Bool(), ::testing::ValuesIn(kLengths), ::testing::Values(1, 3)),
    [](const ::testing::TestParamInfo<std::tuple<bool, size_t, int>>& info) {
      return std::string(std::get<0>(info.param) ? "avx2" : "scalar") + "_n" +
             std::to_string(std::get<1>(info.param)) + "_t" +
             std::to_string(std::get<2>(info.param));
    });

// Every kernel, whole step by step, gives the same bits on 1, 2 and 3 threads (pieces
// are fixed by the data, partial sums added in piece order), at lengths spanning many
// pieces and with chunks that do not fall on piece boundaries.
TEST(CpuKernelsThreadsTest, ThreadCountNeverChangesBits) {
  for (bool simd : {false, true}) {
    if (simd && !CpuHasAvx2()) continue;
    for (size_t n : {size_t{65536 * 3 + 17}, size_t{300007}}) {
      const size_t num_chunks = 5, chunk = RoundUp((n + num_chunks - 1) / num_chunks, 8);
      AdamHyper h;
      h.weight_decay = 0.01f;
      const std::vector<float> g = Normal(n, 31);
      auto run = [&](int threads) {
        auto b = NewCpuBackend(simd, threads);
        std::vector<float> m = Normal(n, 32), v = Normal(n, 33), p = Normal(n, 34);
        for (float& x : v) x = x * x;
        std::vector<float> err(num_chunks * chunk, 0.0f), server_err(chunk, 0.0f);
        std::vector<uint8_t> blocks(num_chunks * CompressedBlockBytes(chunk));
        std::vector<uint8_t> aggregated(CompressedBlockBytes(chunk));
        std::vector<float> rows = Normal(3 * n, 35), sum(n), avg(n), decoded(n);
        double norm = 0;
        EXPECT_TRUE(b->AdamWarmupUpdate(h, g.data(), 0.5f, m.data(), v.data(), p.data(), n).ok());
        EXPECT_TRUE(b->MomentumUpdate(0.9f, g.data(), m.data(), n).ok());
        for (int step = 0; step < 2; ++step) {
          EXPECT_TRUE(b->CompressWorker(m.data(), g.data(), 0.9f, n, num_chunks, chunk,
                                        err.data(), blocks.data()).ok());
        }
        // The 5 blocks as 5 workers' blocks of one chunk.
        EXPECT_TRUE(b->ServerAggregate(blocks.data(), static_cast<int>(num_chunks), chunk,
                                       server_err.data(), aggregated.data()).ok());
        EXPECT_TRUE(b->Decompress(blocks.data(), num_chunks, chunk, n, decoded.data()).ok());
        EXPECT_TRUE(b->DecompressFrozenAdamUpdate(blocks.data(), num_chunks, chunk, h, v.data(),
                                                  nullptr, m.data(), p.data(), n).ok());
        EXPECT_TRUE(b->FrozenAdamUpdate(h, v.data(), nullptr, m.data(), p.data(), n).ok());
        EXPECT_TRUE(b->SumRows(rows.data(), 3, n, sum.data()).ok());
        EXPECT_TRUE(b->AverageRows(rows.data(), 3, n, avg.data()).ok());
        EXPECT_TRUE(b->SumSquares(err.data(), err.size(), &norm).ok());
        // int8: two worker steps, the 5 blocks as 5 workers of one chunk, decoding.
        std::vector<float> err8(num_chunks * chunk, 0.0f), server_err8(chunk, 0.0f), decoded8(n);
        std::vector<uint8_t> blocks8(num_chunks * Int8BlockBytes(chunk));
        std::vector<uint8_t> aggregated8(Int8BlockBytes(chunk));
        for (int step = 0; step < 2; ++step) {
          EXPECT_TRUE(b->CompressWorkerInt8(m.data(), g.data(), 0.9f, n, num_chunks, chunk,
                                            err8.data(), blocks8.data()).ok());
        }
        EXPECT_TRUE(b->ServerAggregateInt8(blocks8.data(), static_cast<int>(num_chunks), chunk,
                                           server_err8.data(), aggregated8.data()).ok());
        EXPECT_TRUE(b->DecompressInt8(blocks8.data(), num_chunks, chunk, n, decoded8.data()).ok());
        std::vector<uint8_t> all;
        auto append = [&](const void* data, size_t bytes) {
          const auto* c = static_cast<const uint8_t*>(data);
          all.insert(all.end(), c, c + bytes);
        };
        for (const std::vector<float>* x : {&m, &v, &p, &err, &server_err, &sum, &avg, &decoded}) {
          append(x->data(), x->size() * sizeof(float));
        }
        append(blocks.data(), blocks.size());
        append(aggregated.data(), aggregated.size());
        for (const std::vector<float>* x : {&err8, &server_err8, &decoded8}) {
          append(x->data(), x->size() * sizeof(float));
        }
        append(blocks8.data(), blocks8.size());
        append(aggregated8.data(), aggregated8.size());
        append(&norm, sizeof(norm));
        return all;
      };
      const std::vector<uint8_t> one = run(1);
      for (int threads : {2, 3}) {
        EXPECT_TRUE(one == run(threads)) << (simd ? "avx2" : "scalar") << " n " << n
                                         << " threads " << threads;
      }
    }
  }
}

// The SIMD and scalar paths evaluate the same float expressions: element-wise kernels must
// agree bit for bit.
TEST(CpuKernelsSimdTest, MatchesScalarBitForBit) {
  if (!CpuHasAvx2()) GTEST_SKIP() << "this CPU has no AVX2+FMA";
  auto simd = NewCpuBackend(true), scalar = NewCpuBackend(false);
  const size_t n = 10007, num_chunks = 3, chunk = RoundUp((n + 2) / 3, 8);
  AdamHyper h;
  h.weight_decay = 0.01f;
  std::vector<float> g = Normal(n, 21), v = Normal(n, 22);
  for (float& x : v) x = x * x;
  auto run = [&](Backend* b) {
    std::vector<float> m = Normal(n, 23), vv = v, p = Normal(n, 24);
    std::vector<float> err(num_chunks * chunk, 0.0f);
    std::vector<uint8_t> blocks(num_chunks * CompressedBlockBytes(chunk));
    EXPECT_TRUE(b->AdamWarmupUpdate(h, g.data(), 0.5f, m.data(), vv.data(), p.data(), n).ok());
    EXPECT_TRUE(b->CompressWorker(m.data(), g.data(), 0.9f, n, num_chunks, chunk, err.data(),
                                  blocks.data()).ok());
    // The scales differ in the last bits (summation order): give both the same ones so
    // that everything downstream is compared exactly.
    for (size_t r = 0; r < num_chunks; ++r) {
      const float scale = 0.01f;
      std::memcpy(blocks.data() + r * CompressedBlockBytes(chunk), &scale, 4);
    }
    EXPECT_TRUE(b->DecompressFrozenAdamUpdate(blocks.data(), num_chunks, chunk, h, vv.data(),
                                              nullptr, m.data(), p.data(), n).ok());
    std::vector<float> all = m;
    all.insert(all.end(), vv.begin(), vv.end());
    all.insert(all.end(), p.begin(), p.end());
    for (size_t r = 0; r < num_chunks; ++r) {
      const uint8_t* bits = blocks.data() + r * CompressedBlockBytes(chunk) + 4;
      all.insert(all.end(), bits, bits + chunk / 8);  // sign bytes as values
    }
    return all;
  };
  const std::vector<float> a = run(simd.get()), b = run(scalar.get());
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)));
}

// The update clip: the AVX2 table's bits are the scalar table's (FrozenAdamUpdate and the
// fused decode), a clipped element moves by exactly lr * clip, and a NaN stays NaN.
TEST(CpuKernelsSimdTest, UpdateClipMatchesScalarBitForBitAndKeepsNaN) {
  if (!CpuHasAvx2()) GTEST_SKIP() << "this CPU has no AVX2+FMA";
  auto simd = NewCpuBackend(true), scalar = NewCpuBackend(false);
  const size_t n = 1003, chunk = RoundUp(n, 8);
  AdamHyper h;
  h.lr = 0.01f;
  h.update_clip = 10.0f;
  std::vector<float> v = Normal(n, 31, 0.1f);
  for (size_t i = 0; i < n; ++i) v[i] = i % 5 == 0 ? 0.0f : v[i] * v[i];  // froze at 0
  std::vector<float> m0 = Normal(n, 32, 0.1f);
  m0[7] = std::numeric_limits<float>::quiet_NaN();
  auto run = [&](Backend* b, bool fused) {
    std::vector<float> m = m0, p(n, 0.0f);
    if (fused) {
      std::vector<uint8_t> blocks(CompressedBlockBytes(chunk), 0x5a);
      const float scale = 0.01f;
      std::memcpy(blocks.data(), &scale, 4);
      EXPECT_TRUE(b->DecompressFrozenAdamUpdate(blocks.data(), 1, chunk, h, v.data(), nullptr,
                                                m.data(), p.data(), n).ok());
    } else {
      EXPECT_TRUE(b->FrozenAdamUpdate(h, v.data(), nullptr, m.data(), p.data(), n).ok());
    }
    return p;
  };
  for (bool fused : {false, true}) {
    const std::vector<float> a = run(simd.get(), fused), b = run(scalar.get(), fused);
    EXPECT_EQ(0, std::memcmp(a.data(), b.data(), n * sizeof(float))) << fused;
    for (size_t i = 0; i < n; i += 5) {
      EXPECT_EQ(std::fabs(a[i]), 0.01f * 10.0f) << i << " fused " << fused;  // v = 0: clipped
    }
    if (!fused) {
      EXPECT_TRUE(std::isnan(a[7]));
    }
  }
}

// 0/1 Adam's kernels: the AVX2 table's bits are the scalar table's (a local step with and
// without weight decay, a sync with a mask and without).
TEST(CpuKernelsSimdTest, ZeroOneMatchesScalarBitForBit) {
  if (!CpuHasAvx2()) GTEST_SKIP() << "this CPU has no AVX2+FMA";
  auto simd = NewCpuBackend(true), scalar = NewCpuBackend(false);
  const size_t n = 10007;
  std::vector<float> g = Normal(n, 51), v = Normal(n, 52, 0.1f), mask(n);
  for (float& x : v) x = x * x;
  for (size_t i = 0; i < n; ++i) mask[i] = i % 5 == 0 ? 0.0f : 1.0f;
  auto run = [&](Backend* b) {
    std::vector<float> m = Normal(n, 53, 0.1f), p = Normal(n, 54), acc = Normal(n, 55, 0.01f);
    std::vector<float> anchor = Normal(n, 56), avg(n);
    for (float wd : {0.0f, 0.01f}) {
      AdamHyper h;
      h.lr = 0.01f;
      h.weight_decay = wd;
      EXPECT_TRUE(
          b->ZeroOneLocalUpdate(h, g.data(), v.data(), m.data(), p.data(), acc.data(), n).ok());
    }
    EXPECT_TRUE(b->ZeroOneSyncPrepare(1e-8f, v.data(), acc.data(), n).ok());
    for (size_t i = 0; i < n; ++i) avg[i] = acc[i] * (i % 2 ? 0.9f : 1.1f);
    for (const float* k : std::vector<const float*>{nullptr, mask.data()}) {
      EXPECT_TRUE(b->ZeroOneSyncApply(1e-8f, 0.07f, v.data(), k, avg.data(), m.data(),
                                      anchor.data(), p.data(), n).ok());
    }
    std::vector<float> all = m;
    for (const auto* x : {&p, &acc, &anchor}) all.insert(all.end(), x->begin(), x->end());
    return all;
  };
  const std::vector<float> a = run(simd.get()), b = run(scalar.get());
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)));
}

TEST(CpuKernelsErrorsTest, RejectsBadChunks) {
  auto b = NewCpuBackend();
  std::vector<float> x(16), err(16);
  std::vector<uint8_t> out(64);
  EXPECT_EQ(b->CompressWorker(x.data(), nullptr, 0.9f, 16, 1, 12, err.data(), out.data()).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(b->CompressWorker(x.data(), nullptr, 0.9f, 17, 2, 8, err.data(), out.data()).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(b->ServerAggregate(out.data(), 0, 8, err.data(), out.data()).code(),
            absl::StatusCode::kInvalidArgument);
}

// int8 has no sum of squares: the SIMD and scalar backends give the same bits throughout.
TEST(CpuKernelsSimdTest, Int8MatchesScalarBitForBit) {
  if (!CpuHasAvx2()) GTEST_SKIP() << "this CPU has no AVX2+FMA";
  auto simd = NewCpuBackend(true), scalar = NewCpuBackend(false);
  const size_t n = 10007, num_chunks = 3, chunk = RoundUp((n + 2) / 3, 8);
  std::vector<float> m = Normal(n, 41), g = Normal(n, 42);
  for (size_t i = 0; i < n; i += 89) m[i] = g[i] = (i % 2) ? 0.0f : -0.0f;  // zeros of both signs
  for (size_t i = 5; i < n; i += 97) m[i] = std::round(m[i] * 8) / 8, g[i] = m[i];  // on a grid
  auto run = [&](Backend* b) {
    std::vector<float> err(num_chunks * chunk, 0.0f), server_err(chunk, 0.0f), out(n);
    std::vector<uint8_t> blocks(num_chunks * Int8BlockBytes(chunk)), result(Int8BlockBytes(chunk));
    for (int step = 0; step < 3; ++step) {
      EXPECT_TRUE(b->CompressWorkerInt8(m.data(), g.data(), 0.9f, n, num_chunks, chunk,
                                        err.data(), blocks.data()).ok());
      EXPECT_TRUE(b->ServerAggregateInt8(blocks.data(), 3, chunk, server_err.data(),
                                         result.data()).ok());
    }
    EXPECT_TRUE(b->DecompressInt8(blocks.data(), num_chunks, chunk, n, out.data()).ok());
    std::vector<uint8_t> all(blocks);
    all.insert(all.end(), result.begin(), result.end());
    for (const std::vector<float>* x : {&err, &server_err, &out}) {
      const auto* c = reinterpret_cast<const uint8_t*>(x->data());
      all.insert(all.end(), c, c + x->size() * sizeof(float));
    }
    return all;
  };
  EXPECT_TRUE(run(simd.get()) == run(scalar.get()));
}

// One chunk of 8 through CompressWorkerInt8 (no momentum, zero error): the block's scale,
// offset and codes, and the error it leaves.
struct Int8One {
  float scale, lo;
  std::vector<int> codes;
  std::vector<float> err, decoded;
};
Int8One CompressOne(Backend* b, const std::vector<float>& x) {
  Int8One r;
  r.err.assign(x.size(), 0.0f);
  std::vector<uint8_t> block(Int8BlockBytes(x.size()));
  EXPECT_TRUE(b->CompressWorkerInt8(x.data(), nullptr, 0.0f, x.size(), 1, x.size(), r.err.data(),
                                    block.data()).ok());
  std::memcpy(&r.scale, block.data(), 4);
  std::memcpy(&r.lo, block.data() + 4, 4);
  for (size_t i = 0; i < x.size(); ++i) r.codes.push_back(block[8 + i]);
  r.decoded.resize(x.size());
  EXPECT_TRUE(b->DecompressInt8(block.data(), 1, x.size(), x.size(), r.decoded.data()).ok());
  return r;
}

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

TEST(CpuKernelsInt8Test, EdgeCases) {
  for (bool simd : {false, true}) {
    if (simd && !CpuHasAvx2()) continue;
    auto b = NewCpuBackend(simd);
    const std::string what = simd ? "avx2" : "scalar";
    // Ties round to even: lo 0, hi 255 give scale 1 and 1/scale 1 exactly.
    Int8One t = CompressOne(b.get(), {0.0f, 255.0f, 0.5f, 1.5f, 2.5f, 253.5f, 254.5f, 3.49f});
    EXPECT_EQ(t.scale, 1.0f) << what;
    EXPECT_EQ(t.lo, 0.0f) << what;
    EXPECT_EQ(t.codes, (std::vector<int>{0, 255, 0, 2, 2, 254, 254, 3})) << what;
    EXPECT_EQ(t.err[2], 0.5f) << what;
    EXPECT_EQ(t.err[4], 0.5f) << what;
    // A constant chunk: scale 0, every code 0, decoded exactly, no error.
    t = CompressOne(b.get(), std::vector<float>(8, -3.25f));
    EXPECT_EQ(t.scale, 0.0f) << what;
    EXPECT_EQ(t.lo, -3.25f) << what;
    EXPECT_EQ(t.codes, std::vector<int>(8, 0)) << what;
    EXPECT_EQ(t.decoded, std::vector<float>(8, -3.25f)) << what;
    EXPECT_EQ(t.err, std::vector<float>(8, 0.0f)) << what;
    // Zeros of both signs: offset +0 whichever the min saw first; decoded +0.
    for (float first : {0.0f, -0.0f}) {
      t = CompressOne(b.get(), {first, -first, 0.0f, -0.0f, 0.0f, -0.0f, 0.0f, 0.0f});
      EXPECT_EQ(Bits(t.lo), 0u) << what;
      EXPECT_EQ(Bits(t.scale), 0u) << what;
      for (float d : t.decoded) EXPECT_EQ(Bits(d), 0u) << what;
    }
    // Huge values: hi - lo overflows float32 but not the float64 scale.
    t = CompressOne(b.get(), {3e38f, -3e38f, 0.0f, 1e38f, -1e38f, 3e38f, -3e38f, 2e38f});
    EXPECT_TRUE(std::isfinite(t.scale)) << what;
    EXPECT_EQ(t.lo, -3e38f) << what;
    EXPECT_EQ(t.codes[0], 255) << what;
    EXPECT_EQ(t.codes[1], 0) << what;
    for (float d : t.decoded) EXPECT_TRUE(std::isfinite(d)) << what;
    EXPECT_NEAR(t.decoded[2], 0.0, 1.2e36) << what;  // within one step (2.35e36)
    // NaN or infinity anywhere: the whole chunk decodes to NaN, every code 0.
    for (float bad : {std::nanf(""), INFINITY, -INFINITY}) {
      t = CompressOne(b.get(), {1.0f, 2.0f, bad, 4.0f, 5.0f, 6.0f, 7.0f, 8.0f});
      EXPECT_FALSE(std::isfinite(t.scale)) << what << " " << bad;
      EXPECT_EQ(t.codes, std::vector<int>(8, 0)) << what << " " << bad;
      for (float d : t.decoded) EXPECT_TRUE(std::isnan(d)) << what << " " << bad;
    }
    t = CompressOne(b.get(), std::vector<float>(8, INFINITY));
    EXPECT_EQ(Bits(t.scale), 0x7fc00000u) << what;  // inf - inf, stored as the one NaN
    for (float d : t.decoded) EXPECT_TRUE(std::isnan(d)) << what << " all inf";
    // A server fed a NaN block passes the NaN on.
    std::vector<uint8_t> blocks(2 * Int8BlockBytes(8), 0), out(Int8BlockBytes(8));
    const float nan = std::nanf("");
    std::memcpy(blocks.data() + Int8BlockBytes(8), &nan, 4);
    std::vector<float> server_err(8, 0.0f), decoded(8);
    ASSERT_TRUE(b->ServerAggregateInt8(blocks.data(), 2, 8, server_err.data(), out.data()).ok());
    ASSERT_TRUE(b->DecompressInt8(out.data(), 1, 8, 8, decoded.data()).ok());
    for (float d : decoded) EXPECT_TRUE(std::isnan(d)) << what << " server";
  }
}

TEST(CpuKernelsInt8Test, RejectsBadChunks) {
  auto b = NewCpuBackend();
  std::vector<float> x(16), err(16);
  std::vector<uint8_t> out(64);
  EXPECT_EQ(b->CompressWorkerInt8(x.data(), nullptr, 0.9f, 16, 1, 12, err.data(), out.data()).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(b->CompressWorkerInt8(x.data(), nullptr, 0.9f, 17, 2, 8, err.data(), out.data()).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(b->ServerAggregateInt8(out.data(), 0, 8, err.data(), out.data()).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(b->DecompressInt8(out.data(), 1, 8, 9, err.data()).code(),
            absl::StatusCode::kInvalidArgument);
}

// The formats' block sizes (the codecs' names: compression/codec_test.cc).
// Host memory: kernels from outside kernels/ run on the pointers themselves.
TEST(CpuBackendTest, HostAddressIsThePointer) {
  for (int threads : {1, 2}) {
    std::unique_ptr<Backend> cpu = NewCpuBackend(true, threads);
    float x[4] = {1, 2, 3, 4};
    EXPECT_EQ(HostAddressOf(*cpu, x), x);
    EXPECT_EQ(HostAddressOf(*cpu, static_cast<const float*>(x + 3)), x + 3);
    EXPECT_EQ(cpu->HostAddress(nullptr), nullptr);
    absl::StatusOr<void*> p = cpu->Allocate(16);
    ASSERT_TRUE(p.ok());
    EXPECT_EQ(cpu->HostAddress(*p), *p);
    cpu->Free(*p);
  }
}

// A tensor of n elements of a 16-bit dtype: normal values of both signs, a sixteenth of
// them large (bf16 ~1e30; fp16 up to its largest finite value), an eighth tiny (fp16:
// subnormals, some rounding to +-0), and at the front the largest finite value, the smallest
// negative subnormal and -0.
std::vector<uint16_t> Wire16Tensor(WireDtype dtype, size_t n, uint32_t seed) {
  const bool fp16 = dtype == WireDtype::kFp16;
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> kind(0, 15);
  std::vector<uint16_t> h(n);
  for (size_t i = 0; i < n; ++i) {
    float x = normal(rng);
    switch (kind(rng)) {
      case 0:
        x = fp16 ? std::max(-65504.0f, std::min(65504.0f, x * 2e4f)) : x * 1e30f;
        break;
      case 1:
        x *= 1e-6f;
        break;
      case 2:
        x *= 1e-8f;
        break;
      default:
        break;
    }
    h[i] = NarrowParam(dtype, x);
  }
  const uint16_t front[] = {static_cast<uint16_t>(fp16 ? 0x7bff : 0x7f7f),  // largest finite
                            0x8001,   // the smallest negative subnormal
                            0x8000};  // -0
  for (size_t i = 0; i < n && i < 3; ++i) h[i] = front[i];
  return h;
}

// SumSquaresWire of a bf16 or fp16 tensor is SumSquares of its float32 widening, bit for
// bit (each piece is widened and summed by the same piece kernel), with the scalar and the
// AVX2 kernels, on 1 and 3 threads, at lengths around 8 and the 65536-element pieces, from
// an aligned and an odd first element. For fp32 it is SumSquares itself.
TEST(CpuSumSquaresWireTest, MatchesSumSquaresOfTheWidenedCopyBitForBit) {
  constexpr size_t kWireLengths[] = {0, 1, 7, 8, 65535, 65536, 65537, 3 * 65536 + 5};
  auto same_bits = [](double a, double b) { return std::memcmp(&a, &b, sizeof(a)) == 0; };
  for (bool simd : {false, true}) {
    if (simd && !CpuHasAvx2()) {
      std::cout << "this CPU has no AVX2+FMA: the scalar kernels only\n";
      continue;
    }
    for (int threads : {1, 3}) {
      std::unique_ptr<Backend> b = NewCpuBackend(simd, threads);
      for (size_t n : kWireLengths) {
        for (WireDtype dtype : {WireDtype::kBf16, WireDtype::kFp16}) {
          SCOPED_TRACE(b->name() + " " + WireDtypeName(dtype) + " n " + std::to_string(n));
          const std::vector<uint16_t> h = Wire16Tensor(dtype, n, 40 + static_cast<uint32_t>(n));
          std::vector<float> wide(n);
          for (size_t i = 0; i < n; ++i) wide[i] = WidenParam(dtype, h[i]);
          for (size_t first : {size_t{0}, size_t{1}}) {
            if (first > n) continue;
            double want = -1, got = -2;
            ASSERT_TRUE(b->SumSquares(wide.data() + first, n - first, &want).ok());
            ASSERT_TRUE(b->SumSquaresWire(dtype, h.data() + first, n - first, &got).ok());
            EXPECT_TRUE(same_bits(got, want))
                << "from " << first << ": got " << got << " want " << want;
          }
          if (n > 0) {  // the largest finite value is in: not a vacuous match
            double got = 0;
            ASSERT_TRUE(b->SumSquaresWire(dtype, h.data(), n, &got).ok());
            EXPECT_GE(got, static_cast<double>(wide[0]) * wide[0]);
          }
        }
        const std::vector<float> x = Normal(n, 41);
        double want = -1, got = -2;
        ASSERT_TRUE(b->SumSquares(x.data(), n, &want).ok());
        ASSERT_TRUE(b->SumSquaresWire(WireDtype::kFp32, x.data(), n, &got).ok());
        EXPECT_TRUE(same_bits(got, want)) << b->name() << " fp32 n " << n;
      }
    }
  }
}

TEST(CpuSumSquaresWireTest, UnknownDtypeIsInvalidAndNothingSumsToZero) {
  for (bool simd : {false, true}) {
    std::unique_ptr<Backend> b = NewCpuBackend(simd, 2);
    const uint16_t h[4] = {0x3f80, 0x4000, 0x3c00, 0xc000};
    double got = -1;
    EXPECT_EQ(b->SumSquaresWire(static_cast<WireDtype>(3), h, 4, &got).code(),
              absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(b->SumSquaresWire(static_cast<WireDtype>(-1), h, 0, &got).code(),
              absl::StatusCode::kInvalidArgument);
    for (WireDtype dtype : {WireDtype::kFp32, WireDtype::kBf16, WireDtype::kFp16}) {
      got = -1;
      ASSERT_TRUE(b->SumSquaresWire(dtype, h, 0, &got).ok());
      EXPECT_EQ(got, 0.0) << WireDtypeName(dtype);
      EXPECT_FALSE(std::signbit(got)) << WireDtypeName(dtype);
    }
    got = -1;  // bf16 0x3f80 = 1, 0x4000 = 2, 0x3c00 = 2^-7, 0xc000 = -2
    ASSERT_TRUE(b->SumSquaresWire(WireDtype::kBf16, h, 4, &got).ok());
    EXPECT_EQ(got, 9.0 + std::ldexp(1.0, -14));
    got = -1;  // fp16 0x3f80 = 1.875, 0x4000 = 2, 0x3c00 = 1, 0xc000 = -2
    ASSERT_TRUE(b->SumSquaresWire(WireDtype::kFp16, h, 4, &got).ok());
    EXPECT_EQ(got, 1.875 * 1.875 + 4.0 + 1.0 + 4.0);
  }
}

TEST(BlockBytesTest, Sizes) {
  EXPECT_EQ(CompressedBlockBytes(64), 12u);
  EXPECT_EQ(Int8BlockBytes(64), 72u);
}

}  // namespace
}  // namespace onebit::kernels
