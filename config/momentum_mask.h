// The momentum mask of onebit.momentum_mask (config/job_config.h MomentumMaskConfig;
// docs/algorithms.md, "Momentum masks"): after every exchange m *= mask.
//
// Thread safety: the function is thread safe (it reads the .npy file, if any, each call).
#ifndef ONEBIT_CONFIG_MOMENTUM_MASK_H_
#define ONEBIT_CONFIG_MOMENTUM_MASK_H_

#include <cstddef>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "config/job_config.h"

namespace onebit {

// True when the config asks for a mask from a file or ranges (auto_zero_grad is the
// trainer's business and not counted here).
bool HasMomentumMask(const MomentumMaskConfig& config);

// The mask for a model of `n` parameters: n values, 0.0 where masked and 1.0 elsewhere.
// From `npy`: a 1-D array of exactly n elements, float32, bool or uint8, every value 0 or 1.
// From `ranges`: 0 on each [begin, end) (any order, overlaps fine), which must lie within
// [0, n). Neither: all ones. Errors name the key (onebit.momentum_mask.npy / .ranges[i])
// and the file: InvalidArgument for a wrong shape, dtype, value or a truncated file,
// NotFound for a missing one.
absl::StatusOr<std::vector<float>> BuildMomentumMask(const MomentumMaskConfig& config, size_t n);

// What a built mask is, for comparing two workers' (JobTerms' mask_summary): "K of N
// masked, digest H", H a 64-bit FNV-1a of the masked positions' run boundaries, so two
// masks with the same zeros, from whatever file or dtype, have the same summary.
std::string MomentumMaskSummary(const std::vector<float>& mask);

}  // namespace onebit

#endif  // ONEBIT_CONFIG_MOMENTUM_MASK_H_
