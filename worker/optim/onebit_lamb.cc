#include "worker/optim/onebit_lamb.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/optim/optim_checks.h"
#include "worker/optim/sliced_reductions.h"

namespace onebit {
namespace {

std::string GroupKey(const char* name, size_t k) { return absl::StrCat(name, "/", k); }

}  // namespace

absl::Status OnebitLamb::ValidateOptions(const OnebitLambOptions& o, size_t n) {
  ONEBIT_RETURN_IF_ERROR(ValidateAdamHyper(o.hyper));
  if (o.freeze_step < 0) {
    return absl::InvalidArgumentError(absl::StrCat("freeze_step must be >= 0, got ", o.freeze_step));
  }
  ONEBIT_RETURN_IF_ERROR(ValidateLambCoeffs(o.coeffs));
  if (!o.group_offsets.empty()) {
    const std::vector<size_t>& g = o.group_offsets;
    if (g.size() < 2 || g.front() != 0 || g.back() != n) {
      return absl::InvalidArgumentError(absl::StrCat(
          "parameter groups must run from 0 to ", n, " (", g.size(), " offsets given)"));
    }
    for (size_t i = 1; i < g.size(); ++i) {
      if (g[i] <= g[i - 1]) {
        return absl::InvalidArgumentError(
            absl::StrCat("parameter group ", i - 1, " is empty or reversed: [", g[i - 1], ", ",
                         g[i], ")"));
      }
    }
  }
  return ValidateMomentumMask(o.momentum_mask, n);
}

absl::Status ValidateLambCoeffs(const LambCoeffs& c) {
  const std::pair<const char*, double> all[] = {
      {"max_coeff", c.max_coeff},   {"min_coeff", c.min_coeff},
      {"coeff_beta", c.coeff_beta}, {"factor_max", c.factor_max},
      {"factor_min", c.factor_min}, {"factor_threshold", c.factor_threshold}};
  for (const auto& [name, value] : all) {
    if (!std::isfinite(value)) {
      return absl::InvalidArgumentError(absl::StrCat(name, " must be finite, got ", value));
    }
  }
  if (!(c.min_coeff > 0 && c.min_coeff <= c.max_coeff)) {
    return absl::InvalidArgumentError(absl::StrCat("need 0 < min_coeff <= max_coeff, got ",
                                                   c.min_coeff, " and ", c.max_coeff));
  }
  if (!(c.coeff_beta >= 0 && c.coeff_beta < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("coeff_beta must be in [0, 1), got ", c.coeff_beta));
  }
  if (!(c.factor_min > 0 && c.factor_min <= 1 && c.factor_max >= 1)) {
    return absl::InvalidArgumentError(absl::StrCat("need 0 < factor_min <= 1 <= factor_max, got ",
                                                   c.factor_min, " and ", c.factor_max));
  }
  if (c.factor_threshold < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("factor_threshold must be >= 0, got ", c.factor_threshold));
  }
  return absl::OkStatus();
}

absl::Status OnebitLamb::Init(std::vector<HyperGroup> hyper, const float* initial_params) {
  // Each tensor (LAMB's layer) lies in one hyper-parameter group.
  size_t h = 0;
  for (const Group& t : groups_) {
    while (hyper[h].end <= t.begin) ++h;
    if (t.begin < hyper[h].begin || t.end > hyper[h].end) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor [", t.begin, ", ", t.end, ") straddles parameter groups: group ", h,
          " is [", hyper[h].begin, ", ", hyper[h].end, ")"));
    }
    tensor_hyper_.push_back(h);
  }
  hyper_groups_ = std::move(hyper);
  return InitCommon(initial_params, {{"exp_avg_sq_fresh", &v_fresh_}, {nullptr, &m_last_}, {nullptr, &u_}});
}

OnebitLamb::OnebitLamb(const OnebitLambOptions& options, kernels::Backend* backend,
                       Exchange* exchange, size_t n)
    : OptimizerBase(options, backend, exchange, n) {
  if (options.group_offsets.empty()) {
    groups_.push_back({0, n});
  } else {
    for (size_t i = 1; i < options.group_offsets.size(); ++i) {
      groups_.push_back({options.group_offsets[i - 1], options.group_offsets[i]});
    }
  }
  coeff_freeze_.assign(groups_.size(), 0.0);
  scaling_.assign(groups_.size(), 1.0);
  last_factor_.assign(groups_.size(), 1.0);
}

absl::StatusOr<double> OnebitLamb::Norm(const float* x, const Group& tensor) {
  ONEBIT_ASSIGN_OR_RETURN(
      double sumsq,
      SlicedSumSquares(*backend_, x, {tensor.begin, tensor.end}, exchange_->reduction_stride()));
  return std::sqrt(sumsq);
}

absl::Status OnebitLamb::Step(const float* grad) {
  if (stage() == Stage::kWarmup) {
    ONEBIT_RETURN_IF_ERROR(WarmupStep(grad));
  } else {
    if (!switched_) ONEBIT_RETURN_IF_ERROR(Switch());
    ONEBIT_RETURN_IF_ERROR(CompressionStep(grad));
  }
  ++step_;
  return absl::OkStatus();
}

