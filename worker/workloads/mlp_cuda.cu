// The Fashion-MNIST MLP on a GPU (mlp_cuda.h). Matrices are column-major with one example
// per column, as on the CPU, so each layer is one cuBLAS SGEMM:
//   forward    z_l = W_l a_{l-1}            (N, N)   then a_l = relu(z_l + b_l)
//   backward   dW_l = delta_l a_{l-1}^T     (N, T)   db_l = row sums of delta_l
//              back = W_l^T delta_l         (T, N)   delta_{l-1} = back * [a_{l-1} > 0]
// delta_l overwrites a_l in place, exactly as MlpCpu does.

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kernels/buffer.h"
#include "kernels/cuda_backend.h"
#include "kernels/kernels.h"
#include "common/status_macros.h"
#include "worker/workloads/fashion_mnist.h"
#include "kernels/cuda_status.h"
#include "worker/workloads/mlp_cpu.h"
#include "worker/workloads/mlp_cuda.h"
#include "worker/workloads/workload.h"

namespace onebit {
namespace {

// ---------------------------------------------------------------------------------------
// Errors: every CUDA and cuBLAS call names itself, its file and line.

// cuBLAS is loaded when the first CUDA workload is made, not linked: linking
// libcublasLt.so makes civetweb (the /metrics server of prometheus-cpp) fail to start in
// the same process, and CPU-only runs should not need cuBLAS installed at all.
struct CublasApi {
  decltype(&cublasCreate_v2) create;
  decltype(&cublasDestroy_v2) destroy;
  decltype(&cublasSetStream_v2) set_stream;
  decltype(&cublasSetMathMode) set_math_mode;
  decltype(&cublasSetPointerMode_v2) set_pointer_mode;
  decltype(&cublasSgemm_v2) sgemm;
  decltype(&cublasGetStatusName) status_name;
  decltype(&cublasGetStatusString) status_string;
};

absl::StatusOr<const CublasApi*> LoadCublas() {
  static const absl::StatusOr<const CublasApi*> api = []() -> absl::StatusOr<const CublasApi*> {
    void* lib = dlopen("libcublas.so.13", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      return absl::UnavailableError(absl::StrCat("cannot load cuBLAS: ", dlerror()));
    }
    static CublasApi table;
    bool ok = true;
    auto get = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, name));
      ok = ok && fn != nullptr;
    };
    get(table.create, "cublasCreate_v2");
    get(table.destroy, "cublasDestroy_v2");
    get(table.set_stream, "cublasSetStream_v2");
    get(table.set_math_mode, "cublasSetMathMode");
    get(table.set_pointer_mode, "cublasSetPointerMode_v2");
    get(table.sgemm, "cublasSgemm_v2");
    get(table.status_name, "cublasGetStatusName");
    get(table.status_string, "cublasGetStatusString");
    if (!ok) return absl::UnavailableError("libcublas.so.13 lacks a function onebit needs");
    return &table;
  }();
  return api;
}

absl::Status CublasStatus(cublasStatus_t status, const char* expr, const char* file, int line) {
  const absl::StatusCode code =
      status == CUBLAS_STATUS_ALLOC_FAILED      ? absl::StatusCode::kResourceExhausted
      : status == CUBLAS_STATUS_NOT_INITIALIZED ? absl::StatusCode::kUnavailable
                                                : absl::StatusCode::kInternal;
  return absl::Status(
      code, absl::StrCat(file, ":", line, ": ", expr, ": ", (*LoadCublas())->status_name(status),
                         ": ", (*LoadCublas())->status_string(status)));
}

#define ONEBIT_CUBLAS_RETURN_IF_ERROR(expr)                                  \
  do {                                                                       \
    const cublasStatus_t onebit_cublas_status_ = (expr);                     \
    if (onebit_cublas_status_ != CUBLAS_STATUS_SUCCESS) {                    \
      return CublasStatus(onebit_cublas_status_, #expr, __FILE__, __LINE__); \
    }                                                                        \
  } while (0)


// ---------------------------------------------------------------------------------------
// Device code. Elementwise kernels use grid-stride loops over a capped grid.

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 4096;

int BlocksFor(int64_t n) {
  return static_cast<int>(
      std::max<int64_t>(1, std::min((n + kThreads - 1) / kThreads, kMaxBlocks)));
}

// Columns j of `out` (size x n) are images indices[j] (or first + j when indices is null),
// scaled to [0, 1] as p / 255 (IEEE division, as the CPU's table); labels follow.
__global__ void GatherKernel(const uint8_t* pixels, const uint8_t* all_labels,
                             const int64_t* indices, int64_t first, int64_t size, int64_t n,
                             float* out, uint8_t* labels) {
  const int64_t total = size * n;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t j = e / size;
    const int64_t k = e - j * size;
    const int64_t image = indices != nullptr ? indices[j] : first + j;
    out[e] = static_cast<float>(pixels[image * size + k]) / 255.0f;
    if (k == 0) labels[j] = all_labels[image];
  }
}

