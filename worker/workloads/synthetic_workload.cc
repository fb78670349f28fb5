#include "worker/workloads/synthetic_workload.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace onebit {
namespace {

constexpr uint64_t kTargetDomain = 0x746172676574ULL;  // "target"
constexpr uint64_t kNoiseDomain = 0x6e6f697365ULL;     // "noise"

// Chris Wellons' lowbias32: a 32-bit bijective mix with good avalanche, built from the
// 32-bit multiplies and shifts that SIMD units have (64-bit multiplies would not
// vectorise on AVX2).
inline uint32_t LowBias32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352dU;
  x ^= x >> 15;
  x *= 0x846ca68bU;
  x ^= x >> 16;
  return x;
}

// The top 24 bits as a float in [0, 1): exact, and an int -> float conversion SIMD has.
inline float Unit(uint32_t h) {
  return static_cast<float>(static_cast<int32_t>(h >> 8)) * 0x1p-24f;
}

void SplitKey(uint64_t key, uint32_t out[2]) {
  out[0] = static_cast<uint32_t>(key);
  out[1] = static_cast<uint32_t>(key >> 32);
}

// The loss of one block (count <= kBlock), the gradient written to grad. Separate lanes
// keep the float sum free of a loop-carried dependency, so the compiler vectorises without
// -ffast-math and without changing the order of any sum (the bits are the same with and
// without SIMD); blocks are summed in float64, so large n loses no precision.
// target_clones: AVX2 where the CPU has it, plain x86-64 otherwise (chosen at load time).
constexpr uint32_t kBlock = 4096;

__attribute__((target_clones("avx2", "default"))) double GradientBlock(
    const float* p, uint32_t first, uint32_t count, const uint32_t target_key[2],
    const uint32_t noise_key[2], float noise, float* grad) {
  constexpr uint32_t kLanes = 16;
  constexpr float kSqrt3 = 1.7320508075688772f;  // u in [-sqrt3, sqrt3): variance 1
  const uint32_t t0 = target_key[0], t1 = target_key[1];
  const uint32_t n0 = noise_key[0], n1 = noise_key[1];
  float lanes[kLanes] = {};
  const uint32_t full = count - count % kLanes;
  for (uint32_t j = 0; j < full; j += kLanes) {
    for (uint32_t l = 0; l < kLanes; ++l) {
      const uint32_t i = first + j + l;
      const float target = 2.0f * Unit(LowBias32(LowBias32(i + t0) ^ t1)) - 1.0f;
      const float u = kSqrt3 * (2.0f * Unit(LowBias32(LowBias32(i + n0) ^ n1)) - 1.0f);
      const float d = p[j + l] - target;
      lanes[l] += d * d;
      grad[j + l] = d + noise * u;
    }
  }
  for (uint32_t j = full; j < count; ++j) {
    const uint32_t i = first + j;
    const float target = 2.0f * Unit(LowBias32(LowBias32(i + t0) ^ t1)) - 1.0f;
    const float u = kSqrt3 * (2.0f * Unit(LowBias32(LowBias32(i + n0) ^ n1)) - 1.0f);
    const float d = p[j] - target;
    lanes[j - full] += d * d;
    grad[j] = d + noise * u;
  }
  double sum = 0;
  for (float lane : lanes) sum += lane;
  return sum;
}

class SyntheticWorkload : public Workload {
 public:
  SyntheticWorkload(const SyntheticWorkloadOptions& options, kernels::Backend* device)
      : options_(options), device_(device) {}

  std::string name() const override {
    return absl::StrCat("synthetic quadratic bowl, ", options_.parameters, " parameters",
                        device_ != nullptr ? " (staged through the host)" : "");
  }
  size_t num_parameters() const override { return static_cast<size_t>(options_.parameters); }
  kernels::MemorySpace memory_space() const override {
    return device_ != nullptr ? device_->memory_space() : kernels::MemorySpace::kHost;
  }

  absl::Status InitParameters(float* host_params, uint64_t) const override {
    std::memset(host_params, 0, num_parameters() * sizeof(float));
    return absl::OkStatus();
  }

