#include "worker/job_setup.h"

#include <algorithm>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "config/lr_schedule.h"
#include "config/momentum_mask.h"
#include "config/optimizer_kind.h"
#include "worker/workloads/fashion_mnist.h"
#include "worker/workloads/mlp_cpu.h"
#include "worker/workloads/mlp_cuda.h"
#include "worker/workloads/synthetic_workload.h"

namespace onebit {

absl::StatusOr<std::unique_ptr<Workload>> NewWorkload(const JobConfig& config, int rank,
                                                      int world_size, kernels::Backend* backend) {
  WorkloadShard shard;
  shard.rank = rank;
  shard.world_size = world_size;
  shard.micro_batch = config.micro_batch;
  shard.seed = config.seed;
  if (config.workload.type == "synthetic") {
    SyntheticWorkloadOptions options;
    options.parameters = config.workload.parameters;
    options.shard = shard;
    return NewSyntheticWorkload(options, backend);
  }
  if (config.workload.type == "fashion_mnist") {
    ONEBIT_ASSIGN_OR_RETURN(std::shared_ptr<const FashionMnist> data,
                            LoadFashionMnist(config.workload.data_dir));
    FashionMnistWorkloadOptions options;
    options.hidden = config.workload.hidden;
    options.shard = shard;
    if (backend->memory_space() == kernels::MemorySpace::kCuda) {
      // The CPU computes in fp32 whatever the config says (the config's notice says so).
      options.precision = WorkloadPrecision(config);
      return NewFashionMnistCudaWorkload(options, std::move(data), backend);
    }
    return NewFashionMnistCpuWorkload(options, std::move(data));
  }
  if (config.workload.type == "pytorch") {
    return absl::InvalidArgumentError(
        "onebit.workload.type pytorch is a training script's model: run the script (its "
        "optimizer is onebit.torch's), not onebit-worker");
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown workload '", config.workload.type, "'"));
}

TrainerOptions TrainerOptionsFromConfig(const JobConfig& config) {
  TrainerOptions t;
  const OptimizerConfig& o = config.optimizer;
  t.optimizer.hyper.lr = static_cast<float>(o.lr);
  t.optimizer.hyper.beta1 = static_cast<float>(o.beta1);
  t.optimizer.hyper.beta2 = static_cast<float>(o.beta2);
  t.optimizer.hyper.eps = static_cast<float>(o.eps);
  t.optimizer.hyper.weight_decay = static_cast<float>(o.weight_decay);
  t.optimizer.hyper.update_clip = static_cast<float>(o.update_clip);
  t.optimizer.kind = o.kind;
  t.optimizer.bias_correction = o.bias_correction;
  t.optimizer.max_grad_norm = config.gradient_clipping;
  t.optimizer.zero_one.var_update_scaler = o.var_update_scaler;
  t.optimizer.zero_one.local_step_scaler = o.local_step_scaler;
  t.optimizer.zero_one.local_step_clipper = o.local_step_clipper;
  t.optimizer.lamb.max_coeff = o.max_coeff;
  t.optimizer.lamb.min_coeff = o.min_coeff;
  t.optimizer.lamb.coeff_beta = o.coeff_beta;
  t.optimizer.lamb.factor_max = o.factor_max;
  t.optimizer.lamb.factor_min = o.factor_min;
  t.optimizer.lamb.factor_threshold = o.factor_threshold;
  t.optimizer.auto_mask_zero_gradients = config.momentum_mask.auto_zero_grad;
  // The user's mask needs the parameter count: MomentumMaskFromConfig, once it is known.
  t.never_freeze = !Traits(o.kind).compresses;
  if (!config.scheduler.type.empty()) {
    t.learning_rate = [scheduler = config.scheduler, base = o.lr](int64_t step) {
      return LearningRate(scheduler, base, step);
    };
  }
  if (SchedulerCyclesBetas(config)) {
    t.betas = [scheduler = config.scheduler, b = Betas{o.beta1, o.beta2}](int64_t step) {
      const Betas now = ScheduledBetas(scheduler, b, step);
      return std::make_pair(now.beta1, now.beta2);
    };
  }
  t.gradient_accumulation_steps = config.gradient_accumulation_steps;
  t.init_seed = config.seed;
  t.total_steps = config.steps >= kOpenEndedSteps ? 0 : config.steps;  // 0: open-ended
  t.log_every = config.log_every;
  t.eval_every = config.workload.type == "fashion_mnist" ? config.workload.eval_every : 0;
  t.report_interval = config.freeze.report_interval;
  const PrecisionConfig& p = config.precision;
  if (ScalesLoss(config)) {
    LossScalerOptions scaling;
    scaling.loss_scale = p.loss_scale;
    scaling.initial_scale_power = p.initial_scale_power;
    scaling.loss_scale_window = p.loss_scale_window;
    scaling.hysteresis = p.hysteresis;
    scaling.consecutive_hysteresis = p.consecutive_hysteresis;
    scaling.min_loss_scale = p.min_loss_scale;
    t.loss_scaling = scaling;
  }
  return t;
}

ComputePrecision WorkloadPrecision(const JobConfig& config) {
  if (config.device != "cuda") return ComputePrecision::kFp32;
  if (config.precision.fp16) return ComputePrecision::kFp16;
  if (config.precision.bf16) return ComputePrecision::kBf16;
  return ComputePrecision::kFp32;
}

absl::StatusOr<std::vector<float>> MomentumMaskFromConfig(const JobConfig& config, size_t n) {
  if (!HasMomentumMask(config.momentum_mask)) return std::vector<float>{};
  return BuildMomentumMask(config.momentum_mask, n);
}

int WorkerCpuThreads(int flag, const JobConfig& config, int usable, const char* local_world_size) {
  const int threads = flag >= 0 ? flag : config.cpu_threads;
  if (threads > 0) return threads;
  int sharing = 1;
  if (local_world_size != nullptr && !absl::SimpleAtoi(local_world_size, &sharing)) sharing = 1;
  sharing = std::max(sharing, 1);
  return std::max(1, usable / sharing);
}

}  // namespace onebit
