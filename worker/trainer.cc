#include "worker/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_format.h"
#include "common/permanent_error.h"
#include "common/status_macros.h"
#include "compression/worker_compressor.h"
#include "worker/optim/sliced_reductions.h"
#include "worker/workloads/step_inputs.h"

namespace onebit {
namespace {

// The optimizer's freeze step while no switch is scheduled.
constexpr int64_t kNeverFreeze = std::numeric_limits<int64_t>::max();

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void PrintToStdout(absl::string_view line) {
  // One write per line, so lines of workers sharing a process do not interleave.
  const std::string text = absl::StrCat(line, "\n");
  std::fwrite(text.data(), 1, text.size(), stdout);
  std::fflush(stdout);
}

// Overlap buckets below this many elements are merged with the next announced range (when
// adjacent): each bucket's exchange costs 2(W-1) SendRecv calls of its own, which a bucket
// of a few KB does not earn back (the MLP's output layer is 1,290 floats).
constexpr size_t kMinOverlapBucket = size_t{1} << 14;  // 64 KiB of fp32

// The workload's announcements, merged into the exchange's buckets, to the overlapped
// warmup's exchange thread.
class BucketForwarder : public GradientListener {
 public:
  // Groups consecutive `ranges` (the workload's, in announcement order) into buckets of at
  // least kMinOverlapBucket elements where they are adjacent in the buffer.
  BucketForwarder(OverlappedWarmup* exchange, std::vector<ParamRange> ranges)
      : exchange_(exchange), ranges_(std::move(ranges)), closes_(ranges_.size(), -1) {
    for (size_t i = 0; i < ranges_.size(); ++i) {
      const ParamRange& r = ranges_[i];
      if (i > 0) {
        ParamRange& cur = buckets_.back();
        const bool adjacent = r.end == cur.begin || r.begin == cur.end;
        if (adjacent && cur.end - cur.begin < kMinOverlapBucket) {
          cur = {std::min(cur.begin, r.begin), std::max(cur.end, r.end)};
          closes_[i - 1] = -1;
          closes_[i] = static_cast<int>(buckets_.size()) - 1;
          continue;
        }
      }
      buckets_.push_back(r);
      closes_[i] = static_cast<int>(buckets_.size()) - 1;
    }
  }

  const std::vector<ParamRange>& buckets() const { return buckets_; }
  // Before each ComputeGradient: the next announcement is the first range.
  void Reset() { next_ = 0; }

  void GradientReady(size_t begin, size_t end) override {
    if (next_ < ranges_.size() && ranges_[next_] == ParamRange{begin, end}) {
      const int closes = closes_[next_++];
      if (closes >= 0) exchange_->BucketReady(buckets_[closes].begin, buckets_[closes].end);
    } else {
      next_ = ranges_.size();
      exchange_->BucketReady(begin, end);  // out of order: the exchange fails the step
    }
  }

