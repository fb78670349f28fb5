#include "worker/workloads/mlp_cpu.h"

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <numeric>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"

namespace onebit {

static_assert(kFashionMnistClasses == kFashionMnistMlpOutputs,
              "the model spec and the data set disagree about the classes");

namespace {

constexpr uint64_t kInitDomain = 0x6d6c70696e6974ULL;  // "mlpinit"

}  // namespace

void InitMlpParameters(const MlpLayout& layout, uint64_t seed, float* params) {
  for (int l = 0; l < layout.num_layers(); ++l) {
    const uint64_t key = HashCombine(HashCombine(seed, kInitDomain), l);
    const size_t count = static_cast<size_t>(layout.outputs(l)) * layout.inputs(l);
    float* w = params + layout.weights_offset(l);
    const bool hidden = l + 1 < layout.num_layers();
    if (hidden) {
      const double stddev = std::sqrt(2.0 / layout.inputs(l));
      for (size_t i = 0; i < count; ++i) w[i] = static_cast<float>(stddev * NormalDouble(key, i));
    } else {
      const double limit = std::sqrt(6.0 / (layout.inputs(l) + layout.outputs(l)));
      for (size_t i = 0; i < count; ++i) {
        w[i] = static_cast<float>(limit * (2.0 * UniformDouble(HashCombine(key, i)) - 1.0));
      }
    }
    std::fill_n(params + layout.bias_offset(l), layout.outputs(l), 0.0f);
  }
}

template <typename T>
MlpCpu<T>::MlpCpu(MlpLayout layout, int64_t max_batch)
    : layout_(std::move(layout)), max_batch_(max_batch) {
  for (int l = 0; l < layout_.num_layers(); ++l) {
    activations_.emplace_back(static_cast<size_t>(layout_.outputs(l)) * max_batch_);
  }
  scratch_.resize(static_cast<size_t>(layout_.max_width()) * max_batch_);
}

template <typename T>
absl::StatusOr<MlpBatchResult> MlpCpu<T>::Run(const T* params, const T* x, const uint8_t* labels,
                                              int64_t batch, T* grad,
                                              const std::function<void(int layer)>& layer_done) {
  using Matrix = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic>;
  using Vector = Eigen::Matrix<T, Eigen::Dynamic, 1>;
  using ConstMap = Eigen::Map<const Matrix>;
  using Map = Eigen::Map<Matrix>;

  if (batch < 1 || batch > max_batch_) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch of ", batch, " examples; this MLP takes 1 to ", max_batch_));
  }
  const int num_layers = layout_.num_layers();
  const int classes = layout_.outputs(num_layers - 1);
  for (int64_t j = 0; j < batch; ++j) {
    if (labels[j] >= classes) {
      return absl::InvalidArgumentError(
          absl::StrCat("label ", int{labels[j]}, " of example ", j, " is not below ", classes));
    }
  }
  auto input_of = [&](int l) -> const T* { return l == 0 ? x : activations_[l - 1].data(); };

  // Forward: a_l = relu(W_l a_{l-1} + b_l) for hidden layers, logits = W a + b at the end.
  for (int l = 0; l < num_layers; ++l) {
    ConstMap w(params + layout_.weights_offset(l), layout_.outputs(l), layout_.inputs(l));
    Eigen::Map<const Vector> b(params + layout_.bias_offset(l), layout_.outputs(l));
    ConstMap in(input_of(l), layout_.inputs(l), batch);
    Map z(activations_[l].data(), layout_.outputs(l), batch);
    z.noalias() = w * in;
    z.colwise() += b;
    if (l + 1 < num_layers) z = z.cwiseMax(T(0));
  }

  // Softmax cross-entropy, column by column: loss = logsumexp(z) - z[label]. The logits
  // are overwritten by d(mean loss)/dz = (softmax - onehot) / batch.
  Map logits(activations_[num_layers - 1].data(), classes, batch);
  MlpBatchResult result;
  const T inv_batch = T(1) / static_cast<T>(batch);
  for (int64_t j = 0; j < batch; ++j) {
    auto z = logits.col(j);
    Eigen::Index argmax = 0;
    const T max = z.maxCoeff(&argmax);  // first maximum on ties, as on the GPU
    T sum = 0;
    for (int k = 0; k < classes; ++k) sum += std::exp(z(k) - max);
    const T lse = max + std::log(sum);
    result.loss_sum += static_cast<double>(lse - z(labels[j]));
    if (argmax == labels[j]) ++result.correct;
    if (grad != nullptr) {
      for (int k = 0; k < classes; ++k) {
        z(k) = (std::exp(z(k) - lse) - (k == labels[j] ? T(1) : T(0))) * inv_batch;
      }
    }
  }
  if (grad == nullptr) return result;

  // Backward. activations_[l] now holds delta_l = dLoss/dz_l; it replaces a_l once a_l's
  // ReLU mask (a_l > 0, the same as z_l > 0) has been used.
  for (int l = num_layers - 1; l >= 0; --l) {
    const int outs = layout_.outputs(l);
    const int ins = layout_.inputs(l);
    ConstMap delta(activations_[l].data(), outs, batch);
    ConstMap in(input_of(l), ins, batch);
    Map dw(grad + layout_.weights_offset(l), outs, ins);
    dw.noalias() = delta * in.transpose();
    Eigen::Map<Vector> db(grad + layout_.bias_offset(l), outs);
    db = delta.rowwise().sum();
    if (layer_done) layer_done(l);  // the exchange can take it while the next layer runs
    if (l > 0) {
      ConstMap w(params + layout_.weights_offset(l), outs, ins);
      Map back(scratch_.data(), ins, batch);
      back.noalias() = w.transpose() * delta;
      Map a(activations_[l - 1].data(), ins, batch);
      a = (a.array() > T(0)).select(back.array(), T(0)).matrix();
    }
  }
  return result;
}

