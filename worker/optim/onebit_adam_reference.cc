#include "worker/optim/onebit_adam_reference.h"

#include <algorithm>
#include <cmath>
#include <utility>

namespace onebit {

std::vector<double> ReferenceClip(const ReferenceHyper& h, std::vector<double> g) {
  if (h.max_grad_norm <= 0) return g;
  double sumsq = 0;
  for (double x : g) sumsq += x * x;
  const double factor = h.max_grad_norm / (std::sqrt(sumsq) + 1e-6);
  if (factor < 1) {
    for (double& x : g) x *= factor;
  }
  return g;
}

std::vector<double> ReferenceMeanGradient(const ReferenceHyper& h,
                                          const std::vector<std::vector<float>>& grads) {
  const int w = static_cast<int>(grads.size());
  std::vector<double> g(grads[0].size(), 0.0);
  for (size_t j = 0; j < g.size(); ++j) {
    for (int i = 0; i < w; ++i) g[j] += grads[i][j];
    g[j] /= w;
  }
  return ReferenceClip(h, std::move(g));
}

namespace {

// Warmup on the exact mean of every worker's gradient (clipped): m and v.
void WarmupMoments(const ReferenceHyper& h, const std::vector<std::vector<float>>& grads,
                   std::vector<double>* m, std::vector<double>* v) {
  const std::vector<double> g = ReferenceMeanGradient(h, grads);
  for (size_t j = 0; j < m->size(); ++j) {
    (*m)[j] = h.beta1 * (*m)[j] + (1 - h.beta1) * g[j];
    (*v)[j] = h.beta2 * (*v)[j] + (1 - h.beta2) * g[j] * g[j];
  }
}

// m *= mask (if any); p -= lr * (clip(m^ / (sqrt(v^) + eps)) + wd * p), the clip on the
// steps after the freeze.
void MaskAndUpdate(const ReferenceHyper& h, int64_t t, const std::vector<double>& mask,
                   const std::vector<double>& v, std::vector<double>* m, std::vector<double>* p) {
  double bc1, bc2;
  ReferenceBiasCorrection(h, t, std::min(t, h.freeze_step), &bc1, &bc2);
  const double clip = t > h.freeze_step ? h.update_clip : 0.0;
  for (size_t j = 0; j < p->size(); ++j) {
    if (!mask.empty()) (*m)[j] *= mask[j];
    double u = ReferenceClipDirection(((*m)[j] / bc1) / (std::sqrt(v[j] / bc2) + h.eps), clip);
    if (h.weight_decay > 0) u += h.weight_decay * (*p)[j];
    (*p)[j] -= h.lr * u;
  }
}

}  // namespace

double ReferenceClipDirection(double u, double clip) {
  if (clip <= 0) return u;
  return u > clip ? clip : u < -clip ? -clip : u;
}

void ReferenceBiasCorrection(const ReferenceHyper& h, int64_t t, int64_t k, double* bc1,
                             double* bc2) {
  *bc1 = h.bias_correction && t >= 1 ? 1 - std::pow(h.beta1, static_cast<double>(t)) : 1.0;
  *bc2 = h.bias_correction && k >= 1 ? 1 - std::pow(h.beta2, static_cast<double>(k)) : 1.0;
}

ReferenceOnebitAdam::ReferenceOnebitAdam(const ReferenceHyper& hyper, int workers,
                                         const std::vector<float>& initial_params,
                                         std::vector<float> momentum_mask)
    : h_(hyper),
      w_(workers),
      p_(initial_params.begin(), initial_params.end()),
      m_(initial_params.size(), 0.0),
      v_(initial_params.size(), 0.0),
      mask_(momentum_mask.begin(), momentum_mask.end()),
      exchange_(workers, initial_params.size()) {}

void ReferenceOnebitAdam::Step(const std::vector<std::vector<float>>& grads) {
  ++step_;
  const size_t n = p_.size();
  if (step_ <= h_.freeze_step) {
    WarmupMoments(h_, grads, &m_, &v_);
    MaskAndUpdate(h_, step_, {}, v_, &m_, &p_);
    return;
  }
  std::vector<std::vector<double>> local(w_, std::vector<double>(n));
  for (int i = 0; i < w_; ++i) {
    const std::vector<double> g = ReferenceClip(h_, {grads[i].begin(), grads[i].end()});
    for (size_t j = 0; j < n; ++j) local[i][j] = h_.beta1 * m_[j] + (1 - h_.beta1) * g[j];
  }
  m_ = w_ == 1 ? local[0] : exchange_.Run(local);
  MaskAndUpdate(h_, step_, mask_, v_, &m_, &p_);
}

ReferenceHierarchicalOnebitAdam::ReferenceHierarchicalOnebitAdam(
    const ReferenceHyper& hyper, int nodes, int local_size,
    const std::vector<float>& initial_params, std::vector<float> momentum_mask)
    : h_(hyper),
      nodes_(nodes),
      local_size_(local_size),
      slice_(ReferencePaddedSize(
          (initial_params.size() + static_cast<size_t>(local_size) - 1) / local_size, nodes)),
      p_(initial_params.begin(), initial_params.end()),
      m_(initial_params.size(), 0.0),
      v_(initial_params.size(), 0.0),
      mask_(momentum_mask.begin(), momentum_mask.end()),
      slices_(local_size, ReferenceCompressedAllreduce(nodes, slice_)) {}

void ReferenceHierarchicalOnebitAdam::Step(const std::vector<std::vector<float>>& grads) {
  ++step_;
  const size_t n = p_.size();
  if (step_ <= h_.freeze_step) {
    WarmupMoments(h_, grads, &m_, &v_);
    MaskAndUpdate(h_, step_, {}, v_, &m_, &p_);
    return;
  }
  // Each node's exact average of its workers' momenta b1*m + (1-b1)*g_i.
  std::vector<std::vector<double>> node_m(nodes_, std::vector<double>(n, 0.0));
  for (int node = 0; node < nodes_; ++node) {
    for (int l = 0; l < local_size_; ++l) {
      const std::vector<float>& g = grads[node * local_size_ + l];
      for (size_t j = 0; j < n; ++j) {
        node_m[node][j] += (h_.beta1 * m_[j] + (1 - h_.beta1) * g[j]) / local_size_;
      }
    }
  }
  if (nodes_ == 1) {
    m_ = node_m[0];
  } else {
    for (int l = 0; l < local_size_; ++l) {  // slice l between the nodes
      const size_t begin = l * slice_;
      std::vector<std::vector<double>> inputs(nodes_, std::vector<double>(slice_, 0.0));
      for (int node = 0; node < nodes_; ++node) {
        for (size_t j = begin; j < n && j < begin + slice_; ++j) {
          inputs[node][j - begin] = node_m[node][j];
        }
      }
      const std::vector<double> averaged = slices_[l].Run(inputs);
      for (size_t j = begin; j < n && j < begin + slice_; ++j) m_[j] = averaged[j - begin];
    }
  }
  MaskAndUpdate(h_, step_, mask_, v_, &m_, &p_);
}

}  // namespace onebit
