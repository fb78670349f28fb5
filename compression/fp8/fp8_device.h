// The fp8 kernels for a backend whose memory host code cannot touch (Backend::HostAddress is
// null: a CUDA backend). They live in //compression/fp8:cuda, which registers them here
// when it is linked: //compression:codecs_cuda links every codec's CUDA kernels, and the
// worker links it. What links the codecs without a CUDA backend (the shards, the tests, the
// fuzzers) then links no CUDA runtime.
//
// Thread safety: registration happens while the program starts (a static initializer);
// Registered() may be called from any thread after that.
#ifndef ONEBIT_COMPRESSION_FP8_FP8_DEVICE_H_
#define ONEBIT_COMPRESSION_FP8_FP8_DEVICE_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "kernels/kernels.h"

namespace onebit::fp8 {

// The codec's three kernels (compression/codec.h) on `backend`'s memory, arguments checked.
struct DeviceKernels {
  absl::Status (*compress)(kernels::Backend& backend, const float* m, const float* g,
                           float beta1, size_t n, size_t num_chunks, size_t chunk, float* err,
                           uint8_t* out);
  absl::Status (*aggregate)(kernels::Backend& backend, const uint8_t* blocks, int num_workers,
                            size_t chunk, float* err, uint8_t* out);
  absl::Status (*decode)(kernels::Backend& backend, const uint8_t* blocks, size_t num_chunks,
                         size_t chunk, size_t n, float* out);
};

// Registers `kernels` (static storage) as the device kernels; the last registration wins.
void RegisterDeviceKernels(const DeviceKernels* kernels);

// The registered device kernels, or null where none is linked.
const DeviceKernels* RegisteredDeviceKernels();

}  // namespace onebit::fp8

#endif  // ONEBIT_COMPRESSION_FP8_FP8_DEVICE_H_
