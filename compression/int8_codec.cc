// The int8 format: a float32 scale and offset, then one code per element (kernels.h, INT8
// WIRE FORMAT).
#include <cmath>
#include <cstring>

#include "compression/codec.h"
#include "compression/codec_registry.h"

namespace onebit {
namespace {

class Int8 final : public Codec {
 public:
  absl::string_view name() const override { return "int8"; }
  size_t alignment() const override { return 8; }
  size_t BlockBytes(size_t chunk) const override { return kernels::Int8BlockBytes(chunk); }
  size_t header_bytes() const override { return 2 * sizeof(float); }

  std::optional<HeaderFault> CheckHeader(const uint8_t* header) const override {
    float scale, offset;
    std::memcpy(&scale, header, sizeof(scale));
    std::memcpy(&offset, header + sizeof(scale), sizeof(offset));
    if (std::optional<HeaderFault> fault = CheckScale(scale)) return fault;
    if (!std::isfinite(offset)) return HeaderFault{"offset", "finite", offset};
    return std::nullopt;
  }

  absl::Status Compress(kernels::Backend& backend, const float* m, const float* g, float beta1,
                        size_t n, size_t num_chunks, size_t chunk, float* err,
                        uint8_t* out) const override {
    return backend.CompressWorkerInt8(m, g, beta1, n, num_chunks, chunk, err, out);
  }

  absl::Status Aggregate(kernels::Backend& backend, const uint8_t* blocks, int num_workers,
                         size_t chunk, float* err, uint8_t* out) const override {
    return backend.ServerAggregateInt8(blocks, num_workers, chunk, err, out);
  }

  absl::Status Decode(kernels::Backend& backend, const uint8_t* blocks, size_t num_chunks,
                      size_t chunk, size_t n, float* out) const override {
    return backend.DecompressInt8(blocks, num_chunks, chunk, n, out);
  }
};

}  // namespace

const Codec& Int8Codec() {
  static const Int8* const codec = new Int8;
  return *codec;
}

}  // namespace onebit
