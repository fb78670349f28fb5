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
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "compression/codec.h"
#include "kernels/kernels.h"
#include "worker/exchange/gradient.h"
#include "worker/exchange/step_clock.h"

namespace onebit {

class WorkerCompressor;

// Named host copies of error buffers (Exchange::SaveErrors).
using ErrorState = std::map<std::string, std::vector<float>>;

// The averaged momentum, in one of two forms, valid until the next call (backend memory):
// - compressed: `codec` is set, and `blocks` holds num_chunks blocks of `chunk` elements
//   in its format; the exchange does not decode them (DecodeResult, or the codec's fused
//   frozen-Adam decode);
// - exact: `codec` is null, and `exact` holds the average as floats, n elements (or more,
//   padded): a hierarchical exchange with one node averages without compressing.
struct CompressedResult {
  const Codec* codec = nullptr;
  const uint8_t* blocks = nullptr;
  size_t num_chunks = 0;
  size_t chunk = 0;
  const float* exact = nullptr;

  // The exact form, over `floats`.
  static CompressedResult Exact(const float* floats) {
    CompressedResult r;
    r.exact = floats;
    return r;
  }
};

// The first n elements of `r` as floats into `out` (backend memory): a copy of r.exact, or
// r.codec's Decode of the blocks.
absl::Status DecodeResult(const CompressedResult& r, kernels::Backend& backend, size_t n,
                          float* out);

// Payload bytes one way or the other.
struct LinkBytes {
  uint64_t sent = 0;
  uint64_t received = 0;
};

// SHARDED STATE: which part of the optimizer state this worker keeps, on an exchange that
// shards it (HierarchicalExchange built with shard_state; hierarchical_exchange.h). The
// padded tensor is `pieces` slices of `stride` elements; this worker keeps the state of
// slice `piece` only. Element i of a shard buffer (stride elements, zero past end - begin)
// is parameter piece*stride + i.
struct StateShard {
  // The parameters of slice `piece`, [begin, end) within [0, n): begin = piece*stride
  // unless the slice is all padding, and then begin = end = n.
  size_t begin = 0, end = 0;
  size_t stride = 0;              // S: the padded tensor is pieces*stride elements
  int piece = 0, pieces = 1;      // this worker's local rank, and the node's workers
  int replica = 0, replicas = 1;  // this worker's node, and the nodes: every node holds
                                  // slice `piece` too (who saves which part of it)
};

// state[name], or INVALID_ARGUMENT naming what the checkpoint lacks.
absl::StatusOr<const std::vector<float>*> FindError(const ErrorState& state,
                                                    const std::string& name);

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

  // 0/1 Adam: CompressedAllreduce of x itself (n elements, backend memory; not written),
  // with the same error buffers and the same result form as AverageMomentum, so that
  // every worker gets the same compressed average of the workers' x. A flat exchange
  // compresses x as it is; a hierarchical one averages it inside the node first.
  virtual absl::StatusOr<CompressedResult> CompressedAverage(int64_t step, const float* x) = 0;

  // 0/1 Adam, once before its first local step: every error buffer of the exchange is set
  // to zero, the worker error here and the server errors of every chunk (this worker's own
  // in peer mode; in parameter-server mode the shards zero theirs before they aggregate
  // step `step`, the next exchange).
  virtual absl::Status ResetErrors(int64_t step) = 0;

  // fp16's LOSS SCALING: whether the gradient of `step` overflowed on any worker, given
  // this worker's `local_overflow`; every worker gets the same answer, so that every worker
  // skips the same steps. Every worker calls it for a step, before the step's other calls
  // (or none does). It moves one flag, not the gradient, and changes no error buffer.
  virtual absl::StatusOr<bool> AnyOverflow(int64_t step, bool local_overflow) = 0;

  // Where a hierarchical exchange cuts its tensor into slices (HierarchicalLayout::slice()),
  // so that whole-tensor sums of squares are added slice by slice in slice order, the
  // same in sharded and unsharded runs (docs/algorithms.md, "Sums of squares and
  // threads"). 0: no cut, one piece (the flat exchanges).
  virtual size_t reduction_stride() const { return 0; }

  // SHARDED STATE (StateShard). An exchange that shards the optimizer state answers
  // state_shard() and the calls below, and then FAILED_PRECONDITION to SumGradients,
  // AverageMomentum and CompressedAverage (whole-tensor results it keeps no buffers for);
  // one that does not answers nullopt, and these calls fail (the defaults: UNIMPLEMENTED).
  // Every call below but state_shard and buffer_bytes is a collective of the node's
  // workers (the step calls: of every worker): all call it at the same point, with the
  // same sizes.
  virtual std::optional<StateShard> state_shard() const { return std::nullopt; }

  // Warmup: slice `piece` of SumGradients(step, grad): stride floats (backend memory),
  // the same bits as those elements of SumGradients, zero past the parameters; valid
  // until the next call. `grad`: this worker's whole gradient (n elements; float32 or
  // 16-bit, gradient.h).
  virtual absl::StatusOr<const float*> SumGradientsOfShard(int64_t step, Gradient grad);

