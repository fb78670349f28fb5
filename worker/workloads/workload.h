// What the training loop trains: a model with its data, seen as one flat parameter vector
// (so the optimizer sees one tensor) and a gradient source. Implementations: Fashion-MNIST
// MLP on the CPU (mlp_cpu.h) and on a GPU (mlp_cuda.h), and a synthetic gradient source
// for communication benchmarks (synthetic_workload.h).
//
// DATA SHARDS: a workload is built for one worker (WorkloadShard: rank, world size, micro
// batch, seed). The examples a worker uses at step t are a deterministic function of
// (seed, t, rank, world size, micro batch), so runs are reproducible and two optimizers
// given the same seed see the same samples.
//
// MEMORY: `params` and `grad_out` live in memory_space(): host memory for CPU workloads,
// device memory of the workload's CUDA backend for GPU ones. InitParameters always writes
// host memory (the optimizer uploads it).
//
// OVERLAP: a workload may announce, during ComputeGradient, that a range of grad_out is
// final (GradientListener), so that the exchange can move it while the rest is computed.
// The CPU MLP announces each layer as its backward pass finishes it; the synthetic and
// CUDA workloads announce nothing (see gradient_buckets()).
//
// THREAD SAFETY: one thread at a time (a workload owns scratch buffers).
#ifndef ONEBIT_WORKER_WORKLOADS_WORKLOAD_H_
#define ONEBIT_WORKER_WORKLOADS_WORKLOAD_H_

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "kernels/kernels.h"
#include "worker/exchange/gradient.h"
#include "worker/workloads/step_inputs.h"

namespace onebit {

// MIXED PRECISION. What a workload computes its forward and backward passes in. The
// parameters it is given, the gradients it writes and the optimizer's state stay fp32
// whatever this is (the fp32 "master" copy, docs/algorithms.md's numbers); only the CUDA
// workload computes in fp16 or bf16 (the job config's fp16 / bf16 blocks), the CPU ones
// always in fp32.
enum class ComputePrecision { kFp32, kFp16, kBf16 };

inline const char* ComputePrecisionName(ComputePrecision p) {
  switch (p) {
    case ComputePrecision::kFp16:
      return "fp16";
    case ComputePrecision::kBf16:
      return "bf16";
    case ComputePrecision::kFp32:
      break;
  }
  return "fp32";
}

struct WorkloadShard {
  int rank = 0;
  int world_size = 1;
  int64_t micro_batch = 64;  // examples per worker and step
  uint64_t seed = 1;
};

// Validates a shard: 0 <= rank < world_size, micro_batch >= 1.
inline absl::Status ValidateShard(const WorkloadShard& shard) {
  if (shard.world_size < 1 || shard.rank < 0 || shard.rank >= shard.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", shard.rank, " is not in a world of ", shard.world_size));
  }
  if (shard.micro_batch < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("micro batch must be >= 1, got ", shard.micro_batch));
  }
  return absl::OkStatus();
}

// Elements [begin, end) of the flat parameter (and gradient) vector.
struct ParamRange {
  size_t begin = 0;
  size_t end = 0;
  bool operator==(const ParamRange& o) const { return begin == o.begin && end == o.end; }
};

// Told during ComputeGradient that part of the gradient is final.
class GradientListener {
 public:
  virtual ~GradientListener() = default;
  // grad_out[begin, end) will not be written again by this ComputeGradient call. Called
  // on the thread that called ComputeGradient, which goes on computing as soon as this
  // returns (so: quick, and no calls back into the workload); an ExternalWorkload calls
  // it on its client's thread while ComputeGradient waits (one call at a time, after the
  // trainer's preparations for the step: the workload's lock orders them).
  virtual void GradientReady(size_t begin, size_t end) = 0;
};

struct EvalResult {
  double loss = 0.0;               // mean over the evaluation set
  std::optional<double> accuracy;  // fraction in [0, 1]; absent where it means nothing
  int64_t examples = 0;
};

class Workload {
 public:
  virtual ~Workload() = default;

  virtual std::string name() const = 0;
  virtual size_t num_parameters() const = 0;
  virtual kernels::MemorySpace memory_space() const = 0;

  // Writes the initial parameters (host memory, num_parameters() floats); the same seed
  // gives the same bits on every worker and machine.
  virtual absl::Status InitParameters(float* host_params, uint64_t seed) const = 0;

  // Gradient of this worker's loss at `step` (>= 1) on its micro batch, written to
  // grad_out (num_parameters() floats); returns that loss. Both pointers are in
  // memory_space(); on a GPU the call returns once grad_out is complete on the backend's
  // stream (the returned loss needs the result anyway).
  virtual absl::StatusOr<double> ComputeGradient(const float* params, int64_t step,
                                                 float* grad_out) = 0;
  // Whether the loss the last ComputeGradient returned is the model's: false where the
  // workload was given none (a training script that does not hand its loss to the
  // optimizer) and 0 stands in; the progress line, the metrics and the coordinator's
  // last_loss then leave it out.
  virtual bool loss_given() const { return true; }

