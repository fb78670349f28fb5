// nccl_transport.h in a build without CUDA (kernels/cuda.bzl): no NCCL. Nothing makes a
// CUDA backend here (kernels/cuda_backend_stub.cc), so a job never gets this far; whoever
// calls anyway gets kFailedPrecondition, never a crash.
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kernels/kernels.h"
#include "worker/transport/nccl_transport.h"

namespace onebit {
namespace {

absl::Status NoNccl() {
  return absl::FailedPreconditionError(
      "the NCCL transport needs a CUDA backend, and this build of onebit has no CUDA (it was "
      "built without /usr/local/cuda/bin/nvcc, or with ONEBIT_CUDA=off)");
}

}  // namespace

absl::StatusOr<NcclUniqueId> NewNcclUniqueId() { return NoNccl(); }

absl::StatusOr<std::unique_ptr<NcclTransport>> NcclTransport::Create(int, int,
                                                                     const NcclUniqueId&,
                                                                     kernels::Backend*,
                                                                     absl::Duration) {
  return NoNccl();
}

// Create never makes one; these only complete the class.
NcclTransport::~NcclTransport() = default;
absl::Status NcclTransport::AllToAll(const void*, void*, size_t) { return NoNccl(); }
absl::Status NcclTransport::AllGather(const void*, void*, size_t) { return NoNccl(); }
absl::Status NcclTransport::AllReduceSum(float*, size_t) { return NoNccl(); }
absl::Status NcclTransport::Barrier() { return NoNccl(); }
absl::Status NcclTransport::SendRecv(const void*, size_t, int, void*, size_t, int) {
  return NoNccl();
}

}  // namespace onebit
