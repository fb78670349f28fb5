// Registers the fp8 CUDA kernels (fp8_cuda.h) as the codec's device kernels (fp8_device.h)
// when this library is linked (alwayslink): a backend without host addresses runs them on
// its stream, CudaStreamOf (Backend::HostAddress's contract).
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "compression/fp8/fp8_cuda.h"
#include "compression/fp8/fp8_device.h"
#include "kernels/cuda_backend.h"
#include "kernels/kernels.h"

namespace onebit::fp8 {
namespace {

absl::StatusOr<void*> StreamOf(kernels::Backend& backend) {
  void* stream = kernels::CudaStreamOf(&backend);
  if (stream == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the fp8 codec cannot run on backend ", backend.name(),
        ": it has neither host addresses (Backend::HostAddress) nor a CUDA stream"));
  }
  return stream;
}

absl::Status Compress(kernels::Backend& backend, const float* m, const float* g, float beta1,
                      size_t n, size_t num_chunks, size_t chunk, float* err, uint8_t* out) {
  ONEBIT_ASSIGN_OR_RETURN(void* stream, StreamOf(backend));
  return cuda::CompressWorker(stream, m, g, beta1, n, num_chunks, chunk, err, out);
}

absl::Status Aggregate(kernels::Backend& backend, const uint8_t* blocks, int num_workers,
                       size_t chunk, float* err, uint8_t* out) {
  ONEBIT_ASSIGN_OR_RETURN(void* stream, StreamOf(backend));
  return cuda::ServerAggregate(stream, blocks, num_workers, chunk, err, out);
}

absl::Status Decode(kernels::Backend& backend, const uint8_t* blocks, size_t num_chunks,
                    size_t chunk, size_t n, float* out) {
  ONEBIT_ASSIGN_OR_RETURN(void* stream, StreamOf(backend));
  return cuda::Decode(stream, blocks, num_chunks, chunk, n, out);
}

const DeviceKernels kCudaKernels = {&Compress, &Aggregate, &Decode};

[[maybe_unused]] const bool kRegistered = (RegisterDeviceKernels(&kCudaKernels), true);

}  // namespace
}  // namespace onebit::fp8
