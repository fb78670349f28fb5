// What a training script sets for one of its steps, handed over with the step's gradient
// (ExternalWorkload::Supply) and read by the trainer (Workload::ScriptInputs). A field left
// unset (nullopt) means the script sets nothing there: the job's schedule or fixed value
// applies.
#ifndef ONEBIT_WORKER_WORKLOADS_STEP_INPUTS_H_
#define ONEBIT_WORKER_WORKLOADS_STEP_INPUTS_H_

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "absl/status/status.h"

namespace onebit {

struct StepInputs {
  // The step's loss (a script that hands none: the progress line leaves it out).
  std::optional<double> loss;
  // The learning rate its own scheduler gives the step (a torch lr_scheduler's); >= 0.
  std::optional<double> lr;
  // The norm its clip_grad_norm_ asked for; >= 0 (0: no clipping).
  std::optional<double> max_grad_norm;
  // The factor its own loss scaler (torch's GradScaler) multiplied the gradient by (1:
  // already divided out); finite and > 0. Unset: the workers do not agree on overflows.
  std::optional<double> grad_scale;
  // (beta1, beta2) from its momentum schedule (OneCycleLR's cycling); each in [0, 1).
  std::optional<std::pair<double, double>> betas;
  // Each parameter group's weight decay, in group order, from its weight-decay schedule;
  // not empty, each >= 0 and finite. Unset: the decays the optimizer was built with.
  std::optional<std::vector<double>> weight_decays;
};

// OK when every field that is set is in its range above; else INVALID_ARGUMENT naming step
// `step`, the field and its value. The loss is not checked: a non-finite loss is the
// trainer's to report (the run diverged).
absl::Status ValidateStepInputs(int64_t step, const StepInputs& inputs);

}  // namespace onebit

#endif  // ONEBIT_WORKER_WORKLOADS_STEP_INPUTS_H_
