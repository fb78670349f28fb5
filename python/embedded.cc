#include "python/embedded.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/permanent_error.h"
#include "common/status_macros.h"
#include "config/job_config.h"
#include "security/flags.h"

namespace onebit {
namespace {

// The trainer's optimizer state as host copies (the trainer between two steps).
absl::StatusOr<OptimizerState> Save(Trainer& trainer) {
  ONEBIT_ASSIGN_OR_RETURN(OptimizerState state, SaveOptimizerState(trainer.optimizer()));
  state.trainer = trainer.CheckpointScalars();
  return state;
}

// Puts a state into a trainer. Everything is checked before anything changes. With
// keep_errors false the error buffers stay as they are (zero at a job's start): the
// state's are another worker's, or of another topology.
absl::Status RestoreState(Trainer& trainer, const OptimizerState& s, bool keep_errors) {
  ONEBIT_RETURN_IF_ERROR(RestoreOptimizerState(trainer.optimizer(), s, keep_errors));
  return trainer.RestoreScalars(s.trainer);
}

absl::Status NotRunning() { return absl::FailedPreconditionError("the worker is not running"); }

}  // namespace

absl::StatusOr<std::unique_ptr<EmbeddedWorker>> EmbeddedWorker::Create(
    WorkerProcessOptions options, std::vector<float> initial, std::vector<size_t> groups,
    std::vector<ParamRange> buckets, std::optional<OptimizerState> loaded) {
  if (loaded.has_value()) {
    if (loaded->step < 1) return absl::InvalidArgumentError("a loaded state's step must be >= 1");
    options.loaded_step = loaded->step;
    options.loaded_freeze_step = loaded->freeze_step;
  }
  options.num_parameters = initial.size();
  return std::unique_ptr<EmbeddedWorker>(
      new EmbeddedWorker(std::move(options), std::move(initial), std::move(groups),
                         std::move(buckets), std::move(loaded)));
}

EmbeddedWorker::EmbeddedWorker(WorkerProcessOptions options, std::vector<float> initial,
                               std::vector<size_t> groups, std::vector<ParamRange> buckets,
                               std::optional<OptimizerState> loaded)
    : options_(std::move(options)),
      groups_(std::move(groups)),
      buckets_(std::move(buckets)),
      loaded_(std::move(loaded)),
      initial_(std::make_shared<const std::vector<float>>(std::move(initial))) {}

EmbeddedWorker::~EmbeddedWorker() {
  Close("the Python optimizer was destroyed");
  if (thread_.joinable()) thread_.join();
}

absl::Status EmbeddedWorker::Start() {
  if (thread_.joinable()) return absl::FailedPreconditionError("the worker is already started");
  WorkerProcessOptions o = options_;
  o.evaluate = false;
  o.workload_factory = [this](const JobConfig& config, int rank, int world_size,
                              kernels::Backend* backend)
      -> absl::StatusOr<std::unique_ptr<Workload>> {
    if (config.workload.type != "pytorch") {
      return absl::InvalidArgumentError(absl::StrCat(
          "the job config's onebit.workload.type is ", config.workload.type,
          "; a PyTorch training script's job needs \"pytorch\""));
    }
    // 0: the workers' model decides (the coordinator checks they agree).
    if (config.workload.parameters != 0 &&
        static_cast<size_t>(config.workload.parameters) != initial_->size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the model has ", initial_->size(), " parameters; the job config's "
          "onebit.workload.parameters says ", config.workload.parameters,
          " (every process of the job reads it: set it to ", initial_->size(),
          ", or to 0 to take the model's)"));
    }
    ExternalWorkloadOptions w;
    w.name = "pytorch";
    w.initial = initial_;
    w.groups = groups_;
    w.buckets = buckets_;
    // bf16 models of a sharded job keep a bf16 gradient buffer (their .grad tensors view
    // it): 2 bytes a parameter in place of a float32 buffer's 4 plus the tensors' own 2. It
    // gives the same bits (gradient.h). Where the gradient is written in float32 (summed
    // micro-batches, unscaled by fp16's loss scaling, or copied into overlap buckets) it
    // stays float32.
    if (options_.param_dtype == kernels::WireDtype::kBf16 && config.exchange.shard_state &&
        config.gradient_accumulation_steps == 1 && !ScalesLoss(config) && buckets_.empty()) {
      w.gradient_dtype = kernels::WireDtype::kBf16;
    }
    ONEBIT_ASSIGN_OR_RETURN(std::unique_ptr<ExternalWorkload> made,
                            ExternalWorkload::Create(std::move(w), backend));
    absl::MutexLock lock(&mu_);
    workload_ = made.get();
    backend_ = backend;
    rank_ = rank;
    world_size_ = world_size;
    cuda_ = backend->memory_space() == kernels::MemorySpace::kCuda;
    return std::unique_ptr<Workload>(std::move(made));
  };
  o.after_run = [this](Trainer& trainer) -> absl::Status {
    ONEBIT_ASSIGN_OR_RETURN(std::vector<float> params, trainer.optimizer().ParamsToHost());
    // The state after the last step, for state_dict() once the worker is gone.
    ONEBIT_ASSIGN_OR_RETURN(OptimizerState state, Save(trainer));
    absl::MutexLock lock(&mu_);
    final_params_ = std::move(params);
    final_state_ = std::move(state);
    return absl::OkStatus();
  };
  if (loaded_.has_value()) {
    o.restore_loaded_state = [this](Trainer& trainer, int rank, int world_size) {
      // The error buffers are this worker's only if the same rank of as many workers saved
      // them (a rank-0-only torch.save loaded by every rank: the others' reset).
      const bool same = loaded_->rank == rank && loaded_->world_size == world_size;
      absl::Status s = RestoreState(trainer, *loaded_, /*keep_errors=*/same);
      if (s.ok() && !same && !loaded_->errors.empty()) {
        std::fprintf(stderr, "worker rank %d: error buffers reset (the state was saved by "
                     "rank %d of %d workers; this is rank %d of %d)\n", rank, loaded_->rank,
                     loaded_->world_size, rank, world_size);
      }
      return s;
    };
  }
  o.before_run = [this](Trainer& trainer) -> absl::Status {
    absl::MutexLock lock(&mu_);
    trainer_ = &trainer;
    return absl::OkStatus();
  };
  o.before_teardown = [this] {
    // The workload goes with RunWorkerProcess: stop using it before it does (a client in
    // WaitForStep wakes up, finds none, and waits for done_).
    absl::MutexLock lock(&mu_);
    ending_ = true;
    if (workload_ != nullptr) workload_->Finish(absl::CancelledError("the worker is ending"));
    mu_.Await(absl::Condition(
        +[](int* waiting) { return *waiting == 0; }, &waiting_));  // WaitSlice is done with it
    workload_ = nullptr;
    backend_ = nullptr;
    trainer_ = nullptr;
  };
  o.on_verdict = [this](const MemberVerdict& verdict) {
    // The script is the process: it hears of the verdict as an error of its wait (an
    // OnebitError in Python, so that its finally blocks and atexit handlers run), where
    // onebit-worker would exit.
    absl::MutexLock lock(&mu_);
    if (verdict_.has_value()) return;
    verdict_ = verdict;
    std::fprintf(stderr, "worker rank %d: %s\n", rank_, verdict.reason.c_str());
    if (workload_ != nullptr) workload_->Close(absl::AbortedError(verdict.reason));
  };
  thread_ = std::thread([this, o] {
    const absl::Status status = RunWorkerProcess(o, &member_);
    absl::MutexLock lock(&mu_);
    done_ = true;
    status_ = status;
  });
  return absl::OkStatus();
}

