// What a job's model is, computed from its config alone: the parameter layout of each
// built-in workload. No data, no Eigen, no CUDA, so every process of a job (the shards
// size themselves by the parameter count) can link it without linking a workload.
#ifndef ONEBIT_CONFIG_MODEL_SPEC_H_
#define ONEBIT_CONFIG_MODEL_SPEC_H_

#include <cstddef>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "config/job_config.h"

namespace onebit {

// The Fashion-MNIST MLP's input and output widths: 28x28 pixels, 10 classes.
inline constexpr int kFashionMnistMlpInputs = 28 * 28;
inline constexpr int kFashionMnistMlpOutputs = 10;

// Where each layer's parameters sit in the flat vector. Layer l maps sizes[l] inputs to
// sizes[l+1] outputs: its weights W_l (sizes[l+1] x sizes[l], column-major, so that
// W_l * x is one GEMM over a column-major batch) and then its bias b_l (sizes[l+1]).
class MlpLayout {
 public:
  // sizes = {inputs, hidden..., outputs}; at least two, all >= 1.
  static absl::StatusOr<MlpLayout> Create(std::vector<int> sizes);

  const std::vector<int>& sizes() const { return sizes_; }
  int num_layers() const { return static_cast<int>(sizes_.size()) - 1; }
  int inputs(int layer) const { return sizes_[layer]; }
  int outputs(int layer) const { return sizes_[layer + 1]; }
  size_t weights_offset(int layer) const { return offsets_[layer]; }
  size_t bias_offset(int layer) const {
    return offsets_[layer] + static_cast<size_t>(outputs(layer)) * inputs(layer);
  }
  size_t num_parameters() const { return offsets_.back(); }
  int max_width() const;  // the widest layer, input included
  // The model's tensors (each layer's weights, then its bias) as boundaries {0, ..., n}.
  std::vector<size_t> tensor_offsets() const;

 private:
  MlpLayout(std::vector<int> sizes, std::vector<size_t> offsets)
      : sizes_(std::move(sizes)), offsets_(std::move(offsets)) {}
  std::vector<int> sizes_;
  std::vector<size_t> offsets_;  // num_layers() + 1 entries
};

// The layout of the Fashion-MNIST MLP: 784 -> hidden... -> 10.
absl::StatusOr<MlpLayout> FashionMnistLayout(const std::vector<int>& hidden);

// The number of parameters the configured workload trains.
absl::StatusOr<size_t> WorkloadParameterCount(const WorkloadConfig& config);

}  // namespace onebit

#endif  // ONEBIT_CONFIG_MODEL_SPEC_H_
