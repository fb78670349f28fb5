#include "worker/optim/onebit_lamb.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <utility>
#include <vector>

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

OnebitLamb::Group OnebitLamb::OwnPart(size_t k) const {
  const size_t lo = std::max(groups_[k].begin, state_begin_);
  const size_t hi = std::min(groups_[k].end, state_begin_ + state_count_);
  return lo < hi ? Group{lo - state_begin_, hi - state_begin_} : Group{0, 0};
}

absl::Status OnebitLamb::AddSumSquares(const float* x, size_t k, Reductions* r) {
  ONEBIT_ASSIGN_OR_RETURN(
      const std::vector<double> pieces,
      SumSquaresOfPieces(*backend_, x, state_begin_,
                         StatePieces({groups_[k].begin, groups_[k].end})));
  r->mine.push_back(AddInOrder(pieces));
  r->combine.push_back(&AddInOrder);
  return absl::OkStatus();
}

absl::Status OnebitLamb::AddMaxDenomRatio(float eps, size_t k, Reductions* r) {
  ONEBIT_ASSIGN_OR_RETURN(
      const std::vector<double> pieces,
      MaxDenomRatioOfPieces(*backend_, eps, v_.data(), v_fresh_.data(), state_begin_,
                            StatePieces({groups_[k].begin, groups_[k].end})));
  r->mine.push_back(MaxNanWins(pieces));
  r->combine.push_back(&MaxNanWins);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<double>> OnebitLamb::Gather(Reductions r) {
  ScopedStepTime time(exchange_->step_clock(), &exchange_call_seconds_);
  return CombineInNode(std::move(r.mine), r.combine);
}

absl::Status OnebitLamb::ScaleTensors(float* x, bool inverse) {
  for (size_t k = 0; k < groups_.size(); ++k) {
    const Group own = OwnPart(k);
    if (own.size() == 0) continue;
    const float a = static_cast<float>(inverse ? 1.0 / scaling_[k] : scaling_[k]);
    ONEBIT_RETURN_IF_ERROR(backend_->Scale(a, x + own.begin, own.size()));
  }
  return absl::OkStatus();
}

absl::Status OnebitLamb::Step(Gradient grad) {
  ONEBIT_RETURN_IF_ERROR(CheckGradient(grad));
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

absl::Status OnebitLamb::WarmupStep(Gradient grad) {
  double scale = 1.0;  // the same for every group
  const kernels::AdamHyper h = StepHyper(hyper_groups_[0], &scale);  // its betas, eps: all's
  const LambCoeffs& c = options_.coeffs;
  const int w = exchange_->world_size();
  const float* g = grad.fp32();  // the exact sum of the state range (one worker: float32)
  if (w > 1) {
    ScopedStepTime time(exchange_->step_clock(), &exchange_call_seconds_);
    ONEBIT_ASSIGN_OR_RETURN(g, sharded() ? exchange_->SumGradientsOfShard(step_ + 1, grad)
                                         : exchange_->SumGradients(step_ + 1, grad.fp32()));
  }
  ONEBIT_RETURN_IF_ERROR(mask_.Observe(g));
  // The exact sum's norm in slice order (sliced_reductions.h); sharded, gathered.
  ONEBIT_ASSIGN_OR_RETURN(double clip, ExactSumClipFactor(g, 1.0 / w));
  ONEBIT_RETURN_IF_ERROR(backend_->AdamMomentsUpdate(h, g, MeanScale(clip, w), m_.data(),
                                                     v_.data(), state_count_));
  for (const HyperGroup& hg : StateGroups()) {  // u with each group's weight decay
    ONEBIT_RETURN_IF_ERROR(backend_->AdamDirectionInto(
        StepHyper(hg, &scale), m_.data() + hg.begin, v_.data() + hg.begin,
        state_params() + hg.begin, u_.data() + hg.begin, hg.size()));
  }
  // ||p_k|| (before the update) and ||u_k|| of every tensor, in one gather. Each tensor's
  // update below reads only its own p.
  const size_t tensors = groups_.size();
  Reductions r;
  for (const float* x : {state_params(), u_.data()}) {
    for (size_t k = 0; k < tensors; ++k) ONEBIT_RETURN_IF_ERROR(AddSumSquares(x, k, &r));
  }
  ONEBIT_ASSIGN_OR_RETURN(const std::vector<double> sumsq, Gather(std::move(r)));
  for (size_t k = 0; k < tensors; ++k) {
    const float lr = StepHyper(HyperOf(k), &scale).lr;
    const double p_norm = std::sqrt(sumsq[k]);
    const double u_norm = std::sqrt(sumsq[tensors + k]) * scale;  // the true direction's
    double trust = 1.0;
    if (p_norm != 0 && u_norm != 0) {
      trust = std::clamp(p_norm / u_norm, c.min_coeff, c.max_coeff);
      coeff_freeze_[k] = c.coeff_beta * coeff_freeze_[k] + (1 - c.coeff_beta) * trust;
    }
    const Group own = OwnPart(k);
    if (own.size() == 0) continue;
    ONEBIT_RETURN_IF_ERROR(backend_->Axpy(static_cast<float>(-lr * trust), u_.data() + own.begin,
                                          state_params() + own.begin, own.size()));
  }
  return SyncParams();
}

absl::Status OnebitLamb::Switch() {
  ONEBIT_RETURN_IF_ERROR(mask_.Fix());
  ONEBIT_RETURN_IF_ERROR(
      backend_->Copy(v_fresh_.data(), v_.data(), state_count_ * sizeof(float)));
  Reductions r;
  for (size_t k = 0; k < groups_.size(); ++k) {
    ONEBIT_RETURN_IF_ERROR(AddSumSquares(m_.data(), k, &r));
  }
  ONEBIT_ASSIGN_OR_RETURN(const std::vector<double> sumsq, Gather(std::move(r)));
  std::vector<double> rms(groups_.size());
  double total = 0.0;
  for (size_t k = 0; k < groups_.size(); ++k) {
    rms[k] = std::sqrt(sumsq[k]) / std::sqrt(static_cast<double>(groups_[k].size()));
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

absl::StatusOr<CompressedResult> OnebitLamb::ShardedMomentumAverage(float beta1,
                                                                    Gradient grad) {
  // The clip as the rows are packed (ShardRows' scale): the bits of Clip's whole copy,
  // without it.
  ONEBIT_ASSIGN_OR_RETURN(const float g_scale, clip_.ClipScale(grad));
  float* rows = nullptr;
  {
    ScopedStepTime time(exchange_->step_clock(), &exchange_call_seconds_);
    ONEBIT_ASSIGN_OR_RETURN(rows, exchange_->ShardRows(step_ + 1, grad, g_scale));
  }
  // Row j is local worker j's gradient over this slice; it becomes the slice of that
  // worker's scaled momentum m_j = fma(b1, m, (1-b1)*g_j) * scaling, element by element
  // the floats worker j forms unsharded. Past the parameters the rows stay zero.
  if (state_count_ > 0) {
    for (size_t j = 0; j < shard_pieces_; ++j) {
      float* row = rows + j * state_alloc_;  // the slices' stride
      ONEBIT_RETURN_IF_ERROR(backend_->Copy(u_.data(), m_.data(), state_count_ * sizeof(float)));
      ONEBIT_RETURN_IF_ERROR(backend_->MomentumUpdate(beta1, row, u_.data(), state_count_));
      ONEBIT_RETURN_IF_ERROR(ScaleTensors(u_.data(), /*inverse=*/false));
      ONEBIT_RETURN_IF_ERROR(backend_->Copy(row, u_.data(), state_count_ * sizeof(float)));
    }
  }
  ScopedStepTime time(exchange_->step_clock(), &exchange_call_seconds_);
  return exchange_->CompressedAverageOfRows(step_ + 1);
}

absl::Status OnebitLamb::CompressionStep(Gradient local_grad) {
  double scale = 1.0;  // lr*scale*u is the true step: h.lr already has it
  const kernels::AdamHyper h = StepHyper(hyper_groups_[0], &scale);  // its betas, eps: all's
  const LambCoeffs& c = options_.coeffs;
  const size_t count = state_count_;
  ONEBIT_RETURN_IF_ERROR(backend_->Copy(m_last_.data(), m_.data(), count * sizeof(float)));
  if (exchange_->world_size() > 1) {
    CompressedResult r;
    if (sharded()) {
      ONEBIT_ASSIGN_OR_RETURN(r, ShardedMomentumAverage(h.beta1, local_grad));
    } else {
      ONEBIT_ASSIGN_OR_RETURN(const float* grad, clip_.Clip(local_grad.fp32()));  // whole, own
      ONEBIT_RETURN_IF_ERROR(backend_->MomentumUpdate(h.beta1, grad, m_.data(), n_));
      ONEBIT_RETURN_IF_ERROR(ScaleTensors(m_.data(), /*inverse=*/false));
      ScopedStepTime time(exchange_->step_clock(), &exchange_call_seconds_);
      ONEBIT_ASSIGN_OR_RETURN(r, exchange_->CompressedAverage(step_ + 1, m_.data()));
    }
    ONEBIT_RETURN_IF_ERROR(DecodeResult(r, *backend_, count, m_.data()));
    ONEBIT_RETURN_IF_ERROR(ScaleTensors(m_.data(), /*inverse=*/true));
  } else {
    ONEBIT_ASSIGN_OR_RETURN(const float* grad, clip_.Clip(local_grad.fp32()));
    ONEBIT_RETURN_IF_ERROR(backend_->MomentumUpdate(h.beta1, grad, m_.data(), n_));
  }
  if (mask_.data() != nullptr) {
    ONEBIT_RETURN_IF_ERROR(backend_->ApplyMask(mask_.data(), m_.data(), count));
  }
  ONEBIT_RETURN_IF_ERROR(backend_->FreshVarianceUpdate(h.beta1, h.beta2, m_.data(),
                                                       m_last_.data(), v_fresh_.data(), count));
  // u_pre = m/(sqrt(v)+eps) first, for its norms; the weight decay goes in after.
  kernels::AdamHyper no_decay = h;
  no_decay.weight_decay = 0.0f;
  ONEBIT_RETURN_IF_ERROR(backend_->AdamDirectionInto(no_decay, m_.data(), v_.data(),
                                                     state_params(), u_.data(), count));
  // Per tensor: the ratio's max; with weight decay ||u_pre_k||, then u_k += wd*p_k, then
  // ||u_k||. All of them in one gather: each tensor's decay reads only its own p.
  const size_t tensors = groups_.size();
  std::vector<kernels::AdamHyper> hk(tensors);
  Reductions reductions;
  for (size_t k = 0; k < tensors; ++k) {
    hk[k] = StepHyper(HyperOf(k), &scale);  // its lr and decay
    ONEBIT_RETURN_IF_ERROR(AddMaxDenomRatio(h.eps, k, &reductions));
    if (hk[k].weight_decay > 0.0f) {
      ONEBIT_RETURN_IF_ERROR(AddSumSquares(u_.data(), k, &reductions));
      const Group own = OwnPart(k);
      if (own.size() > 0) {
        ONEBIT_RETURN_IF_ERROR(backend_->Axpy(hk[k].weight_decay, state_params() + own.begin,
                                              u_.data() + own.begin, own.size()));
      }
      ONEBIT_RETURN_IF_ERROR(AddSumSquares(u_.data(), k, &reductions));
    }
  }
  ONEBIT_ASSIGN_OR_RETURN(const std::vector<double> reduced, Gather(std::move(reductions)));
  size_t at = 0;
  for (size_t k = 0; k < tensors; ++k) {
    double factor = reduced[at++];
    if (hk[k].weight_decay > 0.0f) {
      const double pre_norm = std::sqrt(reduced[at++]);
      const double norm = std::sqrt(reduced[at++]);
      const double r = norm > 0 ? std::min(1.0, pre_norm / norm) : 1.0;
      factor = factor * r + (1.0 - r);
    }
    factor = std::clamp(factor, c.factor_min, c.factor_max);
    factor = std::clamp(factor, last_factor_[k] * (1.0 - c.factor_threshold),
                        last_factor_[k] * (1.0 + c.factor_threshold));
    last_factor_[k] = factor;
    const Group own = OwnPart(k);
    if (own.size() == 0) continue;
    ONEBIT_RETURN_IF_ERROR(
        backend_->Axpy(static_cast<float>(-hk[k].lr * coeff_freeze_[k] * factor),
                       u_.data() + own.begin, state_params() + own.begin, own.size()));
  }
  return SyncParams();
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
