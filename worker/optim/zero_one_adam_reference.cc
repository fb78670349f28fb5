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

// u = m / (sqrt(v) + eps) (+ wd * p) for worker i, element j.
double ReferenceZeroOneAdam::Direction(int i, size_t j) const {
  const ReferenceHyper& a = h_.adam;
  double u = m_[i][j] / (std::sqrt(v_[j]) + a.eps);
  if (a.weight_decay > 0) u += a.weight_decay * p_[i][j];
  return u;
}

void ReferenceZeroOneAdam::Step(const std::vector<std::vector<float>>& grads) {
  const ReferenceHyper& a = h_.adam;
  const size_t n = v_.size();
  const int64_t t = ++step_;
  if (t <= h_.var_freeze_step) {
    if (t % var_interval_ == 0) {  // the variance moves, from the exact average
      ++variance_steps_;
      for (size_t j = 0; j < n; ++j) {
        double g = 0;
        for (int i = 0; i < w_; ++i) g += grads[i][j];
        g /= w_;
        for (int i = 0; i < w_; ++i) m_[i][j] = a.beta1 * m_[i][j] + (1 - a.beta1) * g;
        v_[j] = a.beta2 * v_[j] + (1 - a.beta2) * g * g;
      }
      if (++var_updates_ % h_.var_update_scaler == 0) var_interval_ *= 2;
    } else {  // only the momentum moves, from the compressed average
      ++compressed_steps_;
      std::vector<std::vector<double>> x(w_, std::vector<double>(n));
      for (int i = 0; i < w_; ++i) {
        for (size_t j = 0; j < n; ++j) x[i][j] = grads[i][j];
      }
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
    for (size_t j = 0; j < n; ++j) {
      m_[i][j] = a.beta1 * m_[i][j] + (1 - a.beta1) * grads[i][j];
      const double u = Direction(i, j);
      p_[i][j] -= a.lr * u;
      acc_[i][j] -= a.lr * u;
    }
  }
  lrs_ += a.lr;
  if (t % local_interval_ == 0) {  // sync
    ++sync_steps_;
    for (int i = 0; i < w_; ++i) {
      for (size_t j = 0; j < n; ++j) {
        p_[i][j] -= acc_[i][j];
        acc_[i][j] *= std::sqrt(v_[j]) + a.eps;
      }
    }
    const std::vector<double> avg = Compressed(acc_);
    for (int i = 0; i < w_; ++i) {
      for (size_t j = 0; j < n; ++j) {
        if (lrs_ != 0) {
          m_[i][j] = -avg[j] / lrs_;
          if (!mask_.empty()) m_[i][j] *= mask_[j];
        }
        p_[i][j] += avg[j] / (std::sqrt(v_[j]) + a.eps);
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