  absl::StatusOr<double> ComputeGradient(const float* params, int64_t step,
                                         float* grad_out) override {
    if (step < 1) return absl::InvalidArgumentError(absl::StrCat("step ", step, " is not >= 1"));
    const SyntheticKeys keys = MakeSyntheticKeys(options_.shard.seed, step, options_.shard.rank);
    if (device_ == nullptr) {
      return 0.5 * SyntheticGradient(params, num_parameters(), keys, options_.noise, grad_out) /
             static_cast<double>(num_parameters());
    }
    ONEBIT_RETURN_IF_ERROR(CopyParamsToHost(params));
    const double sumsq = SyntheticGradient(host_params_.data(), num_parameters(), keys,
                                           options_.noise, host_grad_.data());
    ONEBIT_RETURN_IF_ERROR(
        device_->CopyFromHost(grad_out, host_grad_.data(), num_parameters() * sizeof(float)));
    return 0.5 * sumsq / static_cast<double>(num_parameters());
  }

  absl::StatusOr<EvalResult> Evaluate(const float* params) override {
    // The noise-free loss. The keys of step 0 never serve a gradient, but only the target
    // key matters here.
    const SyntheticKeys keys = MakeSyntheticKeys(options_.shard.seed, 0, options_.shard.rank);
    const float* host = params;
    if (device_ != nullptr) {
      ONEBIT_RETURN_IF_ERROR(CopyParamsToHost(params));
      host = host_params_.data();
    }
    EvalResult result;
    result.loss = 0.5 * SyntheticGradient(host, num_parameters(), keys, 0.0f, nullptr) /
                  static_cast<double>(num_parameters());
    return result;
  }

 private:
  // Copies device parameters into the host staging buffer (allocated on first use).
  absl::Status CopyParamsToHost(const float* device_params) {
    host_params_.resize(num_parameters());
    host_grad_.resize(num_parameters());
    return device_->CopyToHost(host_params_.data(), device_params,
                               num_parameters() * sizeof(float));
  }

  const SyntheticWorkloadOptions options_;
  kernels::Backend* const device_;              // null: host memory
  std::vector<float> host_params_, host_grad_;  // staging, only with a device backend
};

}  // namespace

SyntheticKeys MakeSyntheticKeys(uint64_t seed, int64_t step, int rank) {
  SyntheticKeys keys;
  SplitKey(HashCombine(seed, kTargetDomain), keys.target);
  SplitKey(HashCombine(HashCombine(HashCombine(seed, kNoiseDomain), static_cast<uint64_t>(step)),
                       static_cast<uint64_t>(rank)),
           keys.noise);
  return keys;
}

double SyntheticGradient(const float* params, size_t n, const SyntheticKeys& keys, float noise,
                         float* grad) {
  // Blocks: small enough that float lane sums stay accurate, large enough to amortise the
  // call. Without a gradient buffer the block writes to scratch: one loop body to vectorise.
  float scratch[kBlock];
  double total = 0;
  for (size_t first = 0; first < n; first += kBlock) {
    const uint32_t count = static_cast<uint32_t>(std::min<size_t>(kBlock, n - first));
    total += GradientBlock(params + first, static_cast<uint32_t>(first), count, keys.target,
                           keys.noise, noise, grad != nullptr ? grad + first : scratch);
  }
  return total;
}

absl::StatusOr<std::unique_ptr<Workload>> NewSyntheticWorkload(
    const SyntheticWorkloadOptions& options, kernels::Backend* backend) {
  ONEBIT_RETURN_IF_ERROR(ValidateShard(options.shard));
  if (options.parameters < 1 || options.parameters > kMaxSyntheticParameters) {
    return absl::InvalidArgumentError(absl::StrCat("synthetic parameters must be in [1, ",
                                                   kMaxSyntheticParameters, "], got ",
                                                   options.parameters));
  }
  if (!(options.noise >= 0.0f) || !std::isfinite(options.noise)) {
    return absl::InvalidArgumentError(
        absl::StrCat("synthetic noise must be >= 0, got ", options.noise));
  }
  kernels::Backend* device =
      backend != nullptr && backend->memory_space() != kernels::MemorySpace::kHost ? backend
                                                                                   : nullptr;
  return std::unique_ptr<Workload>(new SyntheticWorkload(options, device));
}

}  // namespace onebit
