// The hierarchical exchange (docs/design.md, "Hierarchical mode"): full precision inside
// a node, where links are fast, and 1-bit compression only between nodes, where they are
// slow. Worker (node, l) of nodes x local_size workers holds slice l of the padded tensor
// (compression/layout.h, HierarchicalLayout):
//
//   warmup       reduce-scatter inside the node (local-rank order), the inter-node
//                exchange's exact sum of slice l (node order), all-gather inside the node:
//                the sum over all workers, the same bits over every transport.
//   compression  the node's average gradient of slice l (Backend::AverageRows), its
//                momentum fma(b1, m, (1-b1)*avg) (= the average of the node's local
//                momenta), the inter-node compressed allreduce of it (worker and server
//                errors exist only here, per slice), then an all-gather inside the node of
//                the result blocks. With one node nothing is compressed: the exact average.
//
// The inter-node exchange is any Exchange over layout.slice() elements whose world is the
// nodes (PeerExchange over the same local rank on every node, or PsExchange over the
// slice's shards). Inside the node: a Transport of its local_size workers.
//
// The intra-node reduce-scatter runs segment by segment (HierarchicalOptions::
// segment_elements): each AllToAll moves segment k of every local rank's slice, and its L
// rows are summed (averaged) in local-rank order into the same elements of slice l. The
// sum is elementwise, so segments change no bit; the exchange keeps L rows of one segment
// to send and L to receive, not two copies of the padded tensor.
//
// SHARDED STATE (HierarchicalOptions::shard_state): worker l keeps the optimizer state of
// slice l only (state_shard()). The step calls then stop before the intra-node all-gather:
// SumGradientsOfShard, AverageMomentumOfShard and ShardRows + CompressedAverageOfRows give
// slice l (the inter-node result as it is; one node: exact floats); the optimizer updates
// slice l of the parameters and AllGatherShards makes them whole on every local worker.
// The whole-tensor calls (SumGradients, AverageMomentum, CompressedAverage) then fail,
// and without shard_state the shard calls do (FAILED_PRECONDITION both ways), so that no
// worker silently does the other mode's work. The inter-node traffic and the bits of
// slice l are the same in both modes.
//
// Thread safety: one thread at a time. Backend and intra transport are borrowed; the
// inter-node exchange is owned.
#ifndef ONEBIT_WORKER_EXCHANGE_HIERARCHICAL_EXCHANGE_H_
#define ONEBIT_WORKER_EXCHANGE_HIERARCHICAL_EXCHANGE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "compression/layout.h"
#include "compression/worker_compressor.h"
#include "kernels/buffer.h"
#include "kernels/kernels.h"
#include "worker/exchange/exchange.h"
#include "worker/transport/transport.h"

namespace onebit {

// How a HierarchicalExchange is built.
struct HierarchicalOptions {
  // Shard the optimizer state across the node's workers (the header comment). Off: every
  // worker keeps the whole state, as before sharding existed.
  bool shard_state = false;
  // This worker's node, the inter-node exchange's rank in [0, nodes): StateShard::replica.
  // CreatePeer takes it from the inter transport instead.
  int node = 0;
  // Elements of one segment of the intra-node reduce-scatter (>= 1; the header comment):
  // one AllToAll moves L blocks of this many floats. 4 Mi elements (16 MiB a block) keeps
  // the two L x segment buffers at 128 MiB on a node of 4 and 256 MiB on a node of 8, O(1)
  // in n. Over gloo on loopback a call costs a few ms of its own: at 32 Mi parameters and
  // L = 4, 4 Mi segments took 1-3% longer than one segment, 1 Mi 24-36%
  // (tools/segment_bench_main.cc, results/bench/2026-11-29/memory-step7/segments.txt).
  // On NVLink a 16 MiB block takes about 50 us against NCCL's ~10 us a call (not
  // measured here).
  size_t segment_elements = size_t{1} << 22;
};

class HierarchicalExchange : public Exchange {
 public:
  // `intra`: this node's workers; its rank is this worker's local rank and its world size
  // layout.local_size(). `inter`: the exchange of this local rank's slice between the
  // nodes, over layout.slice() elements in layout.inter_chunks() server chunks; its world
  // size is the number of nodes. Null means a single node.
  static absl::StatusOr<std::unique_ptr<HierarchicalExchange>> Create(
      kernels::Backend* backend, Transport* intra, std::unique_ptr<Exchange> inter,
      const HierarchicalLayout& layout, const HierarchicalOptions& options = {});
  // The peer form: the inter-node exchange is a PeerExchange over `inter` (local rank l of
  // every node; its world size is the number of nodes), for a tensor of n elements.
  // `codec`: the inter-node exchange's format (with Create, the inter exchange's own).
  static absl::StatusOr<std::unique_ptr<HierarchicalExchange>> CreatePeer(
      kernels::Backend* backend, Transport* intra, Transport* inter, size_t n,
      const Codec& codec = OnebitCodec(), const HierarchicalOptions& options = {});