absl::StatusOr<int64_t> EmbeddedWorker::WaitForStep(double timeout_s) {
  const absl::Time deadline = absl::Now() + absl::Seconds(timeout_s);
  for (;;) {
    bool idle = false;
    bool ending = false;
    {
      absl::MutexLock lock(&mu_);
      if (verdict_.has_value()) return absl::AbortedError(verdict_->reason);
      if (done_) {
        if (!status_.ok()) return status_;
        return -1;
      }
      ending = ending_;
      idle = ending || workload_ == nullptr;
    }
    // Still registering and setting up, or the run is ending: poll for done_ (slowly, so
    // that the worker thread gets mu_).
    if (idle) {
      if (!ending && absl::Now() >= deadline) {
        return absl::UnavailableError("the worker did not start in time");
      }
      absl::SleepFor(absl::Milliseconds(5));
      continue;
    }
    // In short slices: the workload goes away when the run ends.
    absl::StatusOr<int64_t> step = WaitSlice(deadline);
    if (step.ok() && *step == kAgain) continue;
    if (!step.ok() && step.status().code() == absl::StatusCode::kUnavailable &&
        absl::Now() < deadline) {
      continue;
    }
    return step;
  }
}

absl::StatusOr<int64_t> EmbeddedWorker::WaitSlice(absl::Time deadline) {
  // The wait itself is outside mu_: this loop would otherwise take mu_ again the moment it
  // let it go, and the worker thread's short sections (before_run, after_run, the
  // teardown) could starve for a minute and more (seen on a 16-core GPU machine: the first
  // and the last step of a job took ~90 s). waiting_ keeps the workload alive instead: the
  // teardown finishes it (which ends the wait at once) and waits for 0.
  ExternalWorkload* w = nullptr;
  {
    absl::MutexLock lock(&mu_);
    if (workload_ == nullptr || ending_) return kAgain;
    w = workload_;
    ++waiting_;
  }
  absl::StatusOr<int64_t> step =
      w->WaitForStep(std::min(deadline, absl::Now() + absl::Milliseconds(20)));
  {
    absl::MutexLock lock(&mu_);
    --waiting_;
    // The run ended while we waited (the teardown finished the workload): what the worker
    // thread returns is the answer, not the workload's "ending".
    if (ending_) return kAgain;
  }
  if (!step.ok() && step.status().code() == absl::StatusCode::kUnavailable &&
      absl::Now() < deadline) {
    return kAgain;
  }
  return step;
}

