// The training loop of one worker: a Workload's gradients through OnebitAdam, in steps
// granted by a StepController (the coordinator's leases, or a fixed plan), with progress
// lines, periodic evaluation, the variance-change statistic for automatic freezing, and
// per-stage byte accounting.
//
// Each step t (numbered from 1):
//   1. if t is past the current lease, Acquire(t); apply its freeze step to the optimizer
//      (every worker gets the same leases, so every worker switches at the same step);
//      stop if the lease says the job ended before t. Never runs past a lease.
//   2. compute the gradient, then the optimizer Step; the time splits into compute,
//      compress, exchange and update (StepReport), read from TrainerOptions::clock;
//   3. build a StepReport and give it to the controller and the metrics sink;
//   4. print progress and eval lines (TrainerOptions::log_every, eval_every).
//
// Optimizer "Adam" is OnebitAdam that never freezes (TrainerOptions::never_freeze). The
// others (worker/optim/optimizer_factory.h) switch stage where the leases say: 1-bit Adam
// freezes the variance, 0/1 Adam ends its variance stage.
//
// Thread safety: one thread at a time. Everything passed to Create is borrowed and must
// outlive the trainer.
#ifndef ONEBIT_WORKER_TRAINER_H_
#define ONEBIT_WORKER_TRAINER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/buffer.h"
#include "kernels/kernels.h"
#include "worker/divergence_watch.h"
#include "worker/exchange/exchange.h"
#include "worker/exchange/overlapped_warmup.h"
#include "worker/exchange/peer_exchange.h"
#include "worker/exchange/step_clock.h"
#include "worker/optim/loss_scaler.h"
#include "worker/optim/optimizer.h"
#include "worker/optim/optimizer_factory.h"
#include "worker/transport/transport.h"
#include "worker/workloads/workload.h"

