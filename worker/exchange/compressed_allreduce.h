// CompressedAllreduce (docs/algorithms.md): 1-bit averaging with error feedback on both sides,
// written once against Transport. In peer mode every worker is also the server of its own
// chunk: one all-to-all of compressed blocks (worker -> server), the server-side
// aggregation of the own chunk, one all-gather of the server blocks (server -> everyone).
//
// Layout: N_pad is n rounded up to a multiple of W*lcm(W,8); chunk C = N_pad/W; chunk r
// belongs to rank r. Blocks are in the codec's format (compression/codec.h): 1 bit with
// one scale per tensor, or int8 with a scale and offset per chunk.
//
// Thread safety: one thread at a time. Backend and transport are borrowed.
#ifndef ONEBIT_WORKER_EXCHANGE_COMPRESSED_ALLREDUCE_H_
#define ONEBIT_WORKER_EXCHANGE_COMPRESSED_ALLREDUCE_H_

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/buffer.h"
#include "kernels/kernels.h"
#include "compression/chunk_aggregator.h"
#include "compression/codec.h"
#include "compression/codec_registry.h"
#include "compression/layout.h"
#include "worker/transport/transport.h"
#include "compression/worker_compressor.h"
#include "worker/exchange/step_clock.h"

namespace onebit {

class CompressedAllreduce {
 public:
  static absl::StatusOr<std::unique_ptr<CompressedAllreduce>> Create(
      kernels::Backend* backend, Transport* transport, size_t n,
      const Codec& codec = OnebitCodec());

  // out = the compressed average of every rank's `in` (n elements, backend memory).
  // in and out may be the same buffer.
  absl::Status Run(const float* in, float* out);

  // Exchanges the local momentum fma(b1, m, (1-b1)*g) without materialising it, leaving
  // the averaged result as blocks in result_blocks(); m is not written. Callers decode
  // with codec().Decode or its fused update.
  absl::Status RunMomentum(const float* m, const float* g, float beta1);

  // After Run*/RunMomentum: world_size blocks of chunk() elements (backend memory).
  const uint8_t* result_blocks() const { return gathered_.data(); }
  // Decodes result_blocks() into out (n elements, backend memory), timed as compression.
  absl::Status DecodeResult(float* out);
  const Codec& codec() const { return *codec_; }
  size_t num_chunks() const { return static_cast<size_t>(world_size_); }
  size_t chunk() const { return chunk_; }
  size_t padded_size() const { return n_pad_; }
  size_t size() const { return n_; }
  // The bytes of its buffers (backend memory): the worker and server errors, the blocks.
  uint64_t buffer_bytes() const {
    return worker_->error().bytes() + server_->error().bytes() + send_.bytes() +
           received_.bytes() + server_out_.bytes() + gathered_.bytes();
  }

  const WorkerCompressor& worker() const { return *worker_; }
  const ChunkAggregator& server() const { return *server_; }
  WorkerCompressor& mutable_worker() { return *worker_; }
  ChunkAggregator& mutable_server() { return *server_; }

  // Seconds spent so far compressing, aggregating the own chunk and decompressing (not in
  // the transport), read on `clock` (null: not measured). Cumulative. The clock is borrowed.
  double compress_seconds() const { return compress_seconds_; }
  void set_step_clock(StepClock* clock) { clock_ = clock; }

 private:
  CompressedAllreduce(kernels::Backend* backend, Transport* transport, size_t n,
                      const Codec& codec);
  absl::Status Init();
  absl::Status Exchange();

  kernels::Backend* backend_;
  Transport* transport_;
  int world_size_;
  const Codec* codec_;
  size_t n_, n_pad_, chunk_, block_bytes_;
  std::unique_ptr<WorkerCompressor> worker_;
  std::unique_ptr<ChunkAggregator> server_;
  kernels::Buffer<uint8_t> send_;        // W blocks this rank compressed, block r for server r
  kernels::Buffer<uint8_t> received_;    // W blocks of this rank's chunk, one per worker
  kernels::Buffer<uint8_t> server_out_;  // 1 block: this rank's server result
  kernels::Buffer<uint8_t> gathered_;    // W blocks: every server's result
  StepClock* clock_ = StepClock::Real();
  double compress_seconds_ = 0.0;
};

}  // namespace onebit

#endif  // ONEBIT_WORKER_EXCHANGE_COMPRESSED_ALLREDUCE_H_
