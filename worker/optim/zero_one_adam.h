// 0/1 Adam for one worker (Lu et al., 2022). Steps are numbered from 1, as 1-bit Adam's:
// steps 1..var_freeze_step are the variance stage (Stage::kWarmup), later ones the local
// stage (Stage::kCompression); ZeroOneSchedule says which steps communicate. The math of
// every kind of step, the error reset before step var_freeze_step + 1 and the sync's
// anchor is docs/algorithms.md's "0/1 Adam". Between syncs the workers' p and m differ.
//
// Thread safety: one thread at a time. The backend and exchange are borrowed.
#ifndef ONEBIT_WORKER_OPTIM_ZERO_ONE_ADAM_H_
#define ONEBIT_WORKER_OPTIM_ZERO_ONE_ADAM_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/buffer.h"
#include "kernels/kernels.h"
#include "worker/exchange/exchange.h"
#include "worker/optim/optim_checks.h"
#include "worker/optim/optimizer.h"
#include "worker/optim/optimizer_base.h"
#include "config/zero_one_schedule.h"

namespace onebit {

// bias_correction: k of BiasCorrectedHyper counts the variance updates so far, the current
// one included. The local steps then accumulate lr' = lr*c and sum it: after a sync m is
// the lr'-weighted mean of the momenta since the last one.
// hyper_groups: each group sums its own lr over the local steps. A sync exchanges the
// lr-weighted accumulators of every group in one compressed buffer, so with several workers
// the groups' lr and decay shape each other's compression (with one, each group gets the
// bits of a run of everything with its hyper-parameters).
struct ZeroOneAdamOptions : CommonOptimizerOptions {
  // The last step of the variance stage (DeepSpeed's default).
  int64_t var_freeze_step = 100000;
  ZeroOneScheduleParams schedule;
};

// stage(): kWarmup through var_freeze_step (the variance stage), kCompression after. The
// freeze step is var_freeze_step; it moves only while it has not passed, with the same
// value on every worker.
class ZeroOneAdam : public OptimizerBase<ZeroOneAdam, ZeroOneAdamOptions,
                                         &ZeroOneAdamOptions::var_freeze_step> {
 public:
  absl::Status Step(Gradient grad) override;
  absl::Status SkipStep() override;

  bool sums_gradients() const override {
    return next_step_kind() == ZeroOneStep::kVarianceUpdate;
  }
  // How the next step communicates.
  ZeroOneStep next_step_kind() const { return schedule_.Next(options_.var_freeze_step); }
  const ZeroOneSchedule& schedule() const { return schedule_; }
  // first must be the next step.
  std::optional<std::vector<int64_t>> ExchangeSteps(int64_t first, int64_t last,
                                                    int64_t freeze_step) const override;

  // The sum of the (first parameter group's) learning rates since the last sync.
  double lr_sum() const { return lrs_[0]; }


 private:
  friend OptimizerBase;
  static constexpr const char* kCannotShard =
      "0/1 Adam cannot shard its state (onebit.exchange.shard_state): its local steps keep "
      "each worker's own parameters and momentum (docs/algorithms.md, \"Local steps\"), so a "
      "node has no state to share; use OneBitAdam or OneBitLamb, or shard_state false";
  ZeroOneAdam(const ZeroOneAdamOptions& options, kernels::Backend* backend, Exchange* exchange,
              size_t n);
  static absl::Status ValidateOptions(const ZeroOneAdamOptions& o, size_t n);
  absl::Status Init(std::vector<HyperGroup> groups, const float* initial_params);
  absl::Status VarianceUpdate(const float* grad);
  absl::Status CompressedGradient(const float* grad);
  absl::Status LocalStep(const float* grad, bool sync);
  // The compressed average of x (the exchange's result, decoded into avg_), or x itself
  // with one worker.
  absl::StatusOr<const float*> CompressedAverage(const float* x);
  kernels::AdamHyper StepHyper(ZeroOneStep kind, const HyperGroup& group) const;
  // Checkpoints. Through the variance stage "params", "exp_avg" and "exp_avg_sq", all
  // shared; after it the variance is still shared, while "params", "exp_avg",
  // "accumulator" and "anchor" are each worker's own; the scalar "lr_sum" ("lr_sum.K" for
  // group K > 0). The schedule is rebuilt from the step.
  std::vector<StateSpec> TensorStates(int64_t step, int64_t var_freeze_step) const;
  StateScalars OwnScalars() const;
  absl::StatusOr<RestoreCommit> ReadScalars(int64_t step, int64_t var_freeze_step,
                                            const StateScalars& scalars);

  ZeroOneSchedule schedule_;
  bool errors_reset_ = false;
  std::vector<double> lrs_;         // per group: the lr summed since the last sync
  // anchor_: the parameters after the last sync (or at the end of the variance stage).
  kernels::Buffer<float> acc_, avg_, anchor_;
};

}  // namespace onebit

#endif  // ONEBIT_WORKER_OPTIM_ZERO_ONE_ADAM_H_
