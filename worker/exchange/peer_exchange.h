// The peer exchange: every worker is also the server of its own chunk. Warmup sums go
// through ExactAllreduce, compressed averages through CompressedAllreduce, both over one
// Transport (in-process, gloo or NCCL).
//
// OVERLAP. The warmup sum can also run bucket by bucket while the gradient is
// still being computed: overlap() (overlapped_warmup.h); SumGradients closes a step it
// opened, with the same bits as one sum of the whole buffer.
//
// Thread safety: one thread at a time (overlap() as overlapped_warmup.h says). Backend and
// transport are borrowed.
#ifndef ONEBIT_WORKER_EXCHANGE_PEER_EXCHANGE_H_
#define ONEBIT_WORKER_EXCHANGE_PEER_EXCHANGE_H_

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/buffer.h"
#include "kernels/kernels.h"
#include "worker/exchange/compressed_allreduce.h"
#include "worker/exchange/exact_allreduce.h"
#include "worker/exchange/exchange.h"
#include "worker/exchange/overlapped_warmup.h"
#include "worker/transport/transport.h"

namespace onebit {

class PeerExchange : public Exchange {
 public:
  // `exact` configures the warmup's ExactAllreduce (its wire dtype, say); `codec` is the
  // compressed exchange's format (job config exchange.compressor; every rank the same).
  static absl::StatusOr<std::unique_ptr<PeerExchange>> Create(
      kernels::Backend* backend, Transport* transport, size_t n,
      const ExactAllreduceOptions& exact = ExactAllreduceOptions(),
      const Codec& codec = OnebitCodec());

  // The overlapped warmup sum (the header comment); not enabled until the trainer
  // enables it with the workload's buckets.
  OverlappedWarmup& overlap() { return *overlap_; }

  int world_size() const override { return transport_->world_size(); }
  absl::StatusOr<const float*> SumGradients(int64_t step, const float* grad) override;
  absl::StatusOr<CompressedResult> AverageMomentum(int64_t step, const float* m, const float* g,
                                                   float beta1) override;
  absl::StatusOr<CompressedResult> CompressedAverage(int64_t step, const float* x) override;
  absl::Status ResetErrors(int64_t step) override;
  // A one-float sum over the transport.
  absl::StatusOr<bool> AnyOverflow(int64_t step, bool local_overflow) override;
  WorkerCompressor& worker_compressor() override { return compressed_->mutable_worker(); }
  // "worker_error" and "server_error" (this rank's chunk: every worker is a server here).
  absl::StatusOr<ErrorState> SaveErrors() override;
  absl::Status RestoreErrors(const ErrorState& state) override;
  uint64_t bytes_sent() const override { return transport_->bytes_sent(); }
  uint64_t bytes_received() const override { return transport_->bytes_received(); }
  // The warmup's (overlapped too) and the compressed allreduce's buffers.
  uint64_t buffer_bytes() const override {
    return exact_->buffer_bytes() + compressed_->buffer_bytes() + flag_.bytes() +
           overlap_->buffer_bytes();
  }
  // The compressed allreduce's compression and own-chunk aggregation.
  double compress_seconds() const override { return compressed_->compress_seconds(); }
  void set_step_clock(StepClock* clock) override {
    Exchange::set_step_clock(clock);
    compressed_->set_step_clock(clock);
    overlap_->set_step_clock(clock);
  }

  const CompressedAllreduce& compressed() const { return *compressed_; }
  CompressedAllreduce& mutable_compressed() { return *compressed_; }

 private:
  PeerExchange(kernels::Backend* backend, Transport* transport, size_t n,
               const ExactAllreduceOptions& exact);

  kernels::Backend* backend_;
  Transport* transport_;
  std::unique_ptr<ExactAllreduce> exact_;
  std::unique_ptr<CompressedAllreduce> compressed_;
  kernels::Buffer<float> flag_;  // AnyOverflow's one float
  const std::unique_ptr<OverlappedWarmup> overlap_;  // last: its thread stops first
};

}  // namespace onebit

#endif  // ONEBIT_WORKER_EXCHANGE_PEER_EXCHANGE_H_