 private:
  OverlappedWarmup* const exchange_;
  const std::vector<ParamRange> ranges_;
  std::vector<int> closes_;  // per range: the bucket it completes, or -1
  std::vector<ParamRange> buckets_;
  size_t next_ = 0;
};

}  // namespace

// ---- StaticStepController ----

StaticStepController::StaticStepController(int64_t freeze_step, int64_t total_steps,
                                           int64_t lease_steps)
    : freeze_step_(freeze_step),
      total_steps_(total_steps),
      lease_steps_(std::max<int64_t>(1, lease_steps)) {}

absl::StatusOr<Lease> StaticStepController::Acquire(int64_t next_step) {
  ++acquisitions_;
  Lease lease;
  lease.freeze_step = freeze_step_;
  lease.stop_after_step = total_steps_;
  lease.through_step = std::min(total_steps_, next_step + lease_steps_ - 1);
  return lease;
}

absl::Status StaticStepController::Report(const StepReport& report) {
  ++reports_;
  if (report.variance_change.has_value()) variance_reports_.push_back(report);
  return absl::OkStatus();
}

// ---- Trainer ----

Trainer::Trainer(const TrainerOptions& options, Workload* workload, kernels::Backend* backend,
                 StepController* controller, TrainerMetricsSink* sink)
    : options_(options),
      workload_(workload),
      backend_(backend),
      controller_(controller),
      sink_(sink),
      clock_(options.clock != nullptr ? options.clock : StepClock::Real()) {
  if (!options_.print) options_.print = PrintToStdout;
}

absl::StatusOr<std::unique_ptr<Trainer>> Trainer::Create(
    const TrainerOptions& options, Workload* workload, kernels::Backend* backend,
    Exchange* exchange, StepController* controller, TrainerMetricsSink* sink) {
  if (exchange == nullptr) return absl::InvalidArgumentError("no exchange");
  std::unique_ptr<Trainer> trainer(new Trainer(options, workload, backend, controller, sink));
  ONEBIT_RETURN_IF_ERROR(trainer->Init(exchange, nullptr));
  return trainer;
}

absl::StatusOr<std::unique_ptr<Trainer>> Trainer::Create(
    const TrainerOptions& options, Workload* workload, kernels::Backend* backend,
    Transport* transport, StepController* controller, TrainerMetricsSink* sink) {
  if (transport == nullptr) return absl::InvalidArgumentError("no transport");
  std::unique_ptr<Trainer> trainer(new Trainer(options, workload, backend, controller, sink));
  ONEBIT_RETURN_IF_ERROR(trainer->Init(nullptr, transport));
  return trainer;
}

absl::Status Trainer::Init(Exchange* exchange, Transport* transport) {
  if (workload_ == nullptr || backend_ == nullptr || controller_ == nullptr) {
    return absl::InvalidArgumentError("the trainer needs a workload, a backend and a controller");
  }
  if (workload_->memory_space() != backend_->memory_space()) {
    return absl::InvalidArgumentError(absl::StrCat("workload ", workload_->name(), " and backend ",
                                                   backend_->name(),
                                                   " use different memory spaces"));
  }
  if (options_.log_every < 0 || options_.eval_every < 0 || options_.report_interval < 0) {
    return absl::InvalidArgumentError("log_every, eval_every and report_interval must be >= 0");
  }
  if (options_.gradient_accumulation_steps < 1) {
    return absl::InvalidArgumentError(absl::StrCat("gradient_accumulation_steps must be >= 1, got ",
                                                   options_.gradient_accumulation_steps));
  }
  const size_t n = workload_->num_parameters();
  std::vector<float> initial(n);
  ONEBIT_RETURN_IF_ERROR(workload_->InitParameters(initial.data(), options_.init_seed));
  OptimizerSpec spec = options_.optimizer;
  spec.freeze_step = kNeverFreeze;  // until a lease schedules the switch
  if (spec.group_offsets.empty()) spec.group_offsets = workload_->parameter_groups();
  if (exchange == nullptr) {
    ONEBIT_ASSIGN_OR_RETURN(owned_exchange_, PeerExchange::Create(backend_, transport, n));
    exchange = owned_exchange_.get();
  }
  ONEBIT_ASSIGN_OR_RETURN(optimizer_, CreateOptimizer(spec, backend_, exchange, initial.data(), n));
  built_weight_decays_ = optimizer_->weight_decays();
  low_grad_ = workload_->low_precision_gradient();
  if (low_grad_.has_value()) {
    // Read in place by the sharded exchange (gradient.h): nothing here may write it.
    const char* dtype = kernels::WireDtypeName(low_grad_->dtype);
    if (options_.gradient_accumulation_steps > 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "gradient_accumulation_steps ", options_.gradient_accumulation_steps, " with a ",
          dtype, " gradient buffer: the micro-batches are summed in float32; accumulate in "
                 "the script (backward() under `with opt.no_sync():` but the last)"));
    }
    if (options_.loss_scaling.has_value()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "fp16 loss scaling with a ", dtype,
          " gradient buffer: unscaling writes the gradient in float32; bf16 needs no loss "
          "scaling"));
    }
    ONEBIT_RETURN_IF_ERROR(optimizer_->CheckGradient(*low_grad_));
  }
  grad_data_ = options_.gradient_accumulation_steps == 1 ? workload_->gradient_buffer() : nullptr;
  if (grad_data_ == nullptr && !low_grad_.has_value()) {
    ONEBIT_ASSIGN_OR_RETURN(grad_, kernels::Buffer<float>::Create(backend_, n));
    grad_data_ = grad_.data();
  }
  if (options_.gradient_accumulation_steps > 1) {
    ONEBIT_ASSIGN_OR_RETURN(micro_grad_, kernels::Buffer<float>::Create(backend_, n));
  }
  optimizer_->exchange().set_step_clock(clock_);
  const int w = optimizer_->exchange().world_size();
  fp32_allreduce_bytes_ = RingAllReduceWireBytes(n * sizeof(float), w);
  sent_at_start_ = optimizer_->exchange().bytes_sent();
  // A fresh optimizer's variance is zero: v_0 is known without a copy.
  if (optimizer_->step() == 0) v_prev_step_ = 0;
  if (options_.loss_scaling.has_value()) {
    ONEBIT_ASSIGN_OR_RETURN(scaler_, LossScaler::Create(*options_.loss_scaling));
    ONEBIT_RETURN_IF_ERROR(workload_->SetLossScale(static_cast<float>(scaler_->scale())));
    summary_.loss_scale = scaler_->scale();
  }
  RecordStateBytes(/*first=*/true);
  const std::optional<StateShard> shard = optimizer_->exchange().state_shard();
  Print(absl::StrFormat(
      "memory: optimizer state %.1f MiB%s, exchange buffers %.1f MiB (backend memory, "
      "docs/performance.md#memory)",
      static_cast<double>(summary_.optimizer_state_bytes) / (1 << 20),
      shard.has_value() ? absl::StrFormat(" (sharded, slice %d of %d)", shard->piece + 1,
                                          shard->pieces)
                        : std::string(),
      static_cast<double>(summary_.exchange_buffer_bytes) / (1 << 20)));
  return InitOverlap();
}

