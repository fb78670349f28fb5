// A full-precision allreduce whose result does not depend on the transport: a
// reduce-scatter built from AllToAll (rank r receives chunk r of every rank) and summed
// in rank order, then an AllGather. Each rank moves 2*(W-1)/W of the buffer each way, as
// a ring allreduce does, but the sum order is fixed, so inproc, gloo and NCCL runs give
// the same bits. The warmup stage averages gradients with it.
//
// Thread safety: one thread at a time. Backend and transport are borrowed.
#ifndef ONEBIT_WORKER_EXCHANGE_EXACT_ALLREDUCE_H_
#define ONEBIT_WORKER_EXCHANGE_EXACT_ALLREDUCE_H_

#include <cstddef>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/buffer.h"
#include "kernels/kernels.h"
#include "worker/transport/transport.h"

namespace onebit {

class ExactAllreduce {
 public:
  static absl::StatusOr<std::unique_ptr<ExactAllreduce>> Create(kernels::Backend* backend,
                                                                Transport* transport, size_t n);

  // Sums `in` (n elements, backend memory) over all ranks, in rank order. The sum is at
  // result() until the next call.
  absl::Status Run(const float* in);
  const float* result() const { return gathered_.data(); }

 private:
  ExactAllreduce(kernels::Backend* backend, Transport* transport, size_t n, size_t chunk)
      : backend_(backend), transport_(transport), n_(n), chunk_(chunk) {}

  kernels::Backend* backend_;
  Transport* transport_;
  size_t n_, chunk_;                 // n padded to W*chunk
  kernels::Buffer<float> send_;      // the input, padded with zeros
  kernels::Buffer<float> received_;  // chunk r of every rank, r = this rank
  kernels::Buffer<float> summed_;    // this rank's chunk of the sum
  kernels::Buffer<float> gathered_;  // the whole sum
};

}  // namespace onebit

#endif  // ONEBIT_WORKER_EXCHANGE_EXACT_ALLREDUCE_H_