kernels::AdamHyper OnebitLamb::StepHyper(const HyperGroup& group, double* c) const {
  *c = 1.0;
  kernels::AdamHyper h = GroupHyper(options_.hyper, group);
  h.update_clip = 0.0f;  // LAMB bounds its steps with the trust ratio's coefficients instead
  if (!options_.bias_correction) return h;
  const int64_t t = step_ + 1;
  return BiasCorrectedHyper(h, t, std::min(t, options_.freeze_step), c);
}

absl::Status OnebitLamb::WarmupStep(const float* grad) {
  double scale = 1.0;  // the same for every group
  const kernels::AdamHyper h = StepHyper(hyper_groups_[0], &scale);  // its betas, eps: all's
  const LambCoeffs& c = options_.coeffs;
  const int w = exchange_->world_size();
  const float* g = grad;
  if (w > 1) {
    ScopedStepTime time(exchange_->step_clock(), &exchange_call_seconds_);
    ONEBIT_ASSIGN_OR_RETURN(g, exchange_->SumGradients(step_ + 1, grad));
  }
  ONEBIT_RETURN_IF_ERROR(mask_.Observe(g));
  // The exact sum: its norm in slice order (sliced_reductions.h).
  ONEBIT_ASSIGN_OR_RETURN(double clip,
                          clip_.Factor(g, 1.0 / w, exchange_->reduction_stride()));
  ONEBIT_RETURN_IF_ERROR(
      backend_->AdamMomentsUpdate(h, g, MeanScale(clip, w), m_.data(), v_.data(), n_));
  for (const HyperGroup& hg : hyper_groups_) {  // u with each group's weight decay
    ONEBIT_RETURN_IF_ERROR(backend_->AdamDirectionInto(
        StepHyper(hg, &scale), m_.data() + hg.begin, v_.data() + hg.begin,
        p_.data() + hg.begin, u_.data() + hg.begin, hg.size()));
  }
  for (size_t k = 0; k < groups_.size(); ++k) {
    const Group& gr = groups_[k];
    const float lr = StepHyper(HyperOf(k), &scale).lr;
    ONEBIT_ASSIGN_OR_RETURN(double p_norm, Norm(p_.data(), gr));
    ONEBIT_ASSIGN_OR_RETURN(double u_norm, Norm(u_.data(), gr));
    u_norm *= scale;  // the true direction's
    double trust = 1.0;
    if (p_norm != 0 && u_norm != 0) {
      trust = std::clamp(p_norm / u_norm, c.min_coeff, c.max_coeff);
      coeff_freeze_[k] = c.coeff_beta * coeff_freeze_[k] + (1 - c.coeff_beta) * trust;
    }
    ONEBIT_RETURN_IF_ERROR(backend_->Axpy(static_cast<float>(-lr * trust),
                                          u_.data() + gr.begin, p_.data() + gr.begin,
                                          gr.size()));
  }
  return absl::OkStatus();
}

absl::Status OnebitLamb::Switch() {
  ONEBIT_RETURN_IF_ERROR(mask_.Fix());
  ONEBIT_RETURN_IF_ERROR(backend_->Copy(v_fresh_.data(), v_.data(), n_ * sizeof(float)));
  std::vector<double> rms(groups_.size());
  double total = 0.0;
  for (size_t k = 0; k < groups_.size(); ++k) {
    const Group& gr = groups_[k];
    ONEBIT_ASSIGN_OR_RETURN(double norm, Norm(m_.data(), gr));
    rms[k] = norm / std::sqrt(static_cast<double>(gr.size()));
    total += rms[k];
  }
  const double united = total / static_cast<double>(groups_.size());
  for (size_t k = 0; k < groups_.size(); ++k) {
    scaling_[k] = rms[k] > 0 ? united / rms[k] : 1.0;
    last_factor_[k] = 1.0;
  }
  switched_ = true;
  return absl::OkStatus();
}

