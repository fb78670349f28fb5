// The synthetic gradient source: determinism, noise statistics, BERT-Large size without
// per-element memory, and convergence under Adam.
#include "worker/workloads/synthetic_workload.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/kernels.h"
#include "worker/transport/inproc_transport.h"
#include "worker/optim/onebit_adam.h"

namespace onebit {
namespace {

std::unique_ptr<Workload> Make(int64_t n, int rank, float noise = 1.0f, uint64_t seed = 3) {
  SyntheticWorkloadOptions options;
  options.parameters = n;
  options.noise = noise;
  options.shard = {rank, 4, 1, seed};
  auto workload = NewSyntheticWorkload(options);
  EXPECT_TRUE(workload.ok()) << workload.status();
  return *std::move(workload);
}

std::vector<float> Grad(Workload& w, const std::vector<float>& p, int64_t step, double* loss) {
  std::vector<float> g(p.size());
  auto l = w.ComputeGradient(p.data(), step, g.data());
  EXPECT_TRUE(l.ok()) << l.status();
  if (loss != nullptr) *loss = *l;
  return g;
}

TEST(SyntheticWorkloadTest, GradientIsAFunctionOfSeedStepRankAndIndex) {
  constexpr int64_t kN = 10007;  // not a multiple of the vector width or block
  auto a = Make(kN, 1);
  auto b = Make(kN, 1);
  std::vector<float> p(kN);
  ASSERT_TRUE(a->InitParameters(p.data(), 3).ok());
  const std::vector<float> g = Grad(*a, p, 5, nullptr);
  EXPECT_EQ(g, Grad(*b, p, 5, nullptr));
  EXPECT_NE(g, Grad(*a, p, 6, nullptr));
  EXPECT_NE(g, Grad(*Make(kN, 2), p, 5, nullptr));
  EXPECT_NE(g, Grad(*Make(kN, 1, 1.0f, 4), p, 5, nullptr));
  // A prefix of a larger problem sees the same elements.
  std::vector<float> p_big(2 * kN);
  const std::vector<float> g_big = Grad(*Make(2 * kN, 1), p_big, 5, nullptr);
  EXPECT_TRUE(std::equal(g.begin(), g.end(), g_big.begin()));
}

TEST(SyntheticWorkloadTest, NoiseHasMeanZeroAndVarianceOne) {
  constexpr int64_t kN = 1 << 18;
  std::vector<float> p(kN, 0.25f);
  double loss_clean = 0, loss_noisy = 0;
  const std::vector<float> clean = Grad(*Make(kN, 0, 0.0f), p, 1, &loss_clean);
  const std::vector<float> noisy = Grad(*Make(kN, 0, 1.0f), p, 1, &loss_noisy);
  // The loss is the bowl's, without noise.
  EXPECT_EQ(loss_clean, loss_noisy);
  double mean = 0, sumsq = 0, target_sum = 0, loss = 0;
  for (int64_t i = 0; i < kN; ++i) {
    const double u = double{noisy[i]} - clean[i];
    mean += u;
    sumsq += u * u;
    target_sum += 0.25 - clean[i];  // target_i = p_i - clean gradient
    loss += 0.5 * double{clean[i]} * clean[i];
  }
  mean /= kN;
  EXPECT_NEAR(mean, 0.0, 0.01);
  EXPECT_NEAR(sumsq / kN - mean * mean, 1.0, 0.01);
  EXPECT_NEAR(target_sum / kN, 0.0, 0.01);  // targets uniform in [-1, 1)
  EXPECT_NEAR(loss_clean, loss / kN, 1e-6 * loss_clean);
  auto eval = Make(kN, 2)->Evaluate(p.data());
  ASSERT_TRUE(eval.ok());
  EXPECT_NEAR(eval->loss, loss_clean, 1e-12);
  EXPECT_FALSE(eval->accuracy.has_value());
}

TEST(SyntheticWorkloadTest, BertLargeSizeAllocatesNothingPerElement) {
  SyntheticWorkloadOptions options;
  options.parameters = 340'000'000;
  auto workload = NewSyntheticWorkload(options);
  ASSERT_TRUE(workload.ok()) << workload.status();
  EXPECT_EQ((*workload)->num_parameters(), 340'000'000u);
  options.parameters = kMaxSyntheticParameters + 1;
  EXPECT_EQ(NewSyntheticWorkload(options).status().code(), absl::StatusCode::kInvalidArgument);
  options.parameters = 10;
  options.noise = -1;
  EXPECT_EQ(NewSyntheticWorkload(options).status().code(), absl::StatusCode::kInvalidArgument);
  options.noise = 1;
  options.shard.rank = 1;  // world size 1
  EXPECT_EQ(NewSyntheticWorkload(options).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(SyntheticWorkloadTest, AdamConverges) {
  constexpr int64_t kN = 5000;
  auto workload = Make(kN, 0, 0.5f);
  std::vector<float> p0(kN);
  ASSERT_TRUE(workload->InitParameters(p0.data(), 3).ok());
  auto backend = kernels::NewCpuBackend();
  auto hub = InprocHub::Create(1);
  ASSERT_TRUE(hub.ok());
  auto transport = (*hub)->Connect(0);
  ASSERT_TRUE(transport.ok());
  OnebitAdamOptions options;
  options.hyper.lr = 0.01f;
  auto adam = OnebitAdam::Create(options, backend.get(), transport->get(), p0.data(), kN);
  ASSERT_TRUE(adam.ok()) << adam.status();
  const double initial = workload->Evaluate((*adam)->params())->loss;
  EXPECT_NEAR(initial, 1.0 / 6, 0.01);  // 0.5 * E[t^2], t uniform in [-1, 1)
  std::vector<float> grad(kN);
  for (int t = 1; t <= 300; ++t) {
    ASSERT_TRUE(workload->ComputeGradient((*adam)->params(), t, grad.data()).ok());
    ASSERT_TRUE((*adam)->Step(grad.data()).ok());
  }
  EXPECT_LT(workload->Evaluate((*adam)->params())->loss, 0.1 * initial);
}

TEST(SyntheticWorkloadTest, Throughput) {
  // Not a pass/fail bound (shared CI machines): prints the rate for the record.
  constexpr int64_t kN = 1 << 24;
  auto workload = Make(kN, 0);
  std::vector<float> p(kN), g(kN);
  ASSERT_TRUE(workload->ComputeGradient(p.data(), 1, g.data()).ok());  // warm the pages
  const auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE(workload->ComputeGradient(p.data(), 2, g.data()).ok());
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("synthetic gradient: %.2f ns per parameter (%.0f M parameters/s)\n",
              1e9 * seconds / kN, kN / seconds / 1e6);
}

}  // namespace
}  // namespace onebit
