#include "worker/optim/zero_one_adam_reference.h"

#include <algorithm>
#include <cmath>

namespace onebit {

ReferenceZeroOneAdam::ReferenceZeroOneAdam(const ReferenceZeroOneHyper& hyper, int workers,
                                           const std::vector<float>& initial_params,
                                           std::vector<float> momentum_mask)
    : h_(hyper),
      w_(workers),
      p_(workers, std::vector<double>(initial_params.begin(), initial_params.end())),
      m_(workers, std::vector<double>(initial_params.size(), 0.0)),
      acc_(workers, std::vector<double>(initial_params.size(), 0.0)),
      v_(initial_params.size(), 0.0),
      mask_(momentum_mask.begin(), momentum_mask.end()),
      exchange_(workers, initial_params.size()) {}

std::vector<double> ReferenceZeroOneAdam::Compressed(const std::vector<std::vector<double>>& x) {
  return w_ == 1 ? x[0] : exchange_.Run(x);
}

// u = clip(m^ / (sqrt(v^) + eps)) (+ wd * p) for worker i, element j, with the step's bias
// correction (bc1_, bc2_); the clip on every step but a variance step (clip_).
double ReferenceZeroOneAdam::Direction(int i, size_t j) const {
  const ReferenceHyper& a = h_.adam;
  double u = ReferenceClipDirection((m_[i][j] / bc1_) / (std::sqrt(v_[j] / bc2_) + a.eps), clip_);
  if (a.weight_decay > 0) u += a.weight_decay * p_[i][j];
  return u;
}

void ReferenceZeroOneAdam::Step(const std::vector<std::vector<float>>& grads) {
  const ReferenceHyper& a = h_.adam;
  const size_t n = v_.size();
  const int64_t t = ++step_;
  const bool variance_step = t <= h_.var_freeze_step && t % var_interval_ == 0;
  ReferenceBiasCorrection(a, t, var_updates_ + (variance_step ? 1 : 0), &bc1_, &bc2_);
  clip_ = variance_step ? 0.0 : a.update_clip;
  if (t <= h_.var_freeze_step) {
    if (variance_step) {  // the variance moves, from the exact average
      ++variance_steps_;
      const std::vector<double> g = ReferenceMeanGradient(a, grads);
      for (size_t j = 0; j < n; ++j) {
        for (int i = 0; i < w_; ++i) m_[i][j] = a.beta1 * m_[i][j] + (1 - a.beta1) * g[j];
        v_[j] = a.beta2 * v_[j] + (1 - a.beta2) * g[j] * g[j];
      }
      if (++var_updates_ % h_.var_update_scaler == 0) var_interval_ *= 2;
    } else {  // only the momentum moves, from the compressed average
      ++compressed_steps_;
      std::vector<std::vector<double>> x(w_);
      for (int i = 0; i < w_; ++i) x[i] = ReferenceClip(a, {grads[i].begin(), grads[i].end()});
      const std::vector<double> g = Compressed(x);
      for (int i = 0; i < w_; ++i) {
        for (size_t j = 0; j < n; ++j) {
          m_[i][j] = a.beta1 * m_[i][j] + (1 - a.beta1) * g[j];
          if (!mask_.empty()) m_[i][j] *= mask_[j];
        }
      }
    }
    for (int i = 0; i < w_; ++i) {
      for (size_t j = 0; j < n; ++j) p_[i][j] -= a.lr * Direction(i, j);
    }
    return;
  }
  if (t == h_.var_freeze_step + 1) exchange_.ResetErrors();
  // A local step on every worker.
  for (int i = 0; i < w_; ++i) {
    const std::vector<double> g = ReferenceClip(a, {grads[i].begin(), grads[i].end()});
    for (size_t j = 0; j < n; ++j) {
      m_[i][j] = a.beta1 * m_[i][j] + (1 - a.beta1) * g[j];
      const double u = Direction(i, j);
      p_[i][j] -= a.lr * u;
      acc_[i][j] -= a.lr * u;
    }
  }
  // The sum of lr' = lr * sqrt(bc2)/bc1 (lr without bias correction): after a sync m is the
  // lr'-weighted mean of the momenta since the last one.
  lrs_ += a.lr * std::sqrt(bc2_) / bc1_;
  // The sync's denominator: sqrt(bc2) * (sqrt(v^) + eps) (sqrt(v) + eps without).
  auto denominator = [&](size_t j) { return std::sqrt(bc2_) * (std::sqrt(v_[j] / bc2_) + a.eps); };
  if (t % local_interval_ == 0) {  // sync
    ++sync_steps_;
    for (int i = 0; i < w_; ++i) {
      for (size_t j = 0; j < n; ++j) {
        p_[i][j] -= acc_[i][j];
        acc_[i][j] *= denominator(j);
      }
    }
    const std::vector<double> avg = Compressed(acc_);
    for (int i = 0; i < w_; ++i) {
      for (size_t j = 0; j < n; ++j) {
        if (lrs_ != 0) {
          m_[i][j] = -avg[j] / lrs_;
          if (!mask_.empty()) m_[i][j] *= mask_[j];
        }
        p_[i][j] += avg[j] / denominator(j);
        acc_[i][j] = 0;
      }
    }
    lrs_ = 0;
  }
  if (++local_steps_ % h_.local_step_scaler == 0) {
    local_interval_ = std::min(2 * local_interval_, h_.local_step_clipper);
  }
}

}  // namespace onebit