  // A buffer of num_parameters() floats in memory_space() that this workload computes its
  // gradient into anyway: ComputeGradient(params, step, gradient_buffer()) then copies
  // nothing. The caller may read and change it as its step's gradient until it next calls
  // ComputeGradient (the trainer unscales fp16 gradients in place). Null (the default):
  // the workload writes grad_out itself, and the caller owns that buffer.
  virtual float* gradient_buffer() { return nullptr; }

  // A workload whose gradient stays in a 16-bit buffer of its own (gradient.h; the PyTorch
  // package's bfloat16 models with sharded state): that gradient, which
  // ComputeGradient(params, step, nullptr) fills, and which the caller only reads. nullopt
  // (the default): float32 gradients, as above.
  virtual std::optional<Gradient> low_precision_gradient() const { return std::nullopt; }

  // Loss (and accuracy where it means something) on the held-out set.
  virtual absl::StatusOr<EvalResult> Evaluate(const float* params) = 0;

  // A workload whose data can run out (a training script's loop, in a job without steps):
  // the last step it computed once it did; then ComputeGradient of later steps fails. In
  // ComputeGradient's numbering: with gradient accumulation, micro-batches.
  // nullopt (the default): it computes every step it is asked for.
  virtual std::optional<int64_t> ended_after() const { return std::nullopt; }

  // OVERLAP. The ranges a ComputeGradient call announces to the listener, in the order it
  // announces them: a partition of [0, num_parameters()), the same for every call and on
  // every rank (a function of the model, not of timing), so that every rank can exchange
  // them in this order. A workload that has them announces every one, in this order,
  // once per successful ComputeGradient (a failed call may stop announcing). Such a
  // workload does not use the backend inside ComputeGradient: the exchange does, on
  // another thread, meanwhile. Empty (the default): nothing is announced, the gradient is
  // final when ComputeGradient returns.
  virtual std::vector<ParamRange> gradient_buckets() const { return {}; }

  // The model's tensors, for optimizers with per-tensor quantities (1-bit LAMB's trust
  // ratios): the boundaries {0, e_1, ..., num_parameters()} of a partition into non-empty
  // ranges. Default: one tensor of everything.
  virtual std::vector<size_t> parameter_groups() const { return {0, num_parameters()}; }
  // What the forward and backward passes compute in (see ComputePrecision).
  virtual ComputePrecision precision() const { return ComputePrecision::kFp32; }

  // LOSS SCALING (fp16's dynamic loss scaling, worker/optim/loss_scaler.h). From the next
  // ComputeGradient on, the backward pass starts from `scale` times the loss's gradient, so
  // grad_out holds scale * gradient in fp32, with inf or NaN where the low-precision
  // backward pass overflowed; the returned loss is unscaled. The trainer divides the scale
  // back out and skips, on every worker alike, a step that overflowed anywhere. `scale` is
  // finite and > 0 (INVALID_ARGUMENT otherwise). Default: a workload that does not scale
  // accepts 1 only (FAILED_PRECONDITION otherwise).
  virtual absl::Status SetLossScale(float scale) {
    if (scale == 1.0f) return absl::OkStatus();
    return absl::FailedPreconditionError(absl::StrCat(
        "workload ", name(), " computes in fp32 and does not scale its loss (scale ", scale,
        " asked)"));
  }

  // What a training script set for workload step `step` (its learning rate, clipping norm,
  // betas, weight decays, gradient scale), once ComputeGradient of that step returned; the
  // trainer reads it at each optimizer step's last micro-batch and prefers it to the job's
  // schedule and fixed values. Default: nothing set.
  virtual StepInputs ScriptInputs(int64_t /*step*/) const { return {}; }

  // Workload step `step`'s optimizer step is over: it was skipped (an overflow on some
  // worker under loss scaling) or taken. Default: nothing.
  virtual void StepEnded(int64_t step, bool skipped) {}

  // Where announcements go; null (the default): nowhere. Borrowed.
  void set_gradient_listener(GradientListener* listener) { listener_ = listener; }

 protected:
  void AnnounceGradient(size_t begin, size_t end) {
    if (listener_ != nullptr) listener_->GradientReady(begin, end);
  }

 private:
  GradientListener* listener_ = nullptr;
};

// ---- Counter-based randomness shared by the workloads ----
//
// Pure functions of their inputs, the same on every platform (std:: distributions are not),
// so initial parameters and samples do not depend on the standard library.

// SplitMix64's finalizer: a bijective 64-bit mix with full avalanche.
inline uint64_t Mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

// A key from a key and one more input (order matters).
inline uint64_t HashCombine(uint64_t key, uint64_t value) {
  return Mix64(key ^ Mix64(value + 0x9e3779b97f4a7c15ULL));
}

// Uniform in [0, 1) from the top 53 bits.
inline double UniformDouble(uint64_t bits) {
  return static_cast<double>(bits >> 11) * (1.0 / 9007199254740992.0);
}

// Standard normal from two hashes of (key, i) by Box-Muller. Not for hot loops.
inline double NormalDouble(uint64_t key, uint64_t i) {
  const double u1 = 1.0 - UniformDouble(HashCombine(key, 2 * i));  // (0, 1]
  const double u2 = UniformDouble(HashCombine(key, 2 * i + 1));
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

}  // namespace onebit

#endif  // ONEBIT_WORKER_WORKLOADS_WORKLOAD_H_