  int world_size() const override { return nodes_ * layout_.local_size(); }
  absl::StatusOr<const float*> SumGradients(int64_t step, const float* grad) override;
  absl::StatusOr<CompressedResult> AverageMomentum(int64_t step, const float* m, const float* g,
                                                   float beta1) override;
  // The node average of x (exact), then its slice through the inter-node exchange's
  // CompressedAverage; with one node, the exact average.
  absl::StatusOr<CompressedResult> CompressedAverage(int64_t step, const float* x) override;
  absl::Status ResetErrors(int64_t step) override;
  // Inside the node over the intra transport, then over the inter-node exchange.
  absl::StatusOr<bool> AnyOverflow(int64_t step, bool local_overflow) override;
  // The slice length: the sums of squares are cut where the slices begin.
  size_t reduction_stride() const override { return layout_.slice(); }
  // SHARDED STATE (exchange.h; FAILED_PRECONDITION without shard_state). Slice l's
  // results live in this exchange's slice buffers, or with other nodes in the inter-node
  // exchange's result, valid until the next call. AllGatherShards (and AllGatherShardBytes)
  // stages this worker's slice first: a Transport does not promise an in-place all-gather.
  std::optional<StateShard> state_shard() const override;
  absl::StatusOr<const float*> SumGradientsOfShard(int64_t step, Gradient grad) override;
  // g_scale multiplies each segment of g after it is packed, before it is sent.
  absl::StatusOr<CompressedResult> AverageMomentumOfShard(int64_t step, const float* m_shard,
                                                          Gradient g, float beta1,
                                                          float g_scale) override;
  // The rows (L x S floats, 1-bit LAMB's) are allocated on the first call: an exchange
  // that never answers ShardRows keeps only the segment buffers.
  absl::StatusOr<float*> ShardRows(int64_t step, Gradient x, float scale = 1.0f) override;
  absl::StatusOr<CompressedResult> CompressedAverageOfRows(int64_t step) override;
  absl::Status AllGatherShards(float* whole) override;
  absl::Status AllGatherShardBytes(void* whole, size_t element_bytes) override;
  absl::StatusOr<std::vector<double>> GatherPartials(const std::vector<double>& mine) override;
  // This exchange's buffers and the inter-node exchange's buffer_bytes(). ShardRows' rows
  // count from its first call on.
  uint64_t buffer_bytes() const override;
  // The worker error of this worker's slice (one node: a compressor that never runs, so
  // that metrics and checkpoints see zero error).
  WorkerCompressor& worker_compressor() override;
  // The inter-node exchange's errors (one node: none, nothing is compressed).
  absl::StatusOr<ErrorState> SaveErrors() override;
  absl::Status RestoreErrors(const ErrorState& state) override;
  void ScheduleCheckpoint(int64_t step) override {
    if (inter_ != nullptr) inter_->ScheduleCheckpoint(step);
  }
  // The sums of intra_node_bytes() (the intra transport) and inter_node_bytes() (the
  // inter-node exchange).
  uint64_t bytes_sent() const override;
  uint64_t bytes_received() const override;
  LinkBytes intra_node_bytes() const override;
  LinkBytes inter_node_bytes() const override;
  // The inter-node exchange's compression (the intra-node reduce-scatter and all-gather
  // are full precision: exchange time).
  double compress_seconds() const override {
    return inter_ != nullptr ? inter_->compress_seconds() : 0.0;
  }
  void set_step_clock(StepClock* clock) override {
    Exchange::set_step_clock(clock);
    if (inter_ != nullptr) inter_->set_step_clock(clock);
  }

