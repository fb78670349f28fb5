#include "worker/optim/optimizer_factory.h"

#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/optim/onebit_adam.h"
#include "worker/optim/zero_one_adam.h"

namespace onebit {

namespace {

using Built = absl::StatusOr<std::unique_ptr<Optimizer>>;

// Each optimizer's own options from the spec (the common part is copied before).
void OnebitAdamOwn(const OptimizerSpec& spec, OnebitAdamOptions* o) {
  // Adam is OnebitAdam that never freezes.
  o->freeze_step =
      Traits(spec.kind).compresses ? spec.freeze_step : std::numeric_limits<int64_t>::max();
}
void ZeroOneAdamOwn(const OptimizerSpec& spec, ZeroOneAdamOptions* o) {
  o->var_freeze_step = spec.freeze_step;
  o->schedule = spec.zero_one;
}
void OnebitLambOwn(const OptimizerSpec& spec, OnebitLambOptions* o) {
  o->freeze_step = spec.freeze_step;
  o->coeffs = spec.lamb;
  o->group_offsets = spec.group_offsets;
}

// T::Create over the exchange, as an Optimizer, with the spec's common options and the
// ones kOwn sets.
template <typename T, typename Options, void (*kOwn)(const OptimizerSpec&, Options*)>
Built Build(const OptimizerSpec& spec, kernels::Backend* backend, Exchange* exchange,
            const float* initial_params, size_t n) {
  Options options;
  static_cast<CommonOptimizerOptions&>(options) = spec;
  kOwn(spec, &options);
  ONEBIT_ASSIGN_OR_RETURN(std::unique_ptr<T> optimizer,
                          T::Create(options, backend, exchange, initial_params, n));
  return std::unique_ptr<Optimizer>(std::move(optimizer));
}

// The one registration of an optimizer's code: its kind's builder.
struct Builder {
  OptimizerKind kind;
  Built (*build)(const OptimizerSpec&, kernels::Backend*, Exchange*, const float*, size_t);
};
constexpr Builder kBuilders[] = {
    {OptimizerKind::kOneBitAdam, Build<OnebitAdam, OnebitAdamOptions, OnebitAdamOwn>},
    {OptimizerKind::kZeroOneAdam, Build<ZeroOneAdam, ZeroOneAdamOptions, ZeroOneAdamOwn>},
    {OptimizerKind::kOneBitLamb, Build<OnebitLamb, OnebitLambOptions, OnebitLambOwn>},
    {OptimizerKind::kAdam, Build<OnebitAdam, OnebitAdamOptions, OnebitAdamOwn>},
};

}  // namespace

absl::StatusOr<std::unique_ptr<Optimizer>> CreateOptimizer(const OptimizerSpec& spec,
                                                           kernels::Backend* backend,
                                                           Exchange* exchange,
                                                           const float* initial_params, size_t n) {
  for (const Builder& b : kBuilders) {
    if (b.kind == spec.kind) return b.build(spec, backend, exchange, initial_params, n);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("no builder for optimizer type ", Traits(spec.kind).name));
}

}  // namespace onebit