// z = z + b (per row), then max(z, 0) on hidden layers.
__global__ void BiasActivationKernel(float* z, const float* bias, int rows, int64_t cols,
                                     bool relu) {
  const int64_t total = rows * cols;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float v = z[e] + bias[e % rows];
    z[e] = relu ? fmaxf(v, 0.0f) : v;
  }
}

// One thread per example: loss = logsumexp(z) - z[label], whether the first largest logit is
// the label, and (write_delta) z := (softmax(z) - onehot) / batch in place.
__global__ void SoftmaxXentKernel(float* logits, const uint8_t* labels, int classes, int64_t batch,
                                  float inv_batch, bool write_delta, float* loss, float* correct) {
  const int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (j >= batch) return;
  float* z = logits + j * classes;
  const int label = labels[j];
  int argmax = 0;
  float max = z[0];
  for (int k = 1; k < classes; ++k) {
    if (z[k] > max) {
      max = z[k];
      argmax = k;
    }
  }
  float sum = 0.0f;
  for (int k = 0; k < classes; ++k) sum += expf(z[k] - max);
  const float lse = max + logf(sum);
  loss[j] = lse - z[label];
  correct[j] = argmax == label ? 1.0f : 0.0f;
  if (write_delta) {
    for (int k = 0; k < classes; ++k) {
      z[k] = (expf(z[k] - lse) - (k == label ? 1.0f : 0.0f)) * inv_batch;
    }
  }
}

// One block: stats[0] = sum of loss, stats[1] = sum of correct, in float64.
__global__ void SumStatsKernel(const float* loss, const float* correct, int64_t n, double* stats) {
  __shared__ double loss_sums[kThreads];
  __shared__ double correct_sums[kThreads];
  double l = 0.0, c = 0.0;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
    l += loss[j];
    c += correct[j];
  }
  loss_sums[threadIdx.x] = l;
  correct_sums[threadIdx.x] = c;
  __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride >>= 1) {
    if (threadIdx.x < stride) {
      loss_sums[threadIdx.x] += loss_sums[threadIdx.x + stride];
      correct_sums[threadIdx.x] += correct_sums[threadIdx.x + stride];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    stats[0] = loss_sums[0];
    stats[1] = correct_sums[0];
  }
}

// out[r] = sum over columns of delta[r, :]. One thread per row: adjacent threads read
// adjacent addresses of each column.
__global__ void RowSumKernel(const float* delta, int rows, int64_t cols, float* out) {
  const int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  float sum = 0.0f;
  for (int64_t j = 0; j < cols; ++j) sum += delta[r + j * rows];
  out[r] = sum;
}

// a := back where a > 0, else 0 (ReLU's derivative; a > 0 exactly where z > 0).
__global__ void ReluBackwardKernel(float* a, const float* back, int64_t n) {
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < n;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    a[e] = a[e] > 0.0f ? back[e] : 0.0f;
  }
}

// ---------------------------------------------------------------------------------------
// The workload.

// A split's images and labels in device memory.
struct DeviceSplit {
  kernels::Buffer<uint8_t> pixels;
  kernels::Buffer<uint8_t> labels;
  int64_t count = 0;
};

absl::StatusOr<DeviceSplit> Upload(kernels::Backend* backend, const LabeledImages& split) {
  DeviceSplit d;
  ONEBIT_ASSIGN_OR_RETURN(d.pixels, kernels::Buffer<uint8_t>::FromHost(backend, split.pixels.data(),
                                                                       split.pixels.size()));
  ONEBIT_ASSIGN_OR_RETURN(d.labels, kernels::Buffer<uint8_t>::FromHost(backend, split.labels.data(),
                                                                       split.labels.size()));
  d.count = split.count;
  return d;
}

