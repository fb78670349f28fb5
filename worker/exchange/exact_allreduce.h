// A full-precision allreduce whose result does not depend on the transport: a
// reduce-scatter, each rank's chunk summed in a fixed order, then an all-gather, both moved
// as W-1 permutation steps of point-to-point SendRecv, segment by segment. The warmup
// stage sums gradients with it. docs/algorithms.md has the orders and the 16-bit wires.
//
// ORDER OF THE SUM (kRank). The n elements are cut into W chunks of C = ceil(n/W) (the
// last ones shorter or empty); rank v owns chunk v, receives chunk v from every rank and
//
//   s = 0.0f;  for j = 0..W-1: s = s + from_wire(to_wire(x_j))     (float32 adds)
//
// in rank order (Backend::SumWireRows), then sends to_wire(s) to every rank; every rank,
// the owner included, reads the result back with from_wire. With the default fp32 wire
// to_wire is the identity and this is exactly the parameter-server shards' sum (rank order
// from 0.0f, compression/layout.h), so ps and peer mode give the same bits. With bf16 or
// fp16 each value is rounded once on the way in and the sum once on the way out (round to
// nearest even, kernels/wire_dtype.h). Segments change no bit (the sum is elementwise).
//
// Thread safety: one thread at a time. Backend and transport are borrowed.
#ifndef ONEBIT_WORKER_EXCHANGE_EXACT_ALLREDUCE_H_
#define ONEBIT_WORKER_EXCHANGE_EXACT_ALLREDUCE_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/buffer.h"
#include "kernels/kernels.h"
#include "worker/transport/transport.h"

namespace onebit {

// "fp32", "bf16" or "fp16" (the job config's exchange.warmup_dtype).
absl::StatusOr<kernels::WireDtype> ParseWireDtype(absl::string_view name);

// The fixed order of the sums. kRank (above) is the parameter-server shards' order: step
// s = 1..W-1 of the reduce-scatter, rank r sends chunk r+s to rank r+s and receives chunk r
// from rank r-s (mod W); the all-gather runs its steps s = W-1..1 the same way.
// kRing (fp32 wire only) is gloo's and NCCL's ring: chunk v's partial sum starts at rank
// v+1 and travels v+1 -> v+2 -> ... -> v, each rank adding its own values,
//
//   s = 0.0f;  for j = v+1, v+2, ..., v (mod W): s = s + x_j
//
// then the sums go round once more. The same bytes, but no link changes peer. Its bits do
// not depend on the transport but differ from kRank's, so ps and peer mode then no longer
// agree bit for bit in the warmup: peer mode only.
enum class SumOrder { kRank, kRing };

// "rank" or "ring" (the job config's exchange.warmup_order).
absl::StatusOr<SumOrder> ParseSumOrder(absl::string_view name);

// Whether `local` is true on any rank of `transport`: an AllGather of one float a rank
// (one message round; a ring allreduce of the flag took 2(W-1)) through `*flag`, a buffer
// of `backend` (in the transport's memory, 1 + W floats) that is made on the first call
// and reused. Every rank gets the same answer.
absl::StatusOr<bool> AnyAcrossRanks(Transport* transport, kernels::Backend* backend,
                                    kernels::Buffer<float>* flag, bool local);

struct ExactAllreduceOptions {
  SumOrder order = SumOrder::kRank;
  // What the partial sums travel as.
  kernels::WireDtype wire_dtype = kernels::WireDtype::kFp32;
  // Elements per SendRecv (>= 1): bounds one message, and is the unit of the pipeline.
  // 1M elements is 4 MB of fp32: 0.34 s at 100 Mbit/s, 3.4 ms at 10 Gbit/s, against a
  // few hundred microseconds of gloo's own per message.
  size_t segment_elements = size_t{1} << 20;
  // SendRecv calls started and not yet waited for (>= 1; 1 is the unpipelined schedule).
  // Segments go step by step, in lockstep; a segment of this rank's chunk is summed as soon
  // as its last row has arrived and its all-gather sends wait only for that sum. On a
  // transport whose StartSendRecv blocks (inproc, NCCL) this is the plain schedule.
  int max_in_flight = 2;
};

class ExactAllreduce {
 public:
  static absl::StatusOr<std::unique_ptr<ExactAllreduce>> Create(
      kernels::Backend* backend, Transport* transport, size_t n,
      const ExactAllreduceOptions& options = ExactAllreduceOptions());

  // Sums `in` (n elements, backend memory) over all ranks in rank order. The sum is at
  // result() until the next call.
  absl::Status Run(const float* in);
  const float* result() const { return result_; }
  // The bytes of its buffers (backend memory).
  uint64_t buffer_bytes() const {
    return wire_in_.bytes() + rows_.bytes() + summed_.bytes() + gathered_.bytes() +
           converted_.bytes() + partial_.bytes() + slots_.bytes();
  }

 private:
  ExactAllreduce(kernels::Backend* backend, Transport* transport, size_t n, size_t chunk,
                 const ExactAllreduceOptions& options)
      : backend_(backend), transport_(transport), n_(n), chunk_(chunk), options_(options) {}

  // Bytes of `elements` elements on the wire.
  size_t WireBytes(size_t elements) const {
    return elements * kernels::WireDtypeBytes(options_.wire_dtype);
  }
  // Elements of chunk c (C, fewer for the last chunks, 0 past n).
  size_t ChunkCount(size_t c) const {
    const size_t begin = c * chunk_;
    return begin >= n_ ? 0 : std::min(chunk_, n_ - begin);
  }
  // Segments per chunk: of the longest chunk, the same on every rank (segments past a
  // shorter chunk's end are empty calls).
  size_t NumSegments() const {
    return chunk_ == 0 ? 0 : (chunk_ + options_.segment_elements - 1) / options_.segment_elements;
  }
  // Elements of segment k of a chunk of `count` elements.
  size_t SegmentCount(size_t count, size_t k) const {
    const size_t begin = k * options_.segment_elements;
    return begin >= count ? 0 : std::min(options_.segment_elements, count - begin);
  }
  // Sums segment k of this rank's chunk in rank order into gathered_ (wire dtype).
  absl::Status SumSegment(size_t k);
  // Run() in ring order.
  absl::Status RunRing(const float* in);

  kernels::Backend* backend_;
  Transport* transport_;
  const size_t n_, chunk_;
  const ExactAllreduceOptions options_;
  kernels::Buffer<uint8_t> wire_in_;   // the input in the wire dtype (16-bit wires only)
  // Chunk r of every rank, segment-major: segment k's W rows (rank order) lie together at
  // element W * k * segment_elements, each SegmentCount(ChunkCount(r), k) long.
  kernels::Buffer<uint8_t> rows_;
  kernels::Buffer<float> summed_;      // this rank's chunk of the sum
  kernels::Buffer<uint8_t> gathered_;  // the whole sum, wire dtype
  kernels::Buffer<float> converted_;   // the sum as float32 (16-bit wires only)
  // Ring order: the partial sums (n elements), and per call in flight a received partial
  // and this rank's values beside it (2 rows of segment_elements).
  kernels::Buffer<float> partial_;
  kernels::Buffer<float> slots_;
  const float* result_ = nullptr;
};

}  // namespace onebit

#endif  // ONEBIT_WORKER_EXCHANGE_EXACT_ALLREDUCE_H_