void Trainer::RecordStateBytes(bool first) {
  const uint64_t optimizer = optimizer_->state_bytes();
  const uint64_t exchange = optimizer_->exchange().buffer_bytes();
  if (!first && optimizer == summary_.optimizer_state_bytes &&
      exchange == summary_.exchange_buffer_bytes) {
    return;
  }
  summary_.optimizer_state_bytes = optimizer;
  summary_.exchange_buffer_bytes = exchange;
  if (sink_ != nullptr) sink_->RecordStateBytes(optimizer, exchange);
}

absl::Status Trainer::InitOverlap() {
  OverlappedWarmup* overlap = options_.overlap;
  if (overlap == nullptr) return absl::OkStatus();
  if (options_.gradient_accumulation_steps > 1) {
    Print("exchange overlap: off, gradients are accumulated over micro batches first");
    return absl::OkStatus();
  }
  if (scaler_.has_value()) {
    Print("exchange overlap: off, fp16 loss scaling agrees on overflows before the exchange");
    return absl::OkStatus();
  }
  if (overlap->world_size() != optimizer_->exchange().world_size()) {
    return absl::InvalidArgumentError("the overlap exchange is not the trainer's exchange");
  }
  const std::vector<ParamRange> buckets = workload_->gradient_buckets();
  if (buckets.empty()) {
    Print(absl::StrCat("exchange overlap: off, workload ", workload_->name(),
                       " announces no gradient buckets (the warmup sum runs after it)"));
    return absl::OkStatus();
  }
  auto forwarder = std::make_unique<BucketForwarder>(overlap, buckets);
  if (!overlap->enabled()) {
    std::vector<std::pair<size_t, size_t>> ranges;
    for (const ParamRange& b : forwarder->buckets()) ranges.emplace_back(b.begin, b.end);
    ONEBIT_RETURN_IF_ERROR(overlap->Enable(ranges));
  }
  Print(absl::StrCat("exchange overlap: on, ", forwarder->buckets().size(),
                     " buckets from the workload's ", buckets.size(), " gradient ranges"));
  listener_ = std::move(forwarder);
  workload_->set_gradient_listener(listener_.get());
  return absl::OkStatus();
}

Trainer::~Trainer() {
  if (listener_ != nullptr) workload_->set_gradient_listener(nullptr);
}

absl::Status Trainer::ApplyLease(const Lease& lease, int64_t next_step) {
  if (lease.stop_after_step >= 0 && lease.stop_after_step < next_step) {
    lease_ = lease;  // the end of the job
    return absl::OkStatus();
  }
  if (lease.through_step < next_step) {
    return absl::FailedPreconditionError(absl::StrCat("lease through step ", lease.through_step,
                                                      " does not cover step ", next_step));
  }
  if (!options_.never_freeze) {
    const int64_t freeze = lease.freeze_step >= 0 ? lease.freeze_step : kNeverFreeze;
    if (freeze != optimizer_->freeze_step()) {
      ONEBIT_RETURN_IF_ERROR(optimizer_->SetFreezeStep(freeze));
    }
  }
  const std::optional<std::vector<int64_t>> mine =
      optimizer_->ExchangeSteps(next_step, lease.through_step, optimizer_->freeze_step());
  // A lease without a schedule (a fixed plan, or a coordinator of another optimizer) checks
  // nothing here.
  if (lease.exchange_steps.has_value() && mine != lease.exchange_steps) {
    auto list = [](const std::optional<std::vector<int64_t>>& s) {
      return s.has_value() ? absl::StrCat("[", absl::StrJoin(*s, ", "), "]")
                           : std::string("every step");
    };
    return absl::FailedPreconditionError(absl::StrCat(
        "steps ", next_step, "-", lease.through_step, " communicate at ", list(lease.exchange_steps),
        " in the coordinator's schedule but at ", list(mine),
        " in this worker's: the optimizer type or its params (var_update_scaler, "
        "local_step_scaler, local_step_clipper) differ between the configs"));
  }
  lease_ = lease;
  return absl::OkStatus();
}