class FashionMnistCudaWorkload : public Workload {
 public:
  static absl::StatusOr<std::unique_ptr<Workload>> Create(
      const FashionMnistWorkloadOptions& options, std::shared_ptr<const FashionMnist> data,
      MlpLayout layout, kernels::Backend* backend, cudaStream_t stream, int device) {
    std::unique_ptr<FashionMnistCudaWorkload> w(
        new FashionMnistCudaWorkload(options, data, std::move(layout), backend, stream, device));
    ONEBIT_RETURN_IF_ERROR(w->Init());
    return std::unique_ptr<Workload>(std::move(w));
  }

  ~FashionMnistCudaWorkload() override {
    if (handle_ != nullptr) {
      cudaSetDevice(device_);
      cublas_->destroy(handle_);
    }
  }

  std::string name() const override {
    return absl::StrCat("fashion_mnist mlp ", absl::StrJoin(layout_.sizes(), "-"),
                        " (cuda:", device_, ")");
  }
  size_t num_parameters() const override { return layout_.num_parameters(); }
  std::vector<size_t> parameter_groups() const override { return layout_.tensor_offsets(); }
  kernels::MemorySpace memory_space() const override { return kernels::MemorySpace::kCuda; }

  absl::Status InitParameters(float* host_params, uint64_t seed) const override {
    InitMlpParameters(layout_, seed, host_params);
    return absl::OkStatus();
  }

  absl::StatusOr<double> ComputeGradient(const float* params, int64_t step,
                                         float* grad_out) override {
    if (step < 1) return absl::InvalidArgumentError(absl::StrCat("step ", step, " is not >= 1"));
    ONEBIT_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    const int64_t batch = shard_.micro_batch;
    sampler_.Indices(step, host_indices_.data());
    ONEBIT_RETURN_IF_ERROR(
        backend_->CopyFromHost(indices_.data(), host_indices_.data(), batch * sizeof(int64_t)));
    ONEBIT_ASSIGN_OR_RETURN(MlpBatchResult r,
                            Run(train_, indices_.data(), 0, batch, params, grad_out));
    return r.loss_sum / static_cast<double>(batch);
  }

  absl::StatusOr<EvalResult> Evaluate(const float* params) override {
    ONEBIT_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    MlpBatchResult total;
    for (int64_t first = 0; first < test_.count; first += kMlpEvalChunk) {
      const int64_t n = std::min(kMlpEvalChunk, test_.count - first);
      ONEBIT_ASSIGN_OR_RETURN(MlpBatchResult r, Run(test_, nullptr, first, n, params, nullptr));
      total.loss_sum += r.loss_sum;
      total.correct += r.correct;
    }
    EvalResult result;
    result.examples = test_.count;
    if (test_.count > 0) {
      result.loss = total.loss_sum / static_cast<double>(test_.count);
      result.accuracy = static_cast<double>(total.correct) / static_cast<double>(test_.count);
    }
    return result;
  }

 private:
  FashionMnistCudaWorkload(const FashionMnistWorkloadOptions& options,
                           std::shared_ptr<const FashionMnist> data, MlpLayout layout,
                           kernels::Backend* backend, cudaStream_t stream, int device)
      : shard_(options.shard),
        data_(std::move(data)),
        sampler_(data_->train.count, shard_.seed, shard_.rank, shard_.world_size,
                 shard_.micro_batch),
        layout_(std::move(layout)),
        max_batch_(std::max(shard_.micro_batch, kMlpEvalChunk)),
        backend_(backend),
        stream_(stream),
        device_(device),
        host_indices_(shard_.micro_batch) {}

