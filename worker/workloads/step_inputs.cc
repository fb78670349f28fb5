#include "worker/workloads/step_inputs.h"

#include <cmath>
#include <cstddef>

#include "absl/strings/str_cat.h"

namespace onebit {

absl::Status ValidateStepInputs(int64_t step, const StepInputs& in) {
  if (in.lr.has_value() && (!(*in.lr >= 0) || !std::isfinite(*in.lr))) {
    return absl::InvalidArgumentError(
        absl::StrCat("the learning rate of step ", step, " is ", *in.lr, "; it must be >= 0"));
  }
  if (in.max_grad_norm.has_value() &&
      (!(*in.max_grad_norm >= 0) || !std::isfinite(*in.max_grad_norm))) {
    return absl::InvalidArgumentError(absl::StrCat("the gradient-clipping norm of step ", step,
                                                   " is ", *in.max_grad_norm,
                                                   "; it must be >= 0"));
  }
  if (in.betas.has_value()) {
    const auto [beta1, beta2] = *in.betas;
    if (!(beta1 >= 0 && beta1 < 1 && beta2 >= 0 && beta2 < 1)) {
      return absl::InvalidArgumentError(absl::StrCat("the betas of step ", step, " are (", beta1,
                                                     ", ", beta2, "); each must be in [0, 1)"));
    }
  }
  if (in.grad_scale.has_value() && (!(*in.grad_scale > 0) || !std::isfinite(*in.grad_scale))) {
    return absl::InvalidArgumentError(absl::StrCat("the gradient scale of step ", step, " is ",
                                                   *in.grad_scale,
                                                   "; it must be finite and > 0"));
  }
  if (in.weight_decays.has_value()) {
    const std::vector<double>& decays = *in.weight_decays;
    if (decays.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the weight decays of step ", step,
          " are an empty list; give one per parameter group, or leave them unset"));
    }
    for (size_t i = 0; i < decays.size(); ++i) {
      if (!(decays[i] >= 0) || !std::isfinite(decays[i])) {
        return absl::InvalidArgumentError(absl::StrCat(
            "the weight decay of parameter group ", i, " for step ", step, " is ", decays[i],
            "; it must be >= 0 and finite"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace onebit
