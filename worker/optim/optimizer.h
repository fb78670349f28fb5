// What the trainer, the checkpoints and the tools ask of an optimizer, whichever it is:
// OnebitAdam (also "Adam": one that never freezes), ZeroOneAdam, OneBitLamb. Each is one
// worker's stage machine over an Exchange; all their state lives in the backend's memory.
//
// Stages: every optimizer starts in Stage::kWarmup (1-bit Adam's and 1-bit LAMB's warmup,
// 0/1 Adam's variance stage) and moves to Stage::kCompression after freeze_step() (1-bit
// Adam's and 1-bit LAMB's freeze_step, 0/1 Adam's var_freeze_step). The coordinator's
// leases move that step while it has not passed, the same on every worker.
//
// CHECKPOINTS. An optimizer lists the n-element tensors a checkpoint after the current
// step holds (CheckpointStates) and a few scalars (CheckpointScalars). A shared tensor has
// the same bits on every worker, so each worker saves a slice of it; a worker's own tensor
// (0/1 Adam's parameters between syncs) is saved whole by its worker. Restore takes them
// back by name.
//
// Thread safety: one thread at a time.
#ifndef ONEBIT_WORKER_OPTIM_OPTIMIZER_H_
#define ONEBIT_WORKER_OPTIM_OPTIMIZER_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/wire_dtype.h"
#include "worker/exchange/exchange.h"

namespace onebit {

enum class Stage { kWarmup, kCompression };
const char* StageName(Stage stage);

struct StateSpec {
  std::string name;  // "params", "exp_avg", "exp_avg_sq", ...
  bool shared = true;
};

// Named host copies of state tensors (n elements each) and scalars.
using StateTensors = std::map<std::string, std::vector<float>>;
using StateScalars = std::map<std::string, double>;

class Optimizer {
 public:
  virtual ~Optimizer() = default;

  // One step on this worker's local gradient (backend memory, n elements, not modified):
  // float32, or 16-bit where the optimizer shards its state (gradient.h;
  // FAILED_PRECONDITION elsewhere).
  virtual absl::Status Step(Gradient grad) = 0;
  // Whether Step would take `grad`'s dtype: OK for float32; FAILED_PRECONDITION with the
  // reason for a 16-bit gradient the optimizer cannot read in place.
  virtual absl::Status CheckGradient(const Gradient& grad) const = 0;
  // fp16's overflow: the next step is skipped. It counts as a step (step() and the stage,
  // the schedules and the exchange's step numbers move on, as they do on every worker)
  // but changes neither parameters nor moments nor error buffers, and sends nothing. 0/1
  // Adam's local window still counts its learning rate, so that a worker that skipped a
  // local step alone recovers the same momentum as the others at the next sync.
  virtual absl::Status SkipStep() = 0;

  // The stage the next Step() runs in.
  virtual Stage stage() const = 0;
  // Whether the next Step() sums the full-precision gradients (Exchange::SumGradients): the
  // trainer overlaps that sum with the gradient's computation. Every warmup step, by
  // default; 0/1 Adam's variance updates only.
  virtual bool sums_gradients() const { return stage() == Stage::kWarmup; }
  // Steps completed.
  virtual int64_t step() const = 0;
  // The last step of the warmup stage.
  virtual int64_t freeze_step() const = 0;
  // Moves it; FAILED_PRECONDITION once it has passed or when steps after it already ran.
  virtual absl::Status SetFreezeStep(int64_t freeze_step) = 0;
  // The learning rate of the steps that follow (a schedule's value; every worker alike).
  virtual void set_lr(float lr) = 0;
  virtual float lr() const = 0;
  // The betas of the steps that follow (OneCycle's momentum cycling; every worker alike).
  virtual void set_betas(float beta1, float beta2) = 0;
  // Each parameter group's weight decay for the steps that follow (a weight-decay schedule,
  // every worker alike): one value per group, in order (optim_checks.h's HyperGroup; one
  // group where the job has none). INVALID_ARGUMENT, and no change, for another count or a
  // value < 0 or not finite.
  virtual absl::Status set_weight_decays(const std::vector<double>& decays) = 0;
  virtual std::vector<double> weight_decays() const = 0;
  // The gradient-clipping norm of the steps that follow (0: off; gradient_clipper.h).
  virtual absl::Status set_max_grad_norm(double max_norm) = 0;

