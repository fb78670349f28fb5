// fp8_cuda.h in a build without CUDA (kernels/cuda.bzl): every call fails, naming the build.
#include "absl/status/status.h"
#include "compression/fp8/fp8_cuda.h"

namespace onebit::fp8::cuda {
namespace {

absl::Status NoCuda() {
  return absl::FailedPreconditionError(
      "this build of onebit has no CUDA: the fp8 codec's CUDA kernels are not built");
}

}  // namespace

absl::Status CompressWorker(void*, const float*, const float*, float, size_t, size_t, size_t,
                            float*, uint8_t*) {
  return NoCuda();
}

absl::Status ServerAggregate(void*, const uint8_t*, int, size_t, float*, uint8_t*) {
  return NoCuda();
}

absl::Status Decode(void*, const uint8_t*, size_t, size_t, size_t, float*) { return NoCuda(); }

}  // namespace onebit::fp8::cuda