namespace onebit {

// What a worker may run: the stage is settled through `through_step`.
struct Lease {
  int64_t through_step = 0;
  // Last warmup step, when a switch is scheduled; < 0: none scheduled (warmup goes on). A
  // later lease may move or drop a switch that has not happened yet.
  int64_t freeze_step = -1;
  // The job ends after this step; < 0: not known yet.
  int64_t stop_after_step = -1;
  // Steps of this lease after which the trainer hands its state to the CheckpointSink.
  std::vector<int64_t> checkpoint_steps;
  // 0/1 Adam: the steps of this lease that communicate, from the coordinator's schedule
  // (Optimizer::ExchangeSteps); the trainer stops with an error when its optimizer's
  // differ. Not set: nothing to check (every step communicates, or a fixed plan).
  std::optional<std::vector<int64_t>> exchange_steps;
};

// Where checkpoints go (worker/checkpointer.h writes parts and reports them).
class CheckpointSink {
 public:
  virtual ~CheckpointSink() = default;
  // The state after `step`, before step + 1 runs: the optimizer's, and the trainer's own
  // scalars (Trainer::CheckpointScalars, the same on every worker). An error ends the run.
  virtual absl::Status Save(int64_t step, Optimizer& optimizer,
                            const StateScalars& trainer_scalars) = 0;
};

// One finished step, as the controller and the metrics see it.
struct StepReport {
  int64_t step = 0;
  Stage stage = Stage::kWarmup;
  double loss = 0.0;  // this worker's micro batch
  bool loss_given = true;  // false: the workload had none (Workload::loss_given); loss is 0
  // The step time split; each >= 0, summing to the step.
  double compute_seconds = 0.0;
  // Compression with error feedback and server-side aggregation on this worker, as the
  // Exchange reports it.
  double compress_seconds = 0.0;
  // The rest of the exchange call: transport, waiting for peers or shards.
  double exchange_seconds = 0.0;
  // The rest of the step: the optimizer update, fused with decompression in the
  // compression stage; the backend is synchronized at its end, so GPU times are real.
  double update_seconds = 0.0;
  double seconds() const {
    return compute_seconds + compress_seconds + exchange_seconds + update_seconds;
  }
  // With overlap: seconds spent on this step's buckets, on the exchange thread in parallel
  // with compute and, for what was left, inside exchange_seconds. Not part of seconds().
  double overlapped_exchange_seconds = 0.0;
  uint64_t bytes_sent = 0;      // during this step
  uint64_t bytes_received = 0;  // during this step
  // The part of those between nodes (Exchange::inter_node_bytes: all of it for a flat
  // exchange, the compressed slice traffic for a hierarchical one).
  uint64_t inter_node_bytes_sent = 0;
  uint64_t inter_node_bytes_received = 0;
  // What the optimizer's step (its exchange and update) copied from the backend's memory
  // to the host and back (Backend::host_transfers): PCIe on a GPU, 0 on the CPU.
  uint64_t device_bytes_to_host = 0;
  uint64_t device_bytes_from_host = 0;
  // The seconds of those copies: part of compress_seconds and exchange_seconds (PCIe).
  double device_copy_seconds = 0.0;
  // What an fp32 ring allreduce of the gradient would send, 2*(W-1)/W * 4 * n bytes, over
  // bytes_sent; 0 when nothing was sent (one worker).
  double compression_ratio = 0.0;
  // ||v_t - v_{t-k}|| / ||v_t|| with k = report_interval, on warmup steps t divisible by k.
  std::optional<double> variance_change;
  // L2 norm of the worker error, on compression steps that print a progress line.
  std::optional<double> error_norm;
  // Parameters the optimizer's momentum mask zeroes after this step.
  int64_t masked_elements = 0;
  // fp16 (TrainerOptions::loss_scaling): the scale this step's loss was multiplied by, and
  // whether the step was skipped because its gradient overflowed on some worker. 0 and
  // false without loss scaling.
  double loss_scale = 0.0;
  bool skipped = false;
  // What every worker must step alike: this step's learning rate, and a digest of every
  // step's lr, betas, param groups' weight decays and clipping norm so far in this run (a
  // chain: a difference at any step shows in every later digest; never 0), which the
  // coordinator compares between workers at the steps they report (a schedule computed
  // from one rank's own numbers would train the replicas apart).
  double lr = 0.0;
  uint64_t hyper_digest = 0;
};

// Where leases come from: the coordinator (a gRPC client) or a fixed plan.
class StepController {
 public:
  virtual ~StepController() = default;
  // A lease that covers next_step (through_step >= next_step), or one that ends the job
  // before it (0 <= stop_after_step < next_step). May block while the lease is being
  // decided. An error ends the run with that error.
  virtual absl::StatusOr<Lease> Acquire(int64_t next_step) = 0;
  // Called after every step, in order; implementations may forward only part (say, the
  // variance changes) or batch. An error ends the run.
  virtual absl::Status Report(const StepReport& report) = 0;
  // This worker's training loop ended after `last_step` (the workload's data ran out in a
  // job without steps): the job must end there for every worker.
  virtual absl::Status EndAfter(int64_t /*last_step*/) {
    return absl::FailedPreconditionError("this job's steps are fixed: it cannot end early");
  }
};

// A fixed plan for single-process runs and tests: freeze after `freeze_step` (< 0: never),
// stop after `total_steps`, leases of `lease_steps` steps. Thread safety: one thread.
class StaticStepController : public StepController {
 public:
  StaticStepController(int64_t freeze_step, int64_t total_steps, int64_t lease_steps = 10);

  absl::StatusOr<Lease> Acquire(int64_t next_step) override;
  absl::Status Report(const StepReport& report) override;

  // For tests.
  int acquisitions() const { return acquisitions_; }
  int64_t reports() const { return reports_; }
  const std::vector<StepReport>& variance_reports() const { return variance_reports_; }

