// A workload whose gradients come from outside the trainer: another thread of the same
// process hands them in, step by step (the Python package: PyTorch computes them, see
// python/onebit). The trainer runs on its own thread and calls ComputeGradient as usual;
// the call waits for the client's gradient of that step.
//
//   client thread                              trainer thread
//   WaitForStep() -> t  <--------------------  ComputeGradient(params, t, grad_out) waits
//   (forward/backward into gradient())
//   Supply(t, inputs) -----------------------> copies gradient() into grad_out, returns loss
//   WaitForStep() -> t+1 (the update of step t is in params() by then)
//
// Thread safety: the trainer calls the Workload methods from one thread; the client's
// methods may be called from any one other thread.
#ifndef ONEBIT_WORKER_WORKLOADS_EXTERNAL_WORKLOAD_H_
#define ONEBIT_WORKER_WORKLOADS_EXTERNAL_WORKLOAD_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "kernels/buffer.h"
#include "kernels/kernels.h"
#include "worker/workloads/step_inputs.h"
#include "worker/workloads/workload.h"

namespace onebit {

struct ExternalWorkloadOptions {
  std::string name = "external";
  // The initial parameters (every worker must pass the same; the trainer checks nothing).
  // Shared, not copied: the PyTorch package's EmbeddedWorker keeps the same vector for the
  // job's restarts, and at 7B one fp32 copy is 26 GiB of host memory.
  std::shared_ptr<const std::vector<float>> initial;
  // Boundaries {0, e_1, ..., n} of the model's tensors (Workload::parameter_groups); empty:
  // one tensor.
  std::vector<size_t> groups;
  // OVERLAP: empty, or a partition of [0, n) in the order the client's backward pass
  // finishes them (gradient_buckets()). The client announces each bucket of the step it
  // computes as soon as its part of gradient() is final, in that order:
  //
  //   WaitForStep() -> t
  //   (backward ...) Announce(t, 0) ---------->  copies bucket 0 into grad_out, tells the
  //   (backward ...) Announce(t, 1) ---------->  listener (the trainer's overlapped exchange
  //   ...                                        starts on it while backward goes on)
  //   Supply(t, inputs) -----------------------> announces the buckets not announced yet
  //
  // so ComputeGradient copies nothing at its end. The copies are host memcpys on the
  // client's thread (the exchange thread owns the backend meanwhile): buckets need host
  // memory.
  std::vector<ParamRange> buckets;
  // The gradient buffer's elements: float32, or bfloat16 (2 bytes: the bf16 models of a
  // sharded job, whose .grad tensors view it; Workload::low_precision_gradient). A 16-bit
  // buffer takes no buckets and no loss scaling (the trainer refuses those).
  kernels::WireDtype gradient_dtype = kernels::WireDtype::kFp32;
};

class ExternalWorkload : public Workload {
 public:
  // INVALID_ARGUMENT for no parameters, bad groups or bad buckets (or buckets on a GPU).
  // `backend` is borrowed.
  static absl::StatusOr<std::unique_ptr<ExternalWorkload>> Create(ExternalWorkloadOptions options,
                                                                  kernels::Backend* backend);

  // ---- Workload (the trainer's thread) ----
  std::string name() const override { return name_; }
  size_t num_parameters() const override { return initial_->size(); }
  kernels::MemorySpace memory_space() const override { return backend_->memory_space(); }
  absl::Status InitParameters(float* host_params, uint64_t seed) const override;
  absl::StatusOr<double> ComputeGradient(const float* params, int64_t step,
                                         float* grad_out) override;
  bool loss_given() const override;
  // The client evaluates its model itself: FAILED_PRECONDITION (turn evaluation off).
  absl::StatusOr<EvalResult> Evaluate(const float* params) override;
  std::vector<size_t> parameter_groups() const override { return groups_; }
  std::vector<ParamRange> gradient_buckets() const override { return buckets_; }
  // fp16 loss scaling (Workload::SetLossScale): the client scales its loss by loss_scale()
  // before backward; the trainer sets it before it asks for the next step.
  // INVALID_ARGUMENT unless finite and > 0.
  absl::Status SetLossScale(float scale) override;
  // What Supply handed in with `step` while `step` is the last step supplied; nothing set
  // for any other step.
  StepInputs ScriptInputs(int64_t step) const override;

