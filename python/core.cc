// _onebit_core: the C++ side of the Python package (python/onebit). A Worker runs a whole
// onebit worker (worker/worker_process.h: registration, leases, the exchange, /metrics,
// checkpoints) on a thread of the training process, over an ExternalWorkload whose
// gradients the Python optimizer hands in. No libtorch: the parameters and gradients cross
// as raw memory (numpy arrays over the C++ buffers on the CPU, device addresses on a GPU).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "config/job_config.h"
#include "coordinator/job_coordinator.h"
#include "security/flags.h"
#include "worker/trainer.h"
#include "common/permanent_error.h"
#include "worker/worker_process.h"
#include "worker/workloads/external_workload.h"

namespace py = pybind11;

namespace onebit {
namespace {

// A Python exception for a status: ValueError for INVALID_ARGUMENT, TimeoutError for
// UNAVAILABLE or DEADLINE_EXCEEDED, RuntimeError otherwise.
[[noreturn]] void Throw(const absl::Status& status) {
  const std::string message = status.ToString();
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
      throw py::value_error(message);
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kDeadlineExceeded:
      PyErr_SetString(PyExc_TimeoutError, message.c_str());
      throw py::error_already_set();
    default:
      throw std::runtime_error(message);
  }
}

// A copy of `v` as a NumPy array (with the GIL).
py::array_t<float> FloatArray(const std::vector<float>& v) {
  py::array_t<float> a(static_cast<py::ssize_t>(v.size()));
  std::copy(v.begin(), v.end(), a.mutable_data());
  return a;
}

// A state_dict() from Python, parsed (with the GIL) into what the optimizer restores.
struct LoadedState {
  int64_t step = 0;
  int64_t freeze_step = -1;
  int rank = -1;        // the rank and world size that saved it (-1: not said)
  int world_size = -1;
  StateTensors tensors;
  StateScalars scalars;
  ErrorState errors;
  StateScalars trainer;
};

LoadedState ParseState(const py::dict& d) {
  auto floats = [](const py::handle& h) {
    auto a = py::array_t<float, py::array::c_style | py::array::forcecast>::ensure(h);
    if (!a || a.ndim() != 1) throw py::value_error("state tensors must be 1-D float32 arrays");
    return std::vector<float>(a.data(), a.data() + a.size());
  };
  for (const char* key : {"step", "freeze_step", "tensors", "scalars", "errors", "trainer"}) {
    if (!d.contains(key)) throw py::value_error(absl::StrCat("the state has no '", key, "'"));
  }
  LoadedState s;
  s.step = d["step"].cast<int64_t>();
  s.freeze_step = d["freeze_step"].cast<int64_t>();
  if (d.contains("rank")) s.rank = d["rank"].cast<int>();
  if (d.contains("world_size")) s.world_size = d["world_size"].cast<int>();
  for (auto [k, v] : d["tensors"].cast<py::dict>()) s.tensors[k.cast<std::string>()] = floats(v);
  for (auto [k, v] : d["scalars"].cast<py::dict>()) s.scalars[k.cast<std::string>()] = v.cast<double>();
  for (auto [k, v] : d["errors"].cast<py::dict>()) s.errors[k.cast<std::string>()] = floats(v);
  for (auto [k, v] : d["trainer"].cast<py::dict>()) s.trainer[k.cast<std::string>()] = v.cast<double>();
  return s;
}

// Puts a parsed state into a trainer. Everything is checked before anything changes.
// With keep_errors false the error buffers stay as they are (zero at a job's start): the
// state's are another worker's, or of another topology.
absl::Status RestoreState(Trainer& trainer, const LoadedState& s, bool keep_errors) {
  Optimizer& o = trainer.optimizer();
  for (const StateSpec& spec : o.CheckpointStates()) {
    auto it = s.tensors.find(spec.name);
    if (it == s.tensors.end() || it->second.size() != o.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("the state's ", spec.name, " is missing or not ", o.size(), " elements"));
    }
  }
  if (keep_errors) {
    absl::StatusOr<ErrorState> current = o.exchange().SaveErrors();
    if (!current.ok()) return current.status();
    for (const auto& [name, v] : *current) {
      auto it = s.errors.find(name);
      if (it == s.errors.end() || it->second.size() != v.size()) {
        return absl::InvalidArgumentError(
            absl::StrCat("the state's ", name, " is missing or not ", v.size(), " elements"));
      }
    }
  }
  ONEBIT_RETURN_IF_ERROR(o.Restore(s.step, s.freeze_step, s.tensors, s.scalars));
  if (keep_errors) ONEBIT_RETURN_IF_ERROR(o.exchange().RestoreErrors(s.errors));
  return trainer.RestoreScalars(s.trainer);
}

