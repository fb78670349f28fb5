// The MLP's layout and initialisation, its gradient against finite differences in float64,
// and the Fashion-MNIST workload learning on the real data.
#include "worker/workloads/mlp_cpu.h"

#include <cmath>
#include <memory>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/kernels.h"
#include "worker/workloads/fashion_mnist.h"
#include "worker/transport/inproc_transport.h"
#include "worker/optim/onebit_adam.h"

namespace onebit {
namespace {

TEST(InitMlpParametersTest, DeterministicHeAndGlorot) {
  auto layout = *MlpLayout::Create({784, 256, 10});
  std::vector<float> a(layout.num_parameters()), b(a.size()), c(a.size());
  InitMlpParameters(layout, 7, a.data());
  InitMlpParameters(layout, 7, b.data());
  InitMlpParameters(layout, 8, c.data());
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  // Hidden layer: normal with std sqrt(2 / 784).
  double sumsq = 0;
  const size_t count = 784 * 256;
  for (size_t i = 0; i < count; ++i) sumsq += double{a[i]} * a[i];
  EXPECT_NEAR(std::sqrt(sumsq / count), std::sqrt(2.0 / 784), 0.01 * std::sqrt(2.0 / 784));
  for (int i = 0; i < 256; ++i) EXPECT_EQ(a[layout.bias_offset(0) + i], 0.0f);
  // Output layer: uniform within +-sqrt(6 / (256 + 10)).
  const double limit = std::sqrt(6.0 / 266);
  for (size_t i = layout.weights_offset(1); i < layout.bias_offset(1); ++i) {
    EXPECT_LE(std::abs(a[i]), limit);
  }
}

struct TinyProblem {
  std::vector<double> params, x;
  std::vector<uint8_t> labels;
};

TinyProblem MakeTinyProblem(const MlpLayout& layout, int64_t batch) {
  std::mt19937 rng(3);
  std::normal_distribution<double> normal(0.0, 1.0);
  TinyProblem p;
  p.params.resize(layout.num_parameters());
  for (double& v : p.params) v = 0.7 * normal(rng);
  p.x.resize(layout.inputs(0) * batch);
  for (double& v : p.x) v = normal(rng);
  const int classes = layout.outputs(layout.num_layers() - 1);
  for (int64_t j = 0; j < batch; ++j) p.labels.push_back(static_cast<uint8_t>(j % classes));
  return p;
}

TEST(MlpCpuTest, GradientMatchesFiniteDifferencesInFloat64) {
  const MlpLayout layout = *MlpLayout::Create({5, 4, 6, 3});
  constexpr int64_t kBatch = 7;
  TinyProblem p = MakeTinyProblem(layout, kBatch);
  MlpCpu<double> mlp(layout, kBatch);
  std::vector<double> grad(layout.num_parameters());
  auto result = mlp.Run(p.params.data(), p.x.data(), p.labels.data(), kBatch, grad.data());
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_GT(result->loss_sum, 0.0);

  auto mean_loss = [&](std::vector<double>& params) {
    return mlp.Run(params.data(), p.x.data(), p.labels.data(), kBatch, nullptr)->loss_sum / kBatch;
  };
  constexpr double kH = 1e-6;
  int nonzero = 0;
  for (size_t i = 0; i < grad.size(); ++i) {
    std::vector<double> plus = p.params, minus = p.params;
    plus[i] += kH;
    minus[i] -= kH;
    const double numeric = (mean_loss(plus) - mean_loss(minus)) / (2 * kH);
    EXPECT_NEAR(grad[i], numeric, 1e-8 + 1e-6 * std::abs(numeric)) << "parameter " << i;
    if (grad[i] != 0.0) ++nonzero;
  }
  // Some ReLUs are off, but most parameters must get a gradient.
  EXPECT_GT(nonzero, static_cast<int>(grad.size()) / 2);
}

TEST(MlpCpuTest, FloatAgreesWithDouble) {
  const MlpLayout layout = *MlpLayout::Create({20, 16, 10});
  constexpr int64_t kBatch = 9;
  TinyProblem p = MakeTinyProblem(layout, kBatch);
  std::vector<float> params_f(p.params.begin(), p.params.end());
  std::vector<float> x_f(p.x.begin(), p.x.end());
  std::vector<double> grad_d(layout.num_parameters());
  std::vector<float> grad_f(layout.num_parameters());
  MlpCpu<double> mlp_d(layout, kBatch);
  MlpCpu<float> mlp_f(layout, kBatch);
  auto rd = mlp_d.Run(p.params.data(), p.x.data(), p.labels.data(), kBatch, grad_d.data());
  auto rf = mlp_f.Run(params_f.data(), x_f.data(), p.labels.data(), kBatch, grad_f.data());
  ASSERT_TRUE(rd.ok() && rf.ok());
  EXPECT_NEAR(rf->loss_sum, rd->loss_sum, 1e-4 * rd->loss_sum);
  EXPECT_EQ(rf->correct, rd->correct);
  for (size_t i = 0; i < grad_d.size(); ++i) EXPECT_NEAR(grad_f[i], grad_d[i], 1e-5) << i;
}

TEST(MlpCpuTest, BadBatchesAreErrors) {
  const MlpLayout layout = *MlpLayout::Create({4, 3});
  MlpCpu<float> mlp(layout, 2);
  std::vector<float> params(layout.num_parameters()), x(12), grad(params.size());
  std::vector<uint8_t> labels = {0, 1, 2};
  EXPECT_EQ(mlp.Run(params.data(), x.data(), labels.data(), 3, grad.data()).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(mlp.Run(params.data(), x.data(), labels.data(), 0, grad.data()).status().code(),
            absl::StatusCode::kInvalidArgument);
  labels = {0, 3};
  EXPECT_EQ(mlp.Run(params.data(), x.data(), labels.data(), 2, grad.data()).status().code(),
            absl::StatusCode::kInvalidArgument);
}

class FashionMnistCpuWorkloadTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto data = LoadFashionMnist(kDefaultFashionMnistDir);
    ASSERT_TRUE(data.ok()) << data.status();
    data_ = new std::shared_ptr<const FashionMnist>(*std::move(data));
  }
  static void TearDownTestSuite() { delete data_; }