absl::Status EmbeddedWorker::Supply(int64_t step, StepInputs inputs) {
  absl::MutexLock lock(&mu_);
  if (workload_ == nullptr) return NotRunning();
  return workload_->Supply(step, std::move(inputs));
}

absl::StatusOr<bool> EmbeddedWorker::Skipped(int64_t step) {
  absl::MutexLock lock(&mu_);
  if (workload_ == nullptr) return NotRunning();
  return workload_->skipped(step);
}

absl::Status EmbeddedWorker::Announce(int64_t step, size_t bucket) {
  absl::MutexLock lock(&mu_);
  if (workload_ == nullptr) return NotRunning();
  return workload_->Announce(step, bucket);
}

absl::StatusOr<float> EmbeddedWorker::LossScale() {
  absl::MutexLock lock(&mu_);
  if (workload_ == nullptr) return NotRunning();
  return workload_->loss_scale();
}

absl::StatusOr<int64_t> EmbeddedWorker::ChangedSinceAnnounced() {
  absl::MutexLock lock(&mu_);
  if (workload_ == nullptr) return NotRunning();
  return workload_->ChangedSinceAnnounced();
}

absl::Status EmbeddedWorker::EndAfter(int64_t step) {
  absl::MutexLock lock(&mu_);
  if (workload_ == nullptr) return NotRunning();
  return workload_->EndAfter(step);
}

void EmbeddedWorker::Close(const std::string& why) {
  absl::MutexLock lock(&mu_);
  if (workload_ != nullptr) workload_->Close(absl::AbortedError(why));
}

std::optional<std::pair<int, std::string>> EmbeddedWorker::Join(double timeout_s) {
  const absl::Time deadline = absl::Now() + absl::Seconds(timeout_s);
  absl::MutexLock lock(&mu_);
  mu_.AwaitWithDeadline(absl::Condition(&done_), deadline);
  if (!done_) return std::nullopt;
  if (thread_.joinable()) thread_.join();
  int code = 0;
  if (!status_.ok()) code = status_.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  return std::make_pair(code, status_.ToString());
}

int EmbeddedWorker::FailJob(const std::string& why, int64_t step) {
  return member_.ExitCodeAfterError(MarkPermanent(absl::FailedPreconditionError(why), step));
}

MemberVerdict EmbeddedWorker::VerdictAfterFailure() {
  absl::Status error;
  {
    absl::MutexLock lock(&mu_);
    if (verdict_.has_value()) return *verdict_;  // said when it came
    error = status_;
  }
  MemberVerdict verdict = member_.VerdictAfterError(error);
  if (!verdict.reason.empty()) std::fprintf(stderr, "onebit-worker: %s\n", verdict.reason.c_str());
  return verdict;
}