 private:
  const int64_t freeze_step_, total_steps_, lease_steps_;
  int acquisitions_ = 0;
  int64_t reports_ = 0;
  std::vector<StepReport> variance_reports_;  // the reports with a variance change
};

// Receives what the trainer measures (the Prometheus metrics implement it; tests record).
class TrainerMetricsSink {
 public:
  virtual ~TrainerMetricsSink() = default;
  virtual void RecordStep(const StepReport& report) = 0;
  virtual void RecordEval(int64_t step, const EvalResult& result) = 0;
  // A checkpoint part written after `step`, taking `seconds` of the training thread.
  virtual void RecordCheckpoint(int64_t /*step*/, double /*seconds*/) {}
  // The bytes of the optimizer's buffers (Optimizer::state_bytes) and the exchange's
  // (Exchange::buffer_bytes): once when the trainer is made, then after a step that changed
  // them (buffers made on first use).
  virtual void RecordStateBytes(uint64_t /*optimizer*/, uint64_t /*exchange*/) {}
};

struct TrainerOptions {
  // The optimizer's type, lr, betas, eps, weight decay, momentum mask. Its freeze_step is
  // ignored: the leases say when to switch.
  OptimizerSpec optimizer;
  // Optimizer "Adam": full precision throughout; freeze steps in leases are ignored.
  bool never_freeze = false;
  uint64_t init_seed = 1;   // Workload::InitParameters
  int64_t total_steps = 0;  // shown as "step t/total"; 0: unknown. Does not stop.
  // Every log_every steps one line; loss and step time are means over the steps since the
  // last line, "sent" is every byte this worker sent since the trainer was made (1 MB =
  // 10^6 bytes). 0: no progress lines.
  //   step 120/600  loss 0.4123  stage warmup  step 41.2 ms  sent 12.4 MB
  int64_t log_every = 20;
  // Every eval_every steps (and after the last, with eval_at_end) one line. 0: no
  // periodic evaluation.
  //   eval step 600  test loss 0.4012  test accuracy 85.31%
  int64_t eval_every = 0;
  bool eval_at_end = true;
  // k of the variance change, reported every k warmup steps; 0: not computed.
  int64_t report_interval = 10;
  // SCRIPT VALUES: what Workload::ScriptInputs gives for step t's last micro-batch comes
  // first: its lr and betas before the schedules below, its clipping norm before
  // optimizer.max_grad_norm, its weight decays before the optimizer's own. Its gradient
  // scale (a GradScaler's factor) is divided out, and every worker skips alike a step whose
  // gradient overflowed anywhere (loss_scaling's scaler then goes unused for that step).
  // The learning rate of step t (the job config's scheduler), asked once the step's
  // gradient is in; null: optimizer.hyper.lr.
  std::function<double(int64_t step)> learning_rate;
  // The betas of step t (OneCycle's momentum cycling), likewise; null: optimizer.hyper's.
  std::function<std::pair<double, double>(int64_t step)> betas;
  // Micro batches per step (the job config's gradient_accumulation_steps): step t
  // averages the workload's gradients of micro steps (t-1)*k + 1 .. t*k, in that order,
  // before the optimizer sees it; the step's loss is their mean. With k > 1 the warmup
  // exchange does not overlap the backward pass.
  int64_t gradient_accumulation_steps = 1;
  // Where progress and eval lines go, one call per line (no newline). Default: stdout.
  std::function<void(absl::string_view line)> print;
  // Takes the checkpoints the leases ask for; null: none are taken (the leases' steps are
  // ignored). Borrowed.
  CheckpointSink* checkpoints = nullptr;
  // The clock of the step-time split (also given to the exchange); null: steady_clock.
  // Borrowed.
  StepClock* clock = nullptr;
  // OVERLAP (the job config's exchange.overlap): the overlapped warmup of the
  // exchange given to Create (a PeerExchange's or a WorkersWarmupExchange's, that exchange
  // or one it wraps). Its warmup sums then run bucket by bucket during the backward pass,
  // on the buckets the workload announces (Workload::gradient_buckets; a workload without
  // them runs as without overlap). The parameters get the same bits either way. Null: no
  // overlap. Borrowed. The step's "compute" is then the workload's call, with the buckets
  // exchanged beside it (hidden); "exchange" is what the optimizer still waits for after
  // it (the buckets not started by then run on the training thread, inside it).
  OverlappedWarmup* overlap = nullptr;
  // fp16's LOSS SCALING (the job config's fp16 block, for a workload that computes in
  // fp16): the workload scales its loss (Workload::SetLossScale) and each step
  //   1. divides the scale back out of the gradient and checks it for inf/NaN (a
  //      non-finite loss counts as an overflow too);
  //   2. on a step that communicates (every step but 0/1 Adam's local ones), agrees with
  //      every other worker through Exchange::AnyOverflow, so that all skip alike; a local
  //      step decides alone;
  //   3. skips the step when it overflowed (Optimizer::SkipStep: the counters, the leases
  //      and the schedules move on, nothing else does), and updates the LossScaler.
  // An overflow at the minimum dynamic scale ends the run (FAILED_PRECONDITION), on every
  // worker at the same step. Overlap is then off (the warmup's sum would start before the
  // agreement). Null: no scaling; a non-finite loss ends the run.
  std::optional<LossScalerOptions> loss_scaling;
};

struct StageTotals {
  int64_t steps = 0;
  int64_t steps_communicated = 0;  // steps that sent anything (0/1 Adam's local steps do not)
  uint64_t bytes_sent = 0;
  uint64_t bytes_received = 0;
  uint64_t inter_node_bytes_sent = 0;  // part of bytes_sent
  uint64_t device_bytes_to_host = 0;    // StepReport's, summed
  uint64_t device_bytes_from_host = 0;
  double seconds = 0.0;  // compute + compress + exchange + update
  // StepReport's split, summed (device_copy within compress + exchange).
  double compute_seconds = 0.0;
  double compress_seconds = 0.0;
  double exchange_seconds = 0.0;
  double update_seconds = 0.0;
  double device_copy_seconds = 0.0;
  double bytes_sent_per_step() const { return steps > 0 ? double(bytes_sent) / steps : 0.0; }
  double bytes_received_per_step() const {
    return steps > 0 ? double(bytes_received) / steps : 0.0;
  }
};

struct TrainerSummary {
  StageTotals warmup;
  StageTotals compression;
  int64_t last_step = 0;
  int64_t first_compression_step = -1;  // -1: never compressed
  double last_loss = 0.0;
  std::optional<EvalResult> final_eval;  // the last evaluation
  // With loss scaling: the steps skipped for an overflow, and the scale of the next step.
  int64_t skipped_steps = 0;
  double loss_scale = 0.0;
  // The optimizer's and the exchange's buffers (TrainerMetricsSink::RecordStateBytes), as
  // of the last step.
  uint64_t optimizer_state_bytes = 0;
  uint64_t exchange_buffer_bytes = 0;
};

class Trainer {
 public:
  // `sink` may be null. The workload, backend and exchange must share a memory space.
  static absl::StatusOr<std::unique_ptr<Trainer>> Create(
      const TrainerOptions& options, Workload* workload, kernels::Backend* backend,
      Exchange* exchange, StepController* controller, TrainerMetricsSink* sink = nullptr);
  // The same over a PeerExchange on `transport` (owned by the optimizer).
  static absl::StatusOr<std::unique_ptr<Trainer>> Create(
      const TrainerOptions& options, Workload* workload, kernels::Backend* backend,
      Transport* transport, StepController* controller, TrainerMetricsSink* sink = nullptr);

