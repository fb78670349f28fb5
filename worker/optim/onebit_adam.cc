#include "worker/optim/onebit_adam.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/optim/optim_checks.h"

namespace onebit {
absl::Status OnebitAdam::ValidateOptions(const OnebitAdamOptions& o, size_t n) {
  ONEBIT_RETURN_IF_ERROR(ValidateAdamHyper(o.hyper));
  if (o.freeze_step < 0) {
    return absl::InvalidArgumentError(absl::StrCat("freeze_step must be >= 0, got ", o.freeze_step));
  }
  return ValidateMomentumMask(o.momentum_mask, n);
}

absl::Status OnebitAdam::Init(std::vector<HyperGroup> groups, const float* initial_params) {
  hyper_groups_ = std::move(groups);
  return InitCommon(initial_params);
}

absl::Status OnebitAdam::Step(Gradient grad) {
  ONEBIT_RETURN_IF_ERROR(CheckGradient(grad));
  ONEBIT_RETURN_IF_ERROR(stage() == Stage::kWarmup ? WarmupStep(grad) : CompressionStep(grad));
  ++step_;
  return absl::OkStatus();
}

kernels::AdamHyper OnebitAdam::StepHyper(const HyperGroup& group) const {
  const int64_t t = step_ + 1;
  kernels::AdamHyper h = GroupHyper(options_.hyper, group);
  if (stage() == Stage::kWarmup) h.update_clip = 0.0f;  // plain Adam: its variance is fresh
  if (!options_.bias_correction) return h;
  return BiasCorrectedHyper(h, t, std::min(t, options_.freeze_step));
}

absl::Status OnebitAdam::WarmupStep(Gradient grad) {
  const int w = exchange_->world_size();
  // Exact average: with several workers the full-precision sum of the local gradients,
  // then / W in the kernel. (One worker: float32, CheckGradient.)
  const float* sum = grad.fp32();
  if (w > 1) {
    ScopedStepTime time(exchange_->step_clock(), &exchange_call_seconds_);
    // Sharded: the sum of this worker's state range only.
    ONEBIT_ASSIGN_OR_RETURN(sum, sharded() ? exchange_->SumGradientsOfShard(step_ + 1, grad)
                                           : exchange_->SumGradients(step_ + 1, grad.fp32()));
  }
  ONEBIT_RETURN_IF_ERROR(mask_.Observe(sum));
  // The exact sum's norm in slice order (sliced_reductions.h); sharded, gathered.
  ONEBIT_ASSIGN_OR_RETURN(double clip, ExactSumClipFactor(sum, 1.0 / w));
  for (const HyperGroup& g : StateGroups()) {
    ONEBIT_RETURN_IF_ERROR(backend_->AdamWarmupUpdate(StepHyper(g), sum + g.begin,
                                                      MeanScale(clip, w), m_.data() + g.begin,
                                                      v_.data() + g.begin,
                                                      state_params() + g.begin, g.size()));
  }
  return SyncParams();
}

// The frozen-variance update of every group on the momentum in m_.
absl::Status OnebitAdam::FrozenUpdate() {
  const float* mask = mask_.data();
  for (const HyperGroup& g : StateGroups()) {
    ONEBIT_RETURN_IF_ERROR(backend_->FrozenAdamUpdate(
        StepHyper(g), v_.data() + g.begin, mask != nullptr ? mask + g.begin : nullptr,
        m_.data() + g.begin, state_params() + g.begin, g.size()));
  }
  return SyncParams();
}

absl::Status OnebitAdam::CompressionStep(Gradient local_grad) {
  // Sharded: the exchange scales each segment of the gradient as it sends it, with the
  // bits of Clip's whole copy (gradient_clipper.h), so no copy is made; the gradient may
  // be 16-bit. Otherwise float32 (CheckGradient).
  float g_scale = 1.0f;
  Gradient grad = local_grad;
  if (sharded() && exchange_->world_size() > 1) {
    ONEBIT_ASSIGN_OR_RETURN(g_scale, clip_.ClipScale(local_grad));
  } else {
    ONEBIT_ASSIGN_OR_RETURN(grad, clip_.Clip(local_grad.fp32()));
  }
  ONEBIT_RETURN_IF_ERROR(mask_.Fix());  // the first compression step: the automatic mask
  const float beta1 = options_.hyper.beta1;
  if (exchange_->world_size() == 1) {  // one worker: nothing to exchange
    ONEBIT_RETURN_IF_ERROR(backend_->MomentumUpdate(beta1, grad.fp32(), m_.data(), n_));
    return FrozenUpdate();
  }
  // The local momentum goes straight into the compressor; m is rewritten from the result.
  CompressedResult r;
  {
    ScopedStepTime time(exchange_->step_clock(), &exchange_call_seconds_);
    // Sharded: the blocks of this worker's slice only; decoding is chunk by chunk, so they
    // give the bits the whole result gives there.
    ONEBIT_ASSIGN_OR_RETURN(
        r, sharded()
               ? exchange_->AverageMomentumOfShard(step_ + 1, m_.data(), grad, beta1, g_scale)
               : exchange_->AverageMomentum(step_ + 1, m_.data(), grad.fp32(), beta1));
  }
  // The fused decode takes one set of hyper-parameters (GroupsAlike). It gives the bits of
  // DecodeResult then FrozenUpdate (Codec::fuses_frozen_update).
  if (r.codec != nullptr && r.codec->fuses_frozen_update() && GroupsAlike(hyper_groups_)) {
    ONEBIT_RETURN_IF_ERROR(r.codec->DecodeFrozenAdamUpdate(
        *backend_, r.blocks, r.num_chunks, r.chunk, StepHyper(hyper_groups_[0]), v_.data(),
        mask_.data(), m_.data(), state_params(), state_count_));
    return SyncParams();
  }
  ONEBIT_RETURN_IF_ERROR(DecodeResult(r, *backend_, state_count_, m_.data()));
  return FrozenUpdate();
}

absl::StatusOr<std::vector<float>> OnebitAdam::MomentumToHost() const {
  return m_.SliceToHost(0, state_count_);
}
absl::StatusOr<std::vector<float>> OnebitAdam::VarianceToHost() const {
  return v_.SliceToHost(0, state_count_);
}

}  // namespace onebit
