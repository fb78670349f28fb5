// The peer exchange: every worker is also the server of its own chunk. Warmup sums go
// through ExactAllreduce, compressed averages through CompressedAllreduce, both over one
// Transport (in-process, gloo or NCCL).
//
// OVERLAP (issue 7). The warmup sum can also run bucket by bucket while the gradient is
// still being computed (what DDP does). EnableOverlap(buckets) makes one ExactAllreduce
// per bucket up front (the buckets: a partition of [0, n) in the order the gradient
// becomes final, the same on every rank, so that every rank calls the transport in the
// same order) and a thread that runs them. A step then goes:
//   BeginOverlap(step, grad)        the computing thread, before computing grad
//   BucketReady(begin, end) ...     the computing thread, as each bucket of grad is final
//                                   (in the buckets' order); the exchange thread sums it
//   SumGradients(step, grad)        waits for the bucket in flight, runs the ones not
//                                   started yet itself (no hand-off to the exchange thread
//                                   and back), returns the whole sum
// (or EndOverlap() instead, to abandon the step when computing failed). The rank-order
// sum is elementwise, so the result has the same bits as one ExactAllreduce of the whole
// buffer, whatever the buckets. From BeginOverlap to the end of SumGradients/EndOverlap
// the exchange thread owns the transport and the backend: the computing thread must use
// neither (a workload that announces buckets does not use the backend while computing).
// An error of a bucket's exchange skips the buckets after it and comes back from
// SumGradients/EndOverlap; a vanished peer ends the bucket's exchange with the
// transport's timeout, as it would end a whole-buffer one.
//
// Thread safety: one thread at a time, except BucketReady (any thread, between
// BeginOverlap and SumGradients/EndOverlap). Backend and transport are borrowed.
#ifndef ONEBIT_WORKER_EXCHANGE_PEER_EXCHANGE_H_
#define ONEBIT_WORKER_EXCHANGE_PEER_EXCHANGE_H_

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/buffer.h"
#include "kernels/kernels.h"
#include "worker/exchange/compressed_allreduce.h"
#include "worker/exchange/exact_allreduce.h"
#include "worker/exchange/exchange.h"
#include "worker/transport/transport.h"

namespace onebit {

class PeerExchange : public Exchange {
 public:
  // `exact` configures the warmup's ExactAllreduce (its wire dtype, say); `compressor` is
  // the compressed exchange's format (job config exchange.compressor; every rank the same).
  static absl::StatusOr<std::unique_ptr<PeerExchange>> Create(
      kernels::Backend* backend, Transport* transport, size_t n,
      const ExactAllreduceOptions& exact = ExactAllreduceOptions(),
      kernels::Compressor compressor = kernels::Compressor::kOnebit);
  ~PeerExchange() override;

  // OVERLAP (see the header comment). `buckets`: [begin, end) pairs partitioning [0, n) in
  // order of announcement. INVALID_ARGUMENT when they do not; FAILED_PRECONDITION when
  // already enabled.
  absl::Status EnableOverlap(const std::vector<std::pair<size_t, size_t>>& buckets);
  bool overlap_enabled() const { return overlap_ != nullptr; }
  // Starts an overlapped warmup sum of `grad` (n elements, backend memory) for `step`.
  // FAILED_PRECONDITION when overlap is not enabled or a step is still open.
  absl::Status BeginOverlap(int64_t step, const float* grad);
  // grad[begin, end) is final: the next bucket, or the step fails (INTERNAL, naming the
  // bucket expected) and the buckets after it are not exchanged. Ignored when no step is
  // open.
  void BucketReady(size_t begin, size_t end);
  // Waits for the buckets announced so far and closes the open step without a result;
  // returns the first error of its exchange. OK when no step is open.
  absl::Status EndOverlap();
  // Seconds spent on buckets so far (on step_clock()): on the exchange thread, and on the
  // calling thread for those SumGradients runs itself. Cumulative.
  double overlap_busy_seconds() const;

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
  // The compressed allreduce's compression and own-chunk aggregation.
  double compress_seconds() const override { return compressed_->compress_seconds(); }
  void set_step_clock(StepClock* clock) override {
    Exchange::set_step_clock(clock);
    compressed_->set_step_clock(clock);
  }

  const CompressedAllreduce& compressed() const { return *compressed_; }
  CompressedAllreduce& mutable_compressed() { return *compressed_; }

 private:
  PeerExchange(kernels::Backend* backend, Transport* transport, size_t n,
               const ExactAllreduceOptions& exact);

  struct Overlap;
  void OverlapLoop();
  absl::Status RunBucket(size_t i, const float* grad, int64_t step);
  void RunNextBucket(std::unique_lock<std::mutex>& lock);
  // Waits for the bucket in flight, runs the buckets before `last` not started yet on this
  // thread, closes the step and returns its first error.
  absl::Status Drain(std::unique_lock<std::mutex>& lock, size_t last);

  kernels::Backend* backend_;
  Transport* transport_;
  const size_t n_;
  const ExactAllreduceOptions exact_options_;
  std::unique_ptr<Overlap> overlap_;
  std::unique_ptr<ExactAllreduce> exact_;
  std::unique_ptr<CompressedAllreduce> compressed_;
  kernels::Buffer<float> decoded_;  // int8: the decoded result (CompressedResult::momentum)
  kernels::Buffer<float> flag_;     // AnyOverflow's one float
};

}  // namespace onebit

#endif  // ONEBIT_WORKER_EXCHANGE_PEER_EXCHANGE_H_
