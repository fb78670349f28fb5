// The fp8 codec (exchange.compressor "fp8"; fp8_e4m3.h is the format). Its kernels live
// here, not in kernels::Backend: on a backend with host addresses (Backend::HostAddress:
// the CPU backend, the simulated device) it runs fp8_cpu's loops on them; on a CUDA backend,
// the CUDA kernels that //compression/fp8:cuda registers (fp8_device.h).
#include <cstddef>
#include <cstdint>
#include <optional>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "compression/codec.h"
#include "compression/fp8/fp8_cpu.h"
#include "compression/fp8/fp8_device.h"
#include "compression/fp8/fp8_e4m3.h"
#include "kernels/kernels.h"

namespace onebit {
namespace {

using kernels::HostAddressOf;

absl::Status CheckChunks(size_t n, size_t num_chunks, size_t chunk) {
  if (chunk != 0 && num_chunks > SIZE_MAX / chunk) {
    return absl::InvalidArgumentError(
        absl::StrCat(num_chunks, " chunks of ", chunk, " elements overflow"));
  }
  if (n > num_chunks * chunk) {
    return absl::InvalidArgumentError(absl::StrCat("tensor of ", n, " elements does not fit ",
                                                   num_chunks, " chunks of ", chunk));
  }
  return absl::OkStatus();
}

// The device kernels, for a backend without host addresses.
absl::StatusOr<const fp8::DeviceKernels*> Device(const kernels::Backend& backend) {
  const fp8::DeviceKernels* device = fp8::RegisteredDeviceKernels();
  if (device == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the fp8 codec cannot run on backend ", backend.name(),
        ": host code cannot touch its memory, and this binary has no fp8 CUDA kernels "
        "(link //compression:codecs_cuda)"));
  }
  return device;
}

class Fp8 final : public Codec {
 public:
  absl::string_view name() const override { return "fp8"; }
  // Any chunk length: a partial last sub-block is part of the format.
  size_t alignment() const override { return 1; }
  size_t BlockBytes(size_t chunk) const override { return fp8::BlockBytes(chunk); }
  size_t header_bytes() const override { return 1; }  // the first scale byte

  std::optional<HeaderFault> CheckHeader(const uint8_t* header) const override {
    if (header[0] == fp8::kNanScale) {
      return HeaderFault{"scale byte", "below 255 (255 is NaN)", static_cast<float>(header[0])};
    }
    return std::nullopt;
  }

  absl::Status Compress(kernels::Backend& backend, const float* m, const float* g, float beta1,
                        size_t n, size_t num_chunks, size_t chunk, float* err,
                        uint8_t* out) const override {
    if (absl::Status s = CheckChunks(n, num_chunks, chunk); !s.ok()) return s;
    if (num_chunks * chunk == 0) return absl::OkStatus();
    if (backend.HostAddress(err) != nullptr) {
      fp8::cpu::CompressWorker(HostAddressOf(backend, m), HostAddressOf(backend, g), beta1, n,
                               num_chunks, chunk, HostAddressOf(backend, err),
                               HostAddressOf(backend, out));
      return absl::OkStatus();
    }
    absl::StatusOr<const fp8::DeviceKernels*> device = Device(backend);
    if (!device.ok()) return device.status();
    return (*device)->compress(backend, m, g, beta1, n, num_chunks, chunk, err, out);
  }

  absl::Status Aggregate(kernels::Backend& backend, const uint8_t* blocks, int num_workers,
                         size_t chunk, float* err, uint8_t* out) const override {
    if (num_workers < 1) {
      return absl::InvalidArgumentError(absl::StrCat("bad worker count ", num_workers));
    }
    if (chunk == 0) return absl::OkStatus();
    if (backend.HostAddress(err) != nullptr) {
      fp8::cpu::ServerAggregate(HostAddressOf(backend, blocks), num_workers, chunk,
                                HostAddressOf(backend, err), HostAddressOf(backend, out));
      return absl::OkStatus();
    }
    absl::StatusOr<const fp8::DeviceKernels*> device = Device(backend);
    if (!device.ok()) return device.status();
    return (*device)->aggregate(backend, blocks, num_workers, chunk, err, out);
  }

  absl::Status Decode(kernels::Backend& backend, const uint8_t* blocks, size_t num_chunks,
                      size_t chunk, size_t n, float* out) const override {
    if (absl::Status s = CheckChunks(n, num_chunks, chunk); !s.ok()) return s;
    if (n == 0) return absl::OkStatus();
    if (backend.HostAddress(out) != nullptr) {
      fp8::cpu::Decode(HostAddressOf(backend, blocks), num_chunks, chunk, n,
                       HostAddressOf(backend, out));
      return absl::OkStatus();
    }
    absl::StatusOr<const fp8::DeviceKernels*> device = Device(backend);
    if (!device.ok()) return device.status();
    return (*device)->decode(backend, blocks, num_chunks, chunk, n, out);
  }
};

}  // namespace

// Declared in compression/codec_registry.h, whose library (//compression:codecs) depends on
// this one.
const Codec& Fp8Codec() {
  static const Fp8* const codec = new Fp8;
  return *codec;
}

}  // namespace onebit
