// A multilayer perceptron (ReLU hidden layers, softmax cross-entropy) over one flat
// parameter vector (its layout: MlpLayout in config/model_spec.h), its CPU implementation
// with Eigen, and the Fashion-MNIST workload built on it. The layout and initialisation are shared with the GPU version (mlp_cuda.h), so the
// two train the same model from the same bits.
//
// This header has no Eigen in it (the implementation instantiates MlpCpu for float and
// double), so nvcc can include it.
#ifndef ONEBIT_WORKER_WORKLOADS_MLP_CPU_H_
#define ONEBIT_WORKER_WORKLOADS_MLP_CPU_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "config/model_spec.h"
#include "worker/workloads/fashion_mnist.h"
#include "worker/workloads/workload.h"

namespace onebit {

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
  // `layer_done(l)`, when set, is called as soon as layer l's part of grad (weights and
  // bias, MlpLayout's [weights_offset(l), weights_offset(l + 1))) is final: last layer
  // first, while the layers before it are still to come.
  absl::StatusOr<MlpBatchResult> Run(const T* params, const T* x, const uint8_t* labels,
                                     int64_t batch, T* grad,
                                     const std::function<void(int layer)>& layer_done = {});

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
  // The CUDA workload only (NewFashionMnistCudaWorkload); the CPU one computes in fp32 and
  // refuses anything else with INVALID_ARGUMENT.
  ComputePrecision precision = ComputePrecision::kFp32;
};


// Examples per forward pass when evaluating the test set.
inline constexpr int64_t kMlpEvalChunk = 1000;

// The Fashion-MNIST MLP on the CPU (host memory). `data` is shared, read-only, by every
// worker of the process.
absl::StatusOr<std::unique_ptr<Workload>> NewFashionMnistCpuWorkload(
    const FashionMnistWorkloadOptions& options, std::shared_ptr<const FashionMnist> data);

}  // namespace onebit

#endif  // ONEBIT_WORKER_WORKLOADS_MLP_CPU_H_