absl::StatusOr<TrainerSummary> Trainer::Run() {
  while (true) {
    const int64_t t = optimizer_->step() + 1;
    auto ended = [&] { return lease_->stop_after_step >= 0 && t > lease_->stop_after_step; };
    if (lease_.has_value() && ended()) break;
    if (!lease_.has_value() || t > lease_->through_step) {
      ONEBIT_ASSIGN_OR_RETURN(Lease lease, controller_->Acquire(t));
      ONEBIT_RETURN_IF_ERROR(ApplyLease(lease, t));
      if (ended()) break;
    }
    const bool checkpoint = options_.checkpoints != nullptr &&
                            std::count(lease_->checkpoint_steps.begin(),
                                       lease_->checkpoint_steps.end(), t) > 0;
    if (checkpoint) optimizer_->exchange().ScheduleCheckpoint(t);
    if (absl::Status ran = RunStep(t); !ran.ok()) {
      // The workload's data ran out after the previous step (a script's loop ended in a job
      // without steps): that is this run's end, if the job agrees. The workload counts
      // micro-batches.
      const int64_t k = options_.gradient_accumulation_steps;
      const std::optional<int64_t> data_ended = workload_->ended_after();
      if (data_ended.has_value() && *data_ended > (t - 1) * k && *data_ended < t * k) {
        return MarkPermanent(absl::FailedPreconditionError(absl::StrFormat(
            "the training loop ended after micro-batch %d, inside step %d "
            "(gradient_accumulation_steps = %d micro-batches a step): end it after a whole "
            "step",
            *data_ended, t, k)), t);
      }
      if (data_ended != std::optional<int64_t>((t - 1) * k)) return ran;
      ONEBIT_RETURN_IF_ERROR(controller_->EndAfter(t - 1));
      Print(absl::StrFormat("the training loop ended after step %d: the job ends there", t - 1));
      break;
    }
    if (checkpoint) {
      const auto start = std::chrono::steady_clock::now();
      ONEBIT_RETURN_IF_ERROR(options_.checkpoints->Save(t, *optimizer_, CheckpointScalars()));
      const double seconds = SecondsSince(start);
      if (sink_ != nullptr) sink_->RecordCheckpoint(t, seconds);
      Print(absl::StrFormat("checkpoint after step %d: training paused %.1f ms", t, seconds * 1e3));
    }
    if (options_.eval_every > 0 && t % options_.eval_every == 0) {
      ONEBIT_RETURN_IF_ERROR(Evaluate(t));
    }
  }
  const int64_t last = optimizer_->step();
  if (options_.eval_at_end && last > 0 && last_eval_step_ != last) {
    ONEBIT_RETURN_IF_ERROR(Evaluate(last));
  }
  return summary_;
}

absl::StatusOr<double> Trainer::ComputeGradient(int64_t t) {
  const int64_t k = options_.gradient_accumulation_steps;
  if (k == 1) return workload_->ComputeGradient(optimizer_->params(), t, grad_data_);
  const size_t n = workload_->num_parameters();
  double loss_sum = 0.0;
  for (int64_t j = 0; j < k; ++j) {
    float* out = j == 0 ? grad_data_ : micro_grad_.data();
    ONEBIT_ASSIGN_OR_RETURN(double loss,
                            workload_->ComputeGradient(optimizer_->params(), (t - 1) * k + j + 1, out));
    loss_sum += loss;
    if (j > 0) ONEBIT_RETURN_IF_ERROR(backend_->Axpy(1.0f, micro_grad_.data(), grad_data_, n));
  }
  ONEBIT_RETURN_IF_ERROR(backend_->Scale(1.0f / static_cast<float>(k), grad_data_, n));
  return loss_sum / static_cast<double>(k);
}

StateScalars Trainer::CheckpointScalars() const {
  if (!scaler_.has_value()) return {};
  const LossScalerState& s = scaler_->state();
  return {{"loss_scale", s.scale},
          {"loss_scale_hysteresis_left", static_cast<double>(s.hysteresis_left)},
          {"loss_scale_updates", static_cast<double>(s.updates)},
          {"loss_scale_last_overflow", static_cast<double>(s.last_overflow)},
          {"loss_scale_overflows", static_cast<double>(s.overflows)}};
}

absl::Status Trainer::RestoreScalars(const StateScalars& scalars) {
  if (!scaler_.has_value() || scalars.count("loss_scale") == 0) return absl::OkStatus();
  LossScalerState s;
  auto get = [&scalars](const char* name, double* out) {
    auto it = scalars.find(name);
    if (it == scalars.end()) {
      return absl::InvalidArgumentError(absl::StrCat("the checkpoint has loss_scale but no ", name));
    }
    *out = it->second;
    return absl::OkStatus();
  };
  double left = 0, updates = 0, last = 0, overflows = 0;
  ONEBIT_RETURN_IF_ERROR(get("loss_scale", &s.scale));
  ONEBIT_RETURN_IF_ERROR(get("loss_scale_hysteresis_left", &left));
  ONEBIT_RETURN_IF_ERROR(get("loss_scale_updates", &updates));
  ONEBIT_RETURN_IF_ERROR(get("loss_scale_last_overflow", &last));
  ONEBIT_RETURN_IF_ERROR(get("loss_scale_overflows", &overflows));
  for (double v : {left, updates, last, overflows}) {
    if (!(std::abs(v) < 9e15) || v != std::floor(v)) {
      return absl::InvalidArgumentError(absl::StrCat("loss scaler counter ", v, " is not an integer"));
    }
  }
  s.hysteresis_left = static_cast<int>(left);
  s.updates = static_cast<int64_t>(updates);
  s.last_overflow = static_cast<int64_t>(last);
  s.overflows = static_cast<int64_t>(overflows);
  ONEBIT_RETURN_IF_ERROR(scaler_->Restore(s));
  ONEBIT_RETURN_IF_ERROR(workload_->SetLossScale(static_cast<float>(scaler_->scale())));
  summary_.loss_scale = scaler_->scale();
  return absl::OkStatus();
}

