// The Fashion-MNIST MLP on a GPU: cuBLAS SGEMMs plus small CUDA kernels (gather, bias +
// ReLU, softmax cross-entropy, reductions), all queued on the stream of a CUDA backend so
// they are ordered with the optimizer's kernels. The layout, initialisation and sampler are
// the CPU version's (mlp_cpu.h): both train the same model from the same bits and agree to
// within float rounding (GEMM summation order differs). cuBLAS runs in plain FP32 (no TF32)
// for that reason.
//
// LOSS SCALING (all precisions): after SetLossScale(s), s finite and > 0, grad_out holds s
// times the gradient (s multiplies the loss's gradient at the softmax, before the backward
// pass); the default is 1.
//
// This header has no CUDA types in it; the implementation is compiled by nvcc.
#ifndef ONEBIT_WORKER_WORKLOADS_MLP_CUDA_H_
#define ONEBIT_WORKER_WORKLOADS_MLP_CUDA_H_

#include <memory>

#include "absl/status/statusor.h"
#include "kernels/kernels.h"
#include "worker/workloads/fashion_mnist.h"
#include "worker/workloads/mlp_cpu.h"
#include "worker/workloads/workload.h"

namespace onebit {

// PRECISION (FashionMnistWorkloadOptions::precision, Workload::precision()):
//  - kFp32: everything above, in fp32.
//  - kFp16, kBf16: mixed precision as in Megatron-LM and DeepSpeed. The fp32 parameters the
//    caller passes are the master copy: each ComputeGradient and Evaluate rounds them into a
//    device copy in the half type, and the forward and backward passes keep activations,
//    deltas and gradients in that type (GEMMs by cublasGemmEx with fp32 accumulation;
//    elementwise arithmetic in fp32, rounded where stored). Softmax cross-entropy is
//    computed in fp32 from the half logits; the returned loss is fp32 and unscaled. The
//    half gradient is widened into the fp32 grad_out, overflow included: a too-large loss
//    scale in fp16 shows as inf or NaN there (never clamped). bf16 has fp32's exponent range
//    and needs no scaling. Expect a relative L2 distance to the fp32 gradient of about
//    6e-3 (fp16) and 2e-2 (bf16) on average, more on single steps (mlp_cuda_test.cc).
//    The half copies are allocated once, at creation (4 bytes per parameter).
//
// The workload on the GPU of `cuda_backend` (made by kernels::NewCudaBackend; borrowed, it
// must outlive the workload). The data set is copied to the GPU once (about 55 MB).
// Parameters and gradients are device memory. kFailedPrecondition for a backend that is
// not CUDA.
absl::StatusOr<std::unique_ptr<Workload>> NewFashionMnistCudaWorkload(
    const FashionMnistWorkloadOptions& options, std::shared_ptr<const FashionMnist> data,
    kernels::Backend* cuda_backend);

}  // namespace onebit

#endif  // ONEBIT_WORKER_WORKLOADS_MLP_CUDA_H_
