// The server side of CompressedAllreduce for one chunk (docs/algorithms.md): it owns the chunk's
// server error and turns the W compressed worker blocks of that chunk into one compressed
// result block. The same library runs embedded in a worker (peer mode) and behind the
// parameter-server service (ps mode).
//
// Thread safety: one thread at a time. The backend is borrowed.
#ifndef ONEBIT_COMPRESSION_CHUNK_AGGREGATOR_H_
#define ONEBIT_COMPRESSION_CHUNK_AGGREGATOR_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "compression/codec.h"
#include "compression/codec_registry.h"
#include "kernels/buffer.h"
#include "kernels/kernels.h"

namespace onebit {

class ChunkAggregator {
 public:
  // `chunk` elements, a multiple of codec.alignment(), in `codec`'s format. The server
  // error starts at zero.
  static absl::StatusOr<std::unique_ptr<ChunkAggregator>> Create(
      kernels::Backend* backend, size_t chunk, const Codec& codec = OnebitCodec());

  // `blocks`: num_workers consecutive compressed blocks of this chunk, in worker order
  // (backend memory). `out`: one block, the compressed average plus server error.
  absl::Status Aggregate(const uint8_t* blocks, int num_workers, uint8_t* out);

  size_t chunk() const { return error_.size(); }
  const Codec& codec() const { return *codec_; }
  size_t block_bytes() const { return codec_->BlockBytes(chunk()); }

  // The server error: for metrics, checkpoints and topology changes.
  const kernels::Buffer<float>& error() const { return error_; }
  absl::StatusOr<double> ErrorNorm() const;
  absl::Status ResetError() { return error_.Zero(); }
  absl::Status RestoreError(const std::vector<float>& host) {
    return error_.CopyFromHost(host.data(), host.size());
  }

 private:
  ChunkAggregator(kernels::Backend* backend, const Codec& codec, kernels::Buffer<float> error)
      : backend_(backend), codec_(&codec), error_(std::move(error)) {}

  kernels::Backend* backend_;
  const Codec* codec_;
  kernels::Buffer<float> error_;
};

}  // namespace onebit

#endif  // ONEBIT_COMPRESSION_CHUNK_AGGREGATOR_H_