absl::StatusOr<std::pair<bool, bool>> Trainer::UnscaleAndAsk(int64_t t, double loss,
                                                             double scale) {
  const size_t n = workload_->num_parameters();
  const Gradient grad = StepGradient();
  if (scale != 1.0) {
    if (!grad.is_fp32()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "a loss scale (torch's GradScaler, scale ", scale, ") with a ",
          kernels::WireDtypeName(grad.dtype),
          " gradient buffer (a bf16 model with sharded state): unscaling would write the "
          "gradient in float32; bf16 needs no loss scaling, so drop the GradScaler"));
    }
    ONEBIT_RETURN_IF_ERROR(backend_->Scale(static_cast<float>(1.0 / scale), grad_data_, n));
  }
  double sumsq = 0.0;
  ONEBIT_RETURN_IF_ERROR(backend_->SumSquaresWire(grad.dtype, grad.data, n, &sumsq));
  const bool local = !std::isfinite(sumsq) || !std::isfinite(loss);
  Exchange& exchange = optimizer_->exchange();
  bool any = local;
  if (exchange.world_size() > 1) {
    const std::optional<std::vector<int64_t>> talks =
        optimizer_->ExchangeSteps(t, t, optimizer_->freeze_step());
    if (!talks.has_value() || !talks->empty()) {
      ScopedStepTime time(clock_, &agree_seconds_);
      ONEBIT_ASSIGN_OR_RETURN(any, exchange.AnyOverflow(t, local));
    }
  }
  return std::make_pair(local, any);
}

absl::StatusOr<bool> Trainer::UnscaleAndAgree(int64_t t, double loss) {
  const double scale = scaler_->scale();
  ONEBIT_ASSIGN_OR_RETURN(const auto verdict, UnscaleAndAsk(t, loss, scale));
  const auto [local, any] = verdict;
  if (any && scaler_->dynamic() && scaler_->scale() <= options_.loss_scaling->min_loss_scale) {
    return MarkPermanent(absl::FailedPreconditionError(absl::StrCat(
        "fp16: the gradient of step ", t, " overflowed",
        local ? "" : " on another worker", " at the minimum loss scale ", scale,
        " (fp16.min_loss_scale): the training diverged, or needs bf16 or a lower learning rate")),
        t);
  }
  scaler_->Update(any);
  if (scaler_->scale() != scale) {
    ONEBIT_RETURN_IF_ERROR(workload_->SetLossScale(static_cast<float>(scaler_->scale())));
  }
  summary_.loss_scale = scaler_->scale();
  if (any) ++summary_.skipped_steps;
  return any;
}

namespace {

// FNV-1a over `chain`'s and the doubles' bytes; 0 never comes out (StepReport::hyper_digest).
uint64_t HyperDigest(uint64_t chain, const std::vector<double>& values) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (int i = 0; i < 8; ++i) h = (h ^ ((chain >> (8 * i)) & 0xff)) * 0x100000001b3ull;
  for (double v : values) {
    unsigned char bytes[sizeof(double)];
    std::memcpy(bytes, &v, sizeof(v));
    for (unsigned char b : bytes) h = (h ^ b) * 0x100000001b3ull;
  }
  return h == 0 ? 1 : h;
}

}  // namespace