  // ---- The client's thread ----
  // The step whose gradient the trainer waits for; -1 once the trainer finished (OK), or
  // its error. UNAVAILABLE at `deadline`.
  absl::StatusOr<int64_t> WaitForStep(absl::Time deadline = absl::InfiniteFuture());
  // The gradient of the step WaitForStep returned is in gradient(); `inputs` are what the
  // script set for it (StepInputs: its loss, lr, clipping norm, betas, weight decays and
  // gradient scale; unset fields leave the job's). FAILED_PRECONDITION when the trainer is
  // not waiting for `step`; INVALID_ARGUMENT for a value out of range (ValidateStepInputs),
  // after which the step may be supplied again. ScriptInputs(step) returns them.
  absl::Status Supply(int64_t step, StepInputs inputs);
  // The trainer's word on step `step` (Workload::StepEnded); skipped(step): whether it was
  // skipped (false for a step not ended yet).
  void StepEnded(int64_t step, bool skipped) override;
  bool skipped(int64_t step) const;
  // OVERLAP: gradient()'s part of bucket `bucket` is final for `step` (the step WaitForStep
  // returned): it goes to the trainer now. FAILED_PRECONDITION when the trainer does not
  // wait for `step`, when `bucket` is not the next one (the buckets go in order, each once
  // a step) or when there are no buckets.
  absl::Status Announce(int64_t step, size_t bucket);
  // The first element of gradient() that differs (bitwise) from what the buckets announced
  // for the waiting step carried: a gradient changed after it went to the exchange. -1
  // when none did (or nothing was announced).
  int64_t ChangedSinceAnnounced();
  // The script's loop ended after `step` (the last it supplied): the trainer's wait for a
  // later step returns OUT_OF_RANGE, and ended_after() says `step`.
  absl::Status EndAfter(int64_t step);
  std::optional<int64_t> ended_after() const override;
  // The client is gone: the waiting or next ComputeGradient fails with `why` (CANCELLED
  // if OK), so the worker stops and the coordinator hears of it, instead of waiting for a
  // gradient that never comes. Idempotent.
  void Close(absl::Status why);
  // This workload's own n-element buffer (backend memory) that the client writes (its
  // gradient tensors view it). Without buckets it is also gradient_buffer(): a trainer
  // that passes it as grad_out gets the client's gradient with no copy (the client's
  // tensors then hold what the trainer left there, the unscaled gradient under fp16 loss
  // scaling); otherwise ComputeGradient copies it into grad_out, once per step.
  float* gradient() { return gradient_.data(); }
  // The buffer the client writes, whatever its dtype (gradient() or the 16-bit one).
  void* gradient_bytes() {
    return low_precision() ? static_cast<void*>(gradient16_.data()) : gradient_.data();
  }
  kernels::WireDtype gradient_dtype() const { return gradient_dtype_; }
  // What the client multiplies its loss by before backward (1 without loss scaling): the
  // scale the trainer set for the step WaitForStep returned.
  float loss_scale() const;
  // gradient() without buckets (their copies go into the trainer's buffer), else null.
  // Null for a 16-bit buffer: low_precision_gradient() then.
  float* gradient_buffer() override {
    return buckets_.empty() && !low_precision() ? gradient_.data() : nullptr;
  }
  std::optional<Gradient> low_precision_gradient() const override;
  // The optimizer's parameter vector the trainer steps (zero copies: the client's tensors
  // view it): known once the trainer asked for a step (or SetParams); null before, and
  // null for an optimizer whose parameters are low precision (Optimizer::low_params).
  float* params();
  void SetParams(const float* params);
  // Whether the trainer has asked for a step (or SetParams was called).
  bool asked() const;

  // ---- The trainer's side, at its end ----
  // Tells the client that the trainer is done (OK: the job ended; else its error).
  void Finish(absl::Status status);

 private:
  ExternalWorkload(ExternalWorkloadOptions options, kernels::Backend* backend,
                   kernels::Buffer<float> gradient, kernels::Buffer<uint16_t> gradient16);

  kernels::Backend* const backend_;
  const std::string name_;
  const std::shared_ptr<const std::vector<float>> initial_;  // never null
  const std::vector<size_t> groups_;
  const std::vector<ParamRange> buckets_;
  // The gradient's dtype decides which of the two buffers holds it (the other is empty).
  const kernels::WireDtype gradient_dtype_;
  kernels::Buffer<float> gradient_;       // float32: n elements; 16-bit: none
  kernels::Buffer<uint16_t> gradient16_;  // 16-bit: n elements; float32: none
  bool low_precision() const { return gradient_dtype_ != kernels::WireDtype::kFp32; }

  // Copies bucket `bucket` into the waiting trainer's buffer and tells the listener.
  void AnnounceLocked(size_t bucket) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  const float* params_ ABSL_GUARDED_BY(mu_) = nullptr;
  bool asked_ ABSL_GUARDED_BY(mu_) = false;  // ComputeGradient or SetParams came
  float* grad_out_ ABSL_GUARDED_BY(mu_) = nullptr;  // the waiting ComputeGradient's
  size_t announced_ ABSL_GUARDED_BY(mu_) = 0;       // buckets of wanted_ announced
  int64_t wanted_ ABSL_GUARDED_BY(mu_) = 0;    // the step the trainer waits for; 0: none
  int64_t supplied_ ABSL_GUARDED_BY(mu_) = 0;  // the last step supplied
  StepInputs inputs_ ABSL_GUARDED_BY(mu_);  // supplied_'s
  float loss_scale_ ABSL_GUARDED_BY(mu_) = 1.0f;
  int64_t ended_after_ ABSL_GUARDED_BY(mu_) = -1;  // EndAfter's step; -1: not ended
  int64_t skipped_step_ ABSL_GUARDED_BY(mu_) = -1;  // the last step StepEnded skipped
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status close_status_ ABSL_GUARDED_BY(mu_);
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status finish_status_ ABSL_GUARDED_BY(mu_);
};

}  // namespace onebit

#endif  // ONEBIT_WORKER_WORKLOADS_EXTERNAL_WORKLOAD_H_
