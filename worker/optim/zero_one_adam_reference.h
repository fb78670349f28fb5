// A float64 model of docs/algorithms.md's 0/1 Adam, written from the text for tests, sharing no
// code with the implementation (its schedule included). All W workers live in one object;
// between sync steps each keeps its own p and m.
#ifndef ONEBIT_WORKER_OPTIM_ZERO_ONE_ADAM_REFERENCE_H_
#define ONEBIT_WORKER_OPTIM_ZERO_ONE_ADAM_REFERENCE_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "worker/exchange/compressed_allreduce_reference.h"
#include "worker/optim/onebit_adam_reference.h"

namespace onebit {

struct ReferenceZeroOneHyper {
  ReferenceHyper adam;  // its freeze_step is unused
  int64_t var_freeze_step = 0;
  int64_t var_update_scaler = 16;
  int64_t local_step_scaler = 32678;
  int64_t local_step_clipper = 16;
};

class ReferenceZeroOneAdam {
 public:
  ReferenceZeroOneAdam(const ReferenceZeroOneHyper& hyper, int workers,
                       const std::vector<float>& initial_params,
                       std::vector<float> momentum_mask = {});
  // grads[i] is worker i's local gradient (n values).
  void Step(const std::vector<std::vector<float>>& grads);

  const std::vector<double>& params(int worker) const { return p_[worker]; }
  const std::vector<double>& momentum(int worker) const { return m_[worker]; }
  const std::vector<double>& variance() const { return v_; }
  int64_t step() const { return step_; }
  // Steps that exchanged something, by kind.
  int64_t variance_steps() const { return variance_steps_; }
  int64_t compressed_steps() const { return compressed_steps_; }
  int64_t sync_steps() const { return sync_steps_; }

 private:
  // CompressedAllreduce over the workers, or the tensor itself with one worker.
  std::vector<double> Compressed(const std::vector<std::vector<double>>& x);
  double Direction(int worker, size_t j) const;

  ReferenceZeroOneHyper h_;
  int w_;
  int64_t step_ = 0;
  int64_t var_interval_ = 1, var_updates_ = 0;
  int64_t local_interval_ = 1, local_steps_ = 0;
  double lrs_ = 0.0;
  double bc1_ = 1.0, bc2_ = 1.0;  // this step's bias correction
  double clip_ = 0.0;              // this step's update clip (none on variance steps)
  int64_t variance_steps_ = 0, compressed_steps_ = 0, sync_steps_ = 0;
  std::vector<std::vector<double>> p_, m_, acc_;  // [worker][n]
  std::vector<double> v_, mask_;
  ReferenceCompressedAllreduce exchange_;
};

}  // namespace onebit

#endif  // ONEBIT_WORKER_OPTIM_ZERO_ONE_ADAM_REFERENCE_H_
