// The 1-bit Adam stage machine for one worker (docs/algorithms.md, "1-bit Adam").
//
// Steps are numbered from 1. Steps 1..freeze_step are warmup: plain Adam on the exactly
// averaged gradient (a full-precision allreduce with a fixed summation order, so every
// transport gives the same bits). After step freeze_step the variance is
// frozen and every step exchanges the local momentum with CompressedAllreduce. With one
// worker the exchange is skipped. All state (p, m, v, the error buffers) lives in the
// backend's memory.
//
// Thread safety: one thread at a time. The backend is borrowed and must outlive the
// optimizer.
#ifndef ONEBIT_WORKER_OPTIM_ONEBIT_ADAM_H_
#define ONEBIT_WORKER_OPTIM_ONEBIT_ADAM_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/buffer.h"
#include "kernels/kernels.h"
#include "worker/exchange/exchange.h"
#include "worker/optim/gradient_clipper.h"
#include "worker/optim/momentum_mask.h"
#include "worker/optim/optim_checks.h"
#include "worker/optim/optimizer.h"
#include "worker/transport/transport.h"

namespace onebit {

struct OnebitAdamOptions {
  kernels::AdamHyper hyper;
  // Last warmup step. 0 compresses from the first step; a value >= the number of steps
  // run never compresses.
  int64_t freeze_step = 100000;
  // Optional {0,1} momentum mask of n elements (host memory), applied after every
  // compressed exchange. Empty means no mask.
  std::vector<float> momentum_mask;
  // Also mask the parameters whose exactly averaged gradient stays exactly zero through
  // warmup (momentum_mask.h).
  bool auto_mask_zero_gradients = false;
  // Bias-corrected moments (optim_checks.h's BiasCorrectedHyper; the variance's correction
  // freezes with it). Off by default, as in docs/algorithms.md.
  bool bias_correction = false;
  // Gradient clipping by global norm (gradient_clipper.h); 0: off.
  double max_grad_norm = 0.0;
  // Parameter groups with their own lr and weight decay (optim_checks.h); empty: one group
  // with hyper's.
  std::vector<HyperGroup> hyper_groups;
};

class OnebitAdam : public Optimizer {
 public:
  // `initial_params` is host memory with n elements. The exchange is borrowed and must
  // outlive the optimizer; it is not used with one worker.
  static absl::StatusOr<std::unique_ptr<OnebitAdam>> Create(const OnebitAdamOptions& options,
                                                            kernels::Backend* backend,
                                                            Exchange* exchange,
                                                            const float* initial_params,
                                                            size_t n);
  // The same over a PeerExchange on `transport`, which the optimizer owns.
  static absl::StatusOr<std::unique_ptr<OnebitAdam>> Create(const OnebitAdamOptions& options,
                                                            kernels::Backend* backend,
                                                            Transport* transport,
                                                            const float* initial_params,
                                                            size_t n);
  // One optimizer step on this worker's local gradient `grad` (backend memory, n
  // elements; it is not modified).
  absl::Status Step(const float* grad) override;
  absl::Status SkipStep() override;

  Stage stage() const override;
  int64_t step() const override { return step_; }
  int64_t freeze_step() const override { return options_.freeze_step; }
  // Moves the switch. Must not be at or before a step already run in compression, and
  // must be called with the same value on every worker before the step it concerns.
  absl::Status SetFreezeStep(int64_t freeze_step) override;
  void set_lr(float lr) override { options_.hyper.lr = lr; }
  absl::Status set_max_grad_norm(double max_norm) override { return clip_.SetMaxNorm(max_norm); }
  float lr() const override { return options_.hyper.lr; }
  void set_betas(float beta1, float beta2) override {
    options_.hyper.beta1 = beta1;
    options_.hyper.beta2 = beta2;
  }
  absl::Status set_weight_decays(const std::vector<double>& decays) override {
    return SetGroupWeightDecays(decays, &groups_);
  }
  std::vector<double> weight_decays() const override { return GroupWeightDecays(groups_); }

  size_t size() const override { return n_; }
  // Backend memory, n elements each.
  const float* params() const override { return p_.data(); }
  const float* momentum() const { return m_.data(); }
  const float* variance() const override { return v_.data(); }

  // Copies of the state into host memory.
  absl::StatusOr<std::vector<float>> ParamsToHost() const override;
  absl::StatusOr<std::vector<float>> MomentumToHost() const;
  absl::StatusOr<std::vector<float>> VarianceToHost() const;

  // Checkpoints: "params", "exp_avg", "exp_avg_sq", all shared. Restore sets the switch if
  // it had passed (0 <= freeze_step < step). The next Step() is step + 1.
  std::vector<StateSpec> CheckpointStates() const override;
  absl::StatusOr<std::vector<float>> StateToHost(const std::string& name, size_t begin,
                                                 size_t end) const override;
  StateScalars CheckpointScalars() const override;
  absl::Status Restore(int64_t step, int64_t freeze_step, const StateTensors& states,
                       const StateScalars& scalars) override;

  int64_t masked_elements() const override { return mask_.masked(); }
  Exchange& exchange() override { return *exchange_; }

  // Seconds Step() has spent inside the exchange's SumGradients/AverageMomentum so far,
  // read on the exchange's step_clock(); the rest of a Step is the update. Cumulative.
  double exchange_call_seconds() const override { return exchange_call_seconds_; }

 private:
  OnebitAdam(const OnebitAdamOptions& options, kernels::Backend* backend, Exchange* exchange,
             size_t n);
  absl::Status Init(const float* initial_params);
  absl::Status WarmupStep(const float* grad);
  absl::Status CompressionStep(const float* grad);
  absl::Status FrozenUpdate();
  // The next step's hyper-parameters, bias-corrected when asked for.
  // The hyper-parameters of the next step for `group` (bias-corrected if asked for).
  kernels::AdamHyper StepHyper(const HyperGroup& group) const;

  OnebitAdamOptions options_;
  std::vector<HyperGroup> groups_;  // options_.hyper_groups, resolved: at least one
  kernels::Backend* backend_;
  Exchange* exchange_;
  std::unique_ptr<Exchange> owned_exchange_;  // set by the Transport overload
  size_t n_;
  int64_t step_ = 0;
  kernels::Buffer<float> p_, m_, v_;
  MomentumMask mask_;
  GradientClipper clip_;
  double exchange_call_seconds_ = 0.0;
};

}  // namespace onebit

#endif  // ONEBIT_WORKER_OPTIM_ONEBIT_ADAM_H_
