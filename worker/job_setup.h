// Turns a job config into the worker's parts: the workload, the trainer's options, and the
// parameter count that every process of the job must agree on (servers size their shards
// by it).
#ifndef ONEBIT_WORKER_JOB_SETUP_H_
#define ONEBIT_WORKER_JOB_SETUP_H_

#include <cstddef>
#include <memory>

#include "absl/status/statusor.h"
#include "coordinator/job_config.h"
#include "kernels/kernels.h"
#include "worker/trainer.h"
#include "worker/workload.h"

namespace onebit {

// The number of parameters the configured workload trains (no data is read).
absl::StatusOr<size_t> WorkloadParameterCount(const WorkloadConfig& config);

// The workload of worker `rank` of `world_size`, on `backend` (CPU or CUDA).
absl::StatusOr<std::unique_ptr<Workload>> NewWorkload(const JobConfig& config, int rank,
                                                      int world_size, kernels::Backend* backend);

// Optimizer hyperparameters, logging, evaluation and the variance-change interval.
TrainerOptions TrainerOptionsFromConfig(const JobConfig& config);

}  // namespace onebit

#endif  // ONEBIT_WORKER_JOB_SETUP_H_