  // Elements per reduce-scatter segment: options.segment_elements, at most the slice.
  size_t segment() const;
  int nodes() const { return nodes_; }
  int local_rank() const { return intra_->rank(); }
  bool sharded() const { return options_.shard_state; }
  const HierarchicalLayout& layout() const { return layout_; }

 private:
  HierarchicalExchange(kernels::Backend* backend, Transport* intra,
                       std::unique_ptr<Exchange> inter, const HierarchicalLayout& layout,
                       const HierarchicalOptions& options);
  absl::Status Init();
  // OK when the exchange is in the mode `call` belongs to (sharded or not); otherwise
  // FAILED_PRECONDITION naming `call` and what to call instead.
  absl::Status CheckMode(bool sharded_call, absl::string_view call,
                         absl::string_view instead) const;
  // Segment [begin, begin + count) of every local rank's slice of `in` (n elements, zero
  // past n; a 16-bit `in` widened to float32 as it is packed), each scaled by `scale`
  // unless it is 1, into send_; then the AllToAll: row j of `rows` (count floats each,
  // contiguous) is local rank j's segment of slice l.
  absl::Status ExchangeSegment(Gradient in, size_t begin, size_t count, float scale,
                               float* rows);
  // The node's slice of scale * `in` (n elements): its sum (average) over the local workers
  // at slice_sum_, one segment at a time.
  absl::Status ReduceScatter(Gradient in, bool average, float scale = 1.0f);
  // INTERNAL unless `r` (the inter-node result) is this slice's blocks in the layout.
  absl::Status CheckInterResult(const CompressedResult& r) const;
  // Unsharded, one node: every local rank's `slice` (S floats) gathered into gathered_, as
  // an exact result.
  absl::StatusOr<CompressedResult> GatherExact(const float* slice);
  // Every local rank's slice of blocks `r` (the inter-node result) gathered into the
  // node's whole result.
  absl::StatusOr<CompressedResult> GatherSlices(const CompressedResult& r);

  kernels::Backend* const backend_;
  Transport* const intra_;
  const std::unique_ptr<Exchange> inter_;
  const HierarchicalLayout layout_;
  const HierarchicalOptions options_;
  const int nodes_;
  std::unique_ptr<WorkerCompressor> idle_compressor_;  // one node only
  // The reduce-scatter's L rows of one segment: packed from the input, and received.
  kernels::Buffer<float> send_;
  kernels::Buffer<float> received_;
  kernels::Buffer<float> slice_sum_;   // the node's sum (or average) of slice l
  // Unsharded only:
  kernels::Buffer<float> slice_m_;     // slice l of the momentum, zero past the parameters
                                       // (one node: the averaged momentum's slice)
  kernels::Buffer<float> gathered_;    // the whole sum (floats), padded
  kernels::Buffer<uint8_t> blocks_;    // every slice's result blocks
  // Sharded only:
  kernels::Buffer<float> stage_;       // AllGatherShards' copy of slice l; one node: the
                                       // averaged momentum of slice l
  kernels::Buffer<double> partials_;   // GatherPartials: mine, then every rank's (made
                                       // on use, resized with the length)
  kernels::Buffer<float> rows_;        // ShardRows: slice l of every local worker (L x S),
                                       // made on its first call
  std::optional<int64_t> rows_step_;   // the step whose rows ShardRows left in rows_
  kernels::Buffer<float> flag_;        // AnyOverflow's one float
  const Codec* codec_ = nullptr;       // the inter exchange's; null with one node
};

}  // namespace onebit

#endif  // ONEBIT_WORKER_EXCHANGE_HIERARCHICAL_EXCHANGE_H_
