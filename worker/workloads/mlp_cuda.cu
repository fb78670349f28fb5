// The Fashion-MNIST MLP on a GPU (mlp_cuda.h). Matrices are column-major with one example
// per column, as on the CPU, so each layer is one cuBLAS SGEMM:
//   forward    z_l = W_l a_{l-1}            (N, N)   then a_l = relu(z_l + b_l)
//   backward   dW_l = delta_l a_{l-1}^T     (N, T)   db_l = row sums of delta_l
//              back = W_l^T delta_l         (T, N)   delta_{l-1} = back * [a_{l-1} > 0]
// delta_l overwrites a_l in place, exactly as MlpCpu does.
//
// MIXED PRECISION (fp16, bf16): the same passes with every matrix above in the half type T
// (GEMMs by cublasGemmEx, fp32 accumulation), the parameters being a copy of the caller's
// fp32 master parameters rounded to T at each call, the gradient written in T and widened
// into the caller's fp32 grad_out at the end. Softmax cross-entropy is computed in fp32
// from the half logits; its delta, scaled by the loss scale, is rounded to T (an fp16
// overflow starts there and reaches grad_out as inf or NaN, which the trainer detects).

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <algorithm>
#include <climits>
#include <cmath>
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
//
// cublasGemmEx has a C++ overload (the pre-11 computeType) beside the library's symbol, so
// its type is spelled out; the static_cast compiles only if the header declares an overload
// of exactly this type.
using CublasGemmExFn = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t,
                                          int, int, int, const void*, const void*, cudaDataType,
                                          int, const void*, cudaDataType, int, const void*,
                                          void*, cudaDataType, int, cublasComputeType_t,
                                          cublasGemmAlgo_t);
static_assert(std::is_same_v<decltype(static_cast<CublasGemmExFn>(&cublasGemmEx)),
                             CublasGemmExFn>);

struct CublasApi {
  decltype(&cublasCreate_v2) create;
  decltype(&cublasDestroy_v2) destroy;
  decltype(&cublasSetStream_v2) set_stream;
  decltype(&cublasSetMathMode) set_math_mode;
  decltype(&cublasSetPointerMode_v2) set_pointer_mode;
  decltype(&cublasSgemm_v2) sgemm;
  CublasGemmExFn gemm_ex;  // fp16 and bf16
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
    get(table.gemm_ex, "cublasGemmEx");
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
// Element types. T is what activations, the compute copy of the parameters and the
// gradient before widening are stored in: float (fp32), __half (fp16) or __nv_bfloat16
// (bf16). Arithmetic inside the kernels is fp32 whatever T is; values are rounded to T only
// where they are stored (round to nearest even, overflow to inf).

__device__ __forceinline__ float ToFloat(float v) { return v; }
__device__ __forceinline__ float ToFloat(__half v) { return __half2float(v); }
__device__ __forceinline__ float ToFloat(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T>
__device__ __forceinline__ T FromFloat(float v);
template <>
__device__ __forceinline__ float FromFloat<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __half FromFloat<__half>(float v) {
  return __float2half_rn(v);
}
template <>
__device__ __forceinline__ __nv_bfloat16 FromFloat<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// cuBLAS's name of a half type (GemmEx's A, B and C types).
template <typename T>
constexpr cudaDataType_t CudaDataType() {
  static_assert(std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>);
  return std::is_same_v<T, __half> ? CUDA_R_16F : CUDA_R_16BF;
}

// ---------------------------------------------------------------------------------------
// Device code. Elementwise kernels use grid-stride loops over a capped grid. With T = float
// every kernel computes exactly what the fp32-only version did (ToFloat and FromFloat<float>
// are the identity).

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 4096;

int BlocksFor(int64_t n) {
  return static_cast<int>(
      std::max<int64_t>(1, std::min((n + kThreads - 1) / kThreads, kMaxBlocks)));
}

// Columns j of `out` (size x n) are images indices[j] (or first + j when indices is null),
// scaled to [0, 1] as p / 255 (IEEE division, as the CPU's table); labels follow.
template <typename T>
__global__ void GatherKernel(const uint8_t* pixels, const uint8_t* all_labels,
                             const int64_t* indices, int64_t first, int64_t size, int64_t n,
                             T* out, uint8_t* labels) {
  const int64_t total = size * n;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t j = e / size;
    const int64_t k = e - j * size;
    const int64_t image = indices != nullptr ? indices[j] : first + j;
    out[e] = FromFloat<T>(static_cast<float>(pixels[image * size + k]) / 255.0f);
    if (k == 0) labels[j] = all_labels[image];
  }
}

// out[e] = in[e] rounded to T: the compute copy of the fp32 master parameters.
template <typename T>
__global__ void NarrowKernel(const float* in, T* out, int64_t n) {
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < n;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[e] = FromFloat<T>(in[e]);
  }
}