  virtual size_t size() const = 0;
  // SHARDED STATE (Exchange::state_shard): the parameters this worker keeps the moments
  // of, [state_begin(), state_begin() + state_count()); all of them unless sharded.
  virtual size_t state_begin() const { return 0; }
  virtual size_t state_count() const { return size(); }
  // Backend memory: the n parameters (null with low_params()); the variance of the
  // state_count() parameters from state_begin().
  virtual const float* params() const = 0;
  virtual const float* variance() const = 0;
  virtual absl::StatusOr<std::vector<float>> ParamsToHost() const = 0;
  // LOW-PRECISION PARAMETERS (optimizer_base.h): a sharded optimizer of a bf16 or fp16
  // model keeps the model's parameters here, backend memory, padded to the node's
  // pieces x stride elements of low_params_dtype() (2 bytes each); params() is then null.
  // Null and fp32 otherwise. Valid for the optimizer's life; written by each step.
  virtual const void* low_params() const { return nullptr; }
  virtual kernels::WireDtype low_params_dtype() const { return kernels::WireDtype::kFp32; }

  // The steps in [first, last] that will communicate, the next ones being first..last and
  // the warmup ending after `freeze_step`; nullopt for an optimizer whose every step does
  // (all but 0/1 Adam). The leases carry the coordinator's list to check against.
  virtual std::optional<std::vector<int64_t>> ExchangeSteps(int64_t /*first*/,
                                                            int64_t /*last*/,
                                                            int64_t /*freeze_step*/) const {
    return std::nullopt;
  }

  // Elements the momentum mask zeroes now (momentum_mask.h; 0 without one).
  virtual int64_t masked_elements() const { return 0; }

  // The bytes of the optimizer's own buffers in backend memory (device memory on GPUs):
  // p, its state and scratch, the momentum mask and the clipper's copy, as allocated now;
  // for metrics. The exchange's are Exchange::buffer_bytes(); host copies are not counted.
  virtual uint64_t state_bytes() const { return 0; }

  virtual Exchange& exchange() = 0;
  // Seconds Step() has spent inside the exchange's calls so far (its step_clock()).
  virtual double exchange_call_seconds() const = 0;

  // CHECKPOINTS (see above).
  virtual std::vector<StateSpec> CheckpointStates() const = 0;
  // Elements [begin, end) of a listed tensor, copied to host memory. A sharded optimizer
  // holds its shared tensors (but "params") only within its state range: INVALID_ARGUMENT
  // naming that range for any other.
  virtual absl::StatusOr<std::vector<float>> StateToHost(const std::string& name, size_t begin,
                                                         size_t end) const = 0;
  virtual StateScalars CheckpointScalars() const { return {}; }
  // Resumes after `step` of a run whose warmup ended after `freeze_step` (< 0 or >= step:
  // not yet; the leases decide as before). `states` holds every tensor CheckpointStates()
  // lists after that step, n elements each (a shared tensor: state_count() elements from
  // state_begin(), "params" too; a sharded optimizer then all-gathers the parameters inside
  // the node, a collective of every local rank); the error buffers live in the exchange
  // (Exchange::RestoreErrors). INVALID_ARGUMENT naming what is missing or of the wrong
  // size, leaving the state as it was.
  virtual absl::Status Restore(int64_t step, int64_t freeze_step, const StateTensors& states,
                               const StateScalars& scalars) = 0;
};

// states[name] with n elements, or INVALID_ARGUMENT naming it.
absl::StatusOr<const std::vector<float>*> FindState(const StateTensors& states,
                                                    const std::string& name, size_t n);

}  // namespace onebit

#endif  // ONEBIT_WORKER_OPTIM_OPTIMIZER_H_
