// The Fashion-MNIST MLP on a GPU: cuBLAS SGEMMs plus small CUDA kernels (gather, bias +
// ReLU, softmax cross-entropy, reductions), all queued on the stream of a CUDA backend so
// they are ordered with the optimizer's kernels. The layout, initialisation and sampler are
// the CPU version's (mlp_cpu.h): both train the same model from the same bits and agree to
// within float rounding (GEMM summation order differs). cuBLAS runs in plain FP32 (no TF32)
// for that reason.
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

// The workload on the GPU of `cuda_backend` (made by kernels::NewCudaBackend; borrowed, it
// must outlive the workload). The data set is copied to the GPU once (about 55 MB).
// Parameters and gradients are device memory. kFailedPrecondition for a backend that is
// not CUDA.
absl::StatusOr<std::unique_ptr<Workload>> NewFashionMnistCudaWorkload(
    const FashionMnistWorkloadOptions& options, std::shared_ptr<const FashionMnist> data,
    kernels::Backend* cuda_backend);

}  // namespace onebit

#endif  // ONEBIT_WORKER_WORKLOADS_MLP_CUDA_H_