  absl::Status Init() {
    using kernels::Buffer;
    ONEBIT_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    ONEBIT_ASSIGN_OR_RETURN(cublas_, LoadCublas());
    ONEBIT_CUBLAS_RETURN_IF_ERROR(cublas_->create(&handle_));
    ONEBIT_CUBLAS_RETURN_IF_ERROR(cublas_->set_stream(handle_, stream_));
    // Plain FP32: TF32 would make the GPU drift from the CPU model by ~1e-3.
    ONEBIT_CUBLAS_RETURN_IF_ERROR(cublas_->set_math_mode(handle_, CUBLAS_DEFAULT_MATH));
    ONEBIT_CUBLAS_RETURN_IF_ERROR(cublas_->set_pointer_mode(handle_, CUBLAS_POINTER_MODE_HOST));
    ONEBIT_ASSIGN_OR_RETURN(train_, Upload(backend_, data_->train));
    ONEBIT_ASSIGN_OR_RETURN(test_, Upload(backend_, data_->test));
    ONEBIT_ASSIGN_OR_RETURN(indices_, Buffer<int64_t>::Create(backend_, shard_.micro_batch));
    ONEBIT_ASSIGN_OR_RETURN(x_, Buffer<float>::Create(backend_, layout_.inputs(0) * max_batch_));
    ONEBIT_ASSIGN_OR_RETURN(labels_, Buffer<uint8_t>::Create(backend_, max_batch_));
    for (int l = 0; l < layout_.num_layers(); ++l) {
      ONEBIT_ASSIGN_OR_RETURN(Buffer<float> a,
                              Buffer<float>::Create(backend_, layout_.outputs(l) * max_batch_));
      activations_.push_back(std::move(a));
    }
    ONEBIT_ASSIGN_OR_RETURN(scratch_,
                            Buffer<float>::Create(backend_, layout_.max_width() * max_batch_));
    ONEBIT_ASSIGN_OR_RETURN(loss_, Buffer<float>::Create(backend_, max_batch_));
    ONEBIT_ASSIGN_OR_RETURN(correct_, Buffer<float>::Create(backend_, max_batch_));
    ONEBIT_ASSIGN_OR_RETURN(stats_, Buffer<double>::Create(backend_, 2));
    return absl::OkStatus();
  }

  // The MLP on n examples of `split` (indices on the device, or first..first+n-1).
  absl::StatusOr<MlpBatchResult> Run(const DeviceSplit& split, const int64_t* indices,
                                     int64_t first, int64_t n, const float* params, float* grad) {
    const int num_layers = layout_.num_layers();
    const int classes = layout_.outputs(num_layers - 1);
    const int batch = static_cast<int>(n);  // <= max_batch_ <= INT_MAX, checked at creation
    const int64_t image = layout_.inputs(0);
    GatherKernel<<<BlocksFor(image * n), kThreads, 0, stream_>>>(
        split.pixels.data(), split.labels.data(), indices, first, image, n, x_.data(),
        labels_.data());
    ONEBIT_CUDA_RETURN_IF_LAUNCH_ERROR();

    const float one = 1.0f, zero = 0.0f;
    auto input_of = [&](int l) -> const float* {
      return l == 0 ? x_.data() : activations_[l - 1].data();
    };
    for (int l = 0; l < num_layers; ++l) {
      const int outs = layout_.outputs(l), ins = layout_.inputs(l);
      float* z = activations_[l].data();
      ONEBIT_CUBLAS_RETURN_IF_ERROR(cublas_->sgemm(handle_, CUBLAS_OP_N, CUBLAS_OP_N, outs, batch,
                                                   ins, &one, params + layout_.weights_offset(l),
                                                   outs, input_of(l), ins, &zero, z, outs));
      BiasActivationKernel<<<BlocksFor(int64_t{outs} * n), kThreads, 0, stream_>>>(
          z, params + layout_.bias_offset(l), outs, n, l + 1 < num_layers);
      ONEBIT_CUDA_RETURN_IF_LAUNCH_ERROR();
    }

    float* logits = activations_[num_layers - 1].data();
    SoftmaxXentKernel<<<static_cast<int>((n + kThreads - 1) / kThreads), kThreads, 0, stream_>>>(
        logits, labels_.data(), classes, n, 1.0f / static_cast<float>(n), grad != nullptr,
        loss_.data(), correct_.data());
    ONEBIT_CUDA_RETURN_IF_LAUNCH_ERROR();
    SumStatsKernel<<<1, kThreads, 0, stream_>>>(loss_.data(), correct_.data(), n, stats_.data());
    ONEBIT_CUDA_RETURN_IF_LAUNCH_ERROR();

    if (grad != nullptr) {
      for (int l = num_layers - 1; l >= 0; --l) {
        const int outs = layout_.outputs(l), ins = layout_.inputs(l);
        const float* delta = activations_[l].data();
        ONEBIT_CUBLAS_RETURN_IF_ERROR(
            cublas_->sgemm(handle_, CUBLAS_OP_N, CUBLAS_OP_T, outs, ins, batch, &one, delta, outs,
                           input_of(l), ins, &zero, grad + layout_.weights_offset(l), outs));
        RowSumKernel<<<(outs + kThreads - 1) / kThreads, kThreads, 0, stream_>>>(
            delta, outs, n, grad + layout_.bias_offset(l));
        ONEBIT_CUDA_RETURN_IF_LAUNCH_ERROR();
        if (l > 0) {
          ONEBIT_CUBLAS_RETURN_IF_ERROR(cublas_->sgemm(
              handle_, CUBLAS_OP_T, CUBLAS_OP_N, ins, batch, outs, &one,
              params + layout_.weights_offset(l), outs, delta, outs, &zero, scratch_.data(), ins));
          ReluBackwardKernel<<<BlocksFor(int64_t{ins} * n), kThreads, 0, stream_>>>(
              activations_[l - 1].data(), scratch_.data(), int64_t{ins} * n);
          ONEBIT_CUDA_RETURN_IF_LAUNCH_ERROR();
        }
      }
    }

    // Waits for the whole pass (same stream): the gradient is complete when this returns.
    double stats[2];
    ONEBIT_RETURN_IF_ERROR(backend_->CopyToHost(stats, stats_.data(), sizeof(stats)));
    MlpBatchResult result;
    result.loss_sum = stats[0];
    result.correct = static_cast<int64_t>(stats[1]);
    return result;
  }

