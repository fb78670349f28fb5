// A Codec is one block format of the compressed exchange (exchange.compressor): how many
// bytes a chunk takes, what a valid block header holds, and the kernels that compress with
// error feedback, aggregate on the server and decode. The 1-bit and int8 formats are
// specified in kernels/kernels.h and their codecs forward to Backend methods; a codec may
// instead keep its format and kernels with it, running them on any backend through
// Backend::HostAddress and CudaStreamOf (compression/fp8/fp8_e4m3.h).
//
// Adding a format means one implementation of this interface and one row in
// codec_registry.cc (and, for a codec with its own CUDA kernels, one dep of
// //compression:codecs_cuda); no exchange, shard or optimizer branches on the format.
//
// Ownership and thread safety: codecs are stateless singletons that live for the whole
// process (FindCodec, AllCodecs). They hold no buffers: the error buffers belong to the
// caller (WorkerCompressor, ChunkAggregator). Any thread may call a codec; the Backend
// passed in keeps its own rule (one thread at a time).
#ifndef ONEBIT_COMPRESSION_CODEC_H_
#define ONEBIT_COMPRESSION_CODEC_H_

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "kernels/kernels.h"

namespace onebit {

// A block header field outside its allowed range (Codec::CheckHeader): the block must be
// rejected. The texts name the field and its rule, e.g. "scale" must be "finite and >= 0".
struct HeaderFault {
  absl::string_view field;
  absl::string_view rule;
  float value = 0.0f;
};

// The rule for a float32 scale at the start of a header (the 1-bit and int8 formats): finite
// and >= 0.
inline std::optional<HeaderFault> CheckScale(float scale) {
  if (!std::isfinite(scale) || scale < 0.0f) return HeaderFault{"scale", "finite and >= 0", scale};
  return std::nullopt;
}

class Codec {
 public:
  virtual ~Codec() = default;

  // The exchange.compressor value that selects this codec ("onebit", "int8", "fp8").
  virtual absl::string_view name() const = 0;

  // Every chunk is a multiple of alignment() elements (8 for the sign bytes of 1 bit, 1 for
  // fp8). It must divide 8, the layouts' multiple (PsLayout::Create checks it).
  virtual size_t alignment() const = 0;

  // Bytes of one block of `chunk` elements.
  virtual size_t BlockBytes(size_t chunk) const = 0;

  // Bytes at the start of a block that CheckHeader reads: at most BlockBytes(c) for every
  // chunk c >= alignment(). Chunks are never empty: the layouts (compression/layout.h) give
  // at least 8 elements. (fp8's empty block has 0 bytes, its header 1.)
  virtual size_t header_bytes() const = 0;

  // The first fault of the block header at `header` (header_bytes() bytes, host memory),
  // or nullopt when the header is valid. A block that fails is never aggregated or used.
  virtual std::optional<HeaderFault> CheckHeader(const uint8_t* header) const = 0;

  // Worker compression with error feedback (kernels.h, Backend::CompressWorker for 1 bit):
  // num_chunks blocks of `chunk` elements from m (or its fused momentum update with g)
  // plus err into `out`; err is updated. Pointers are in the backend's memory.
  virtual absl::Status Compress(kernels::Backend& backend, const float* m, const float* g,
                                float beta1, size_t n, size_t num_chunks, size_t chunk,
                                float* err, uint8_t* out) const = 0;

  // Server aggregation of one chunk: num_workers blocks in rank order into one block,
  // with the server error err (chunk elements).
  virtual absl::Status Aggregate(kernels::Backend& backend, const uint8_t* blocks,
                                 int num_workers, size_t chunk, float* err,
                                 uint8_t* out) const = 0;

  // Decodes num_chunks blocks into the first n elements of `out` (padding dropped).
  virtual absl::Status Decode(kernels::Backend& backend, const uint8_t* blocks,
                              size_t num_chunks, size_t chunk, size_t n,
                              float* out) const = 0;

  // True if DecodeFrozenAdamUpdate is implemented. It must give the same bits as Decode
  // into m followed by Backend::FrozenAdamUpdate with the same arguments.
  virtual bool fuses_frozen_update() const { return false; }

  // Decode fused with the frozen-variance Adam update (Backend::DecompressFrozenAdamUpdate).
  // UNIMPLEMENTED unless fuses_frozen_update().
  virtual absl::Status DecodeFrozenAdamUpdate(kernels::Backend& backend, const uint8_t* blocks,
                                              size_t num_chunks, size_t chunk,
                                              const kernels::AdamHyper& h, const float* v,
                                              const float* mask, float* m, float* p,
                                              size_t n) const;
};

}  // namespace onebit

#endif  // ONEBIT_COMPRESSION_CODEC_H_