class PyWorker {
 public:
  PyWorker(WorkerProcessOptions options, py::array_t<float, py::array::c_style> initial,
           std::vector<size_t> groups, std::vector<ParamRange> buckets,
           std::optional<LoadedState> loaded)
      : options_(std::move(options)),
        groups_(std::move(groups)),
        buckets_(std::move(buckets)),
        loaded_(std::move(loaded)) {
    if (initial.ndim() != 1) throw py::value_error("initial parameters must be 1-D");
    initial_.assign(initial.data(), initial.data() + initial.size());
  }
  ~PyWorker() {
    Close("the Python optimizer was destroyed");
    if (thread_.joinable()) {
      py::gil_scoped_release release;
      thread_.join();
    }
  }

  void Start() {
    if (thread_.joinable()) throw std::runtime_error("the worker is already started");
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
          static_cast<size_t>(config.workload.parameters) != initial_.size()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "the model has ", initial_.size(), " parameters; the job config's "
            "onebit.workload.parameters says ", config.workload.parameters,
            " (every process of the job reads it: set it to ", initial_.size(),
            ", or to 0 to take the model's)"));
      }
      ExternalWorkloadOptions w;
      w.name = "pytorch";
      w.initial = initial_;
      w.groups = groups_;
      w.buckets = buckets_;
      auto made = ExternalWorkload::Create(std::move(w), backend);
      if (!made.ok()) return made.status();
      absl::MutexLock lock(&mu_);
      workload_ = made->get();
      rank_ = rank;
      world_size_ = world_size;
      cuda_ = backend->memory_space() == kernels::MemorySpace::kCuda;
      return std::unique_ptr<Workload>(std::move(*made));
    };
    o.after_run = [this](Trainer& trainer) -> absl::Status {
      absl::StatusOr<std::vector<float>> params = trainer.optimizer().ParamsToHost();
      if (!params.ok()) return params.status();
      // The state after the last step, for state_dict() once the worker is gone.
      absl::StatusOr<SavedState> state = Save(trainer);
      if (!state.ok()) return state.status();
      absl::MutexLock lock(&mu_);
      final_params_ = *std::move(params);
      final_state_ = *std::move(state);
      return absl::OkStatus();
    };
    o.learning_rate_override = [this](int64_t step) -> std::optional<double> {
      absl::MutexLock lock(&mu_);
      if (workload_ == nullptr) return std::nullopt;
      return workload_->SuppliedLearningRate(step);
    };
    o.max_grad_norm_override = [this](int64_t step) -> std::optional<double> {
      absl::MutexLock lock(&mu_);
      if (workload_ == nullptr) return std::nullopt;
      return workload_->SuppliedMaxGradNorm(step);
    };
    o.betas_override = [this](int64_t step) -> std::optional<std::pair<double, double>> {
      absl::MutexLock lock(&mu_);
      if (workload_ == nullptr) return std::nullopt;
      return workload_->SuppliedBetas(step);
    };
    o.weight_decays_override = [this](int64_t step) -> std::optional<std::vector<double>> {
      absl::MutexLock lock(&mu_);
      if (workload_ == nullptr) return std::nullopt;
      return workload_->SuppliedWeightDecays(step);
    };
    if (loaded_.has_value()) {
      o.restore_loaded_state = [this](Trainer& trainer, int rank, int world_size) {
        // The error buffers are this worker's only if the same rank of as many workers
        // saved them (a rank-0-only torch.save loaded by every rank: the others' reset).
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
      // WaitForStep wakes up, finds none, and waits for done_ below).
      absl::MutexLock lock(&mu_);
      ending_ = true;
      if (workload_ != nullptr) workload_->Finish(absl::CancelledError("the worker is ending"));
      mu_.Await(absl::Condition(
          +[](int* waiting) { return *waiting == 0; }, &waiting_));  // WaitSlice is done with it
      workload_ = nullptr;
      trainer_ = nullptr;
    };
    thread_ = std::thread([this, o] {
      const absl::Status status = RunWorkerProcess(o);
      absl::MutexLock lock(&mu_);
      done_ = true;
      status_ = status;
    });
  }

  // The next step to compute, -1 when the job is over for this worker; raises the worker's
  // error. Waits without the GIL.
  int64_t WaitForStep(double timeout_s) {
    const absl::Time deadline = absl::Now() + absl::Seconds(timeout_s);
    for (;;) {
      ExternalWorkload* w = nullptr;
      bool ending = false;
      {
        absl::MutexLock lock(&mu_);
        if (done_) {
          if (!status_.ok()) Throw(status_);
          return -1;
        }
        ending = ending_;
        w = ending ? nullptr : workload_;
      }
      // Still registering and setting up, or the run is ending: poll for done_ (slowly, so
      // that the worker thread gets mu_).
      if (w == nullptr) {
        if (!ending && absl::Now() >= deadline) {
          Throw(absl::UnavailableError("the worker did not start in time"));
        }
        py::gil_scoped_release release;
        absl::SleepFor(absl::Milliseconds(5));
        continue;
      }
      absl::StatusOr<int64_t> step;
      {
        py::gil_scoped_release release;
        // In short slices: the workload goes away when the run ends.
        step = WaitSlice(deadline);
      }
      if (step.ok() && *step == kAgain) continue;
      if (!step.ok()) {
        if (step.status().code() == absl::StatusCode::kUnavailable && absl::Now() < deadline) {
          continue;
        }
        Throw(step.status());
      }
      return *step;
    }
  }

  // lr, max_grad_norm, beta1 and beta2: the script's own for this step (NaN: the job's);
  // weight_decays: each hyper group's (empty: the optimizer's own). loss: None where the
  // script gave none.
  void Supply(int64_t step, std::optional<double> loss, double lr, double max_grad_norm,
              double beta1, double beta2, std::vector<double> weight_decays) {
    absl::MutexLock lock(&mu_);
    if (workload_ == nullptr) Throw(absl::FailedPreconditionError("the worker is not running"));
    if (absl::Status s = workload_->Supply(step, loss, lr, max_grad_norm, beta1, beta2,
                                           std::move(weight_decays));
        !s.ok()) {
      Throw(s);
    }
  }

  // OVERLAP: bucket `bucket` of step `step`'s gradient is final (ExternalWorkload::Announce).
  // Keeps the GIL: the copy is one memcpy, and mu_ must not be held without it.
  void Announce(int64_t step, size_t bucket) {
    absl::MutexLock lock(&mu_);
    if (workload_ == nullptr) Throw(absl::FailedPreconditionError("the worker is not running"));
    if (absl::Status s = workload_->Announce(step, bucket); !s.ok()) Throw(s);
  }

  // What the script multiplies its loss by before backward (1 without fp16 loss scaling).
  float LossScale() {
    absl::MutexLock lock(&mu_);
    if (workload_ == nullptr) Throw(absl::FailedPreconditionError("the worker is not running"));
    return workload_->loss_scale();
  }

  // The first element of the gradient changed after its bucket was announced, or -1.
  int64_t ChangedSinceAnnounced() {
    absl::MutexLock lock(&mu_);
    if (workload_ == nullptr) Throw(absl::FailedPreconditionError("the worker is not running"));
    return workload_->ChangedSinceAnnounced();
  }

  // The script's loop ended after `step` (a job without steps): the worker ends there.
  void EndAfter(int64_t step) {
    absl::MutexLock lock(&mu_);
    if (workload_ == nullptr) Throw(absl::FailedPreconditionError("the worker is not running"));
    if (absl::Status s = workload_->EndAfter(step); !s.ok()) Throw(s);
  }

  void Close(const std::string& why) {
    absl::MutexLock lock(&mu_);
    if (workload_ != nullptr) workload_->Close(absl::AbortedError(why));
  }

  // Exit status once the thread ended: None while running, else (code, message).
  py::object Join(double timeout_s) {
    const absl::Time deadline = absl::Now() + absl::Seconds(timeout_s);
    {
      py::gil_scoped_release release;
      absl::MutexLock lock(&mu_);
      mu_.AwaitWithDeadline(absl::Condition(&done_), deadline);
    }
    absl::MutexLock lock(&mu_);
    if (!done_) return py::none();
    if (thread_.joinable()) thread_.join();
    int code = 0;
    if (!status_.ok()) {
      code = status_.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
    }
    return py::make_tuple(code, status_.ToString());
  }

  // Fails the job for a reason no restart fixes (the script's loop ended before the job's
  // last step, after `step`): reported to the coordinator, which fails the job at once and
  // tells every member. Call it before Close, while this worker is still a member.
  // Returns the exit code the coordinator's verdict asks for (78).
  int FailJob(const std::string& why, int64_t step) {
    py::gil_scoped_release release;
    return ExitCodeAfterError(MarkPermanent(absl::FailedPreconditionError(why), step));
  }

  // The worker's verdict after an error: (75 when the job recovers (restart), 78 when it
  // failed, else 1; the coordinator's word on why, "" where it said nothing)
  // (worker_process.h VerdictAfterError; the reason is printed too, as onebit-worker does).
  py::tuple VerdictAfterFailure() {
    absl::Status error;
    {
      absl::MutexLock lock(&mu_);
      error = status_;
    }
    MemberVerdict verdict;
    {
      py::gil_scoped_release release;
      verdict = VerdictAfterError(error);
    }
    if (!verdict.reason.empty()) {
      std::fprintf(stderr, "onebit-worker: %s\n", verdict.reason.c_str());
    }
    return py::make_tuple(verdict.exit_code, verdict.reason);
  }

  // This worker stops because the script raised (`why`) after `step`: the job recovers at
  // once, naming it (worker_process.h ReportRestartableExit). Call it before Close.
  void ReportRestartableExit(const std::string& why, int64_t step) {
    py::gil_scoped_release release;
    onebit::ReportRestartableExit(why, step);
  }

  // CPU: the optimizer's parameters and this worker's gradient buffer as float32 numpy
  // arrays over the C++ memory (no copy; valid while the worker runs).
  py::array_t<float> Params(py::object self) { return View(self, /*params=*/true); }
  py::array_t<float> Gradient(py::object self) { return View(self, /*params=*/false); }
  // The parameters at the end of the job (a copy the worker owns), once WaitForStep said -1.
  py::array_t<float> FinalParams(py::object self) {
    absl::MutexLock lock(&mu_);
    if (final_params_.empty()) Throw(absl::FailedPreconditionError("the job has not ended"));
    return py::array_t<float>({static_cast<py::ssize_t>(final_params_.size())}, {sizeof(float)},
                              final_params_.data(), self);
  }
  // The optimizer's whole state between two steps (the trainer waits for the next
  // gradient), or after the last step once the job is over: step, freeze_step, every state
  // tensor (copies), its scalars, this worker's error buffers and the trainer's scalars
  // (the loss scaler).
  py::dict StateDict() {
    SavedState state;
    {
      absl::MutexLock lock(&mu_);
      if (done_ && final_state_.has_value()) {
        state = *final_state_;
      } else {
        RunningOptimizer();  // between two steps, or a clear error
        absl::StatusOr<SavedState> saved = Save(*trainer_);
        if (!saved.ok()) Throw(saved.status());
        state = *std::move(saved);
      }
    }
    py::dict tensors, scalars, errors, trainer;
    for (const auto& [name, v] : state.tensors) tensors[py::str(name)] = FloatArray(v);
    for (const auto& [name, value] : state.scalars) scalars[py::str(name)] = value;
    for (const auto& [name, v] : state.errors) errors[py::str(name)] = FloatArray(v);
    for (const auto& [name, value] : state.trainer) trainer[py::str(name)] = value;
    py::dict d;
    d["step"] = state.step;
    d["freeze_step"] = state.freeze_step;
    d["tensors"] = tensors;
    d["scalars"] = scalars;
    d["errors"] = errors;
    d["trainer"] = trainer;
    return d;
  }

  // Elements [begin, end) of each of the optimizer's state tensors (the parameters left
  // out), as host copies, with its step: {"step", "tensors": {name: array}} (torch.py's
  // opt.state[p]). Between two steps, or after the last one.
  py::dict StateSlice(int64_t begin, int64_t end) {
    int64_t step = 0;
    NamedTensors slices;
    {
      absl::MutexLock lock(&mu_);
      const bool final = done_ && final_state_.has_value();
      const size_t n = final ? final_params_.size() : RunningOptimizer().size();
      if (begin < 0 || end < begin || static_cast<size_t>(end) > n) {
        Throw(absl::InvalidArgumentError(absl::StrCat("elements [", begin, ", ", end,
                                                      ") of a model of ", n)));
      }
      if (final) {
        step = final_state_->step;
        for (const auto& [name, v] : final_state_->tensors) {
          slices.emplace_back(name, std::vector<float>(v.begin() + begin, v.begin() + end));
        }
      } else {
        Optimizer& o = RunningOptimizer();
        step = o.step();
        absl::StatusOr<NamedTensors> tensors = Tensors(o, begin, end);
        if (!tensors.ok()) Throw(tensors.status());
        slices = *std::move(tensors);
      }
    }
    py::dict tensors;
    for (const auto& [name, v] : slices) {
      if (name != "params") tensors[py::str(name)] = FloatArray(v);
    }
    py::dict d;
    d["step"] = step;
    d["tensors"] = tensors;
    return d;
  }

  // Puts back a StateDict of the same step (the coordinator's leases decide the steps: a
  // job resumes from its checkpoints, not from here). ValueError for another step, another
  // freeze step or a state that does not fit; nothing changes then.
  void LoadStateDict(const py::dict& d) {
    const LoadedState state = ParseState(d);
    absl::MutexLock lock(&mu_);
    Optimizer& o = RunningOptimizer();
    if (state.step != o.step()) {
      Throw(absl::InvalidArgumentError(absl::StrCat(
          "the state is of step ", state.step, ", the job is after step ", o.step(),
          ": a state is loaded at the step it was taken, or before a fresh job's first step")));
    }
    if (absl::Status s = RestoreState(*trainer_, state, /*keep_errors=*/true); !s.ok()) Throw(s);
  }

  // GPU: their device addresses.
  uintptr_t ParamsAddress() { return reinterpret_cast<uintptr_t>(Buffers().first); }
  uintptr_t GradientAddress() { return reinterpret_cast<uintptr_t>(Buffers().second); }

  int rank() { absl::MutexLock lock(&mu_); return rank_; }
  int world_size() { absl::MutexLock lock(&mu_); return world_size_; }
  bool cuda() { absl::MutexLock lock(&mu_); return cuda_; }
  size_t size() const { return initial_.size(); }

 private:
  static constexpr int64_t kAgain = -2;

  absl::StatusOr<int64_t> WaitSlice(absl::Time deadline) {
    // The wait itself is outside mu_: this loop would otherwise take mu_ again the moment
    // it let it go, and the worker thread's short sections (before_run, after_run, the
    // teardown) could starve for a minute and more (seen on a 16-core GPU machine: the
    // first and the last step of a job took ~90 s). waiting_ keeps the workload alive
    // instead: the teardown finishes it (which ends the wait at once) and waits for 0.
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

  using NamedTensors = std::vector<std::pair<std::string, std::vector<float>>>;

  struct SavedState {
    int64_t step = 0;
    int64_t freeze_step = -1;
    NamedTensors tensors;
    StateScalars scalars;
    ErrorState errors;
    StateScalars trainer;
  };

  // Elements [begin, end) of each of the optimizer's state tensors, as host copies.
  static absl::StatusOr<NamedTensors> Tensors(Optimizer& o, size_t begin, size_t end) {
    NamedTensors tensors;
    for (const StateSpec& spec : o.CheckpointStates()) {
      absl::StatusOr<std::vector<float>> v = o.StateToHost(spec.name, begin, end);
      if (!v.ok()) return v.status();
      tensors.emplace_back(spec.name, *std::move(v));
    }
    return tensors;
  }

  // The trainer's optimizer state as host copies (the trainer between two steps).
  static absl::StatusOr<SavedState> Save(Trainer& trainer) {
    Optimizer& o = trainer.optimizer();
    SavedState state;
    state.step = o.step();
    state.freeze_step = o.freeze_step();
    absl::StatusOr<NamedTensors> tensors = Tensors(o, 0, o.size());
    if (!tensors.ok()) return tensors.status();
    state.tensors = *std::move(tensors);
    state.scalars = o.CheckpointScalars();
    absl::StatusOr<ErrorState> errors = o.exchange().SaveErrors();
    if (!errors.ok()) return errors.status();
    state.errors = *std::move(errors);
    state.trainer = trainer.CheckpointScalars();
    return state;
  }

  Optimizer& RunningOptimizer() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (trainer_ == nullptr || workload_ == nullptr || workload_->params() == nullptr) {
      Throw(absl::FailedPreconditionError("the worker is not between two steps"));
    }
    return trainer_->optimizer();
  }

  std::pair<float*, float*> Buffers() {
    absl::MutexLock lock(&mu_);
    if (workload_ == nullptr || workload_->params() == nullptr) {
      Throw(absl::FailedPreconditionError("no buffers before the first step"));
    }
    return {workload_->params(), workload_->gradient()};
  }

  py::array_t<float> View(py::object self, bool params) {
    const auto [p, g] = Buffers();
    if (cuda()) throw std::runtime_error("the buffers are on the GPU: use the addresses");
    // The worker object is the arrays' base: it outlives them.
    return py::array_t<float>({static_cast<py::ssize_t>(initial_.size())}, {sizeof(float)},
                              params ? p : g, self);
  }

  const WorkerProcessOptions options_;
  const std::vector<size_t> groups_;
  const std::vector<ParamRange> buckets_;  // overlap: announcement order; empty: none
  const std::optional<LoadedState> loaded_;  // load_state_dict before the first step
  std::vector<float> initial_;
  std::vector<float> final_params_;  // after_run's copy
  std::optional<SavedState> final_state_ ABSL_GUARDED_BY(mu_);  // after_run's, likewise
  Trainer* trainer_ ABSL_GUARDED_BY(mu_) = nullptr;  // from before_run to the teardown
  std::thread thread_;
  absl::Mutex mu_;
  ExternalWorkload* workload_ ABSL_GUARDED_BY(mu_) = nullptr;
  int waiting_ ABSL_GUARDED_BY(mu_) = 0;  // WaitSlice calls using workload_ outside mu_
  bool ending_ ABSL_GUARDED_BY(mu_) = false;  // the teardown has begun
  int rank_ ABSL_GUARDED_BY(mu_) = -1;
  int world_size_ ABSL_GUARDED_BY(mu_) = 0;
  bool cuda_ ABSL_GUARDED_BY(mu_) = false;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
};

