// The peer exchange: every worker is also the server of its own chunk. Warmup sums go
// through ExactAllreduce, compressed averages through CompressedAllreduce, both over one
// Transport (in-process, gloo or NCCL).
//
// Thread safety: one thread at a time. Backend and transport are borrowed.
#ifndef ONEBIT_WORKER_EXCHANGE_PEER_EXCHANGE_H_
#define ONEBIT_WORKER_EXCHANGE_PEER_EXCHANGE_H_

#include <memory>

#include "absl/status/statusor.h"
#include "kernels/kernels.h"
#include "worker/exchange/compressed_allreduce.h"
#include "worker/exchange/exact_allreduce.h"
#include "worker/exchange/exchange.h"
#include "worker/transport/transport.h"

namespace onebit {

class PeerExchange : public Exchange {
 public:
  // `exact` configures the warmup's ExactAllreduce (its wire dtype, say).
  static absl::StatusOr<std::unique_ptr<PeerExchange>> Create(
      kernels::Backend* backend, Transport* transport, size_t n,
      const ExactAllreduceOptions& exact = ExactAllreduceOptions());

  int world_size() const override { return transport_->world_size(); }
  absl::StatusOr<const float*> SumGradients(int64_t step, const float* grad) override;
  absl::StatusOr<CompressedResult> AverageMomentum(int64_t step, const float* m, const float* g,
                                                   float beta1) override;
  WorkerCompressor& worker_compressor() override { return compressed_->mutable_worker(); }
  // "worker_error" and "server_error" (this rank's chunk: every worker is a server here).
  absl::StatusOr<ErrorState> SaveErrors() override;
  absl::Status RestoreErrors(const ErrorState& state) override;
  uint64_t bytes_sent() const override { return transport_->bytes_sent(); }
  uint64_t bytes_received() const override { return transport_->bytes_received(); }
  // The compressed allreduce's compression and own-chunk aggregation.
  double compress_seconds() const override { return compressed_->compress_seconds(); }
  void set_step_clock(StepClock* clock) override {
    Exchange::set_step_clock(clock);
    compressed_->set_step_clock(clock);
  }

  const CompressedAllreduce& compressed() const { return *compressed_; }
  CompressedAllreduce& mutable_compressed() { return *compressed_; }

 private:
  explicit PeerExchange(Transport* transport) : transport_(transport) {}

  Transport* transport_;
  std::unique_ptr<ExactAllreduce> exact_;
  std::unique_ptr<CompressedAllreduce> compressed_;
};

}  // namespace onebit

#endif  // ONEBIT_WORKER_EXCHANGE_PEER_EXCHANGE_H_
