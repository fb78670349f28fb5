// The 1-bit Adam stage machine for one worker (docs/algorithms.md, "1-bit Adam").
//
// Steps are numbered from 1. Steps 1..freeze_step are warmup: plain Adam on the exactly
// averaged gradient (a full-precision allreduce with a fixed summation order, so every
// transport gives the same bits). After step freeze_step the variance is
// frozen and every step exchanges the local momentum with CompressedAllreduce. With one
// worker the exchange is skipped. All state (p, m, v, the error buffers) lives in the
// backend's memory.
//
// Thread safety: one thread at a time. The backend is borrowed and must outlive the
// optimizer.
#ifndef ONEBIT_WORKER_OPTIM_ONEBIT_ADAM_H_
#define ONEBIT_WORKER_OPTIM_ONEBIT_ADAM_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/buffer.h"
#include "kernels/kernels.h"
#include "worker/exchange/exchange.h"
#include "worker/optim/optim_checks.h"
#include "worker/optim/optimizer.h"
#include "worker/optim/optimizer_base.h"

namespace onebit {

// bias_correction: the variance's correction freezes with the variance.
struct OnebitAdamOptions : CommonOptimizerOptions {
  // Last warmup step. 0 compresses from the first step; a value >= the number of steps
  // run never compresses.
  int64_t freeze_step = 100000;
};

class OnebitAdam : public OptimizerBase<OnebitAdam, OnebitAdamOptions,
                                       &OnebitAdamOptions::freeze_step> {
 public:
  // One optimizer step on this worker's local gradient `grad` (backend memory, n
  // elements; it is not modified).
  absl::Status Step(Gradient grad) override;

  // Backend memory, the state range's elements (optimizer.h, state_count()).
  const float* momentum() const { return m_.data(); }

  // Copies of the state range's moments into host memory.
  absl::StatusOr<std::vector<float>> MomentumToHost() const;
  absl::StatusOr<std::vector<float>> VarianceToHost() const;

 private:
  friend OptimizerBase;
  OnebitAdam(const OnebitAdamOptions& options, kernels::Backend* backend, Exchange* exchange,
             size_t n)
      : OptimizerBase(options, backend, exchange, n) {}
  static absl::Status ValidateOptions(const OnebitAdamOptions& o, size_t n);
  absl::Status Init(std::vector<HyperGroup> groups, const float* initial_params);
  absl::Status WarmupStep(Gradient grad);
  absl::Status CompressionStep(Gradient grad);
  absl::Status FrozenUpdate();
  // The next step's hyper-parameters, bias-corrected when asked for.
  // The hyper-parameters of the next step for `group` (bias-corrected if asked for).
  kernels::AdamHyper StepHyper(const HyperGroup& group) const;

};

}  // namespace onebit

#endif  // ONEBIT_WORKER_OPTIM_ONEBIT_ADAM_H_
