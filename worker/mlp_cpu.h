// A multilayer perceptron (ReLU hidden layers, softmax cross-entropy) over one flat
// parameter vector, its CPU implementation with Eigen, and the Fashion-MNIST workload built
// on it. The layout and initialisation are shared with the GPU version (mlp_cuda.h), so the
// two train the same model from the same bits.
//
// This header has no Eigen in it (the implementation instantiates MlpCpu for float and
// double), so nvcc can include it.
#ifndef ONEBIT_WORKER_MLP_CPU_H_
#define ONEBIT_WORKER_MLP_CPU_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/fashion_mnist.h"
#include "worker/workload.h"

namespace onebit {

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

 private:
  MlpLayout(std::vector<int> sizes, std::vector<size_t> offsets)
      : sizes_(std::move(sizes)), offsets_(std::move(offsets)) {}
  std::vector<int> sizes_;
  std::vector<size_t> offsets_;  // num_layers() + 1 entries
};

// He initialisation (normal, std sqrt(2 / fan_in)) for the ReLU layers and Glorot
// (uniform, +-sqrt(6 / (fan_in + fan_out))) for the output layer; zero biases. A pure
// function of (layout, seed): the same bits on every worker.
void InitMlpParameters(const MlpLayout& layout, uint64_t seed, float* params);

// What one batch gives.
struct MlpBatchResult {
  double loss_sum = 0.0;  // sum over the batch of the cross-entropy
  int64_t correct = 0;    // examples whose largest logit is their label
};

// Forward and backward passes on the CPU. Eigen maps the caller's flat buffers (no copies);
// activations live in scratch allocated once for `max_batch` examples.
// Thread safety: one thread at a time.
template <typename T>
class MlpCpu {
 public:
  MlpCpu(MlpLayout layout, int64_t max_batch);

  const MlpLayout& layout() const { return layout_; }
  int64_t max_batch() const { return max_batch_; }

  // x: inputs(0) x batch, column-major (one example per column); labels: batch entries
  // in [0, outputs). With grad != nullptr, writes the gradient of the MEAN loss over the
  // batch (num_parameters() entries). kInvalidArgument for a bad batch size or label.
  absl::StatusOr<MlpBatchResult> Run(const T* params, const T* x, const uint8_t* labels,
                                     int64_t batch, T* grad);

 private:
  MlpLayout layout_;
  int64_t max_batch_;
  std::vector<std::vector<T>> activations_;  // per layer: outputs(l) x max_batch
  std::vector<T> scratch_;                   // max_width x max_batch, for W^T * delta
};

extern template class MlpCpu<float>;
extern template class MlpCpu<double>;

struct FashionMnistWorkloadOptions {
  std::vector<int> hidden = {256, 128};
  WorkloadShard shard;
};

// The layout of the Fashion-MNIST MLP: 784 -> hidden... -> 10.
absl::StatusOr<MlpLayout> FashionMnistLayout(const std::vector<int>& hidden);

// Examples per forward pass when evaluating the test set.
inline constexpr int64_t kMlpEvalChunk = 1000;

// The Fashion-MNIST MLP on the CPU (host memory). `data` is shared, read-only, by every
// worker of the process.
absl::StatusOr<std::unique_ptr<Workload>> NewFashionMnistCpuWorkload(
    const FashionMnistWorkloadOptions& options, std::shared_ptr<const FashionMnist> data);

}  // namespace onebit

#endif  // ONEBIT_WORKER_MLP_CPU_H_