absl::Status Trainer::SetStepHypers(int64_t t, const StepInputs& script, StepReport& report) {
  const double lr = script.lr.has_value()     ? *script.lr
                    : options_.learning_rate ? options_.learning_rate(t)
                                             : options_.optimizer.hyper.lr;
  if (!(lr >= 0) || !std::isfinite(lr)) {
    return absl::InvalidArgumentError(
        absl::StrCat("the learning-rate schedule gives ", lr, " for step ", t));
  }
  optimizer_->set_lr(static_cast<float>(lr));
  // What every worker must step alike (StepReport::hyper_digest), in this order: lr, beta1,
  // beta2, clipping norm, each parameter group's weight decay.
  std::vector<double> hypers = {optimizer_->lr(), options_.optimizer.hyper.beta1,
                                options_.optimizer.hyper.beta2, options_.optimizer.max_grad_norm};
  hypers[3] = script.max_grad_norm.value_or(options_.optimizer.max_grad_norm);
  const absl::Status clipping = optimizer_->set_max_grad_norm(hypers[3]);
  if (!clipping.ok()) return clipping;
  if (script.betas.has_value() || options_.betas) {
    const auto [beta1, beta2] = script.betas.has_value() ? *script.betas : options_.betas(t);
    if (!(beta1 >= 0 && beta1 < 1) || !(beta2 >= 0 && beta2 < 1)) {
      return absl::InvalidArgumentError(
          absl::StrCat("the momentum schedule gives betas ", beta1, ", ", beta2, " for step ", t));
    }
    optimizer_->set_betas(static_cast<float>(beta1), static_cast<float>(beta2));
    hypers[1] = beta1;
    hypers[2] = beta2;
  } else {
    optimizer_->set_betas(options_.optimizer.hyper.beta1, options_.optimizer.hyper.beta2);
  }
  const absl::Status decayed = optimizer_->set_weight_decays(
      script.weight_decays.has_value() ? *script.weight_decays : built_weight_decays_);
  if (!decayed.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the weight-decay schedule for step ", t, ": ", decayed.message()));
  }
  for (double decay : optimizer_->weight_decays()) hypers.push_back(decay);
  report.lr = optimizer_->lr();
  hyper_chain_ = HyperDigest(hyper_chain_, hypers);
  report.hyper_digest = hyper_chain_;
  return absl::OkStatus();
}

