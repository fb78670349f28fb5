// A float64 model of docs/algorithms.md's 1-bit Adam, written from the text for tests, sharing
// no code with the kernels. All W workers live in one object.
#ifndef ONEBIT_WORKER_OPTIM_ONEBIT_ADAM_REFERENCE_H_
#define ONEBIT_WORKER_OPTIM_ONEBIT_ADAM_REFERENCE_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "worker/exchange/compressed_allreduce_reference.h"

namespace onebit {

struct ReferenceHyper {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  int64_t freeze_step = 0;
  // u = (m/bc1) / (sqrt(v/bc2) + eps) (+ wd*p), bc1 = 1 - b1^t, bc2 = 1 - b2^k with k the
  // variance updates so far (none: bc2 = 1).
  bool bias_correction = false;
  // > 0: on the steps whose variance is frozen, u (before the weight decay) is clamped to
  // [-update_clip, update_clip].
  double update_clip = 0.0;
  // Gradient clipping by global norm: g *= max / (||g|| + 1e-6) when that is < 1; 0: off.
  // The exact average where a step averages exactly, else each local gradient.
  double max_grad_norm = 0.0;
};

// The gradient as the optimizer sees it: clipped when max_grad_norm asks for it.
std::vector<double> ReferenceClip(const ReferenceHyper& h, std::vector<double> g);
// The exact mean of the workers' gradients, clipped.
std::vector<double> ReferenceMeanGradient(const ReferenceHyper& h,
                                          const std::vector<std::vector<float>>& grads);

// u clamped to [-clip, clip]; clip <= 0: u.
double ReferenceClipDirection(double u, double clip);

// bc1 and bc2 of step t after k variance updates (1 and 1 without bias correction).
void ReferenceBiasCorrection(const ReferenceHyper& h, int64_t t, int64_t k, double* bc1,
                             double* bc2);

class ReferenceOnebitAdam {
 public:
  ReferenceOnebitAdam(const ReferenceHyper& hyper, int workers,
                      const std::vector<float>& initial_params,
                      std::vector<float> momentum_mask = {});
  // grads[i] is worker i's local gradient (n values).
  void Step(const std::vector<std::vector<float>>& grads);
  // The weight decay of the steps that follow (a schedule).
  void set_weight_decay(double weight_decay) { h_.weight_decay = weight_decay; }

  const std::vector<double>& params() const { return p_; }
  const std::vector<double>& momentum() const { return m_; }
  const std::vector<double>& variance() const { return v_; }
  int64_t step() const { return step_; }

 private:
  ReferenceHyper h_;
  int w_;
  int64_t step_ = 0;
  std::vector<double> p_, m_, v_, mask_;
  ReferenceCompressedAllreduce exchange_;
};

// The hierarchical mode (docs/design.md) in float64: nodes x local_size workers, worker
// w = node * local_size + l. Warmup is the flat model's. In compression every node averages
// its workers' momenta exactly; slice l of the node averages (the tensor padded to
// local_size slices of S = ReferencePaddedSize(ceil(n / local_size), nodes)) goes through
// its own CompressedAllreduce over the nodes, with its own worker and server errors. With
// one node the node average is the momentum, nothing compressed.
class ReferenceHierarchicalOnebitAdam {
 public:
  ReferenceHierarchicalOnebitAdam(const ReferenceHyper& hyper, int nodes, int local_size,
                                  const std::vector<float>& initial_params,
                                  std::vector<float> momentum_mask = {});
  // grads[w] is worker w's local gradient (n values).
  void Step(const std::vector<std::vector<float>>& grads);

  const std::vector<double>& params() const { return p_; }
  const std::vector<double>& momentum() const { return m_; }
  size_t slice() const { return slice_; }

 private:
  ReferenceHyper h_;
  int nodes_, local_size_;
  size_t slice_;
  int64_t step_ = 0;
  std::vector<double> p_, m_, v_, mask_;
  std::vector<ReferenceCompressedAllreduce> slices_;  // one per local rank
};

}  // namespace onebit

#endif  // ONEBIT_WORKER_OPTIM_ONEBIT_ADAM_REFERENCE_H_
