// onebit's worker and coordinator embedded in a training process: what the Python package
// (python/onebit) runs through its C interface (python/c_api.h). No Python and no torch
// here: the parameters and gradients cross as raw memory (host addresses on the CPU, device
// addresses on a GPU), and every call answers with an absl::Status.
#ifndef ONEBIT_PYTHON_EMBEDDED_H_
#define ONEBIT_PYTHON_EMBEDDED_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/job_coordinator.h"
#include "python/optimizer_state.h"
#include "worker/exchange/exchange.h"
#include "worker/optim/optimizer.h"
#include "worker/trainer.h"
#include "worker/worker_process.h"
#include "worker/workloads/external_workload.h"
#include "worker/workloads/step_inputs.h"

namespace onebit {

// A whole onebit worker (worker_process.h: registration, leases, the exchange, /metrics,
// checkpoints) on a thread of its own, over an ExternalWorkload whose gradients the
// training script hands in. Thread safety: every method may be called from any thread; the
// script calls them from its own, the worker thread runs the job.
class EmbeddedWorker {
 public:
  // `options` without a workload factory and hooks (made here); `initial`: the model's
  // parameters, flat; `groups`: the tensors' boundaries; `buckets`: the overlap's
  // announcement order (empty: none); `loaded`: a state loaded before the first step.
  static absl::StatusOr<std::unique_ptr<EmbeddedWorker>> Create(
      WorkerProcessOptions options, std::vector<float> initial, std::vector<size_t> groups,
      std::vector<ParamRange> buckets, std::optional<OptimizerState> loaded);
  ~EmbeddedWorker();  // closes the workload and joins the worker thread

  absl::Status Start();

  // The next step to compute, -1 when the job is over for this worker; the worker's error
  // once it ended with one. UNAVAILABLE when nothing came by the deadline.
  absl::StatusOr<int64_t> WaitForStep(double timeout_s);

  // Step `step`'s gradient is in place; `inputs`: what the script set for it
  // (ExternalWorkload::Supply).
  absl::Status Supply(int64_t step, StepInputs inputs);
  // Whether step `step` was skipped (an overflow on some worker under loss scaling).
  absl::StatusOr<bool> Skipped(int64_t step);
  // Overlap: bucket `bucket` of step `step`'s gradient is final.
  absl::Status Announce(int64_t step, size_t bucket);
  // What the script multiplies its loss by before backward (1 without fp16 loss scaling).
  absl::StatusOr<float> LossScale();
  // The first element of the gradient changed after its bucket was announced, or -1.
  absl::StatusOr<int64_t> ChangedSinceAnnounced();
  // The script's loop ended after `step` (a job without steps): the worker ends there.
  absl::Status EndAfter(int64_t step);
  void Close(const std::string& why);

  // Whether the worker thread ended by the deadline; then its exit code (0, 2 for a bad
  // argument, else 1) and status text.
  std::optional<std::pair<int, std::string>> Join(double timeout_s);
  // Fails the job for a reason no restart fixes; the exit code the verdict asks for (78).
  int FailJob(const std::string& why, int64_t step);
  // The verdict after the worker's error: (75 restart, 78 failed, else 1; the reason).
  MemberVerdict VerdictAfterFailure();
  // The script raised (`why`) after `step`: the job recovers at once, naming this worker.
  void ReportRestartableExit(const std::string& why, int64_t step);

  // The optimizer's parameters and this worker's gradient buffer (host or device memory,
  // as cuda() says; valid while the worker runs). The gradient is null where it is bf16
  // (GradientBuffer).
  absl::StatusOr<std::pair<float*, float*>> Buffers();
  // The gradient buffer the script's .grad tensors view, with its format: float32
  // (Buffers()'s), or bf16 for a bf16 model with sharded state (2 bytes an element).
  absl::StatusOr<std::pair<void*, kernels::WireDtype>> GradientBuffer();
  // The model's parameters as the optimizer keeps them: its low-precision buffer
  // (Optimizer::low_params: bf16 or fp16, padded; host or device memory as cuda() says;
  // valid while the worker runs) with its format, or Buffers()'s fp32 parameters and fp32.
  // The parameters of Buffers() are null in the first case.
  absl::StatusOr<std::pair<const void*, kernels::WireDtype>> ParamBuffer();
  // The parameters at the end of the job, once it ended, copied into `out` (n floats):
  // no copy in between (at 7B one is 26 GiB of host memory). INVALID_ARGUMENT for another
  // n, FAILED_PRECONDITION before the end.
  absl::Status FinalParams(float* out, size_t n);
  // The state between two steps, or after the last step once the job is over: whole, or
  // a sharded worker's state range (optimizer_state.h).
  absl::StatusOr<OptimizerState> StateDict();
  // The whole state between two steps, gathered inside the node on a sharded worker
  // (GatherOptimizerState: a collective of the node's workers, every local rank at the
  // same step); StateDict's on an unsharded one, after the job's end too. A sharded
  // worker's after the end: FAILED_PRECONDITION (its node's workers are gone).
  absl::StatusOr<OptimizerState> GatheredStateDict();
  // Elements [begin, end) of each state tensor but the parameters, with the step; a
  // sharded worker has them within its state range only (its scalars "state_begin" and
  // "state_end" say which).
  absl::StatusOr<OptimizerState> StateSlice(int64_t begin, int64_t end);
  // Puts back a state of the same step, whole or of this worker's state range; nothing
  // changes when it does not fit. A sharded worker's is a collective of its node's workers
  // (RestoreOptimizerState): every local rank loads at the same step.
  absl::Status LoadStateDict(const OptimizerState& state);

