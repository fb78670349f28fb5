// A float64 model of docs/algorithms.md's 1-bit LAMB (and the choices onebit_lamb.h states),
// written from the text for tests, sharing no code with the implementation. All W workers
// live in one object; they share p, m, v and v_fresh.
#ifndef ONEBIT_WORKER_OPTIM_ONEBIT_LAMB_REFERENCE_H_
#define ONEBIT_WORKER_OPTIM_ONEBIT_LAMB_REFERENCE_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "worker/exchange/compressed_allreduce_reference.h"
#include "worker/optim/onebit_adam_reference.h"

namespace onebit {

struct ReferenceLambHyper {
  ReferenceHyper adam;  // lr, betas, eps, weight decay, freeze_step
  double max_coeff = 10.0, min_coeff = 0.01, coeff_beta = 0.9;
  double factor_max = 4.0, factor_min = 0.5, factor_threshold = 0.1;
};

class ReferenceOnebitLamb {
 public:
  // group_offsets: {0, ..., n}; empty: one group.
  ReferenceOnebitLamb(const ReferenceLambHyper& hyper, int workers,
                      const std::vector<float>& initial_params,
                      std::vector<size_t> group_offsets = {},
                      std::vector<float> momentum_mask = {});
  void Step(const std::vector<std::vector<float>>& grads);

  const std::vector<double>& params() const { return p_; }
  const std::vector<double>& coeff_freeze() const { return coeff_freeze_; }
  const std::vector<double>& last_factor() const { return last_factor_; }

 private:
  double Norm(const std::vector<double>& x, size_t k) const;

  ReferenceLambHyper h_;
  int w_;
  int64_t step_ = 0;
  std::vector<size_t> offsets_;
  std::vector<double> p_, m_, v_, v_fresh_, mask_;
  std::vector<double> coeff_freeze_, scaling_, last_factor_;
  bool switched_ = false;
  ReferenceCompressedAllreduce exchange_;
};

}  // namespace onebit

#endif  // ONEBIT_WORKER_OPTIM_ONEBIT_LAMB_REFERENCE_H_
