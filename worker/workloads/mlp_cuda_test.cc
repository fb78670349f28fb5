// The GPU MLP against the CPU MLP: same parameters, same step and shard, so the same
// batch; loss, gradient and test-set evaluation must agree to within float rounding.
// Without a GPU only the clean failure is checked; the rest skips.
#include "worker/workloads/mlp_cuda.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/buffer.h"
#include "kernels/cuda_backend.h"
#include "kernels/kernels.h"
#include "worker/workloads/fashion_mnist.h"
#include "worker/workloads/mlp_cpu.h"

namespace onebit {
namespace {

constexpr char kNoGpu[] = "no CUDA device here (no GPU or no driver): CPU-vs-GPU MLP tests skipped";

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

}  // namespace
}  // namespace onebit
