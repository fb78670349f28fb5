// Shards with exchange.warmup_over "workers": the warmup's full-precision sums go between
// the workers, as in peer mode (ExactAllreduce over the workers' own transport), and only
// the compressed stage goes through the parameter-server shards (the wrapped exchange, a
// PsExchange in a job). ps mode wraps its exchange of the whole tensor; hierarchical over
// inter ps the inter-node exchange of each slice (the transport: the same local rank on
// every node). Why: the workers' allreduce runs one flow each way on every link, where W
// streams per shard would meet on shared links; the server error stays on the shards.
//
// Bits: with the rank order and the fp32 wire the sums are the shards' own (rank order
// from 0.0f, exact_allreduce.h), so a job gives the same bits as with warmup_over
// "shards"; the ring order and the 16-bit wires give their own fixed bits.
//
// The shards see no push before the first compressed step (freeze_step + 1, or the
// resumed step), so they run with allow_step_gaps, and a warmup checkpoint has no shard
// parts (Coordinator::ServersHoldStateAtLocked; ResumeFrom.servers_start_empty). AnyOverflow
// also goes between the workers. The warmup can overlap backward (overlap(),
// overlapped_warmup.h) with the same bits.
//
// Thread safety: one thread at a time. Backend and transport are borrowed.
#ifndef ONEBIT_WORKER_EXCHANGE_WORKERS_WARMUP_EXCHANGE_H_
#define ONEBIT_WORKER_EXCHANGE_WORKERS_WARMUP_EXCHANGE_H_

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "kernels/buffer.h"
#include "kernels/kernels.h"
#include "worker/exchange/exact_allreduce.h"
#include "worker/exchange/exchange.h"
#include "worker/exchange/forwarding_exchange.h"
#include "worker/exchange/overlapped_warmup.h"
#include "worker/transport/transport.h"

namespace onebit {

class WorkersWarmupExchange final : public ForwardingExchange {
 public:
  // `transport` (this worker's group of all workers, in `backend`'s memory) carries the
  // warmup; `compressed` (owned) the compressed stage. INVALID_ARGUMENT when the memory
  // spaces or the world sizes differ.
  static absl::StatusOr<std::unique_ptr<WorkersWarmupExchange>> Create(
      kernels::Backend* backend, Transport* transport, size_t n,
      const ExactAllreduceOptions& exact, std::unique_ptr<Exchange> compressed);

  // The fixed-order allreduce between the workers (or the overlapped one that the
  // trainer opened); the shards see nothing.
  absl::StatusOr<const float*> SumGradients(int64_t step, const float* grad) override;
  // A one-float gather between the workers (as PeerExchange's).
  absl::StatusOr<bool> AnyOverflow(int64_t step, bool local_overflow) override;
  // Both paths: the transport's payload bytes and the shards'.
  uint64_t bytes_sent() const override;
  uint64_t bytes_received() const override;
  // A flat exchange: every byte counts as between nodes (exchange.h).
  LinkBytes intra_node_bytes() const override { return {}; }
  LinkBytes inter_node_bytes() const override { return {bytes_sent(), bytes_received()}; }
  // Both paths' buffers.
  uint64_t buffer_bytes() const override {
    return compressed_->buffer_bytes() + exact_->buffer_bytes() + flag_.bytes() +
           overlap_->buffer_bytes();
  }

  Exchange& compressed() { return *compressed_; }
  // The overlapped warmup sum; not enabled until the trainer enables it.
  OverlappedWarmup& overlap() { return *overlap_; }
  void set_step_clock(StepClock* clock) override {
    ForwardingExchange::set_step_clock(clock);
    overlap_->set_step_clock(clock);
  }

 private:
  WorkersWarmupExchange(kernels::Backend* backend, Transport* transport, size_t n,
                        const ExactAllreduceOptions& exact, std::unique_ptr<Exchange> compressed)
      : ForwardingExchange(compressed.get()),
        backend_(backend),
        transport_(transport),
        compressed_(std::move(compressed)),
        overlap_(std::make_unique<OverlappedWarmup>(backend, transport, n, exact)) {}

  kernels::Backend* const backend_;
  Transport* const transport_;
  const std::unique_ptr<Exchange> compressed_;
  std::unique_ptr<ExactAllreduce> exact_;
  kernels::Buffer<float> flag_;  // AnyOverflow's one float
  const std::unique_ptr<OverlappedWarmup> overlap_;  // last: its thread stops first
};

}  // namespace onebit

#endif  // ONEBIT_WORKER_EXCHANGE_WORKERS_WARMUP_EXCHANGE_H_
