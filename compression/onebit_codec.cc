// The 1-bit format: a float32 scale and the chunk's signs (kernels.h, WIRE FORMAT).
#include <cstring>

#include "compression/codec.h"
#include "compression/codec_registry.h"

namespace onebit {
namespace {

class Onebit final : public Codec {
 public:
  absl::string_view name() const override { return "onebit"; }
  size_t alignment() const override { return 8; }
  size_t BlockBytes(size_t chunk) const override { return kernels::CompressedBlockBytes(chunk); }
  size_t header_bytes() const override { return sizeof(float); }

  std::optional<HeaderFault> CheckHeader(const uint8_t* header) const override {
    float scale;
    std::memcpy(&scale, header, sizeof(scale));
    return CheckScale(scale);
  }

  absl::Status Compress(kernels::Backend& backend, const float* m, const float* g, float beta1,
                        size_t n, size_t num_chunks, size_t chunk, float* err,
                        uint8_t* out) const override {
    return backend.CompressWorker(m, g, beta1, n, num_chunks, chunk, err, out);
  }

  absl::Status Aggregate(kernels::Backend& backend, const uint8_t* blocks, int num_workers,
                         size_t chunk, float* err, uint8_t* out) const override {
    return backend.ServerAggregate(blocks, num_workers, chunk, err, out);
  }

  absl::Status Decode(kernels::Backend& backend, const uint8_t* blocks, size_t num_chunks,
                      size_t chunk, size_t n, float* out) const override {
    return backend.Decompress(blocks, num_chunks, chunk, n, out);
  }

  bool fuses_frozen_update() const override { return true; }

  absl::Status DecodeFrozenAdamUpdate(kernels::Backend& backend, const uint8_t* blocks,
                                      size_t num_chunks, size_t chunk,
                                      const kernels::AdamHyper& h, const float* v,
                                      const float* mask, float* m, float* p,
                                      size_t n) const override {
    return backend.DecompressFrozenAdamUpdate(blocks, num_chunks, chunk, h, v, mask, m, p, n);
  }
};

}  // namespace

const Codec& OnebitCodec() {
  static const Onebit* const codec = new Onebit;
  return *codec;
}

}  // namespace onebit
