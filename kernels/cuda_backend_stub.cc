// cuda_backend.h in a build without CUDA (kernels/cuda.bzl): no devices, and a clear,
// permanent error for whoever asks for one.
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/permanent_error.h"
#include "kernels/cuda_backend.h"

namespace onebit::kernels {

bool CudaBuilt() { return false; }

int CudaDeviceCount() { return 0; }

absl::StatusOr<std::unique_ptr<Backend>> NewCudaBackend(int) {
  return MarkPermanent(absl::FailedPreconditionError(
      "this build of onebit has no CUDA (it was built without /usr/local/cuda/bin/nvcc, or "
      "with ONEBIT_CUDA=off): device \"cuda\" needs a build with CUDA 13; device \"cpu\" "
      "runs here"));
}

void* CudaStreamOf(Backend*) { return nullptr; }

absl::Status SetServerBitLoads(Backend* backend, ServerBitLoads) {
  return absl::InvalidArgumentError(absl::StrCat(
      "SetServerBitLoads: ", backend == nullptr ? "no backend" : backend->name(),
      " is not a CUDA backend (this build has no CUDA)"));
}

}  // namespace onebit::kernels