absl::Status Trainer::RunStep(int64_t t) {
  Exchange& exchange = optimizer_->exchange();
  StepReport report;
  report.step = t;
  report.stage = optimizer_->stage();
  const uint64_t sent_before = exchange.bytes_sent();
  const uint64_t received_before = exchange.bytes_received();
  const LinkBytes inter_before = exchange.inter_node_bytes();

  // Overlap: the exchange thread sums the buckets the workload announces while it computes.
  OverlappedWarmup* const overlap =
      listener_ != nullptr && optimizer_->sums_gradients() && exchange.world_size() > 1
          ? options_.overlap
          : nullptr;
  const double busy_before = overlap != nullptr ? overlap->busy_seconds() : 0.0;
  // On an error before the optimizer's sum, the buckets already handed over finish (or
  // time out) before the error is returned: the exchange thread never outlives the step.
  auto abandon = [&](absl::Status status) {
    if (overlap != nullptr) overlap->End().IgnoreError();
    return status;
  };

  const double start = clock_->Seconds();
  if (overlap != nullptr) {
    static_cast<BucketForwarder*>(listener_.get())->Reset();
    ONEBIT_RETURN_IF_ERROR(overlap->Begin(t, grad_data_));
  }
  absl::StatusOr<double> loss = ComputeGradient(t);
  if (!loss.ok()) return abandon(loss.status());
  // Each value after the gradient (TrainerOptions' SCRIPT VALUES): the script's for the
  // step's last micro-batch, else the schedule's, else the optimizer's own.
  const StepInputs script = workload_->ScriptInputs(t * options_.gradient_accumulation_steps);
  if (absl::Status set = SetStepHypers(t, script, report); !set.ok()) return abandon(set);
  report.loss = *loss;
  report.loss_given = workload_->loss_given();
  const double computed = clock_->Seconds();
  report.compute_seconds = computed - start;
  const std::optional<double> script_scale = script.grad_scale;
  if (script_scale.has_value() && listener_ != nullptr) {
    return abandon(absl::FailedPreconditionError(
        "a script's loss scaler (torch's GradScaler) with the warmup exchange overlapping "
        "backward(): the workers agree on overflows before the exchange; build the optimizer "
        "with overlap=False"));
  }
  if (script_scale.has_value()) {
    // The script's own scaler decides the scale; every worker skips alike.
    report.loss_scale = *script_scale;
    agree_seconds_ = 0.0;
    ONEBIT_ASSIGN_OR_RETURN(const auto verdict,
                            UnscaleAndAsk(t, report.loss_given ? report.loss : 0.0,
                                          *script_scale));
    report.skipped = verdict.second;
    summary_.loss_scale = *script_scale;
    if (report.skipped) ++summary_.skipped_steps;
  } else if (scaler_.has_value()) {
    report.loss_scale = scaler_->scale();
    agree_seconds_ = 0.0;
    ONEBIT_ASSIGN_OR_RETURN(report.skipped, UnscaleAndAgree(t, report.loss));
  } else if (!std::isfinite(report.loss)) {
    // Continuing would only spread NaNs through the exchange. The usual cause in the
    // compression stage is a frozen variance with (near-)zero entries: u = m / (sqrt(v) +
    // eps) blows up where the compressed momentum is nonzero.
    return abandon(MarkPermanent(absl::FailedPreconditionError(absl::StrCat(
        "training diverged: the loss is ", report.loss, " at step ", t, " (",
        StageName(report.stage),
        report.stage == Stage::kCompression
            ? "); parameters whose variance froze at ~0 get large updates from the compressed "
              "momentum: lower optimizer.params.update_clip (2 or 1; 0 turns it off), raise "
              "eps, freeze later, or mask them"
            : "); lower the learning rate")),
        t));
  }
  if (report.loss_given) {
    std::optional<std::string> warning = divergence_.Observe(
        t, report.stage == Stage::kCompression, report.loss, options_.optimizer.hyper.eps,
        options_.optimizer.hyper.update_clip);
    if (warning.has_value()) Print(*warning);
  }
  const double compress_before = exchange.compress_seconds();
  const double call_before = optimizer_->exchange_call_seconds();
  const kernels::Backend::HostTransfers moved_before = backend_->host_transfers();
  // The optimizer's warmup sum closes the overlapped exchange (the exchange's SumGradients).
  const absl::Status stepped_ok =
      report.skipped ? optimizer_->SkipStep() : optimizer_->Step(StepGradient());
  if (!stepped_ok.ok()) return abandon(stepped_ok);
  workload_->StepEnded(t * options_.gradient_accumulation_steps, report.skipped);
  ONEBIT_RETURN_IF_ERROR(backend_->Synchronize());  // GPU work done: the time is real
  const kernels::Backend::HostTransfers moved = backend_->host_transfers();
  report.device_bytes_to_host = moved.to_host - moved_before.to_host;
  report.device_bytes_from_host = moved.from_host - moved_before.from_host;
  report.device_copy_seconds = std::max(0.0, moved.seconds - moved_before.seconds);
  if (overlap != nullptr) {
    report.overlapped_exchange_seconds = overlap->busy_seconds() - busy_before;
  }
  const double stepped = clock_->Seconds() - computed;
  // Nested intervals on one monotonic clock: compress within the exchange call, the call
  // within the optimizer step. The clamps only guard against a clock that is not.
  // The overflow agreement is exchange time too.
  const double call =
      std::max(0.0, optimizer_->exchange_call_seconds() - call_before) + agree_seconds_;
  report.compress_seconds =
      std::clamp(exchange.compress_seconds() - compress_before, 0.0, call);
  report.exchange_seconds = call - report.compress_seconds;
  report.update_seconds = std::max(0.0, stepped - call);

  report.bytes_sent = exchange.bytes_sent() - sent_before;
  report.bytes_received = exchange.bytes_received() - received_before;
  report.inter_node_bytes_sent = exchange.inter_node_bytes().sent - inter_before.sent;
  report.inter_node_bytes_received = exchange.inter_node_bytes().received - inter_before.received;
  if (report.bytes_sent > 0) {
    report.compression_ratio =
        static_cast<double>(fp32_allreduce_bytes_) / static_cast<double>(report.bytes_sent);
  }
  ONEBIT_ASSIGN_OR_RETURN(report.variance_change, VarianceChange(t, report.stage));
  report.masked_elements = optimizer_->masked_elements();
  const bool log_line = options_.log_every > 0 && t % options_.log_every == 0;
  if (report.stage == Stage::kCompression && log_line) {
    ONEBIT_ASSIGN_OR_RETURN(report.error_norm, exchange.worker_compressor().ErrorNorm());
  }

  AddToSummary(report);
  RecordStateBytes(/*first=*/false);

  ONEBIT_RETURN_IF_ERROR(controller_->Report(report));
  if (sink_ != nullptr) sink_->RecordStep(report);

  LogProgress(report, log_line);
  return absl::OkStatus();
}

void Trainer::AddToSummary(const StepReport& report) {
  const int64_t t = report.step;
  StageTotals& totals = report.stage == Stage::kWarmup ? summary_.warmup : summary_.compression;
  ++totals.steps;
  if (report.bytes_sent > 0) ++totals.steps_communicated;
  totals.bytes_sent += report.bytes_sent;
  totals.bytes_received += report.bytes_received;
  totals.inter_node_bytes_sent += report.inter_node_bytes_sent;
  totals.device_bytes_to_host += report.device_bytes_to_host;
  totals.device_bytes_from_host += report.device_bytes_from_host;
  totals.seconds += report.seconds();
  totals.compute_seconds += report.compute_seconds;
  totals.compress_seconds += report.compress_seconds;
  totals.exchange_seconds += report.exchange_seconds;
  totals.update_seconds += report.update_seconds;
  totals.device_copy_seconds += report.device_copy_seconds;
  summary_.last_step = t;
  if (report.loss_given) summary_.last_loss = report.loss;
  if (report.stage == Stage::kCompression && summary_.first_compression_step < 0) {
    summary_.first_compression_step = t;
    if (report.masked_elements > 0 || options_.optimizer.auto_mask_zero_gradients) {
      Print(absl::StrFormat("momentum mask: %d of %d parameters masked from step %d%s",
                            report.masked_elements, optimizer_->size(), t,
                            options_.optimizer.auto_mask_zero_gradients
                                ? " (with those whose gradient stayed exactly zero through warmup)"
                                : ""));
    }
  }
}