// The embedded coordinator: onebit.torch runs one in rank 0 when no coordinator is named
// (coordinator/job_coordinator.h, the same code as onebit-coordinator).
class PyCoordinator {
 public:
  PyCoordinator(const std::string& config, const std::string& host, int port, int rest_port,
                int metrics_port, const std::string& code_digest, const std::string& job_key) {
    JobCoordinatorOptions o;
    o.config_path = config;
    o.code_digest = code_digest;
    o.job_key = job_key;
    o.host = host;
    o.grpc_port = port;
    o.rest_port = rest_port;
    o.metrics_port = metrics_port;
    absl::StatusOr<JobConfig> parsed = LoadJobConfig(config);
    if (!parsed.ok()) Throw(parsed.status());
    absl::StatusOr<security::TlsOptions> tls = security::TlsFromFlags(parsed->security.tls);
    if (!tls.ok()) Throw(tls.status());
    o.tls = *tls;
    absl::StatusOr<PreparedJob> job = JobCoordinator::Prepare(o);
    if (!job.ok()) Throw(job.status());
    absl::StatusOr<std::unique_ptr<JobCoordinator>> started;
    {
      py::gil_scoped_release release;
      started = JobCoordinator::Start(*std::move(job));
    }
    if (!started.ok()) Throw(started.status());
    job_ = *std::move(started);
  }
  ~PyCoordinator() { Close(); }