template class MlpCpu<float>;
template class MlpCpu<double>;


namespace {

class FashionMnistCpuWorkload : public Workload {
 public:
  FashionMnistCpuWorkload(const FashionMnistWorkloadOptions& options, MlpLayout layout,
                          std::shared_ptr<const FashionMnist> data)
      : shard_(options.shard),
        data_(std::move(data)),
        sampler_(data_->train.count, shard_.seed, shard_.rank, shard_.world_size,
                 shard_.micro_batch),
        mlp_(std::move(layout), std::max(shard_.micro_batch, kMlpEvalChunk)),
        x_(static_cast<size_t>(mlp_.layout().inputs(0)) * mlp_.max_batch()),
        labels_(mlp_.max_batch()),
        indices_(mlp_.max_batch()) {}

  std::string name() const override {
    return absl::StrCat("fashion_mnist mlp ", absl::StrJoin(mlp_.layout().sizes(), "-"), " (cpu)");
  }
  size_t num_parameters() const override { return mlp_.layout().num_parameters(); }
  kernels::MemorySpace memory_space() const override { return kernels::MemorySpace::kHost; }

  absl::Status InitParameters(float* host_params, uint64_t seed) const override {
    InitMlpParameters(mlp_.layout(), seed, host_params);
    return absl::OkStatus();
  }

  absl::StatusOr<double> ComputeGradient(const float* params, int64_t step,
                                         float* grad_out) override {
    if (step < 1) return absl::InvalidArgumentError(absl::StrCat("step ", step, " is not >= 1"));
    const int64_t batch = shard_.micro_batch;
    sampler_.Indices(step, indices_.data());
    const MlpLayout& layout = mlp_.layout();
    ONEBIT_ASSIGN_OR_RETURN(
        MlpBatchResult r, RunOn(data_->train, batch, params, grad_out, [&](int l) {
          AnnounceGradient(layout.weights_offset(l), layout.weights_offset(l + 1));
        }));
    return r.loss_sum / static_cast<double>(batch);
  }

  std::vector<size_t> parameter_groups() const override {
    return mlp_.layout().tensor_offsets();
  }

  // One bucket per layer, the last layer first (the order backward finishes them).
  std::vector<ParamRange> gradient_buckets() const override {
    const MlpLayout& layout = mlp_.layout();
    std::vector<ParamRange> buckets;
    for (int l = layout.num_layers() - 1; l >= 0; --l) {
      buckets.push_back({layout.weights_offset(l), layout.weights_offset(l + 1)});
    }
    return buckets;
  }

  absl::StatusOr<EvalResult> Evaluate(const float* params) override {
    const LabeledImages& test = data_->test;
    MlpBatchResult total;
    for (int64_t first = 0; first < test.count; first += kMlpEvalChunk) {
      const int64_t n = std::min(kMlpEvalChunk, test.count - first);
      std::iota(indices_.begin(), indices_.begin() + n, first);
      ONEBIT_ASSIGN_OR_RETURN(MlpBatchResult r, RunOn(test, n, params, nullptr));
      total.loss_sum += r.loss_sum;
      total.correct += r.correct;
    }
    EvalResult result;
    result.examples = test.count;
    if (test.count > 0) {
      result.loss = total.loss_sum / static_cast<double>(test.count);
      result.accuracy = static_cast<double>(total.correct) / static_cast<double>(test.count);
    }
    return result;
  }

 private:
  // The MLP on the examples indices_[0..n) of `split`.
  absl::StatusOr<MlpBatchResult> RunOn(const LabeledImages& split, int64_t n, const float* params,
                                       float* grad,
                                       const std::function<void(int layer)>& layer_done = {}) {
    split.Gather(indices_.data(), n, x_.data());
    for (int64_t j = 0; j < n; ++j) labels_[j] = split.labels[indices_[j]];
    return mlp_.Run(params, x_.data(), labels_.data(), n, grad, layer_done);
  }

  const WorkloadShard shard_;
  const std::shared_ptr<const FashionMnist> data_;
  const BatchSampler sampler_;
  MlpCpu<float> mlp_;
  std::vector<float> x_;
  std::vector<uint8_t> labels_;
  std::vector<int64_t> indices_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Workload>> NewFashionMnistCpuWorkload(
    const FashionMnistWorkloadOptions& options, std::shared_ptr<const FashionMnist> data) {
  ONEBIT_RETURN_IF_ERROR(ValidateShard(options.shard));
  if (data == nullptr) return absl::InvalidArgumentError("no Fashion-MNIST data");
  if (data->train.count < 1) return absl::InvalidArgumentError("empty training set");
  if (options.precision != ComputePrecision::kFp32) {
    return absl::InvalidArgumentError(
        absl::StrCat("the CPU workload computes in fp32, not ",
                     ComputePrecisionName(options.precision)));
  }
  ONEBIT_ASSIGN_OR_RETURN(MlpLayout layout, FashionMnistLayout(options.hidden));
  if (layout.inputs(0) != data->train.pixels_per_image() ||
      layout.inputs(0) != data->test.pixels_per_image()) {
    return absl::InvalidArgumentError("Fashion-MNIST images are not 28x28");
  }
  return std::unique_ptr<Workload>(
      new FashionMnistCpuWorkload(options, std::move(layout), std::move(data)));
}

}  // namespace onebit