void Trainer::LogProgress(const StepReport& report, bool log_line) {
  const int64_t t = report.step;
  if (report.loss_given) {
    window_loss_ += report.loss;
    ++window_loss_steps_;
  }
  window_seconds_ += report.seconds();
  ++window_steps_;
  if (log_line) {
    const std::string of_total =
        options_.total_steps > 0 ? absl::StrCat("/", options_.total_steps) : "";
    const double sent_mb =
        static_cast<double>(optimizer_->exchange().bytes_sent() - sent_at_start_) / 1e6;
    const std::string scaling =
        scaler_.has_value() ? absl::StrFormat("  loss scale %g  skipped %d", scaler_->scale(),
                                              summary_.skipped_steps)
                            : "";
    // A script that hands the optimizer no loss gets no loss here (not a 0).
    const std::string loss_part =
        window_loss_steps_ > 0
            ? absl::StrFormat("  loss %.4f", window_loss_ / window_loss_steps_)
            : std::string();
    Print(absl::StrFormat("step %d%s%s  stage %s  step %.1f ms  sent %.1f MB%s", t, of_total,
                          loss_part, StageName(report.stage),
                          1e3 * window_seconds_ / window_steps_, sent_mb, scaling));
    window_loss_ = window_seconds_ = 0.0;
    window_steps_ = window_loss_steps_ = 0;
  }
}

absl::StatusOr<std::optional<double>> Trainer::VarianceChange(int64_t t, Stage stage) {
  const int64_t k = options_.report_interval;
  // Only warmup moves the variance; once it is frozen the statistic means nothing.
  if (k == 0 || stage == Stage::kCompression) {
    std::vector<float>().swap(v_prev_);  // give the memory back
    std::vector<float>().swap(v_now_);
    v_prev_step_ = -1;
    return std::optional<double>();
  }
  if (t % k != 0) return std::optional<double>();
  // Host copies: every k warmup steps, one read of v (cheap next to k steps of training).
  // Sharded, v is the state range's only.
  const size_t n = optimizer_->size();
  const size_t begin = optimizer_->state_begin(), count = optimizer_->state_count();
  v_now_.resize(count);
  ONEBIT_RETURN_IF_ERROR(
      backend_->CopyToHost(v_now_.data(), optimizer_->variance(), count * sizeof(float)));
  std::optional<double> change;
  if (v_prev_step_ == t - k) {
    if (v_prev_.empty()) v_prev_.assign(count, 0.0f);  // v_0 = 0
    // Per slice of the exchange, added in slice order (sliced_reductions.h): the same bits
    // from a worker that holds one slice of v and gathers the others' partials.
    Exchange& exchange = optimizer_->exchange();
    const size_t stride = exchange.reduction_stride();
    if (!exchange.state_shard().has_value()) {
      change = RelativeChange(
          RelativeChangePartials(v_now_.data(), v_prev_.data(), 0, CutAtStride({0, n}, stride)));
    } else {
      const ChangePartials mine = RelativeChangePartials(
          v_now_.data(), v_prev_.data(), begin, CutAtStride({0, n}, stride, {begin, begin + count}));
      ONEBIT_ASSIGN_OR_RETURN(const std::vector<double> all,
                              exchange.GatherPartials({AddInOrder(mine.diff),
                                                       AddInOrder(mine.norm)}));
      ONEBIT_ASSIGN_OR_RETURN(std::vector<std::vector<double>> by_slice,
                              PartialsBySlice(all, 2));  // slice by slice, in local-rank order
      change = RelativeChange({std::move(by_slice[0]), std::move(by_slice[1])});
    }
  }
  v_prev_.swap(v_now_);
  v_prev_step_ = t;
  return change;
}

absl::Status Trainer::Evaluate(int64_t t) {
  ONEBIT_ASSIGN_OR_RETURN(EvalResult result, workload_->Evaluate(optimizer_->params()));
  last_eval_step_ = t;
  summary_.final_eval = result;
  std::string line = absl::StrFormat("eval step %d  test loss %.4f", t, result.loss);
  if (result.accuracy.has_value()) {
    absl::StrAppend(&line, absl::StrFormat("  test accuracy %.2f%%", 100.0 * *result.accuracy));
  }
  Print(line);
  if (sink_ != nullptr) sink_->RecordEval(t, result);
  return absl::OkStatus();
}

void Trainer::Print(const std::string& line) const { options_.print(line); }

}  // namespace onebit
