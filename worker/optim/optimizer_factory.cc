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

// The part of `options` that every optimizer takes: assigning the spec to it copies just
// that part.
CommonOptimizerOptions& Common(CommonOptimizerOptions& options) { return options; }

// T::Create over the exchange, as an Optimizer.
template <typename T, typename Options>
Built Build(const Options& options, kernels::Backend* backend, Exchange* exchange,
            const float* initial_params, size_t n) {
  ONEBIT_ASSIGN_OR_RETURN(std::unique_ptr<T> optimizer,
                          T::Create(options, backend, exchange, initial_params, n));
  return std::unique_ptr<Optimizer>(std::move(optimizer));
}

// OneBitAdam, and Adam: OnebitAdam that never freezes.
Built BuildOnebitAdam(const OptimizerSpec& spec, kernels::Backend* backend, Exchange* exchange,
                      const float* initial_params, size_t n) {
  OnebitAdamOptions o;
  Common(o) = spec;
  o.freeze_step =
      Traits(spec.kind).compresses ? spec.freeze_step : std::numeric_limits<int64_t>::max();
  return Build<OnebitAdam>(o, backend, exchange, initial_params, n);
}

Built BuildZeroOneAdam(const OptimizerSpec& spec, kernels::Backend* backend, Exchange* exchange,
                       const float* initial_params, size_t n) {
  ZeroOneAdamOptions o;
  Common(o) = spec;
  o.var_freeze_step = spec.freeze_step;
  o.schedule = spec.zero_one;
  return Build<ZeroOneAdam>(o, backend, exchange, initial_params, n);
}

Built BuildOnebitLamb(const OptimizerSpec& spec, kernels::Backend* backend, Exchange* exchange,
                      const float* initial_params, size_t n) {
  OnebitLambOptions o;
  Common(o) = spec;
  o.freeze_step = spec.freeze_step;
  o.coeffs = spec.lamb;
  o.group_offsets = spec.group_offsets;
  return Build<OnebitLamb>(o, backend, exchange, initial_params, n);
}

// The one registration of an optimizer's code: its kind's builder.
struct Builder {
  OptimizerKind kind;
  Built (*build)(const OptimizerSpec&, kernels::Backend*, Exchange*, const float*, size_t);
};
constexpr Builder kBuilders[] = {
    {OptimizerKind::kOneBitAdam, BuildOnebitAdam},
    {OptimizerKind::kZeroOneAdam, BuildZeroOneAdam},
    {OptimizerKind::kOneBitLamb, BuildOnebitLamb},
    {OptimizerKind::kAdam, BuildOnebitAdam},
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