absl::Status OnebitLamb::CompressionStep(const float* local_grad) {
  ONEBIT_ASSIGN_OR_RETURN(const float* grad, clip_.Clip(local_grad));
  double scale = 1.0;  // lr*scale*u is the true step: h.lr already has it
  const kernels::AdamHyper h = StepHyper(hyper_groups_[0], &scale);  // its betas, eps: all's
  const LambCoeffs& c = options_.coeffs;
  ONEBIT_RETURN_IF_ERROR(backend_->Copy(m_last_.data(), m_.data(), n_ * sizeof(float)));
  ONEBIT_RETURN_IF_ERROR(backend_->MomentumUpdate(h.beta1, grad, m_.data(), n_));
  if (exchange_->world_size() > 1) {
    for (size_t k = 0; k < groups_.size(); ++k) {
      ONEBIT_RETURN_IF_ERROR(backend_->Scale(static_cast<float>(scaling_[k]),
                                             m_.data() + groups_[k].begin, groups_[k].size()));
    }
    CompressedResult r;
    {
      ScopedStepTime time(exchange_->step_clock(), &exchange_call_seconds_);
      ONEBIT_ASSIGN_OR_RETURN(r, exchange_->CompressedAverage(step_ + 1, m_.data()));
    }
    ONEBIT_RETURN_IF_ERROR(DecodeResult(r, *backend_, n_, m_.data()));
    for (size_t k = 0; k < groups_.size(); ++k) {
      ONEBIT_RETURN_IF_ERROR(backend_->Scale(static_cast<float>(1.0 / scaling_[k]),
                                             m_.data() + groups_[k].begin, groups_[k].size()));
    }
  }
  if (mask_.data() != nullptr) {
    ONEBIT_RETURN_IF_ERROR(backend_->ApplyMask(mask_.data(), m_.data(), n_));
  }
  ONEBIT_RETURN_IF_ERROR(backend_->FreshVarianceUpdate(h.beta1, h.beta2, m_.data(),
                                                       m_last_.data(), v_fresh_.data(), n_));
  // u_pre = m/(sqrt(v)+eps) first, for its norms; the weight decay goes in after.
  kernels::AdamHyper no_decay = h;
  no_decay.weight_decay = 0.0f;
  ONEBIT_RETURN_IF_ERROR(backend_->AdamDirectionInto(no_decay, m_.data(), v_.data(), p_.data(),
                                                     u_.data(), n_));
  for (size_t k = 0; k < groups_.size(); ++k) {
    const Group& gr = groups_[k];
    const kernels::AdamHyper hk = StepHyper(HyperOf(k), &scale);  // its lr and decay
    float* u = u_.data() + gr.begin;
    float* p = p_.data() + gr.begin;
    ONEBIT_ASSIGN_OR_RETURN(double factor,
                            SlicedMaxDenomRatio(*backend_, h.eps, v_.data(), v_fresh_.data(),
                                                {gr.begin, gr.end}, exchange_->reduction_stride()));
    if (hk.weight_decay > 0.0f) {
      ONEBIT_ASSIGN_OR_RETURN(double pre_norm, Norm(u_.data(), gr));
      ONEBIT_RETURN_IF_ERROR(backend_->Axpy(hk.weight_decay, p, u, gr.size()));
      ONEBIT_ASSIGN_OR_RETURN(double norm, Norm(u_.data(), gr));
      const double r = norm > 0 ? std::min(1.0, pre_norm / norm) : 1.0;
      factor = factor * r + (1.0 - r);
    }
    factor = std::clamp(factor, c.factor_min, c.factor_max);
    factor = std::clamp(factor, last_factor_[k] * (1.0 - c.factor_threshold),
                        last_factor_[k] * (1.0 + c.factor_threshold));
    last_factor_[k] = factor;
    ONEBIT_RETURN_IF_ERROR(
        backend_->Axpy(static_cast<float>(-hk.lr * coeff_freeze_[k] * factor), u, p, gr.size()));
  }
  return absl::OkStatus();
}

std::vector<StateSpec> OnebitLamb::TensorStates(int64_t, int64_t) const {
  return {{"params", true}, {"exp_avg", true}, {"exp_avg_sq", true}, {"exp_avg_sq_fresh", true}};
}

StateScalars OnebitLamb::OwnScalars() const {
  StateScalars s;
  s["switched"] = switched_ ? 1.0 : 0.0;
  for (size_t k = 0; k < groups_.size(); ++k) {
    s[GroupKey("coeff_freeze", k)] = coeff_freeze_[k];
    s[GroupKey("scaling_coeff", k)] = scaling_[k];
    s[GroupKey("last_factor", k)] = last_factor_[k];
  }
  return s;
}

absl::StatusOr<OnebitLamb::RestoreCommit> OnebitLamb::ReadScalars(int64_t, int64_t,
                                                                 const StateScalars& scalars) {
  auto scalar = [&](const std::string& key) -> absl::StatusOr<double> {
    const auto it = scalars.find(key);
    if (it == scalars.end()) return absl::InvalidArgumentError(absl::StrCat("the checkpoint has no ", key));
    return it->second;
  };
  std::vector<double> coeff(groups_.size()), scaling(groups_.size()), last(groups_.size());
  for (size_t k = 0; k < groups_.size(); ++k) {
    ONEBIT_ASSIGN_OR_RETURN(coeff[k], scalar(GroupKey("coeff_freeze", k)));
    ONEBIT_ASSIGN_OR_RETURN(scaling[k], scalar(GroupKey("scaling_coeff", k)));
    ONEBIT_ASSIGN_OR_RETURN(last[k], scalar(GroupKey("last_factor", k)));
  }
  ONEBIT_ASSIGN_OR_RETURN(double switched, scalar("switched"));
  if (scalars.count(GroupKey("coeff_freeze", groups_.size())) > 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the checkpoint has more parameter groups than this model's ", groups_.size()));
  }
  return RestoreCommit([this, coeff, scaling, last, switched]() {
    coeff_freeze_ = coeff;
    scaling_ = scaling;
    last_factor_ = last;
    switched_ = switched != 0.0;
    return absl::OkStatus();
  });
}

}  // namespace onebit
