// Makes the optimizer a job config names (config's optimizer.type) over an exchange: one
// builder per OptimizerKind (config/optimizer_kind.h).
#ifndef ONEBIT_WORKER_OPTIM_OPTIMIZER_FACTORY_H_
#define ONEBIT_WORKER_OPTIM_OPTIMIZER_FACTORY_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "config/optimizer_kind.h"
#include "kernels/kernels.h"
#include "worker/exchange/exchange.h"
#include "worker/optim/onebit_lamb.h"
#include "worker/optim/optim_checks.h"
#include "worker/optim/optimizer.h"
#include "worker/optim/optimizer_base.h"
#include "config/zero_one_schedule.h"

namespace onebit {

// The options every optimizer takes (CommonOptimizerOptions), plus each one's own.
struct OptimizerSpec : CommonOptimizerOptions {
  // Adam is OnebitAdam that never freezes: full precision throughout.
  OptimizerKind kind = OptimizerKind::kOneBitAdam;
  // The last warmup step: freeze_step, or ZeroOneAdam's var_freeze_step. Ignored by Adam.
  int64_t freeze_step = 100000;
  ZeroOneScheduleParams zero_one;  // ZeroOneAdam
  LambCoeffs lamb;                 // OneBitLamb
  // OneBitLamb's parameter groups (the model's tensors): boundaries {0, ..., n}; empty:
  // one group.
  std::vector<size_t> group_offsets;
};

// INVALID_ARGUMENT for bad options. The exchange is borrowed.
absl::StatusOr<std::unique_ptr<Optimizer>> CreateOptimizer(const OptimizerSpec& spec,
                                                           kernels::Backend* backend,
                                                           Exchange* exchange,
                                                           const float* initial_params, size_t n);

}  // namespace onebit

#endif  // ONEBIT_WORKER_OPTIM_OPTIMIZER_FACTORY_H_
