// 1-bit LAMB for one worker (Li et al., 2022). Steps are numbered from 1, as 1-bit Adam's;
// the per-tensor quantities are per parameter group (the model's tensors: a partition of
// [0, n) into ranges, given by the workload). docs/algorithms.md, "1-bit LAMB", is the math
// of the warmup, the switch and the compression stage this implements; its scalars are
// computed on the host in float64 from Backend::SumSquares and applied as float32. Each
// tensor's norms are cut at the exchange's reduction_stride() and added in slice order
// (sliced_reductions.h), so a worker holding one slice can assemble the same bits.
//
// Thread safety: one thread at a time. The backend and exchange are borrowed.
#ifndef ONEBIT_WORKER_OPTIM_ONEBIT_LAMB_H_
#define ONEBIT_WORKER_OPTIM_ONEBIT_LAMB_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/buffer.h"
#include "kernels/kernels.h"
#include "worker/exchange/exchange.h"
#include "worker/optim/optim_checks.h"
#include "worker/optim/optimizer.h"
#include "worker/optim/optimizer_base.h"

namespace onebit {

struct LambCoeffs {
  double max_coeff = 10.0;
  double min_coeff = 0.01;
  double coeff_beta = 0.9;
  double factor_max = 4.0;
  double factor_min = 0.5;
  double factor_threshold = 0.1;
};

// INVALID_ARGUMENT naming the value unless 0 < min_coeff <= max_coeff, coeff_beta in
// [0, 1), 0 < factor_min <= 1 <= factor_max, factor_threshold >= 0, all finite.
absl::Status ValidateLambCoeffs(const LambCoeffs& c);

// bias_correction corrects the direction u (the variance's correction freezes with the
// variance); the trust ratios and factors see the corrected u. Each of hyper_groups is a
// union of whole tensors (group_offsets' groups).
struct OnebitLambOptions : CommonOptimizerOptions {
  int64_t freeze_step = 100000;
  LambCoeffs coeffs;
  // The groups' boundaries {0, e_1, ..., n}, increasing; empty: one group of everything.
  std::vector<size_t> group_offsets;
};

// SkipStep: a skipped first compression step leaves the switch to the next one, since
// nothing it reads has moved.
class OnebitLamb : public OptimizerBase<OnebitLamb, OnebitLambOptions,
                                        &OnebitLambOptions::freeze_step> {
 public:
  absl::Status Step(const float* grad) override;
  size_t num_groups() const { return groups_.size(); }
  // Per group: the running average of the trust ratio, the scaling coefficient (1 until
  // the switch), the last factor.
  const std::vector<double>& coeff_freeze() const { return coeff_freeze_; }
  const std::vector<double>& scaling_coeff() const { return scaling_; }
  const std::vector<double>& last_factor() const { return last_factor_; }


 private:
  struct Group {
    size_t begin, end;
    size_t size() const { return end - begin; }
  };
  friend OptimizerBase;
  static constexpr const char* kCannotShard =
      "1-bit LAMB does not shard its state yet (onebit.exchange.shard_state, issue 47); use "
      "OneBitAdam, or shard_state false";
  OnebitLamb(const OnebitLambOptions& options, kernels::Backend* backend, Exchange* exchange,
             size_t n);
  static absl::Status ValidateOptions(const OnebitLambOptions& o, size_t n);
  // Also checks that each tensor lies in one of `hyper_groups`.
  absl::Status Init(std::vector<HyperGroup> hyper_groups, const float* initial_params);
  absl::Status WarmupStep(const float* grad);
  absl::Status Switch();
  absl::Status CompressionStep(const float* grad);
  // ||x over tensor||, x a whole buffer: cut at the exchange's reduction_stride() and
  // added in slice order (sliced_reductions.h).
  absl::StatusOr<double> Norm(const float* x, const Group& tensor);
  // The step's hyper-parameters for the kernels and c, the factor from their direction to
  // the true one (1 without bias correction).
  kernels::AdamHyper StepHyper(const HyperGroup& group, double* c) const;
  // Tensor k's hyper-parameter group.
  const HyperGroup& HyperOf(size_t k) const { return hyper_groups_[tensor_hyper_[k]]; }
  // Checkpoints: "params", "exp_avg", "exp_avg_sq", "exp_avg_sq_fresh" (all shared); the
  // scalars "coeff_freeze/K", "scaling_coeff/K", "last_factor/K" per group K and
  // "switched" (1 once the switch ran).
  std::vector<StateSpec> TensorStates(int64_t step, int64_t freeze_step) const;
  StateScalars OwnScalars() const;
  absl::StatusOr<RestoreCommit> ReadScalars(int64_t step, int64_t freeze_step,
                                            const StateScalars& scalars);

  std::vector<Group> groups_;              // the tensors
  std::vector<size_t> tensor_hyper_;       // tensor k's index into hyper_groups_
  bool switched_ = false;
  std::vector<double> coeff_freeze_, scaling_, last_factor_;
  kernels::Buffer<float> v_fresh_, m_last_, u_;
};

}  // namespace onebit

#endif  // ONEBIT_WORKER_OPTIM_ONEBIT_LAMB_H_
