// fp16's loss scaling (the job config's fp16 block, DeepSpeed's semantics): the loss is
// multiplied by a scale before the backward pass so that small gradients survive fp16,
// and the gradient is divided by it again before the optimizer sees it. A step whose
// gradient overflowed (inf or NaN anywhere, on any worker) is skipped by every worker,
// and the scale adapts:
//
//   DYNAMIC (loss_scale 0): starts at 2^initial_scale_power.
//     overflow:     with hysteresis h, the first h-1 overflows (since the scale last
//                   changed, or in a row with consecutive_hysteresis) only use up the
//                   hysteresis; the h-th halves the scale, never below min_loss_scale.
//     no overflow:  after loss_scale_window steps without an overflow (counted from the
//                   last overflow, or from the start) the scale doubles and the hysteresis
//                   is restored; with consecutive_hysteresis every good step restores it.
//   STATIC (loss_scale > 0): that scale always; overflowing steps are still skipped.
//
// The scaler is a pure function of the sequence of Update calls, so workers that see the
// same overflow decisions (agreed through the exchange) hold the same scale.
//
// Thread safety: one thread at a time.
#ifndef ONEBIT_WORKER_OPTIM_LOSS_SCALER_H_
#define ONEBIT_WORKER_OPTIM_LOSS_SCALER_H_

#include <cstdint>

#include "absl/status/statusor.h"

namespace onebit {

struct LossScalerOptions {
  double loss_scale = 0;         // 0: dynamic; > 0: static
  int initial_scale_power = 16;  // dynamic: 2^this to start with
  int loss_scale_window = 1000;  // dynamic: good steps before the scale doubles
  int hysteresis = 2;            // dynamic: overflows before the scale halves (>= 1)
  bool consecutive_hysteresis = false;
  double min_loss_scale = 1;
};

// The scaler's whole state, for checkpoints.
struct LossScalerState {
  double scale = 1;
  int hysteresis_left = 1;
  int64_t updates = 0;              // Update calls so far
  int64_t last_overflow = -1;       // the Update index of the last overflow; -1: none
  int64_t overflows = 0;            // skipped steps so far
};

class LossScaler {
 public:
  // INVALID_ARGUMENT naming the field: loss_scale < 0 or not finite, initial_scale_power
  // outside [0, 126], loss_scale_window < 1, hysteresis < 1, min_loss_scale not in
  // (0, 2^126] or above the initial scale.
  static absl::StatusOr<LossScaler> Create(const LossScalerOptions& options);

  // The scale of the next step.
  double scale() const { return state_.scale; }
  bool dynamic() const { return options_.loss_scale == 0; }
  // After a step: `overflow` says whether it was skipped.
  void Update(bool overflow);

  const LossScalerState& state() const { return state_; }
  // INVALID_ARGUMENT for a state no Update sequence gives (a scale <= 0 or not finite,
  // hysteresis_left outside [1, hysteresis], negative counters).
  absl::Status Restore(const LossScalerState& state);

 private:
  explicit LossScaler(const LossScalerOptions& options);
  LossScalerOptions options_;
  LossScalerState state_;
};

}  // namespace onebit

#endif  // ONEBIT_WORKER_OPTIM_LOSS_SCALER_H_