// out[e] = in[e] (exact): the half gradient into the caller's fp32 grad_out, inf and NaN
// included.
template <typename T>
__global__ void WidenKernel(const T* in, float* out, int64_t n) {
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < n;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[e] = ToFloat(in[e]);
  }
}

// z = z + b (per row), then max(z, 0) on hidden layers.
template <typename T>
__global__ void BiasActivationKernel(T* z, const T* bias, int rows, int64_t cols, bool relu) {
  const int64_t total = rows * cols;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float v = ToFloat(z[e]) + ToFloat(bias[e % rows]);
    z[e] = FromFloat<T>(relu ? fmaxf(v, 0.0f) : v);
  }
}

// One thread per example, in fp32 whatever T is: loss = logsumexp(z) - z[label], whether the
// first largest logit is the label, and (write_delta) z := (softmax(z) - onehot) * factor in
// place, where factor = loss scale / batch (the scaled gradient of the mean loss).
template <typename T>
__global__ void SoftmaxXentKernel(T* logits, const uint8_t* labels, int classes, int64_t batch,
                                  float factor, bool write_delta, float* loss, float* correct) {
  const int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (j >= batch) return;
  T* z = logits + j * classes;
  const int label = labels[j];
  int argmax = 0;
  float max = ToFloat(z[0]);
  for (int k = 1; k < classes; ++k) {
    if (ToFloat(z[k]) > max) {
      max = ToFloat(z[k]);
      argmax = k;
    }
  }
  float sum = 0.0f;
  for (int k = 0; k < classes; ++k) sum += expf(ToFloat(z[k]) - max);
  const float lse = max + logf(sum);
  loss[j] = lse - ToFloat(z[label]);
  correct[j] = argmax == label ? 1.0f : 0.0f;
  if (write_delta) {
    for (int k = 0; k < classes; ++k) {
      z[k] = FromFloat<T>((expf(ToFloat(z[k]) - lse) - (k == label ? 1.0f : 0.0f)) * factor);
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

// out[r] = sum over columns of delta[r, :] (summed in fp32, stored as T). One thread per
// row: adjacent threads read adjacent addresses of each column.
template <typename T>
__global__ void RowSumKernel(const T* delta, int rows, int64_t cols, T* out) {
  const int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  float sum = 0.0f;
  for (int64_t j = 0; j < cols; ++j) sum += ToFloat(delta[r + j * rows]);
  out[r] = FromFloat<T>(sum);
}

// a := back where a > 0, else 0 (ReLU's derivative; a > 0 exactly where z > 0).
template <typename T>
__global__ void ReluBackwardKernel(T* a, const T* back, int64_t n) {
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < n;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    a[e] = ToFloat(a[e]) > 0.0f ? back[e] : FromFloat<T>(0.0f);
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

// What the passes compute in, for one element type T. Only the workload's own precision is
// allocated (at creation); the others stay empty.
template <typename T>
struct ComputeBuffers {
  kernels::Buffer<T> x;                         // inputs(0) x max_batch
  std::vector<kernels::Buffer<T>> activations;  // per layer, outputs(l) x max_batch
  kernels::Buffer<T> scratch;                   // max_width x max_batch, for W^T * delta
  // Half types only (fp32 uses the caller's buffers): the compute copy of the fp32 master
  // parameters, and the gradient as the backward pass writes it before it is widened into
  // grad_out. Both num_parameters(), in the flat layout of the fp32 vector.
  kernels::Buffer<T> params;
  kernels::Buffer<T> grad;
};

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
                        " (cuda:", device_,
                        precision_ == ComputePrecision::kFp32
                            ? ""
                            : absl::StrCat(", ", ComputePrecisionName(precision_)),
                        ")");
  }
  size_t num_parameters() const override { return layout_.num_parameters(); }
  std::vector<size_t> parameter_groups() const override { return layout_.tensor_offsets(); }
  kernels::MemorySpace memory_space() const override { return kernels::MemorySpace::kCuda; }
  ComputePrecision precision() const override { return precision_; }

  absl::Status InitParameters(float* host_params, uint64_t seed) const override {
    InitMlpParameters(layout_, seed, host_params);
    return absl::OkStatus();
  }

  absl::Status SetLossScale(float scale) override {
    if (!(scale > 0.0f) || !std::isfinite(scale)) {
      return absl::InvalidArgumentError(
          absl::StrCat("loss scale must be finite and > 0, got ", scale));
    }
    loss_scale_ = scale;
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
    switch (precision_) {
      case ComputePrecision::kFp16:
        return Gradient<__half>(params, batch, grad_out);
      case ComputePrecision::kBf16:
        return Gradient<__nv_bfloat16>(params, batch, grad_out);
      case ComputePrecision::kFp32:
        break;
    }
    return Gradient<float>(params, batch, grad_out);
  }

  absl::StatusOr<EvalResult> Evaluate(const float* params) override {
    ONEBIT_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    switch (precision_) {
      case ComputePrecision::kFp16:
        return Eval<__half>(params);
      case ComputePrecision::kBf16:
        return Eval<__nv_bfloat16>(params);
      case ComputePrecision::kFp32:
        break;
    }
    return Eval<float>(params);
  }

 private:
  FashionMnistCudaWorkload(const FashionMnistWorkloadOptions& options,
                           std::shared_ptr<const FashionMnist> data, MlpLayout layout,
                           kernels::Backend* backend, cudaStream_t stream, int device)
      : shard_(options.shard),
        precision_(options.precision),
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
    // Plain FP32: TF32 would make the GPU drift from the CPU model by ~1e-3. Half types
    // use tensor cores under this mode too; they are kept from reducing split-K partial sums
    // in the half output type (an extra rounding, and an overflow the full sum may not have),
    // so every GEMM sums in fp32 and rounds once.
    const cublasMath_t math_mode =
        precision_ == ComputePrecision::kFp32
            ? CUBLAS_DEFAULT_MATH
            : static_cast<cublasMath_t>(CUBLAS_DEFAULT_MATH |
                                        CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION);
    ONEBIT_CUBLAS_RETURN_IF_ERROR(cublas_->set_math_mode(handle_, math_mode));
    ONEBIT_CUBLAS_RETURN_IF_ERROR(cublas_->set_pointer_mode(handle_, CUBLAS_POINTER_MODE_HOST));
    ONEBIT_ASSIGN_OR_RETURN(train_, Upload(backend_, data_->train));
    ONEBIT_ASSIGN_OR_RETURN(test_, Upload(backend_, data_->test));
    ONEBIT_ASSIGN_OR_RETURN(indices_, Buffer<int64_t>::Create(backend_, shard_.micro_batch));
    ONEBIT_ASSIGN_OR_RETURN(labels_, Buffer<uint8_t>::Create(backend_, max_batch_));
    switch (precision_) {
      case ComputePrecision::kFp16:
        ONEBIT_RETURN_IF_ERROR(Allocate<__half>());
        break;
      case ComputePrecision::kBf16:
        ONEBIT_RETURN_IF_ERROR(Allocate<__nv_bfloat16>());
        break;
      case ComputePrecision::kFp32:
        ONEBIT_RETURN_IF_ERROR(Allocate<float>());
        break;
    }
    ONEBIT_ASSIGN_OR_RETURN(loss_, Buffer<float>::Create(backend_, max_batch_));
    ONEBIT_ASSIGN_OR_RETURN(correct_, Buffer<float>::Create(backend_, max_batch_));
    ONEBIT_ASSIGN_OR_RETURN(stats_, Buffer<double>::Create(backend_, 2));
    return absl::OkStatus();
  }

  template <typename T>
  ComputeBuffers<T>& BuffersOf() {
    if constexpr (std::is_same_v<T, float>) {
      return fp32_;
    } else if constexpr (std::is_same_v<T, __half>) {
      return fp16_;
    } else {
      static_assert(std::is_same_v<T, __nv_bfloat16>);
      return bf16_;
    }
  }

  // Every buffer the passes in T need, once.
  template <typename T>
  absl::Status Allocate() {
    using kernels::Buffer;
    ComputeBuffers<T>& b = BuffersOf<T>();
    ONEBIT_ASSIGN_OR_RETURN(b.x, Buffer<T>::Create(backend_, layout_.inputs(0) * max_batch_));
    for (int l = 0; l < layout_.num_layers(); ++l) {
      ONEBIT_ASSIGN_OR_RETURN(Buffer<T> a,
                              Buffer<T>::Create(backend_, layout_.outputs(l) * max_batch_));
      b.activations.push_back(std::move(a));
    }
    ONEBIT_ASSIGN_OR_RETURN(b.scratch,
                            Buffer<T>::Create(backend_, layout_.max_width() * max_batch_));
    if constexpr (!std::is_same_v<T, float>) {
      ONEBIT_ASSIGN_OR_RETURN(b.params, Buffer<T>::Create(backend_, layout_.num_parameters()));
      ONEBIT_ASSIGN_OR_RETURN(b.grad, Buffer<T>::Create(backend_, layout_.num_parameters()));
    }
    return absl::OkStatus();
  }

  // The parameters the passes read: the caller's for fp32, else their copy rounded to T.
  template <typename T>
  absl::StatusOr<const T*> ComputeParams(const float* params) {
    if constexpr (std::is_same_v<T, float>) {
      return params;
    } else {
      ComputeBuffers<T>& b = BuffersOf<T>();
      const int64_t n = static_cast<int64_t>(layout_.num_parameters());
      NarrowKernel<T><<<BlocksFor(n), kThreads, 0, stream_>>>(params, b.params.data(), n);
      ONEBIT_CUDA_RETURN_IF_LAUNCH_ERROR();
      return static_cast<const T*>(b.params.data());
    }
  }

  // The loss on the micro batch whose indices are in indices_, and its (scaled) gradient.
  template <typename T>
  absl::StatusOr<double> Gradient(const float* params, int64_t batch, float* grad_out) {
    ONEBIT_ASSIGN_OR_RETURN(const T* p, ComputeParams<T>(params));
    T* grad = nullptr;
    if constexpr (std::is_same_v<T, float>) {
      grad = grad_out;
    } else {
      grad = BuffersOf<T>().grad.data();
    }
    ONEBIT_ASSIGN_OR_RETURN(MlpBatchResult r,
                            Run<T>(train_, indices_.data(), 0, batch, p, grad, grad_out));
    return r.loss_sum / static_cast<double>(batch);
  }

  template <typename T>
  absl::StatusOr<EvalResult> Eval(const float* params) {
    ONEBIT_ASSIGN_OR_RETURN(const T* p, ComputeParams<T>(params));
    MlpBatchResult total;
    for (int64_t first = 0; first < test_.count; first += kMlpEvalChunk) {
      const int64_t n = std::min(kMlpEvalChunk, test_.count - first);
      ONEBIT_ASSIGN_OR_RETURN(MlpBatchResult r,
                              Run<T>(test_, nullptr, first, n, p, nullptr, nullptr));
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

  // C = op(A) op(B), m x n, inner dimension k, column-major; fp32 accumulation. fp32 is the
  // plain SGEMM it always was; half types go through GemmEx with A, B and C in T.
  template <typename T>
  cublasStatus_t Gemm(cublasOperation_t op_a, cublasOperation_t op_b, int m, int n, int k,
                      const T* a, int lda, const T* b, int ldb, T* c, int ldc) {
    const float one = 1.0f, zero = 0.0f;
    if constexpr (std::is_same_v<T, float>) {
      return cublas_->sgemm(handle_, op_a, op_b, m, n, k, &one, a, lda, b, ldb, &zero, c, ldc);
    } else {
      return cublas_->gemm_ex(handle_, op_a, op_b, m, n, k, &one, a, CudaDataType<T>(), lda, b,
                              CudaDataType<T>(), ldb, &zero, c, CudaDataType<T>(), ldc,
                              CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    }
  }

  // The MLP on n examples of `split` (indices on the device, or first..first+n-1), with
  // parameters p (num_parameters() of T, the flat layout). With grad != nullptr, writes
  // loss_scale_ times the gradient of the mean loss there (num_parameters() of T), and for
  // a half T widens it into grad_f32 (num_parameters() floats; unused for fp32, where grad
  // is the caller's fp32 buffer already).
  template <typename T>
  absl::StatusOr<MlpBatchResult> Run(const DeviceSplit& split, const int64_t* indices,
                                     int64_t first, int64_t n, const T* p, T* grad,
                                     float* grad_f32) {
    ComputeBuffers<T>& b = BuffersOf<T>();
    const int num_layers = layout_.num_layers();
    const int classes = layout_.outputs(num_layers - 1);
    const int batch = static_cast<int>(n);  // <= max_batch_ <= INT_MAX, checked at creation
    const int64_t image = layout_.inputs(0);
    GatherKernel<T><<<BlocksFor(image * n), kThreads, 0, stream_>>>(
        split.pixels.data(), split.labels.data(), indices, first, image, n, b.x.data(),
        labels_.data());
    ONEBIT_CUDA_RETURN_IF_LAUNCH_ERROR();

    auto input_of = [&](int l) -> const T* {
      return l == 0 ? b.x.data() : b.activations[l - 1].data();
    };
    for (int l = 0; l < num_layers; ++l) {
      const int outs = layout_.outputs(l), ins = layout_.inputs(l);
      T* z = b.activations[l].data();
      ONEBIT_CUBLAS_RETURN_IF_ERROR(Gemm<T>(CUBLAS_OP_N, CUBLAS_OP_N, outs, batch, ins,
                                            p + layout_.weights_offset(l), outs, input_of(l), ins,
                                            z, outs));
      BiasActivationKernel<T><<<BlocksFor(int64_t{outs} * n), kThreads, 0, stream_>>>(
          z, p + layout_.bias_offset(l), outs, n, l + 1 < num_layers);
      ONEBIT_CUDA_RETURN_IF_LAUNCH_ERROR();
    }

    // The scale applies to the loss's gradient, before the backward pass; with a scale of
    // 1 the factor is exactly 1 / n, as before loss scaling existed.
    const float factor = (1.0f / static_cast<float>(n)) * loss_scale_;
    T* logits = b.activations[num_layers - 1].data();
    SoftmaxXentKernel<T><<<static_cast<int>((n + kThreads - 1) / kThreads), kThreads, 0,
                           stream_>>>(logits, labels_.data(), classes, n, factor,
                                      grad != nullptr, loss_.data(), correct_.data());
    ONEBIT_CUDA_RETURN_IF_LAUNCH_ERROR();
    SumStatsKernel<<<1, kThreads, 0, stream_>>>(loss_.data(), correct_.data(), n, stats_.data());
    ONEBIT_CUDA_RETURN_IF_LAUNCH_ERROR();

    if (grad != nullptr) {
      for (int l = num_layers - 1; l >= 0; --l) {
        const int outs = layout_.outputs(l), ins = layout_.inputs(l);
        const T* delta = b.activations[l].data();
        ONEBIT_CUBLAS_RETURN_IF_ERROR(Gemm<T>(CUBLAS_OP_N, CUBLAS_OP_T, outs, ins, batch, delta,
                                              outs, input_of(l), ins,
                                              grad + layout_.weights_offset(l), outs));
        RowSumKernel<T><<<(outs + kThreads - 1) / kThreads, kThreads, 0, stream_>>>(
            delta, outs, n, grad + layout_.bias_offset(l));
        ONEBIT_CUDA_RETURN_IF_LAUNCH_ERROR();
        if (l > 0) {
          ONEBIT_CUBLAS_RETURN_IF_ERROR(Gemm<T>(CUBLAS_OP_T, CUBLAS_OP_N, ins, batch, outs,
                                                p + layout_.weights_offset(l), outs, delta, outs,
                                                b.scratch.data(), ins));
          ReluBackwardKernel<T><<<BlocksFor(int64_t{ins} * n), kThreads, 0, stream_>>>(
              b.activations[l - 1].data(), b.scratch.data(), int64_t{ins} * n);
          ONEBIT_CUDA_RETURN_IF_LAUNCH_ERROR();
        }
      }
      if constexpr (!std::is_same_v<T, float>) {
        const int64_t count = static_cast<int64_t>(layout_.num_parameters());
        WidenKernel<T><<<BlocksFor(count), kThreads, 0, stream_>>>(grad, grad_f32, count);
        ONEBIT_CUDA_RETURN_IF_LAUNCH_ERROR();
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
  const ComputePrecision precision_;
  const std::shared_ptr<const FashionMnist> data_;
  const BatchSampler sampler_;
  const MlpLayout layout_;
  const int64_t max_batch_;
  kernels::Backend* const backend_;
  const cudaStream_t stream_;
  const int device_;
  const CublasApi* cublas_ = nullptr;
  cublasHandle_t handle_ = nullptr;
  float loss_scale_ = 1.0f;
  std::vector<int64_t> host_indices_;
  DeviceSplit train_, test_;
  kernels::Buffer<int64_t> indices_;
  kernels::Buffer<uint8_t> labels_;
  ComputeBuffers<float> fp32_;  // only the one of precision_ is allocated
  ComputeBuffers<__half> fp16_;
  ComputeBuffers<__nv_bfloat16> bf16_;
  kernels::Buffer<float> loss_, correct_;  // per example
  kernels::Buffer<double> stats_;          // loss sum, correct count
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
  if (options.precision != ComputePrecision::kFp32 &&
      options.precision != ComputePrecision::kFp16 &&
      options.precision != ComputePrecision::kBf16) {
    return absl::InvalidArgumentError(absl::StrCat(
        "unknown compute precision ", static_cast<int>(options.precision)));
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
