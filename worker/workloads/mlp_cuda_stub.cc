// mlp_cuda.h in a build without CUDA (kernels/cuda.bzl): there is no CUDA backend to run
// on (kernels/cuda_backend_stub.cc), so a job never gets here; whoever calls anyway gets
// kFailedPrecondition.
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/workloads/mlp_cuda.h"

namespace onebit {

absl::StatusOr<std::unique_ptr<Workload>> NewFashionMnistCudaWorkload(
    const FashionMnistWorkloadOptions&, std::shared_ptr<const FashionMnist>, kernels::Backend*) {
  return absl::FailedPreconditionError(
      "the CUDA Fashion-MNIST workload needs a CUDA backend, and this build of onebit has no "
      "CUDA (it was built without /usr/local/cuda/bin/nvcc, or with ONEBIT_CUDA=off)");
}

}  // namespace onebit
