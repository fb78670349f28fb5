#include "worker/job_setup.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
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
      return NewFashionMnistCudaWorkload(options, std::move(data), backend);
    }
    return NewFashionMnistCpuWorkload(options, std::move(data));
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
  t.never_freeze = o.type == "Adam";
  t.init_seed = config.seed;
  t.total_steps = config.steps;
  t.log_every = config.log_every;
  t.eval_every = config.workload.type == "fashion_mnist" ? config.workload.eval_every : 0;
  t.report_interval = config.freeze.report_interval;
  return t;
}

}  // namespace onebit