  // Compression: AverageMomentum for slice `piece` only. `m_shard`: the slice of m (stride
  // floats, zero past the parameters; not written); `g`: the whole local gradient (n).
  // The result covers the slice's stride elements: its inter-node chunks (the same blocks
  // as that slice's chunks of AverageMomentum's result), or with nothing compressed (one
  // node) the exact floats. Decode with DecodeResult(r, backend, end - begin, out).
  // `g_scale`: the local gradient enters as g_scale * g (one float multiply per element,
  // Backend::Scale's bits; 1: g itself), so the compression step's clip
  // (GradientClipper::ClipScale) needs no clipped copy of g. g may be 16-bit (gradient.h).
  virtual absl::StatusOr<CompressedResult> AverageMomentumOfShard(int64_t step,
                                                                  const float* m_shard,
                                                                  Gradient g, float beta1,
                                                                  float g_scale);

  // 1-bit LAMB's compression, in two calls. ShardRows: slice `piece` of every local
  // worker's `x` (n elements), `pieces` rows of stride floats in local-rank order (zero
  // past the parameters), writable, each element x_j * scale (AverageMomentumOfShard's
  // g_scale); x may be 16-bit (gradient.h). Valid until the next call, which must be
  // CompressedAverageOfRows of the same step.
  // CompressedAverageOfRows: the rows' AverageRows (whatever the caller wrote into them),
  // then the inter-node CompressedAverage of it; the result has AverageMomentumOfShard's
  // form. With the rows untouched it is slice `piece` of CompressedAverage(step, x).
  // FAILED_PRECONDITION when ShardRows(step) did not come just before.
  virtual absl::StatusOr<float*> ShardRows(int64_t step, Gradient x, float scale = 1.0f);
  virtual absl::StatusOr<CompressedResult> CompressedAverageOfRows(int64_t step);

  // Exact: `whole` (pieces*stride floats, backend memory) gets every local worker's slice
  // of its own `whole`; this worker's slice is read from `whole` and kept.
  virtual absl::Status AllGatherShards(float* whole);
  // The same for elements of `element_bytes` bytes (4 or less; the low-precision
  // parameters, 2): `whole` holds pieces*stride of them. Raw bytes: exact for any format.
  virtual absl::Status AllGatherShardBytes(void* whole, size_t element_bytes);

  // Exact: every local worker's `mine` (host; the same length on all of them, a
  // precondition the call cannot check), concatenated in local-rank order.
  virtual absl::StatusOr<std::vector<double>> GatherPartials(const std::vector<double>& mine);

  // The bytes of the exchange's own buffers (backend memory), those of an exchange it
  // wraps included; for metrics. 0: not reported.
  virtual uint64_t buffer_bytes() const { return 0; }

  // The worker side's error state, for metrics and checkpoints.
  virtual WorkerCompressor& worker_compressor() = 0;

  // CHECKPOINTS. The error buffers this worker holds, as host copies by name:
  // "worker_error" (padded, as the compressor keeps it) and, where the worker is also a
  // server (peer mode), "server_error" of its own chunk. The default saves the worker error.
  virtual absl::StatusOr<ErrorState> SaveErrors();
  // Puts back what SaveErrors gave on the same topology. INVALID_ARGUMENT naming the buffer
  // when a name is missing or a size differs; nothing changes then.
  virtual absl::Status RestoreErrors(const ErrorState& state);
  // The state after `step` will be checkpointed: an exchange with servers tells them in
  // that step's pushes, so that each writes its server error after completing it.
  virtual void ScheduleCheckpoint(int64_t /*step*/) {}

  // Payload bytes this worker has sent and received so far.
  virtual uint64_t bytes_sent() const = 0;
  virtual uint64_t bytes_received() const = 0;

  // The same split by link: inside this worker's node and between nodes. A flat exchange
  // (peer, ps) does not know the topology and treats every peer as remote: all its bytes
  // are inter-node, as on a cluster of one worker per node.
  virtual LinkBytes intra_node_bytes() const { return {}; }
  virtual LinkBytes inter_node_bytes() const { return {bytes_sent(), bytes_received()}; }

  // STEP TIME. The seconds SumGradients/AverageMomentum calls have spent so far in local
  // compression work: compressing with error feedback, and the server-side aggregation
  // where this worker serves a chunk (peer mode). The rest of a call's time is the
  // exchange itself (transport, waiting for peers or shards). Full-precision sums count
  // as exchange: their reduction is part of the collective. Cumulative; read deltas.
  virtual double compress_seconds() const { return compress_seconds_; }
  // The clock compress_seconds reads (default StepClock::Real(); null measures nothing).
  // Borrowed.
  virtual void set_step_clock(StepClock* clock) { step_clock_ = clock; }
  StepClock* step_clock() const { return step_clock_; }

 protected:
  // Implementations time their compression work with
  // ScopedStepTime t(step_clock(), &compress_seconds_);
  double compress_seconds_ = 0.0;

 private:
  StepClock* step_clock_ = StepClock::Real();
};

}  // namespace onebit

#endif  // ONEBIT_WORKER_EXCHANGE_EXCHANGE_H_
