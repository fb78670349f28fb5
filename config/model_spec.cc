#include "config/model_spec.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"

namespace onebit {
namespace {

// Wide enough for any MLP this project trains, small enough that every GEMM dimension fits
// cuBLAS's int arguments.
constexpr int kMaxWidth = 1 << 20;

}  // namespace

absl::StatusOr<MlpLayout> MlpLayout::Create(std::vector<int> sizes) {
  if (sizes.size() < 2) {
    return absl::InvalidArgumentError("an MLP needs at least an input and an output size");
  }
  std::vector<size_t> offsets = {0};
  for (size_t l = 0; l < sizes.size(); ++l) {
    if (sizes[l] < 1 || sizes[l] > kMaxWidth) {
      return absl::InvalidArgumentError(absl::StrCat("MLP layer sizes must be in [1, ", kMaxWidth,
                                                     "], got ", absl::StrJoin(sizes, "-")));
    }
    if (l + 1 < sizes.size()) {
      const size_t layer = static_cast<size_t>(sizes[l + 1]) * sizes[l] + sizes[l + 1];
      offsets.push_back(offsets.back() + layer);
    }
  }
  return MlpLayout(std::move(sizes), std::move(offsets));
}

int MlpLayout::max_width() const { return *std::max_element(sizes_.begin(), sizes_.end()); }

std::vector<size_t> MlpLayout::tensor_offsets() const {
  std::vector<size_t> offsets = {0};
  for (int l = 0; l < num_layers(); ++l) {
    offsets.push_back(bias_offset(l));
    offsets.push_back(weights_offset(l + 1));
  }
  return offsets;
}

absl::StatusOr<MlpLayout> FashionMnistLayout(const std::vector<int>& hidden) {
  std::vector<int> sizes = {kFashionMnistMlpInputs};
  sizes.insert(sizes.end(), hidden.begin(), hidden.end());
  sizes.push_back(kFashionMnistMlpOutputs);
  return MlpLayout::Create(std::move(sizes));
}

absl::StatusOr<size_t> WorkloadParameterCount(const WorkloadConfig& config) {
  if (config.type == "synthetic" || config.type == "pytorch") {
    return static_cast<size_t>(config.parameters);
  }
  if (config.type == "fashion_mnist") {
    ONEBIT_ASSIGN_OR_RETURN(MlpLayout layout, FashionMnistLayout(config.hidden));
    return layout.num_parameters();
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown workload '", config.type, "'"));
}

}  // namespace onebit