  std::string address() const { return job_ ? job_->addresses().grpc : ""; }
  std::string rest_address() const { return job_ ? job_->addresses().rest : ""; }
  std::string metrics_address() const { return job_ ? job_->addresses().metrics : ""; }

  // "running", "succeeded" or "failed" (then failure_reason says why).
  std::string Poll() {
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
  std::string failure_reason() {
    if (!job_) return "";
    return job_->coordinator()->GetJob({})->failure_reason();
  }
  // Fails a job that is not over (its members hear why), before this process leaves.
  void Abandon(const std::string& reason) {
    if (job_) job_->coordinator()->Abandon(reason);
  }
  // Starts a recovery of a running job (its members exit 75; a restart resumes it).
  void Recover(const std::string& reason) {
    if (job_) job_->coordinator()->Recover(reason);
  }
  void Close() {
    if (!job_) return;
    py::gil_scoped_release release;
    job_->Shutdown();
    job_.reset();
  }

 private:
  std::unique_ptr<JobCoordinator> job_;
};

}  // namespace
}  // namespace onebit

PYBIND11_MODULE(_onebit_core, m) {
  using onebit::PyWorker;
  using onebit::WorkerProcessOptions;
  m.doc() = "onebit's worker, run in the training process (python/onebit)";
  py::class_<PyWorker>(m, "Worker")
      .def(py::init([](const std::string& config, const std::string& coordinator,
                       py::array_t<float, py::array::c_style> initial,
                       std::vector<size_t> groups, const std::string& host, int metrics_port,
                       int rank, const std::string& summary_file,
                       const std::string& history_csv, int cuda_device,
                       const std::string& member_token_file,
                       const std::vector<std::tuple<size_t, size_t, float, float>>& hyper_groups,
                       const std::optional<py::dict>& loaded,
                       const std::vector<std::pair<size_t, size_t>>& buckets,
                       const std::string& fault, const std::string& job_key) {
             WorkerProcessOptions o;
             // (begin, end, lr scale, weight decay) of each param group; checked by the
             // optimizer (a bad one fails the worker's start with a ValueError).
             for (const auto& [begin, end, lr_scale, weight_decay] : hyper_groups) {
               o.hyper_groups.push_back({begin, end, lr_scale, weight_decay});
             }
             o.config_path = config;
             o.coordinator = coordinator;
             o.host = host;
             o.metrics_port = metrics_port;
             o.rank = rank;
             o.summary_file = summary_file;
             o.history_csv = history_csv;
             o.cuda_device = cuda_device;
             o.member_token_file = member_token_file;
             o.fault = fault;  // onebit-worker's --fault (ONEBIT_FAULT: tests, onebit-launch)
             o.job_key = job_key;
             o.num_parameters = static_cast<size_t>(initial.size());
             // A state loaded before the first step: the job starts after its step.
             std::optional<onebit::LoadedState> state;
             if (loaded.has_value()) {
               state = onebit::ParseState(*loaded);
               if (state->step < 1) throw py::value_error("a loaded state's step must be >= 1");
               o.loaded_step = state->step;
               o.loaded_freeze_step = state->freeze_step;
             }
             std::vector<onebit::ParamRange> ranges;
             for (const auto& [begin, end] : buckets) ranges.push_back({begin, end});
             return std::make_unique<PyWorker>(std::move(o), initial, std::move(groups),
                                               std::move(ranges), std::move(state));
           }),
           py::arg("config"), py::arg("coordinator"), py::arg("initial"), py::arg("groups"),
           py::arg("host") = "127.0.0.1", py::arg("metrics_port") = 0, py::arg("rank") = -1,
           py::arg("summary_file") = "", py::arg("history_csv") = "",
           py::arg("cuda_device") = 0, py::arg("member_token_file") = "",
           py::arg("hyper_groups") = std::vector<std::tuple<size_t, size_t, float, float>>(),
           py::arg("loaded") = std::nullopt,
           py::arg("buckets") = std::vector<std::pair<size_t, size_t>>(),
           py::arg("fault") = "", py::arg("job_key") = "")
      .def("start", &PyWorker::Start)
      .def("wait_for_step", &PyWorker::WaitForStep, py::arg("timeout_s"))
      .def("supply", &PyWorker::Supply, py::arg("step"), py::arg("loss"),
           py::arg("lr") = std::numeric_limits<double>::quiet_NaN(),
           py::arg("max_grad_norm") = std::numeric_limits<double>::quiet_NaN(),
           py::arg("beta1") = std::numeric_limits<double>::quiet_NaN(),
           py::arg("beta2") = std::numeric_limits<double>::quiet_NaN(),
           py::arg("weight_decays") = std::vector<double>())
      .def("close", &PyWorker::Close, py::arg("why"))
      .def("fail_job", &PyWorker::FailJob, py::arg("why"), py::arg("step"))
      .def("end_after", &PyWorker::EndAfter, py::arg("step"))
      .def("announce", &PyWorker::Announce, py::arg("step"), py::arg("bucket"))
      .def("changed_since_announced", &PyWorker::ChangedSinceAnnounced)
      .def("loss_scale", &PyWorker::LossScale)
      .def("join", &PyWorker::Join, py::arg("timeout_s"))
      .def("verdict_after_failure", &PyWorker::VerdictAfterFailure)
      .def("report_restartable_exit", &PyWorker::ReportRestartableExit, py::arg("why"),
           py::arg("step"))
      .def("params", [](py::object self) { return self.cast<PyWorker&>().Params(self); })
      .def("gradient", [](py::object self) { return self.cast<PyWorker&>().Gradient(self); })
      .def("final_params",
           [](py::object self) { return self.cast<PyWorker&>().FinalParams(self); })
      .def("state_dict", &PyWorker::StateDict)
      .def("state_slice", &PyWorker::StateSlice, py::arg("begin"), py::arg("end"))
      .def("load_state_dict", &PyWorker::LoadStateDict, py::arg("state"))
      .def("params_address", &PyWorker::ParamsAddress)
      .def("gradient_address", &PyWorker::GradientAddress)
      .def_property_readonly("rank", &PyWorker::rank)
      .def_property_readonly("world_size", &PyWorker::world_size)
      .def_property_readonly("cuda", &PyWorker::cuda)
      .def_property_readonly("size", &PyWorker::size);
  py::class_<onebit::PyCoordinator>(m, "Coordinator")
      .def(py::init<const std::string&, const std::string&, int, int, int, const std::string&,
                    const std::string&>(),
           py::arg("config"), py::arg("host") = "127.0.0.1", py::arg("port") = 0,
           py::arg("rest_port") = 0, py::arg("metrics_port") = 0, py::arg("code_digest") = "",
           py::arg("job_key") = "")
      .def_property_readonly("address", &onebit::PyCoordinator::address)
      .def_property_readonly("rest_address", &onebit::PyCoordinator::rest_address)
      .def_property_readonly("metrics_address", &onebit::PyCoordinator::metrics_address)
      .def("poll", &onebit::PyCoordinator::Poll)
      .def_property_readonly("failure_reason", &onebit::PyCoordinator::failure_reason)
      .def("abandon", &onebit::PyCoordinator::Abandon, py::arg("reason"))
      .def("recover", &onebit::PyCoordinator::Recover, py::arg("reason"))
      .def("close", &onebit::PyCoordinator::Close);
  // A config's text (comments and trailing commas allowed, as the C++ parser takes them) as
  // strict JSON, for Python's json module.
  m.def("strict_json", [](const std::string& text) {
    absl::StatusOr<std::string> json = onebit::StrictJson(text);
    if (!json.ok()) onebit::Throw(json.status());
    return *json;
  }, py::arg("text"));
  // onebit.failure.max_restarts where a config leaves it out (torch.py's launcher default).
  m.attr("DEFAULT_MAX_RESTARTS") = onebit::FailureConfig{}.max_restarts;
  // The most onebit.momentum_mask.ranges a config may list (torch.py's exp_avg_mask).
  m.attr("MAX_MASK_RANGES") = onebit::kMaxMaskRanges;
  // The job config's errors before anything starts: ValueError naming the key; returns the
  // notices (keys accepted without effect).
  m.def("check_config", [](const std::string& path) {
    absl::StatusOr<onebit::JobConfig> config = onebit::LoadJobConfig(path);
    if (!config.ok()) onebit::Throw(config.status());
    return config->notices;
  }, py::arg("path"));
  // What onebit.torch decides its defaults by, from the C++ rules: whether the config's
  // warmup exchange goes between the workers (peer mode, or ps with warmup_over "workers":
  // overlap is on by default there), whether the trainer scales the loss (fp16), the
  // micro-batches a step (gradient_accumulation_steps, as the batch keys resolve it) and
  // whether the config's scheduler cycles the betas (OneCycle's cycle_momentum). The
  // config's errors raise ValueError as check_config's do.
  m.def("config_facts", [](const std::string& text) {
    absl::StatusOr<onebit::JobConfig> config = onebit::ParseJobConfig(text);
    if (!config.ok()) onebit::Throw(config.status());
    py::dict facts;
    facts["warmup_between_workers"] = onebit::WarmupBetweenWorkers(config->exchange);
    facts["scales_loss"] = onebit::ScalesLoss(*config);
    facts["micro_batches"] = config->gradient_accumulation_steps;
    facts["cycles_betas"] = onebit::SchedulerCyclesBetas(*config);
    return facts;
  }, py::arg("text"));
}