  // Runs steps until the controller's lease ends the job; returns the totals so far.
  // Another call continues from the next step.
  absl::StatusOr<TrainerSummary> Run();

  ~Trainer();

  Optimizer& optimizer() { return *optimizer_; }
  // The trainer's own state for checkpoints: fp16's loss scaler ("loss_scale",
  // "loss_scale_hysteresis_left", "loss_scale_updates", "loss_scale_last_overflow",
  // "loss_scale_overflows"); empty without loss scaling.
  StateScalars CheckpointScalars() const;
  // Puts back what CheckpointScalars gave (a resumed job), before Run. Without loss scaling
  // nothing is needed; a checkpoint without them (a job that did not scale) leaves the
  // scaler fresh. INVALID_ARGUMENT for values no scaler has; nothing changes then.
  absl::Status RestoreScalars(const StateScalars& scalars);
  const TrainerSummary& summary() const { return summary_; }
  // Whether warmup exchanges overlap the backward pass (TrainerOptions::overlap was given
  // and the workload announces buckets).
  bool overlapping() const { return listener_ != nullptr; }

 private:
  Trainer(const TrainerOptions& options, Workload* workload, kernels::Backend* backend,
          StepController* controller, TrainerMetricsSink* sink);
  absl::Status Init(Exchange* exchange, Transport* transport);
  absl::Status InitOverlap();
  absl::Status ApplyLease(const Lease& lease, int64_t next_step);
  absl::Status RunStep(int64_t step);
  // The step's lr, betas, clipping norm and weight decays into the optimizer (the script's,
  // else the schedule's, else the built ones), and their digest into `report`.
  absl::Status SetStepHypers(int64_t step, const StepInputs& script, StepReport& report);
  // A finished step into summary_ (its stage's totals, the first compression step).
  void AddToSummary(const StepReport& report);
  // The optimizer's and exchange's buffer bytes into summary_, and to the sink when they
  // changed (or `first`).
  void RecordStateBytes(bool first);
  // The progress line every log_every steps (`log_line`), averaged over the steps since.
  void LogProgress(const StepReport& report, bool log_line);
  // The step's gradient into grad_ (accumulated over micro batches); its loss.
  absl::StatusOr<double> ComputeGradient(int64_t step);
  // Loss scaling: unscales grad_, agrees on an overflow, updates the scaler; whether the
  // step is skipped.
  absl::StatusOr<bool> UnscaleAndAgree(int64_t step, double loss);
  // Divides the gradient by `scale` and asks every worker whether its gradient (or loss)
  // overflowed: (this worker's, any worker's).
  absl::StatusOr<std::pair<bool, bool>> UnscaleAndAsk(int64_t step, double loss, double scale);
  // The variance change after step `step` (run in `stage`), when one is due.
  absl::StatusOr<std::optional<double>> VarianceChange(int64_t step, Stage stage);
  absl::Status Evaluate(int64_t step);
  void Print(const std::string& line) const;