void EmbeddedWorker::ReportRestartableExit(const std::string& why, int64_t step) {
  member_.ReportRestartableExit(why, step);
}

absl::StatusOr<std::pair<float*, float*>> EmbeddedWorker::Buffers() {
  absl::MutexLock lock(&mu_);
  if (workload_ == nullptr || !workload_->asked()) {
    return absl::FailedPreconditionError("no buffers before the first step");
  }
  return std::make_pair(workload_->params(), workload_->gradient());
}

absl::StatusOr<std::pair<void*, kernels::WireDtype>> EmbeddedWorker::GradientBuffer() {
  absl::MutexLock lock(&mu_);
  if (workload_ == nullptr || !workload_->asked()) {
    return absl::FailedPreconditionError("no buffers before the first step");
  }
  return std::make_pair(workload_->gradient_bytes(), workload_->gradient_dtype());
}

absl::StatusOr<std::pair<const void*, kernels::WireDtype>> EmbeddedWorker::ParamBuffer() {
  absl::MutexLock lock(&mu_);
  if (workload_ == nullptr || !workload_->asked() || trainer_ == nullptr) {
    return absl::FailedPreconditionError("no buffers before the first step");
  }
  const Optimizer& o = trainer_->optimizer();
  if (o.low_params() != nullptr) return std::make_pair(o.low_params(), o.low_params_dtype());
  return std::make_pair(static_cast<const void*>(workload_->params()), kernels::WireDtype::kFp32);
}

absl::Status EmbeddedWorker::FinalParams(float* out, size_t n) {
  absl::MutexLock lock(&mu_);
  if (final_params_.empty()) return absl::FailedPreconditionError("the job has not ended");
  if (final_params_.size() != n) {
    return absl::InvalidArgumentError(
        absl::StrCat("the final parameters are ", final_params_.size(), " floats, not ", n));
  }
  if (n > 0) std::memcpy(out, final_params_.data(), n * sizeof(float));
  return absl::OkStatus();
}

absl::StatusOr<Optimizer*> EmbeddedWorker::RunningOptimizer() {
  if (trainer_ == nullptr || workload_ == nullptr || !workload_->asked()) {
    return absl::FailedPreconditionError("the worker is not between two steps");
  }
  return &trainer_->optimizer();
}

absl::StatusOr<OptimizerState> EmbeddedWorker::StateDict() {
  absl::MutexLock lock(&mu_);
  if (done_ && final_state_.has_value()) return *final_state_;
  ONEBIT_RETURN_IF_ERROR(RunningOptimizer().status());  // between two steps, or a clear error
  return Save(*trainer_);
}

absl::StatusOr<OptimizerState> EmbeddedWorker::GatheredStateDict() {
  absl::MutexLock lock(&mu_);
  if (done_ && final_state_.has_value()) {
    if (final_state_->scalars.count(kStateBeginScalar) == 0) return *final_state_;
    return absl::FailedPreconditionError(
        "the job is over: a sharded worker's node has left, so its whole state can no longer "
        "be gathered (gather it between two steps, or take this worker's own range)");
  }
  ONEBIT_ASSIGN_OR_RETURN(Optimizer * o, RunningOptimizer());
  if (backend_ == nullptr) return NotRunning();
  ONEBIT_ASSIGN_OR_RETURN(OptimizerState state, GatherOptimizerState(*o, *backend_));
  state.trainer = trainer_->CheckpointScalars();
  return state;
}

