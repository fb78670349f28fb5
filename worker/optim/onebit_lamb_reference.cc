#include "worker/optim/onebit_lamb_reference.h"

#include <algorithm>
#include <cmath>

namespace onebit {

ReferenceOnebitLamb::ReferenceOnebitLamb(const ReferenceLambHyper& hyper, int workers,
                                         const std::vector<float>& initial_params,
                                         std::vector<size_t> group_offsets,
                                         std::vector<float> momentum_mask)
    : h_(hyper),
      w_(workers),
      offsets_(group_offsets.empty() ? std::vector<size_t>{0, initial_params.size()}
                                     : std::move(group_offsets)),
      p_(initial_params.begin(), initial_params.end()),
      m_(initial_params.size(), 0.0),
      v_(initial_params.size(), 0.0),
      v_fresh_(initial_params.size(), 0.0),
      mask_(momentum_mask.begin(), momentum_mask.end()),
      coeff_freeze_(offsets_.size() - 1, 0.0),
      scaling_(offsets_.size() - 1, 1.0),
      last_factor_(offsets_.size() - 1, 1.0),
      exchange_(workers, initial_params.size()) {}

double ReferenceOnebitLamb::Norm(const std::vector<double>& x, size_t k) const {
  double s = 0;
  for (size_t j = offsets_[k]; j < offsets_[k + 1]; ++j) s += x[j] * x[j];
  return std::sqrt(s);
}

void ReferenceOnebitLamb::Step(const std::vector<std::vector<float>>& grads) {
  const ReferenceHyper& a = h_.adam;
  const size_t n = p_.size();
  const size_t groups = offsets_.size() - 1;
  const int64_t t = ++step_;
  std::vector<double> u(n), u_pre(n);
  double bc1, bc2;
  ReferenceBiasCorrection(a, t, std::min(t, a.freeze_step), &bc1, &bc2);
  if (t <= a.freeze_step) {
    for (size_t j = 0; j < n; ++j) {
      double g = 0;
      for (int i = 0; i < w_; ++i) g += grads[i][j];
      g /= w_;
      m_[j] = a.beta1 * m_[j] + (1 - a.beta1) * g;
      v_[j] = a.beta2 * v_[j] + (1 - a.beta2) * g * g;
      u[j] = (m_[j] / bc1) / (std::sqrt(v_[j] / bc2) + a.eps);
      if (a.weight_decay > 0) u[j] += a.weight_decay * p_[j];
    }
    for (size_t k = 0; k < groups; ++k) {
      const double pn = Norm(p_, k), un = Norm(u, k);
      double c = 1.0;
      if (pn != 0 && un != 0) {
        c = std::min(std::max(pn / un, h_.min_coeff), h_.max_coeff);
        coeff_freeze_[k] = h_.coeff_beta * coeff_freeze_[k] + (1 - h_.coeff_beta) * c;
      }
      for (size_t j = offsets_[k]; j < offsets_[k + 1]; ++j) p_[j] -= a.lr * c * u[j];
    }
    return;
  }
  if (!switched_) {
    v_fresh_ = v_;
    std::vector<double> rms(groups);
    double mean = 0;
    for (size_t k = 0; k < groups; ++k) {
      rms[k] = Norm(m_, k) / std::sqrt(static_cast<double>(offsets_[k + 1] - offsets_[k]));
      mean += rms[k] / groups;
    }
    for (size_t k = 0; k < groups; ++k) scaling_[k] = rms[k] > 0 ? mean / rms[k] : 1.0;
    switched_ = true;
  }
  const std::vector<double> m_last = m_;
  std::vector<std::vector<double>> local(w_, std::vector<double>(n));
  for (int i = 0; i < w_; ++i) {
    for (size_t k = 0; k < groups; ++k) {
      for (size_t j = offsets_[k]; j < offsets_[k + 1]; ++j) {
        local[i][j] = a.beta1 * m_[j] + (1 - a.beta1) * grads[i][j];
        if (w_ > 1) local[i][j] *= scaling_[k];
      }
    }
  }
  if (w_ == 1) {
    m_ = local[0];
  } else {
    m_ = exchange_.Run(local);
    for (size_t k = 0; k < groups; ++k) {
      for (size_t j = offsets_[k]; j < offsets_[k + 1]; ++j) m_[j] /= scaling_[k];
    }
  }
  for (size_t j = 0; j < n; ++j) {
    if (!mask_.empty()) m_[j] *= mask_[j];
    const double g = (m_[j] - a.beta1 * m_last[j]) / (1 - a.beta1);
    v_fresh_[j] = a.beta2 * v_fresh_[j] + (1 - a.beta2) * g * g;
    u_pre[j] = (m_[j] / bc1) / (std::sqrt(v_[j] / bc2) + a.eps);
    u[j] = u_pre[j] + (a.weight_decay > 0 ? a.weight_decay * p_[j] : 0.0);
  }
  for (size_t k = 0; k < groups; ++k) {
    double factor = 0;
    for (size_t j = offsets_[k]; j < offsets_[k + 1]; ++j) {
      factor = std::max(factor, (std::sqrt(v_[j] / bc2) + a.eps) /
                                    (std::sqrt(v_fresh_[j] / bc2) + a.eps));
    }
    if (a.weight_decay > 0) {
      const double un = Norm(u, k);
      const double r = un > 0 ? std::min(1.0, Norm(u_pre, k) / un) : 1.0;
      factor = factor * r + (1 - r);
    }
    factor = std::min(std::max(factor, h_.factor_min), h_.factor_max);
    factor = std::min(std::max(factor, last_factor_[k] * (1 - h_.factor_threshold)),
                      last_factor_[k] * (1 + h_.factor_threshold));
    last_factor_[k] = factor;
    for (size_t j = offsets_[k]; j < offsets_[k + 1]; ++j) {
      p_[j] -= a.lr * coeff_freeze_[k] * factor * u[j];
    }
  }
}

}  // namespace onebit
