// Turns a job config into the worker's parts: the workload and the trainer's options. (The
// parameter count every process must agree on is config/model_spec.h's.)
#ifndef ONEBIT_WORKER_JOB_SETUP_H_
#define ONEBIT_WORKER_JOB_SETUP_H_

#include <cstddef>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "config/job_config.h"
#include "config/model_spec.h"
#include "kernels/kernels.h"
#include "worker/trainer.h"
#include "worker/workloads/workload.h"

namespace onebit {

// The workload of worker `rank` of `world_size`, on `backend` (CPU or CUDA).
absl::StatusOr<std::unique_ptr<Workload>> NewWorkload(const JobConfig& config, int rank,
                                                      int world_size, kernels::Backend* backend);

// Optimizer hyperparameters, logging, evaluation and the variance-change interval; fp16's
// loss scaling for a CUDA job (the CPU computes in fp32 and scales nothing).
TrainerOptions TrainerOptionsFromConfig(const JobConfig& config);
// What the job's workload computes in: fp16 or bf16 on onebit.device cuda, else fp32.
ComputePrecision WorkloadPrecision(const JobConfig& config);
// The user's momentum mask for n parameters from onebit.momentum_mask (a .npy or ranges);
// empty when none is given. Errors name the file or range.
absl::StatusOr<std::vector<float>> MomentumMaskFromConfig(const JobConfig& config, size_t n);

// The CPU kernels' threads of a worker: `flag` (the worker's --cpu_threads; -1: not given)
// or else the config's onebit.cpu_threads, when > 0; else (0) the `usable` cores shared
// among the workers a launcher says run on this machine, `local_world_size` (torchrun's
// and onebit-run's LOCAL_WORLD_SIZE, onebit-launch's ONEBIT_LOCAL_WORLD_SIZE; null or not
// a positive number: 1). At least 1: 4 workers on 2 cores get 1 thread each, not 2.
int WorkerCpuThreads(int flag, const JobConfig& config, int usable, const char* local_world_size);

}  // namespace onebit

#endif  // ONEBIT_WORKER_JOB_SETUP_H_
