// The worker side of CompressedAllreduce (docs/algorithms.md): it owns the worker error and
// compresses a tensor (or the fused local momentum) into one block per server chunk, in
// its codec's format (compression/codec.h).
//
// Thread safety: one thread at a time. The backend is borrowed.
#ifndef ONEBIT_COMPRESSION_WORKER_COMPRESSOR_H_
#define ONEBIT_COMPRESSION_WORKER_COMPRESSOR_H_

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

class WorkerCompressor {
 public:
  // A tensor of n elements, padded to num_chunks * chunk (chunk a multiple of
  // codec.alignment()), in `codec`'s format.
  static absl::StatusOr<std::unique_ptr<WorkerCompressor>> Create(
      kernels::Backend* backend, size_t n, size_t num_chunks, size_t chunk,
      const Codec& codec = OnebitCodec());

  // Compresses m (g == nullptr) or fma(b1, m, (1-b1)*g) plus the worker error into
  // num_chunks blocks at `out` (backend memory), updating the worker error.
  absl::Status Compress(const float* m, const float* g, float beta1, uint8_t* out);

  size_t size() const { return n_; }
  size_t num_chunks() const { return num_chunks_; }
  size_t chunk() const { return chunk_; }
  size_t padded_size() const { return num_chunks_ * chunk_; }
  const Codec& codec() const { return *codec_; }
  size_t block_bytes() const { return codec_->BlockBytes(chunk_); }
  size_t out_bytes() const { return num_chunks_ * block_bytes(); }

  const kernels::Buffer<float>& error() const { return error_; }
  absl::StatusOr<double> ErrorNorm() const;
  absl::Status ResetError() { return error_.Zero(); }
  absl::Status RestoreError(const std::vector<float>& host) {
    return error_.CopyFromHost(host.data(), host.size());
  }

 private:
  WorkerCompressor(kernels::Backend* backend, size_t n, size_t num_chunks, size_t chunk,
                   const Codec& codec, kernels::Buffer<float> error)
      : backend_(backend),
        n_(n),
        num_chunks_(num_chunks),
        chunk_(chunk),
        codec_(&codec),
        error_(std::move(error)) {}

  kernels::Backend* backend_;
  size_t n_, num_chunks_, chunk_;
  const Codec* codec_;
  kernels::Buffer<float> error_;  // padded_size() elements
};

}  // namespace onebit

#endif  // ONEBIT_COMPRESSION_WORKER_COMPRESSOR_H_
