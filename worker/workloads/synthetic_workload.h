// A synthetic gradient source of any size up to 2^31 parameters (BERT-Large's 340M fits),
// for benchmarks where communication dominates. The model is a quadratic bowl,
//
//   loss(p) = 0.5 * mean_i (p_i - target_i)^2,
//
// and worker r's gradient at step t is the bowl's per-element gradient plus noise,
//
//   g_i = (p_i - target_i) + noise * u(seed, t, r, i),   u uniform with mean 0, variance 1,
//
// so the workers disagree (as with real data shards) and an optimizer still converges.
// (This is the gradient of n * loss; Adam does not care about the scale, and the loss stays
// comparable across sizes.) target_i and u come from a counter-based hash of their indices:
// nothing is stored per element, the loop vectorises, and every value is a pure function of
// (seed, step, rank, i).
#ifndef ONEBIT_WORKER_WORKLOADS_SYNTHETIC_WORKLOAD_H_
#define ONEBIT_WORKER_WORKLOADS_SYNTHETIC_WORKLOAD_H_

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "kernels/kernels.h"
#include "worker/workloads/workload.h"

namespace onebit {

inline constexpr int64_t kMaxSyntheticParameters = int64_t{1} << 31;

struct SyntheticWorkloadOptions {
  int64_t parameters = 1000000;  // 1 .. kMaxSyntheticParameters
  float noise = 1.0f;            // standard deviation of each worker's gradient noise, >= 0
  WorkloadShard shard;           // micro_batch is not used
};

// The bowl's target and a worker's noise at one step, as hash keys.
struct SyntheticKeys {
  uint32_t target[2];
  uint32_t noise[2];
};
SyntheticKeys MakeSyntheticKeys(uint64_t seed, int64_t step, int rank);

// The inner loop, exposed for tests and benchmarks: grad[i] = (p[i] - target_i) +
// noise * u_i for i < n, returning sum_i (p[i] - target_i)^2 (float64). grad may be null
// (loss only).
double SyntheticGradient(const float* params, size_t n, const SyntheticKeys& keys, float noise,
                         float* grad);

// On the CPU when `backend` is null or a host backend. With a CUDA backend the gradient
// is computed on the host and copied (parameters down, gradient up): correct, but slow for
// large models; a device kernel would remove the copies.
absl::StatusOr<std::unique_ptr<Workload>> NewSyntheticWorkload(
    const SyntheticWorkloadOptions& options, kernels::Backend* backend = nullptr);

}  // namespace onebit

#endif  // ONEBIT_WORKER_WORKLOADS_SYNTHETIC_WORKLOAD_H_