  static std::unique_ptr<Workload> Make(std::vector<int> hidden, int rank, int world,
                                        int64_t batch) {
    FashionMnistWorkloadOptions options;
    options.hidden = std::move(hidden);
    options.shard = {rank, world, batch, /*seed=*/5};
    auto workload = NewFashionMnistCpuWorkload(options, *data_);
    EXPECT_TRUE(workload.ok()) << workload.status();
    return *std::move(workload);
  }

  static std::shared_ptr<const FashionMnist>* data_;
};

std::shared_ptr<const FashionMnist>* FashionMnistCpuWorkloadTest::data_ = nullptr;

TEST_F(FashionMnistCpuWorkloadTest, GradientsAreAFunctionOfSeedStepAndRank) {
  auto a = Make({32}, 0, 2, 16);
  auto b = Make({32}, 0, 2, 16);
  auto other_rank = Make({32}, 1, 2, 16);
  std::vector<float> params(a->num_parameters());
  ASSERT_TRUE(a->InitParameters(params.data(), 1).ok());
  std::vector<float> ga(params.size()), gb(params.size()), gc(params.size());
  auto la = a->ComputeGradient(params.data(), 3, ga.data());
  auto lb = b->ComputeGradient(params.data(), 3, gb.data());
  auto lc = other_rank->ComputeGradient(params.data(), 3, gc.data());
  ASSERT_TRUE(la.ok() && lb.ok() && lc.ok());
  EXPECT_EQ(*la, *lb);
  EXPECT_EQ(ga, gb);
  EXPECT_NE(ga, gc);
  // An untrained 10-class model: loss near log(10).
  EXPECT_NEAR(*la, std::log(10.0), 0.7);
  EXPECT_EQ(a->ComputeGradient(params.data(), 0, ga.data()).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// Overlap: each layer's range is announced once per step, the last layer first, and what
// the gradient holds there when it is announced is what the call returns.
TEST_F(FashionMnistCpuWorkloadTest, AnnouncesEachLayerWhenItsGradientIsFinal) {
  auto w = Make({32, 16}, 0, 1, 8);
  const std::vector<ParamRange> expected = {
      {784 * 32 + 32 + 32 * 16 + 16, w->num_parameters()},
      {784 * 32 + 32, 784 * 32 + 32 + 32 * 16 + 16},
      {0, 784 * 32 + 32}};
  ASSERT_EQ(w->gradient_buckets(), expected);
  std::vector<float> params(w->num_parameters());
  ASSERT_TRUE(w->InitParameters(params.data(), 1).ok());
  std::vector<float> grad(params.size(), std::nanf(""));

  struct Recorder : GradientListener {
    const float* grad = nullptr;
    std::vector<ParamRange> seen;
    std::vector<std::vector<float>> copies;  // grad[begin, end) when announced
    void GradientReady(size_t begin, size_t end) override {
      seen.push_back({begin, end});
      copies.emplace_back(grad + begin, grad + end);
    }
  } recorder;
  recorder.grad = grad.data();
  w->set_gradient_listener(&recorder);
  for (int64_t step = 1; step <= 2; ++step) {
    recorder.seen.clear();
    recorder.copies.clear();
    ASSERT_TRUE(w->ComputeGradient(params.data(), step, grad.data()).ok());
    ASSERT_EQ(recorder.seen, expected);
    for (size_t b = 0; b < expected.size(); ++b) {
      EXPECT_EQ(recorder.copies[b], std::vector<float>(grad.begin() + expected[b].begin,
                                                       grad.begin() + expected[b].end))
          << "range " << b << " changed after it was announced";
    }
  }
  // Evaluation announces nothing; without a listener nothing is told.
  recorder.seen.clear();
  ASSERT_TRUE(w->Evaluate(params.data()).ok());
  EXPECT_TRUE(recorder.seen.empty());
  w->set_gradient_listener(nullptr);
  ASSERT_TRUE(w->ComputeGradient(params.data(), 3, grad.data()).ok());
  EXPECT_TRUE(recorder.seen.empty());
}

TEST_F(FashionMnistCpuWorkloadTest, AdamLearnsOnTheRealData) {
  auto workload = Make({64}, 0, 1, 64);
  const size_t n = workload->num_parameters();
  std::vector<float> p0(n);
  ASSERT_TRUE(workload->InitParameters(p0.data(), 1).ok());
  auto backend = kernels::NewCpuBackend();
  auto hub = InprocHub::Create(1);
  ASSERT_TRUE(hub.ok());
  auto transport = (*hub)->Connect(0);
  ASSERT_TRUE(transport.ok());
  OnebitAdamOptions options;
  options.hyper.lr = 2e-3f;
  auto adam = OnebitAdam::Create(options, backend.get(), transport->get(), p0.data(), n);
  ASSERT_TRUE(adam.ok()) << adam.status();

  auto before = workload->Evaluate((*adam)->params());
  ASSERT_TRUE(before.ok()) << before.status();
  EXPECT_EQ(before->examples, 10000);
  std::vector<float> grad(n);
  double first = 0, last = 0;
  constexpr int kSteps = 150;
  for (int t = 1; t <= kSteps; ++t) {
    auto loss = workload->ComputeGradient((*adam)->params(), t, grad.data());
    ASSERT_TRUE(loss.ok()) << loss.status();
    if (t <= 10) first += *loss / 10;
    if (t > kSteps - 10) last += *loss / 10;
    ASSERT_TRUE((*adam)->Step(grad.data()).ok());
  }
  EXPECT_LT(last, 0.6 * first);
  auto after = workload->Evaluate((*adam)->params());
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_LT(after->loss, 0.6 * before->loss);
  ASSERT_TRUE(after->accuracy.has_value());
  EXPECT_GT(*after->accuracy, 0.7);
  EXPECT_LT(*before->accuracy, 0.3);
}

}  // namespace
}  // namespace onebit
