#include "worker/optim/zero_one_adam.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/optim/optim_checks.h"

namespace onebit {
absl::Status ZeroOneAdam::ValidateOptions(const ZeroOneAdamOptions& o, size_t n) {
  ONEBIT_RETURN_IF_ERROR(ValidateAdamHyper(o.hyper));
  if (o.var_freeze_step < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("var_freeze_step must be >= 0, got ", o.var_freeze_step));
  }
  ONEBIT_RETURN_IF_ERROR(ValidateZeroOneScheduleParams(o.schedule));
  return ValidateMomentumMask(o.momentum_mask, n);
}

absl::Status ZeroOneAdam::Init(std::vector<HyperGroup> groups, const float* initial_params) {
  lrs_.assign(groups.size(), 0.0);
  hyper_groups_ = std::move(groups);
  return InitCommon(initial_params, {{"accumulator", &acc_}, {nullptr, &avg_}, {"anchor", &anchor_}});
}

ZeroOneAdam::ZeroOneAdam(const ZeroOneAdamOptions& options, kernels::Backend* backend,
                         Exchange* exchange, size_t n)
    : OptimizerBase(options, backend, exchange, n), schedule_(options.schedule) {}

absl::Status ZeroOneAdam::Step(Gradient gradient) {
  ONEBIT_RETURN_IF_ERROR(CheckGradient(gradient));  // never sharded: float32 only
  const float* grad = gradient.fp32();
  const int64_t t = step_ + 1;
  const ZeroOneStep kind = next_step_kind();
  if (t > options_.var_freeze_step && !errors_reset_) {
    // Once, before the first local step: the errors held the gradients' compression error.
    ONEBIT_RETURN_IF_ERROR(exchange_->ResetErrors(t));
    errors_reset_ = true;
    ONEBIT_RETURN_IF_ERROR(mask_.Fix());
    // The parameters every worker shares until the first sync.
    ONEBIT_RETURN_IF_ERROR(backend_->Copy(anchor_.data(), p_.data(), n_ * sizeof(float)));
  }
  switch (kind) {
    case ZeroOneStep::kVarianceUpdate:
      ONEBIT_RETURN_IF_ERROR(VarianceUpdate(grad));
      break;
    case ZeroOneStep::kCompressedGradient:
      ONEBIT_RETURN_IF_ERROR(CompressedGradient(grad));
      break;
    case ZeroOneStep::kLocal:
    case ZeroOneStep::kSync:
      ONEBIT_RETURN_IF_ERROR(LocalStep(grad, kind == ZeroOneStep::kSync));
      break;
  }
  schedule_.Advance(options_.var_freeze_step);
  ++step_;
  return absl::OkStatus();
}

absl::Status ZeroOneAdam::SkipStep() {
  // The error reset before the first local step stays due (the next Step does it, with its
  // own step number, which a parameter-server exchange needs for its pushes).
  const ZeroOneStep kind = next_step_kind();
  if (kind == ZeroOneStep::kLocal || kind == ZeroOneStep::kSync) {
    // A step of the window with no update: a sync that is skipped leaves the accumulator
    // to the next sync.
    for (size_t k = 0; k < hyper_groups_.size(); ++k) {
      lrs_[k] += StepHyper(ZeroOneStep::kLocal, hyper_groups_[k]).lr;
    }
  }
  schedule_.Advance(options_.var_freeze_step);
  ++step_;
  return absl::OkStatus();
}

kernels::AdamHyper ZeroOneAdam::StepHyper(ZeroOneStep kind, const HyperGroup& group) const {
  kernels::AdamHyper h = GroupHyper(options_.hyper, group);
  // A variance step is plain Adam on the exact average; every other step's variance is
  // frozen since the last one, and its direction is clipped.
  if (kind == ZeroOneStep::kVarianceUpdate) h.update_clip = 0.0f;
  if (!options_.bias_correction) return h;
  const int64_t updates =
      schedule_.variance_updates() + (kind == ZeroOneStep::kVarianceUpdate ? 1 : 0);
  return BiasCorrectedHyper(h, step_ + 1, updates);
}

absl::Status ZeroOneAdam::VarianceUpdate(const float* grad) {
  const int w = exchange_->world_size();
  const float* sum = grad;
  if (w > 1) {
    ScopedStepTime time(exchange_->step_clock(), &exchange_call_seconds_);
    ONEBIT_ASSIGN_OR_RETURN(sum, exchange_->SumGradients(step_ + 1, grad));
  }
  ONEBIT_RETURN_IF_ERROR(mask_.Observe(sum));  // the exactly averaged steps only
  // The exact sum: its norm in slice order (sliced_reductions.h).
  ONEBIT_ASSIGN_OR_RETURN(double clip,
                          clip_.Factor(sum, 1.0 / w, exchange_->reduction_stride()));
  for (const HyperGroup& g : hyper_groups_) {
    ONEBIT_RETURN_IF_ERROR(backend_->AdamWarmupUpdate(
        StepHyper(ZeroOneStep::kVarianceUpdate, g), sum + g.begin, MeanScale(clip, w),
        m_.data() + g.begin, v_.data() + g.begin, p_.data() + g.begin, g.size()));
  }
  return absl::OkStatus();
}