  TrainerOptions options_;
  Workload* const workload_;
  kernels::Backend* const backend_;
  StepController* const controller_;
  TrainerMetricsSink* const sink_;
  StepClock* const clock_;
  std::unique_ptr<Exchange> owned_exchange_;  // the PeerExchange made over a Transport
  std::unique_ptr<Optimizer> optimizer_;
  std::vector<double> built_weight_decays_;  // optimizer_'s at creation (SCRIPT VALUES)
  std::optional<LossScaler> scaler_;
  DivergenceWatch divergence_;  // the compression stage's blow-up, said once
  double agree_seconds_ = 0.0;  // this step's Exchange::AnyOverflow call
  uint64_t hyper_chain_ = 0;    // StepReport::hyper_digest of the last step
  // The step's gradient: the workload's gradient_buffer() where it has one and micro
  // batches are not accumulated (no copy a step), else grad_.
  float* grad_data_ = nullptr;
  // The workload's own 16-bit gradient (Workload::low_precision_gradient), read in place:
  // then grad_data_ is null. StepGradient(): what the optimizer steps on.
  std::optional<Gradient> low_grad_;
  Gradient StepGradient() const { return low_grad_.has_value() ? *low_grad_ : Gradient(grad_data_); }
  kernels::Buffer<float> grad_;
  kernels::Buffer<float> micro_grad_;  // gradient accumulation's scratch
  // Forwards the workload's announcements to options_.overlap; null: no overlap.
  std::unique_ptr<GradientListener> listener_;
  uint64_t fp32_allreduce_bytes_ = 0;  // per step, for the compression ratio

  std::optional<Lease> lease_;
  uint64_t sent_at_start_ = 0;
  TrainerSummary summary_;
  int64_t last_eval_step_ = -1;

  // Progress lines: means since the last line.
  double window_loss_ = 0.0, window_seconds_ = 0.0;
  int64_t window_steps_ = 0, window_loss_steps_ = 0;  // the latter: steps with a loss

  // The variance at step v_prev_step_ (host copy), for the variance change.
  std::vector<float> v_prev_, v_now_;
  int64_t v_prev_step_ = -1;  // -1: no usable copy
};

}  // namespace onebit

#endif  // ONEBIT_WORKER_TRAINER_H_
