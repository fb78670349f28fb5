#include "worker/optim/optimizer_factory.h"

#include <limits>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/optim/onebit_adam.h"
#include "worker/optim/zero_one_adam.h"

namespace onebit {

absl::StatusOr<std::unique_ptr<Optimizer>> CreateOptimizer(const OptimizerSpec& spec,
                                                           kernels::Backend* backend,
                                                           Exchange* exchange,
                                                           const float* initial_params, size_t n) {
  if (spec.type == "OneBitAdam" || spec.type == "Adam") {
    OnebitAdamOptions o;
    o.hyper = spec.hyper;
    o.freeze_step =
        spec.type == "Adam" ? std::numeric_limits<int64_t>::max() : spec.freeze_step;
    o.momentum_mask = spec.momentum_mask;
    o.auto_mask_zero_gradients = spec.auto_mask_zero_gradients;
    o.bias_correction = spec.bias_correction;
    o.max_grad_norm = spec.max_grad_norm;
    o.hyper_groups = spec.hyper_groups;
    ONEBIT_ASSIGN_OR_RETURN(std::unique_ptr<OnebitAdam> adam,
                            OnebitAdam::Create(o, backend, exchange, initial_params, n));
    return std::unique_ptr<Optimizer>(std::move(adam));
  }
  if (spec.type == "ZeroOneAdam") {
    ZeroOneAdamOptions o;
    o.hyper = spec.hyper;
    o.var_freeze_step = spec.freeze_step;
    o.schedule = spec.zero_one;
    o.momentum_mask = spec.momentum_mask;
    o.auto_mask_zero_gradients = spec.auto_mask_zero_gradients;
    o.bias_correction = spec.bias_correction;
    o.max_grad_norm = spec.max_grad_norm;
    o.hyper_groups = spec.hyper_groups;
    ONEBIT_ASSIGN_OR_RETURN(std::unique_ptr<ZeroOneAdam> adam,
                            ZeroOneAdam::Create(o, backend, exchange, initial_params, n));
    return std::unique_ptr<Optimizer>(std::move(adam));
  }
  if (spec.type == "OneBitLamb") {
    OnebitLambOptions o;
    o.hyper = spec.hyper;
    o.freeze_step = spec.freeze_step;
    o.coeffs = spec.lamb;
    o.group_offsets = spec.group_offsets;
    o.momentum_mask = spec.momentum_mask;
    o.auto_mask_zero_gradients = spec.auto_mask_zero_gradients;
    o.bias_correction = spec.bias_correction;
    o.max_grad_norm = spec.max_grad_norm;
    o.hyper_groups = spec.hyper_groups;
    ONEBIT_ASSIGN_OR_RETURN(std::unique_ptr<OnebitLamb> lamb,
                            OnebitLamb::Create(o, backend, exchange, initial_params, n));
    return std::unique_ptr<Optimizer>(std::move(lamb));
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown optimizer type \"", spec.type, "\" (OneBitAdam, Adam, ZeroOneAdam, OneBitLamb)"));
}

}  // namespace onebit
