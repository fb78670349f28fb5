// What the optimizer needs from the network each step, whatever carries it: the peer
// exchange (every worker is the server of its own chunk, over a Transport) or the
// parameter-server exchange (dedicated shards over gRPC). OnebitAdam is written against
// this interface only.
//
// Thread safety: one thread at a time.
#ifndef ONEBIT_WORKER_EXCHANGE_EXCHANGE_H_
#define ONEBIT_WORKER_EXCHANGE_EXCHANGE_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/statusor.h"

namespace onebit {

class WorkerCompressor;

// The averaged momentum as compressed blocks (backend memory), one per server chunk, in
// the wire format of kernels/kernels.h. Valid until the next call.
struct CompressedResult {
  const uint8_t* blocks = nullptr;
  size_t num_chunks = 0;
  size_t chunk = 0;
};

class Exchange {
 public:
  virtual ~Exchange() = default;

  virtual int world_size() const = 0;

  // Warmup: the sum over all workers of `grad` (n elements, backend memory), added in
  // worker-rank order so that every exchange gives the same bits. The result (n
  // elements, backend memory) is valid until the next call. `step` names the step, so
  // that a retried call is recognised as the same one.
  virtual absl::StatusOr<const float*> SumGradients(int64_t step, const float* grad) = 0;

  // Compression: CompressedAllreduce of the local momentum fma(b1, m, (1-b1)*g) (m is
  // not written).
  virtual absl::StatusOr<CompressedResult> AverageMomentum(int64_t step, const float* m,
                                                           const float* g, float beta1) = 0;

  // The worker side's error state, for metrics and checkpoints.
  virtual WorkerCompressor& worker_compressor() = 0;

  // Payload bytes this worker has sent and received so far.
  virtual uint64_t bytes_sent() const = 0;
  virtual uint64_t bytes_received() const = 0;
};

}  // namespace onebit

#endif  // ONEBIT_WORKER_EXCHANGE_EXCHANGE_H_
