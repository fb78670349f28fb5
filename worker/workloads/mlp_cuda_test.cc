// The GPU MLP against the CPU MLP: same parameters, same step and shard, so the same
// batch; loss, gradient and test-set evaluation must agree to within float rounding. Then
// the fp16 and bf16 workloads against the fp32 one, loss scaling, fp16 overflow, and
// training in half precision. Without a GPU only the clean failures are checked; the rest
// skips.
#include "worker/workloads/mlp_cuda.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/status_macros.h"
#include "gtest/gtest.h"
#include "kernels/buffer.h"
#include "kernels/cuda_backend.h"
#include "kernels/kernels.h"
#include "worker/workloads/fashion_mnist.h"
#include "worker/workloads/mlp_cpu.h"
#include "worker/workloads/workload.h"

namespace onebit {
namespace {

constexpr char kNoGpu[] =
    "no CUDA device here (no GPU, no driver, or a build without CUDA): the GPU MLP tests (CPU vs GPU, fp16/bf16 vs "
    "fp32, loss scaling, training) skipped";

std::shared_ptr<const FashionMnist> TinyData() {
  auto data = std::make_shared<FashionMnist>();
  for (LabeledImages* split : {&data->train, &data->test}) {
    split->count = 3;
    split->rows = split->cols = 28;
    split->pixels.assign(3 * 784, 7);
    split->labels = {0, 1, 2};
  }
  return data;
}

TEST(MlpCudaTest, NeedsACudaBackend) {
  auto cpu = kernels::NewCpuBackend();
  FashionMnistWorkloadOptions options;
  auto w = NewFashionMnistCudaWorkload(options, TinyData(), cpu.get());
  EXPECT_EQ(w.status().code(), absl::StatusCode::kFailedPrecondition) << w.status();
  EXPECT_EQ(NewFashionMnistCudaWorkload(options, TinyData(), nullptr).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(MlpCudaTest, UnknownPrecisionIsAnError) {
  if (!kernels::CudaBuilt()) {
    GTEST_SKIP() << "a build without CUDA: every call fails with kFailedPrecondition "
                    "(NeedsACudaBackend)";
  }
  auto cpu = kernels::NewCpuBackend();
  FashionMnistWorkloadOptions options;
  options.precision = static_cast<ComputePrecision>(7);
  EXPECT_EQ(NewFashionMnistCudaWorkload(options, TinyData(), cpu.get()).status().code(),
            absl::StatusCode::kInvalidArgument);
  // A valid half precision still needs a CUDA backend.
  options.precision = ComputePrecision::kFp16;
  EXPECT_EQ(NewFashionMnistCudaWorkload(options, TinyData(), cpu.get()).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(MlpCudaTest, MatchesTheCpuMlp) {
  if (kernels::CudaDeviceCount() == 0) GTEST_SKIP() << kNoGpu;
  auto data = LoadFashionMnist(kDefaultFashionMnistDir);
  ASSERT_TRUE(data.ok()) << data.status();
  auto backend = kernels::NewCudaBackend(0);
  ASSERT_TRUE(backend.ok()) << backend.status();
  kernels::Backend* gpu = backend->get();

  FashionMnistWorkloadOptions options;
  options.hidden = {128, 64};
  options.shard = {/*rank=*/1, /*world_size=*/2, /*micro_batch=*/48, /*seed=*/11};
  auto cpu_workload = NewFashionMnistCpuWorkload(options, *data);
  auto gpu_workload = NewFashionMnistCudaWorkload(options, *data, gpu);
  ASSERT_TRUE(cpu_workload.ok()) << cpu_workload.status();
  ASSERT_TRUE(gpu_workload.ok()) << gpu_workload.status();
  EXPECT_EQ((*gpu_workload)->memory_space(), kernels::MemorySpace::kCuda);
  const size_t n = (*cpu_workload)->num_parameters();
  ASSERT_EQ((*gpu_workload)->num_parameters(), n);

  std::vector<float> params(n), params_gpu_init(n);
  ASSERT_TRUE((*cpu_workload)->InitParameters(params.data(), 3).ok());
  ASSERT_TRUE((*gpu_workload)->InitParameters(params_gpu_init.data(), 3).ok());
  EXPECT_EQ(params, params_gpu_init);
  auto d_params = kernels::Buffer<float>::FromHost(gpu, params.data(), n);
  auto d_grad = kernels::Buffer<float>::Create(gpu, n);
  ASSERT_TRUE(d_params.ok() && d_grad.ok());

  for (int64_t step : {1, 7, 1250}) {  // step 1250 is in the second epoch
    SCOPED_TRACE(step);
    std::vector<float> grad_cpu(n);
    auto loss_cpu = (*cpu_workload)->ComputeGradient(params.data(), step, grad_cpu.data());
    auto loss_gpu = (*gpu_workload)->ComputeGradient(d_params->data(), step, d_grad->data());
    ASSERT_TRUE(loss_cpu.ok()) << loss_cpu.status();
    ASSERT_TRUE(loss_gpu.ok()) << loss_gpu.status();
    EXPECT_NEAR(*loss_gpu, *loss_cpu, 1e-5 * *loss_cpu);
    auto grad_gpu = d_grad->ToHost();
    ASSERT_TRUE(grad_gpu.ok());
    float scale = 0;
    for (float g : grad_cpu) scale = std::max(scale, std::abs(g));
    ASSERT_GT(scale, 0.0f);
    size_t worst = 0;
    float worst_diff = 0;
    for (size_t i = 0; i < n; ++i) {
      const float diff = std::abs((*grad_gpu)[i] - grad_cpu[i]);
      if (diff > worst_diff) {
        worst_diff = diff;
        worst = i;
      }
    }
    EXPECT_LE(worst_diff, 1e-4f * scale)
        << "parameter " << worst << ": gpu " << (*grad_gpu)[worst] << ", cpu " << grad_cpu[worst];
  }

  auto eval_cpu = (*cpu_workload)->Evaluate(params.data());
  auto eval_gpu = (*gpu_workload)->Evaluate(d_params->data());
  ASSERT_TRUE(eval_cpu.ok()) << eval_cpu.status();
  ASSERT_TRUE(eval_gpu.ok()) << eval_gpu.status();
  EXPECT_EQ(eval_gpu->examples, 10000);
  EXPECT_NEAR(eval_gpu->loss, eval_cpu->loss, 1e-5 * eval_cpu->loss);
  // An argmax can flip on a near tie under different rounding: allow two of 10000.
  EXPECT_NEAR(*eval_gpu->accuracy, *eval_cpu->accuracy, 2e-4);
}

// ---- Mixed precision ----

constexpr ComputePrecision kHalves[] = {ComputePrecision::kFp16, ComputePrecision::kBf16};
constexpr ComputePrecision kAll[] = {ComputePrecision::kFp32, ComputePrecision::kFp16,
                                     ComputePrecision::kBf16};
constexpr float kTwoTo40 = 1099511627776.0f;  // 2^40, exact in float

// sqrt(sum_i ||got_i / got_scale - ref_i||^2 / sum_i ||ref_i||^2): the relative L2
// distance, pooled over several gradients.
class Distance {
 public:
  void Add(const std::vector<float>& got, const std::vector<float>& ref, double got_scale = 1.0) {
    ASSERT_EQ(got.size(), ref.size());
    for (size_t i = 0; i < got.size(); ++i) {
      const double d = got[i] / got_scale - ref[i];
      diff_ += d * d;
      norm_ += double{ref[i]} * ref[i];
    }
  }
  double value() const { return std::sqrt(diff_ / norm_); }

 private:
  double diff_ = 0.0, norm_ = 0.0;
};

size_t NonFinite(const std::vector<float>& v) {
  return static_cast<size_t>(
      std::count_if(v.begin(), v.end(), [](float x) { return !std::isfinite(x); }));
}

struct Gradient {
  double loss = 0.0;
  std::vector<float> grad;
};

class MlpCudaPrecisionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (kernels::CudaDeviceCount() == 0) GTEST_SKIP() << kNoGpu;
    auto data = LoadFashionMnist(kDefaultFashionMnistDir);
    ASSERT_TRUE(data.ok()) << data.status();
    data_ = *data;
    auto backend = kernels::NewCudaBackend(0);
    ASSERT_TRUE(backend.ok()) << backend.status();
    backend_ = std::move(*backend);
  }

  absl::StatusOr<std::unique_ptr<Workload>> Make(ComputePrecision precision,
                                                 int64_t micro_batch = 64) {
    FashionMnistWorkloadOptions options;
    options.hidden = {128, 64};
    options.shard = {/*rank=*/0, /*world_size=*/1, micro_batch, /*seed=*/11};
    options.precision = precision;
    return NewFashionMnistCudaWorkload(options, data_, backend_.get());
  }

  // The initial parameters (seed 3) in device memory.
  absl::StatusOr<kernels::Buffer<float>> InitialParams(const Workload& w) {
    std::vector<float> host(w.num_parameters());
    ONEBIT_RETURN_IF_ERROR(w.InitParameters(host.data(), 3));
    return kernels::Buffer<float>::FromHost(backend_.get(), host.data(), host.size());
  }

  absl::StatusOr<Gradient> GradientAt(Workload& w, const kernels::Buffer<float>& params,
                                      int64_t step) {
    ONEBIT_ASSIGN_OR_RETURN(auto grad,
                            kernels::Buffer<float>::Create(backend_.get(), w.num_parameters()));
    Gradient result;
    ONEBIT_ASSIGN_OR_RETURN(result.loss, w.ComputeGradient(params.data(), step, grad.data()));
    ONEBIT_ASSIGN_OR_RETURN(result.grad, grad.ToHost());
    return result;
  }

  std::shared_ptr<const FashionMnist> data_;
  std::unique_ptr<kernels::Backend> backend_;
};

// Tolerances from a CPU emulation of these passes (rounding to fp16 / bf16 wherever the GPU
// stores a value, sums in fp32) on the same data, layout, batch and parameters: the pooled
// distance over 8 steps was 5.9e-3..6.4e-3 for fp16 and 1.6e-2..1.8e-2 for bf16 (five
// windows of 8 steps), the loss within 5e-5 (fp16) and 4e-4 (bf16) relative, the test-set
// loss within 1e-4 and 4e-4, the accuracy within 1e-4 and 1e-3. Unit roundoff alone would
// give less (fp16 2^-11 = 4.9e-4, bf16 2^-8 = 3.9e-3): most of the distance is hidden units
// whose pre-activation is within rounding of 0 and so switch on or off, rare events that
// make single steps heavy-tailed (a batch of 64 gave up to 3e-2 for fp16 on one step), hence
// pooling over steps and a batch of 256. The margins (2.3x and 2.8x) cover the GPU's other
// summation order. The lower bounds show the passes really round to half precision (fp32
// computed twice differs by ~1e-7).
TEST_F(MlpCudaPrecisionTest, HalfGradientsMatchFp32) {
  auto fp32 = Make(ComputePrecision::kFp32, 256);
  ASSERT_TRUE(fp32.ok()) << fp32.status();
  EXPECT_EQ((*fp32)->precision(), ComputePrecision::kFp32);
  auto params = InitialParams(**fp32);
  ASSERT_TRUE(params.ok()) << params.status();
  auto eval32 = (*fp32)->Evaluate(params->data());
  ASSERT_TRUE(eval32.ok()) << eval32.status();

  for (ComputePrecision precision : kHalves) {
    SCOPED_TRACE(ComputePrecisionName(precision));
    const bool fp16 = precision == ComputePrecision::kFp16;
    const double grad_tolerance = fp16 ? 1.5e-2 : 5e-2;
    const double grad_floor = fp16 ? 1e-4 : 1e-3;
    const double loss_tolerance = fp16 ? 1e-3 : 5e-3;
    const double accuracy_tolerance = fp16 ? 2e-3 : 5e-3;
    auto half = Make(precision, 256);
    ASSERT_TRUE(half.ok()) << half.status();
    EXPECT_EQ((*half)->precision(), precision);
    EXPECT_NE((*half)->name().find(ComputePrecisionName(precision)), std::string::npos)
        << (*half)->name();
    ASSERT_EQ((*half)->num_parameters(), (*fp32)->num_parameters());

    Distance distance;
    for (int64_t step = 1; step <= 8; ++step) {
      SCOPED_TRACE(step);
      auto ref = GradientAt(**fp32, *params, step);
      auto got = GradientAt(**half, *params, step);
      ASSERT_TRUE(ref.ok()) << ref.status();
      ASSERT_TRUE(got.ok()) << got.status();
      EXPECT_NEAR(got->loss, ref->loss, loss_tolerance * ref->loss);
      EXPECT_EQ(NonFinite(got->grad), 0u);
      distance.Add(got->grad, ref->grad);
    }
    EXPECT_LT(distance.value(), grad_tolerance);
    EXPECT_GT(distance.value(), grad_floor);

    auto eval = (*half)->Evaluate(params->data());
    ASSERT_TRUE(eval.ok()) << eval.status();
    EXPECT_EQ(eval->examples, eval32->examples);
    EXPECT_NEAR(eval->loss, eval32->loss, loss_tolerance * eval32->loss);
    EXPECT_NEAR(*eval->accuracy, *eval32->accuracy, accuracy_tolerance);
  }
}

// Scaling by a power of two commutes with every rounding in the passes (fp32 and bf16 have
// the exponent range for it), so fp32 and bf16 give 1024 times the gradient up to
// reordering (cuBLAS picks the same algorithm for the same shapes: bit-equal in practice).
// fp16 differs where the unscaled gradient was subnormal (below 6.1e-5) and lost bits that
// the scaled one keeps: that is what the scale is for. The loss is unscaled.
TEST_F(MlpCudaPrecisionTest, LossScaleMultipliesTheGradient) {
  for (ComputePrecision precision : kAll) {
    SCOPED_TRACE(ComputePrecisionName(precision));
    auto w = Make(precision);
    ASSERT_TRUE(w.ok()) << w.status();
    auto params = InitialParams(**w);
    ASSERT_TRUE(params.ok()) << params.status();
    auto unscaled = GradientAt(**w, *params, 5);
    ASSERT_TRUE(unscaled.ok()) << unscaled.status();

    ASSERT_TRUE((*w)->SetLossScale(1024.0f).ok());
    auto scaled = GradientAt(**w, *params, 5);
    ASSERT_TRUE(scaled.ok()) << scaled.status();
    EXPECT_EQ(scaled->loss, unscaled->loss);
    EXPECT_EQ(NonFinite(scaled->grad), 0u);
    Distance distance;
    distance.Add(scaled->grad, unscaled->grad, 1024.0);
    EXPECT_LT(distance.value(), precision == ComputePrecision::kFp16 ? 1e-2 : 1e-6);

    // Back to 1: the unscaled gradient again.
    ASSERT_TRUE((*w)->SetLossScale(1.0f).ok());
    auto again = GradientAt(**w, *params, 5);
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_EQ(again->loss, unscaled->loss);
    Distance back;
    back.Add(again->grad, unscaled->grad);
    EXPECT_LT(back.value(), 1e-6);
  }
}

// 2^40 times the loss's gradient overflows fp16 (largest finite 65504) from the softmax on;
// grad_out shows it as inf or NaN rather than a clamped number. bf16 has fp32's exponent
// range: finite, and 2^40 times the unscaled gradient.
TEST_F(MlpCudaPrecisionTest, Fp16OverflowsWhereBf16DoesNot) {
  for (ComputePrecision precision : kHalves) {
    SCOPED_TRACE(ComputePrecisionName(precision));
    auto w = Make(precision);
    ASSERT_TRUE(w.ok()) << w.status();
    auto params = InitialParams(**w);
    ASSERT_TRUE(params.ok()) << params.status();
    auto unscaled = GradientAt(**w, *params, 2);
    ASSERT_TRUE(unscaled.ok()) << unscaled.status();
    ASSERT_TRUE((*w)->SetLossScale(kTwoTo40).ok());
    auto scaled = GradientAt(**w, *params, 2);
    ASSERT_TRUE(scaled.ok()) << scaled.status();
    EXPECT_EQ(scaled->loss, unscaled->loss);
    EXPECT_TRUE(std::isfinite(scaled->loss));
    if (precision == ComputePrecision::kFp16) {
      EXPECT_GT(NonFinite(scaled->grad), 0u);
    } else {
      EXPECT_EQ(NonFinite(scaled->grad), 0u);
      Distance distance;
      distance.Add(scaled->grad, unscaled->grad, kTwoTo40);
      EXPECT_LT(distance.value(), 1e-6);
    }
  }
}

TEST_F(MlpCudaPrecisionTest, BadLossScalesAreInvalidArguments) {
  for (ComputePrecision precision : kAll) {
    SCOPED_TRACE(ComputePrecisionName(precision));
    auto w = Make(precision);
    ASSERT_TRUE(w.ok()) << w.status();
    auto params = InitialParams(**w);
    ASSERT_TRUE(params.ok()) << params.status();
    auto before = GradientAt(**w, *params, 3);
    ASSERT_TRUE(before.ok()) << before.status();
    for (float scale : {0.0f, -0.0f, -1.0f, std::numeric_limits<float>::quiet_NaN(),
                        std::numeric_limits<float>::infinity(),
                        -std::numeric_limits<float>::infinity()}) {
      SCOPED_TRACE(scale);
      EXPECT_EQ((*w)->SetLossScale(scale).code(), absl::StatusCode::kInvalidArgument);
    }
    // The scale in force is still 1.
    auto after = GradientAt(**w, *params, 3);
    ASSERT_TRUE(after.ok()) << after.status();
    Distance distance;
    distance.Add(after->grad, before->grad);
    EXPECT_LT(distance.value(), 1e-6);
  }
}

// Plain SGD on the fp32 master parameters (on the host, to keep the optimizer out of it),
// with the gradients computed in half precision: fp16 with a loss scale of 1024 divided back
// out, as the trainer does, and bf16 unscaled. In the CPU emulation (see above) these 200
// steps took the mean training loss of the first and last 10 steps from 1.87 to 0.61 and
// the test set from loss 2.46 to 0.576 and accuracy 0.10 to 0.797, in fp32, fp16 and bf16
// alike (within 0.002 and 0.001).
TEST_F(MlpCudaPrecisionTest, HalfPrecisionTrains) {
  constexpr int kSteps = 200;
  constexpr float kLr = 0.1f;
  for (ComputePrecision precision : kHalves) {
    SCOPED_TRACE(ComputePrecisionName(precision));
    const float scale = precision == ComputePrecision::kFp16 ? 1024.0f : 1.0f;
    auto w = Make(precision);
    ASSERT_TRUE(w.ok()) << w.status();
    ASSERT_TRUE((*w)->SetLossScale(scale).ok());
    const size_t n = (*w)->num_parameters();
    std::vector<float> host(n);
    ASSERT_TRUE((*w)->InitParameters(host.data(), 3).ok());
    auto params = kernels::Buffer<float>::FromHost(backend_.get(), host.data(), n);
    ASSERT_TRUE(params.ok()) << params.status();
    auto before = (*w)->Evaluate(params->data());
    ASSERT_TRUE(before.ok()) << before.status();

    double first = 0, last = 0;
    for (int64_t t = 1; t <= kSteps; ++t) {
      auto g = GradientAt(**w, *params, t);
      ASSERT_TRUE(g.ok()) << g.status();
      ASSERT_EQ(NonFinite(g->grad), 0u) << "step " << t;
      if (t <= 10) first += g->loss / 10;
      if (t > kSteps - 10) last += g->loss / 10;
      for (size_t i = 0; i < n; ++i) host[i] -= kLr * (g->grad[i] / scale);
      ASSERT_TRUE(params->CopyFromHost(host.data(), n).ok());
    }
    EXPECT_LT(last, 0.6 * first);
    auto after = (*w)->Evaluate(params->data());
    ASSERT_TRUE(after.ok()) << after.status();
    EXPECT_LT(after->loss, 0.5 * before->loss);
    EXPECT_GT(*after->accuracy, 0.75);
  }
}

}  // namespace
}  // namespace onebit