absl::Status ZeroOneAdam::CompressedGradient(const float* local_grad) {
  ONEBIT_ASSIGN_OR_RETURN(const float* grad, clip_.Clip(local_grad));
  ONEBIT_ASSIGN_OR_RETURN(const float* g, CompressedAverage(grad));
  ONEBIT_RETURN_IF_ERROR(backend_->MomentumUpdate(options_.hyper.beta1, g, m_.data(), n_));
  const float* mask = mask_.data();
  for (const HyperGroup& g : hyper_groups_) {
    ONEBIT_RETURN_IF_ERROR(backend_->FrozenAdamUpdate(
        StepHyper(ZeroOneStep::kCompressedGradient, g), v_.data() + g.begin,
        mask != nullptr ? mask + g.begin : nullptr, m_.data() + g.begin, p_.data() + g.begin,
        g.size()));
  }
  return absl::OkStatus();
}

absl::Status ZeroOneAdam::LocalStep(const float* local_grad, bool sync) {
  ONEBIT_ASSIGN_OR_RETURN(const float* grad, clip_.Clip(local_grad));
  for (size_t k = 0; k < hyper_groups_.size(); ++k) {
    const HyperGroup& g = hyper_groups_[k];
    const kernels::AdamHyper h = StepHyper(ZeroOneStep::kLocal, g);
    ONEBIT_RETURN_IF_ERROR(backend_->ZeroOneLocalUpdate(
        h, grad + g.begin, v_.data() + g.begin, m_.data() + g.begin, p_.data() + g.begin,
        acc_.data() + g.begin, g.size()));
    lrs_[k] += h.lr;
  }
  if (!sync) return absl::OkStatus();
  // eps is every group's (bias correction scales it alike).
  const float eps = StepHyper(ZeroOneStep::kLocal, hyper_groups_[0]).eps;
  ONEBIT_RETURN_IF_ERROR(backend_->ZeroOneSyncPrepare(eps, v_.data(), acc_.data(), n_));
  // With one worker the average is the accumulator itself (SyncApply does not write it).
  ONEBIT_ASSIGN_OR_RETURN(const float* avg, CompressedAverage(acc_.data()));
  const float* mask = mask_.data();
  for (size_t k = 0; k < hyper_groups_.size(); ++k) {
    const HyperGroup& g = hyper_groups_[k];
    ONEBIT_RETURN_IF_ERROR(backend_->ZeroOneSyncApply(
        eps, static_cast<float>(lrs_[k]), v_.data() + g.begin,
        mask != nullptr ? mask + g.begin : nullptr, avg + g.begin, m_.data() + g.begin,
        anchor_.data() + g.begin, p_.data() + g.begin, g.size()));
    lrs_[k] = 0.0;
  }
  return acc_.Zero();
}

absl::StatusOr<const float*> ZeroOneAdam::CompressedAverage(const float* x) {
  if (exchange_->world_size() == 1) return x;
  CompressedResult r;
  {
    ScopedStepTime time(exchange_->step_clock(), &exchange_call_seconds_);
    ONEBIT_ASSIGN_OR_RETURN(r, exchange_->CompressedAverage(step_ + 1, x));
  }
  if (r.codec == nullptr) return r.exact;  // averaged exactly (one node)
  ONEBIT_RETURN_IF_ERROR(DecodeResult(r, *backend_, n_, avg_.data()));
  return avg_.data();
}

std::optional<std::vector<int64_t>> ZeroOneAdam::ExchangeSteps(int64_t first, int64_t last,
                                                               int64_t freeze_step) const {
  std::vector<int64_t> steps;
  ZeroOneSchedule ahead = schedule_;
  for (int64_t t = first; t <= last; ++t) {
    if (ahead.Next(freeze_step) != ZeroOneStep::kLocal) steps.push_back(t);
    ahead.Advance(freeze_step);
  }
  return steps;
}

std::vector<StateSpec> ZeroOneAdam::TensorStates(int64_t step, int64_t var_freeze_step) const {
  if (step <= var_freeze_step) return {{"params", true}, {"exp_avg", true}, {"exp_avg_sq", true}};
  return {{"params", false},
          {"exp_avg", false},
          {"exp_avg_sq", true},
          {"accumulator", false},
          {"anchor", false}};
}

StateScalars ZeroOneAdam::OwnScalars() const {
  // Group 0's sum keeps the name it had before there were groups.
  StateScalars scalars = {{"lr_sum", lrs_[0]}};
  for (size_t k = 1; k < hyper_groups_.size(); ++k) scalars[absl::StrCat("lr_sum.", k)] = lrs_[k];
  return scalars;
}

absl::StatusOr<ZeroOneAdam::RestoreCommit> ZeroOneAdam::ReadScalars(
    int64_t step, int64_t var_freeze_step, const StateScalars& scalars) {
  const bool local = step > var_freeze_step;
  std::vector<double> lrs(hyper_groups_.size(), 0.0);
  if (local) {
    for (size_t k = 0; k < hyper_groups_.size(); ++k) {
      const std::string key = k == 0 ? "lr_sum" : absl::StrCat("lr_sum.", k);
      const auto it = scalars.find(key);
      if (it == scalars.end()) {
        return absl::InvalidArgumentError(absl::StrCat("the checkpoint has no ", key));
      }
      lrs[k] = it->second;
    }
  }
  return RestoreCommit([this, step, var_freeze_step, local, lrs]() -> absl::Status {
    if (!local) ONEBIT_RETURN_IF_ERROR(acc_.Zero());
    lrs_ = lrs;
    errors_reset_ = local;
    schedule_ = ZeroOneSchedule::After(options_.schedule, step, var_freeze_step);
    return absl::OkStatus();
  });
}

}  // namespace onebit
