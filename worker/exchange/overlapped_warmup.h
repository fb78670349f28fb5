// The warmup sum run bucket by bucket while the gradient is still being computed (as DDP
// does), for every exchange whose warmup is an ExactAllreduce between the workers: peer
// mode, and ps mode with exchange.warmup_over "workers".
//
// Enable(buckets) makes one ExactAllreduce per bucket up front and a thread that runs
// them. The buckets partition [0, n) in the order the gradient becomes final, the same on
// every rank, so every rank calls the transport in the same order. A step is Begin (before
// computing grad), BucketReady per bucket as it becomes final (the exchange thread sums
// it), then Finish (the exchange's SumGradients: the rest run on the caller's thread), or
// End to abandon the step. The rank-order sum is elementwise, so the result has the same
// bits as one ExactAllreduce of the whole buffer, whatever the buckets.
//
// From Begin to the end of Finish/End the exchange thread owns the transport and the
// backend: the computing thread must use neither. An error of a bucket's exchange skips
// the buckets after it and comes back from Finish/End; a vanished peer ends a bucket's
// exchange with the transport's timeout, as it would end a whole-buffer one.
//
// Thread safety: one thread at a time, except BucketReady (any thread, between Begin and
// Finish/End). Backend and transport are borrowed.
#ifndef ONEBIT_WORKER_EXCHANGE_OVERLAPPED_WARMUP_H_
#define ONEBIT_WORKER_EXCHANGE_OVERLAPPED_WARMUP_H_

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/kernels.h"
#include "worker/exchange/exact_allreduce.h"
#include "worker/exchange/step_clock.h"
#include "worker/transport/transport.h"

namespace onebit {

class OverlappedWarmup {
 public:
  // `transport` carries the warmup (every worker); `exact` configures each bucket's
  // ExactAllreduce as the exchange's own warmup is configured.
  OverlappedWarmup(kernels::Backend* backend, Transport* transport, size_t n,
                   const ExactAllreduceOptions& exact);
  ~OverlappedWarmup();  // joins the exchange thread (a bucket in flight ends first)

  // `buckets`: [begin, end) pairs partitioning [0, n) in order of announcement.
  // INVALID_ARGUMENT when they do not; FAILED_PRECONDITION when already enabled.
  absl::Status Enable(const std::vector<std::pair<size_t, size_t>>& buckets);
  bool enabled() const { return state_ != nullptr; }
  int world_size() const { return transport_->world_size(); }

  // Starts an overlapped warmup sum of `grad` (n elements, backend memory) for `step`.
  // FAILED_PRECONDITION when overlap is not enabled or a step is still open.
  absl::Status Begin(int64_t step, const float* grad);
  // grad[begin, end) is final: the next bucket, or the step fails (INTERNAL, naming the
  // bucket expected) and the buckets after it are not exchanged. Ignored when no step is
  // open.
  void BucketReady(size_t begin, size_t end);
  // Waits for the buckets announced so far and closes the open step without a result;
  // returns the first error of its exchange. OK when no step is open.
  absl::Status End();
  // Whether a step is open (Begin without Finish or End yet).
  bool open() const;
  // Closes the open step with its sum (n elements, backend memory, valid until the next
  // Begin): every bucket is final now, so this thread runs, in order, the ones the
  // exchange thread has not started. FAILED_PRECONDITION when `step` and `grad` are not
  // the open step's (which is then ended).
  absl::StatusOr<const float*> Finish(int64_t step, const float* grad);

  // Seconds spent on buckets so far (on the step clock): on the exchange thread, and on
  // the calling thread for those Finish runs itself. Cumulative.
  double busy_seconds() const;
  // The bytes of its buffers (backend memory; 0 until enabled). Not during a step.
  uint64_t buffer_bytes() const;
  void set_step_clock(StepClock* clock) { clock_ = clock; }

 private:
  struct State;
  void Loop();
  absl::Status RunBucket(size_t i, const float* grad, int64_t step);
  void RunNextBucket(std::unique_lock<std::mutex>& lock);
  // Waits for the bucket in flight, runs the buckets before `last` not started yet on this
  // thread, closes the step and returns its first error.
  absl::Status Drain(std::unique_lock<std::mutex>& lock, size_t last);

  kernels::Backend* const backend_;
  Transport* const transport_;
  const size_t n_;
  const ExactAllreduceOptions exact_options_;
  StepClock* clock_ = StepClock::Real();
  std::unique_ptr<State> state_;
};

}  // namespace onebit

#endif  // ONEBIT_WORKER_EXCHANGE_OVERLAPPED_WARMUP_H_
