#include "config/momentum_mask.h"

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/npy.h"

namespace onebit {

bool HasMomentumMask(const MomentumMaskConfig& config) {
  return !config.npy.empty() || !config.ranges.empty();
}

absl::StatusOr<std::vector<float>> BuildMomentumMask(const MomentumMaskConfig& config, size_t n) {
  const std::string npy_key = "onebit.momentum_mask.npy";
  if (!config.npy.empty()) {
    std::string descr;
    absl::StatusOr<npy::Float32Array> array = npy::ReadAsFloat32(config.npy, &descr);
    if (!array.ok()) {
      return absl::Status(array.status().code(),
                          absl::StrCat(npy_key, ": ", array.status().message()));
    }
    const int64_t want = static_cast<int64_t>(n);
    if (array->shape.size() != 1 || array->shape[0] != want) {
      return absl::InvalidArgumentError(absl::StrCat(
          npy_key, ": ", config.npy, ": shape ", npy::ShapeToString(array->shape),
          ", expected (", n, ",): one value per parameter of the model"));
    }
    for (size_t i = 0; i < array->data.size(); ++i) {
      const float x = array->data[i];
      if (x != 0.0f && x != 1.0f) {  // NaN fails both
        return absl::InvalidArgumentError(
            absl::StrCat(npy_key, ": ", config.npy, ": element ", i, " is ", x,
                         "; a mask holds only 0 (masked) and 1"));
      }
    }
    return std::move(array->data);
  }
  std::vector<float> mask(n, 1.0f);
  for (size_t i = 0; i < config.ranges.size(); ++i) {
    const auto [begin, end] = config.ranges[i];
    if (begin < 0 || begin >= end || static_cast<uint64_t>(end) > n) {
      return absl::InvalidArgumentError(absl::StrCat(
          "onebit.momentum_mask.ranges[", i, "]: [", begin, ", ", end,
          ") must lie within the model's ", n, " parameters [0, ", n, ")"));
    }
    for (int64_t j = begin; j < end; ++j) mask[static_cast<size_t>(j)] = 0.0f;
  }
  return mask;
}

std::string MomentumMaskSummary(const std::vector<float>& mask) {
  uint64_t hash = 14695981039346656037ull;  // FNV-1a, 64 bits
  auto mix = [&hash](uint64_t x) {
    for (int byte = 0; byte < 8; ++byte, x >>= 8) {
      hash = (hash ^ (x & 0xff)) * 1099511628211ull;
    }
  };
  size_t masked = 0;
  bool in_run = false;
  for (size_t i = 0; i <= mask.size(); ++i) {
    const bool zero = i < mask.size() && mask[i] == 0.0f;
    if (zero != in_run) mix(i);  // where each run of masked elements begins and ends
    in_run = zero;
    masked += zero ? 1 : 0;
  }
  return absl::StrFormat("%d of %d masked, digest %016x", masked, mask.size(), hash);
}

}  // namespace onebit