  const WorkloadShard shard_;
  const std::shared_ptr<const FashionMnist> data_;
  const BatchSampler sampler_;
  const MlpLayout layout_;
  const int64_t max_batch_;
  kernels::Backend* const backend_;
  const cudaStream_t stream_;
  const int device_;
  const CublasApi* cublas_ = nullptr;
  cublasHandle_t handle_ = nullptr;
  std::vector<int64_t> host_indices_;
  DeviceSplit train_, test_;
  kernels::Buffer<int64_t> indices_;
  kernels::Buffer<float> x_;
  kernels::Buffer<uint8_t> labels_;
  std::vector<kernels::Buffer<float>> activations_;  // per layer, outputs(l) x max_batch_
  kernels::Buffer<float> scratch_;                   // max_width x max_batch_
  kernels::Buffer<float> loss_, correct_;            // per example
  kernels::Buffer<double> stats_;                    // loss sum, correct count
};

}  // namespace

absl::StatusOr<std::unique_ptr<Workload>> NewFashionMnistCudaWorkload(
    const FashionMnistWorkloadOptions& options, std::shared_ptr<const FashionMnist> data,
    kernels::Backend* cuda_backend) {
  ONEBIT_RETURN_IF_ERROR(ValidateShard(options.shard));
  if (data == nullptr || data->train.count < 1) {
    return absl::InvalidArgumentError("no Fashion-MNIST training data");
  }
  if (options.shard.micro_batch > INT_MAX) {
    return absl::InvalidArgumentError("micro batch too large for cuBLAS");
  }
  if (cuda_backend == nullptr || cuda_backend->memory_space() != kernels::MemorySpace::kCuda) {
    return absl::FailedPreconditionError(
        absl::StrCat("the CUDA Fashion-MNIST workload needs a CUDA backend, got ",
                     cuda_backend == nullptr ? "none" : cuda_backend->name()));
  }
  auto stream = static_cast<cudaStream_t>(kernels::CudaStreamOf(cuda_backend));
  if (stream == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "backend ", cuda_backend->name(), " has no CUDA stream (make it with NewCudaBackend)"));
  }
  int device = 0;
  ONEBIT_CUDA_RETURN_IF_ERROR(cudaStreamGetDevice(stream, &device));
  ONEBIT_ASSIGN_OR_RETURN(MlpLayout layout, FashionMnistLayout(options.hidden));
  if (layout.inputs(0) != data->train.pixels_per_image() ||
      layout.inputs(0) != data->test.pixels_per_image()) {
    return absl::InvalidArgumentError("Fashion-MNIST images are not 28x28");
  }
  return FashionMnistCudaWorkload::Create(options, std::move(data), std::move(layout), cuda_backend,
                                          stream, device);
}

}  // namespace onebit