  int rank();
  int world_size();
  bool cuda();
  size_t size() const { return initial_->size(); }

 private:
  EmbeddedWorker(WorkerProcessOptions options, std::vector<float> initial,
                 std::vector<size_t> groups, std::vector<ParamRange> buckets,
                 std::optional<OptimizerState> loaded);
  static constexpr int64_t kAgain = -2;
  absl::StatusOr<int64_t> WaitSlice(absl::Time deadline);
  absl::StatusOr<Optimizer*> RunningOptimizer() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const WorkerProcessOptions options_;
  const std::vector<size_t> groups_;
  const std::vector<ParamRange> buckets_;
  const std::optional<OptimizerState> loaded_;
  // Shared with each run's ExternalWorkload (no copy); never null.
  const std::shared_ptr<const std::vector<float>> initial_;
  // The worker's membership, for the verdict after its run failed (thread-safe); destroyed
  // after thread_ is joined.
  WorkerMember member_;
  std::thread thread_;
  absl::Mutex mu_;
  std::vector<float> final_params_ ABSL_GUARDED_BY(mu_);  // after_run's copy
  std::optional<OptimizerState> final_state_ ABSL_GUARDED_BY(mu_);  // likewise
  Trainer* trainer_ ABSL_GUARDED_BY(mu_) = nullptr;  // from before_run to the teardown
  ExternalWorkload* workload_ ABSL_GUARDED_BY(mu_) = nullptr;
  // The workload's backend (GatheredStateDict's staging buffer), from the workload factory
  // to the teardown.
  kernels::Backend* backend_ ABSL_GUARDED_BY(mu_) = nullptr;
  int waiting_ ABSL_GUARDED_BY(mu_) = 0;      // WaitSlice calls using workload_ outside mu_
  bool ending_ ABSL_GUARDED_BY(mu_) = false;  // the teardown has begun
  // The job's word that ended this worker's part (WorkerProcessOptions::on_verdict): the
  // script's next wait fails with it, and VerdictAfterFailure gives it.
  std::optional<MemberVerdict> verdict_ ABSL_GUARDED_BY(mu_);
  int rank_ ABSL_GUARDED_BY(mu_) = -1;
  int world_size_ ABSL_GUARDED_BY(mu_) = 0;
  bool cuda_ ABSL_GUARDED_BY(mu_) = false;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
};

// The coordinator rank 0 runs when no coordinator is named (job_coordinator.h, the same
// code as onebit-coordinator).
class EmbeddedCoordinator {
 public:
  static absl::StatusOr<std::unique_ptr<EmbeddedCoordinator>> Start(
      const std::string& config, const std::string& host, int port, int rest_port,
      int metrics_port, const std::string& code_digest, const std::string& job_key);
  ~EmbeddedCoordinator() { Close(); }

  std::string address() const;
  std::string rest_address() const;
  std::string metrics_address() const;
  // "running", "succeeded", "failed" (failure_reason() says why) or "closed".
  std::string Poll();
  std::string failure_reason();
  void Abandon(const std::string& reason);  // fails a job that is not over
  void Recover(const std::string& reason);  // starts a recovery of a running job
  // Stops the coordinator once the members still connected have heard the job's state
  // and gone (they end their sessions when the job ends, fails or recovers), waiting at
  // most 5 s for them.
  void Close();

 private:
  explicit EmbeddedCoordinator(std::unique_ptr<JobCoordinator> job) : job_(std::move(job)) {}
  std::unique_ptr<JobCoordinator> job_;
};

}  // namespace onebit

#endif  // ONEBIT_PYTHON_EMBEDDED_H_