absl::StatusOr<OptimizerState> EmbeddedWorker::StateSlice(int64_t begin, int64_t end) {
  OptimizerState out;
  absl::MutexLock lock(&mu_);
  const bool final = done_ && final_state_.has_value();
  Optimizer* o = nullptr;
  if (!final) {
    ONEBIT_ASSIGN_OR_RETURN(o, RunningOptimizer());
  }
  const size_t n = final ? final_params_.size() : o->size();
  if (begin < 0 || end < begin || static_cast<size_t>(end) > n) {
    return absl::InvalidArgumentError(
        absl::StrCat("elements [", begin, ", ", end, ") of a model of ", n));
  }
  if (final) {
    out.step = final_state_->step;
    ONEBIT_ASSIGN_OR_RETURN(out.tensors, onebit::StateSlice(*final_state_, n, begin, end));
  } else {
    out.step = o->step();
    ONEBIT_ASSIGN_OR_RETURN(out.tensors, onebit::StateSlice(*o, begin, end));
  }
  // Where a sharded worker's state lies (the range a script may read).
  if (final) {
    for (const char* key : {kStateBeginScalar, kStateEndScalar}) {
      const auto it = final_state_->scalars.find(key);
      if (it != final_state_->scalars.end()) out.scalars[key] = it->second;
    }
  } else if (o->exchange().state_shard().has_value()) {
    out.scalars[kStateBeginScalar] = static_cast<double>(o->state_begin());
    out.scalars[kStateEndScalar] = static_cast<double>(o->state_begin() + o->state_count());
  }
  return out;
}

absl::Status EmbeddedWorker::LoadStateDict(const OptimizerState& state) {
  absl::MutexLock lock(&mu_);
  ONEBIT_ASSIGN_OR_RETURN(Optimizer * o, RunningOptimizer());
  if (state.step != o->step()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the state is of step ", state.step, ", the job is after step ", o->step(),
        ": a state is loaded at the step it was taken, or before a fresh job's first step"));
  }
  return RestoreState(*trainer_, state, /*keep_errors=*/true);
}

int EmbeddedWorker::rank() {
  absl::MutexLock lock(&mu_);
  return rank_;
}
int EmbeddedWorker::world_size() {
  absl::MutexLock lock(&mu_);
  return world_size_;
}
bool EmbeddedWorker::cuda() {
  absl::MutexLock lock(&mu_);
  return cuda_;
}

absl::StatusOr<std::unique_ptr<EmbeddedCoordinator>> EmbeddedCoordinator::Start(
    const std::string& config, const std::string& host, int port, int rest_port,
    int metrics_port, const std::string& code_digest, const std::string& job_key) {
  JobCoordinatorOptions o;
  o.config_path = config;
  o.code_digest = code_digest;
  o.job_key = job_key;
  o.host = host;
  o.grpc_port = port;
  o.rest_port = rest_port;
  o.metrics_port = metrics_port;
  ONEBIT_ASSIGN_OR_RETURN(JobConfig parsed, LoadJobConfig(config));
  ONEBIT_ASSIGN_OR_RETURN(o.tls, security::TlsFromFlags(parsed.security.tls));
  ONEBIT_ASSIGN_OR_RETURN(PreparedJob job, JobCoordinator::Prepare(o));
  ONEBIT_ASSIGN_OR_RETURN(std::unique_ptr<JobCoordinator> started,
                          JobCoordinator::Start(std::move(job)));
  return std::unique_ptr<EmbeddedCoordinator>(new EmbeddedCoordinator(std::move(started)));
}

std::string EmbeddedCoordinator::address() const { return job_ ? job_->addresses().grpc : ""; }
std::string EmbeddedCoordinator::rest_address() const {
  return job_ ? job_->addresses().rest : "";
}
std::string EmbeddedCoordinator::metrics_address() const {
  return job_ ? job_->addresses().metrics : "";
}

std::string EmbeddedCoordinator::Poll() {
  if (!job_) return "closed";
  switch (job_->Check()) {
    case JobCoordinator::kSucceeded:
      return "succeeded";
    case JobCoordinator::kFailed:
      return "failed";
    default:
      return "running";
  }
}

std::string EmbeddedCoordinator::failure_reason() {
  if (!job_) return "";
  return job_->coordinator()->GetJob({})->failure_reason();
}

void EmbeddedCoordinator::Abandon(const std::string& reason) {
  if (job_) job_->coordinator()->Abandon(reason);
}

void EmbeddedCoordinator::Recover(const std::string& reason) {
  if (job_) job_->coordinator()->Recover(reason);
}

void EmbeddedCoordinator::Close() {
  if (!job_) return;
  // The others hear the job's end (or failure, or recovery) on their sessions; stopping
  // before they have would cut that word off, and they would see only a lost coordinator.
  constexpr absl::Duration kMemberDrain = absl::Seconds(5);
  const absl::Time deadline = absl::Now() + kMemberDrain;
  while (job_->open_sessions() > 0 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(20));
  job_->Shutdown();
  job_.reset();
}

}  // namespace onebit
