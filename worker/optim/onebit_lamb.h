// 1-bit LAMB for one worker (Li et al., 2022). Steps are numbered from 1, as 1-bit Adam's;
// the per-tensor quantities are per parameter group (the model's tensors: a partition of
// [0, n) into ranges, given by the workload). docs/algorithms.md, "1-bit LAMB", is the math
// of the warmup, the switch and the compression stage this implements; its scalars are
// computed on the host in float64 from Backend::SumSquares and applied as float32. Each
// tensor's norms are cut at the exchange's reduction_stride() and added in slice order
// (sliced_reductions.h), so a worker holding one slice can assemble the same bits.
//
// SHARDED STATE (optimizer_base.h): m, v, v_fresh and the scratch hold this worker's slice.
// Each phase's per-tensor norms (the warmup's ||p_k|| and ||u_k||, the switch's ||m_k||,
// the compression step's ratio and ||u_k|| before and after the decay) are this worker's
// pieces, then one gather inside the node for all tensors. So the float64 scalars are the
// same on every worker, with the bits of an unsharded run. The compression step never forms
// a worker's whole momentum: it forms every local worker's momentum of this slice from the
// rows of their gradients (Exchange::ShardRows), with the float ops each worker would use.
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
  absl::Status Step(Gradient grad) override;
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
  OnebitLamb(const OnebitLambOptions& options, kernels::Backend* backend, Exchange* exchange,
             size_t n);
  static absl::Status ValidateOptions(const OnebitLambOptions& o, size_t n);
  // Also checks that each tensor lies in one of `hyper_groups`.
  absl::Status Init(std::vector<HyperGroup> hyper_groups, const float* initial_params);
  absl::Status WarmupStep(Gradient grad);
  absl::Status Switch();
  absl::Status CompressionStep(Gradient grad);
  // Sharded: the compression step's exchange. Every local worker's scaled momentum of this
  // slice, formed from m_ and the rows of their clipped gradients (`grad`: this worker's,
  // whole, unclipped; float32 or 16-bit), then averaged: CompressedAverageOfRows' result.
  absl::StatusOr<CompressedResult> ShardedMomentumAverage(float beta1, Gradient grad);
  // x (the state range's) *= float(scaling_k), or float(1/scaling_k) when inverse, over
  // each tensor k's part of the state range.
  absl::Status ScaleTensors(float* x, bool inverse);
  // Tensor k's part of the state range, counted from state_begin(); empty if none.
  Group OwnPart(size_t k) const;
  // Per-tensor reductions of one phase, gathered once (OptimizerBase::CombineInNode). Every
  // worker adds the same ones in the same order; Gather gives them back in that order.
  struct Reductions {
    std::vector<double> mine;
    std::vector<Combine> combine;
  };
  // ||x over tensor k||^2, x holding the state range (element state_begin() at x[0]).
  absl::Status AddSumSquares(const float* x, size_t k, Reductions* r);
  // The largest (sqrt(v) + eps) / (sqrt(v_fresh) + eps) over tensor k.
  absl::Status AddMaxDenomRatio(float eps, size_t k, Reductions* r);
  absl::StatusOr<std::vector<double>> Gather(Reductions r);
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

  std::vector<Group> groups_;              // the tensors (global indices)
  std::vector<size_t> tensor_hyper_;       // tensor k's index into hyper_groups_
  bool switched_ = false;
  std::vector<double> coeff_freeze_, scaling_, last_factor_;
  kernels::Buffer<float> v_fresh_, m_last_, u_;  // the state range's
};

}  // namespace onebit

#endif  // ONEBIT_WORKER_OPTIM_ONEBIT_LAMB_H_
