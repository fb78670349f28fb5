#include "worker/exchange/overlapped_warmup.h"

#include <algorithm>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/buffer.h"

namespace onebit {

struct OverlappedWarmup::State {
  std::vector<std::pair<size_t, size_t>> buckets;
  std::vector<std::unique_ptr<ExactAllreduce>> allreduces;  // one per bucket
  kernels::Buffer<float> sum;                               // the buckets' sums, n elements
  std::thread thread;

  mutable std::mutex mu;
  std::condition_variable cv;
  // Guarded by mu.
  bool stop = false;
  bool open = false;  // a step is open (Begin .. Finish/End)
  int64_t step = 0;
  const float* grad = nullptr;
  size_t announced = 0;  // buckets whose gradient is final
  size_t started = 0;    // buckets taken by a thread (in order: the transport's order)
  size_t done = 0;       // buckets finished (or skipped); started - done <= 1
  // Finish takes the buckets not started yet itself (no hand-off to the exchange thread
  // and back: under load each costs a scheduling delay).
  bool draining = false;
  absl::Status status;  // the open step's first error
  double busy_seconds = 0.0;
};

OverlappedWarmup::OverlappedWarmup(kernels::Backend* backend, Transport* transport, size_t n,
                                   const ExactAllreduceOptions& exact)
    : backend_(backend), transport_(transport), n_(n), exact_options_(exact) {}

uint64_t OverlappedWarmup::buffer_bytes() const {
  if (state_ == nullptr) return 0;
  uint64_t bytes = state_->sum.bytes();
  for (const auto& a : state_->allreduces) bytes += a->buffer_bytes();
  return bytes;
}

OverlappedWarmup::~OverlappedWarmup() {
  if (state_ == nullptr) return;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->stop = true;
  }
  state_->cv.notify_all();
  state_->thread.join();  // a bucket in flight ends, at worst with the transport's timeout
}

absl::Status OverlappedWarmup::Enable(const std::vector<std::pair<size_t, size_t>>& buckets) {
  if (state_ != nullptr) return absl::FailedPreconditionError("overlap is already enabled");
  if (buckets.empty()) return absl::InvalidArgumentError("overlap needs at least one bucket");
  // A partition of [0, n): sorted by begin, they must tile it.
  std::vector<std::pair<size_t, size_t>> sorted = buckets;
  std::sort(sorted.begin(), sorted.end());
  size_t covered = 0;
  for (const auto& [begin, end] : sorted) {
    if (begin != covered || end <= begin) {
      return absl::InvalidArgumentError(absl::StrCat(
          "overlap buckets must partition [0, ", n_, ") into non-empty ranges; [", begin, ", ",
          end, ") does not follow [0, ", covered, ")"));
    }
    covered = end;
  }
  if (covered != n_) {
    return absl::InvalidArgumentError(
        absl::StrCat("overlap buckets cover [0, ", covered, "), the gradient has ", n_));
  }
  auto s = std::make_unique<State>();
  s->buckets = buckets;
  for (const auto& [begin, end] : buckets) {
    ONEBIT_ASSIGN_OR_RETURN(std::unique_ptr<ExactAllreduce> a,
                            ExactAllreduce::Create(backend_, transport_, end - begin,
                                                   exact_options_));
    s->allreduces.push_back(std::move(a));
  }
  ONEBIT_ASSIGN_OR_RETURN(s->sum, kernels::Buffer<float>::Create(backend_, n_));
  state_ = std::move(s);
  state_->thread = std::thread([this] { Loop(); });
  return absl::OkStatus();
}

absl::Status OverlappedWarmup::RunBucket(size_t i, const float* grad, int64_t step) {
  State& s = *state_;
  const auto [begin, end] = s.buckets[i];
  absl::Status status = s.allreduces[i]->Run(grad + begin);
  if (status.ok()) {
    status = backend_->Copy(s.sum.data() + begin, s.allreduces[i]->result(),
                            (end - begin) * sizeof(float));
  }
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrCat("overlapped exchange of gradient [", begin,
                                                  ", ", end, ") of step ", step, ": ",
                                                  status.message()));
}

// Takes the next bucket (lock held; one at a time, in order) and runs it (lock released).
void OverlappedWarmup::RunNextBucket(std::unique_lock<std::mutex>& lock) {
  State& s = *state_;
  const size_t i = s.started++;
  const float* grad = s.grad;
  const int64_t step = s.step;
  const bool skip = !s.status.ok();  // after an error the transport is not to be trusted
  lock.unlock();
  absl::Status status;
  double seconds = 0.0;
  if (!skip) {
    ScopedStepTime time(clock_, &seconds);
    status = RunBucket(i, grad, step);
  }
  lock.lock();
  s.busy_seconds += seconds;
  if (!status.ok() && s.status.ok()) s.status = status;
  ++s.done;
  s.cv.notify_all();
}

void OverlappedWarmup::Loop() {
  State& s = *state_;
  std::unique_lock<std::mutex> lock(s.mu);
  while (true) {
    s.cv.wait(lock, [&] {
      return s.stop || (s.open && !s.draining && s.started == s.done && s.started < s.announced);
    });
    if (s.stop) return;
    RunNextBucket(lock);
  }
}

absl::Status OverlappedWarmup::Drain(std::unique_lock<std::mutex>& lock, size_t last) {
  State& s = *state_;
  s.draining = true;
  s.cv.wait(lock, [&] { return s.started == s.done; });  // the bucket in flight, if any
  while (s.started < last) RunNextBucket(lock);
  s.draining = false;
  s.open = false;
  return std::exchange(s.status, absl::OkStatus());
}

absl::Status OverlappedWarmup::Begin(int64_t step, const float* grad) {
  if (state_ == nullptr) return absl::FailedPreconditionError("overlap is not enabled");
  State& s = *state_;
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.open) {
    return absl::FailedPreconditionError(
        absl::StrCat("the overlapped exchange of step ", s.step, " is still open"));
  }
  s.open = true;
  s.step = step;
  s.grad = grad;
  s.announced = s.started = s.done = 0;
  s.draining = false;
  s.status = absl::OkStatus();
  return absl::OkStatus();
}

void OverlappedWarmup::BucketReady(size_t begin, size_t end) {
  if (state_ == nullptr) return;
  State& s = *state_;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    if (!s.open) return;
    if (s.announced >= s.buckets.size() ||
        s.buckets[s.announced] != std::make_pair(begin, end)) {
      if (s.status.ok()) {
        s.status = absl::InternalError(absl::StrCat(
            "gradient [", begin, ", ", end, ") announced out of order at step ", s.step,
            s.announced < s.buckets.size()
                ? absl::StrCat(": expected [", s.buckets[s.announced].first, ", ",
                               s.buckets[s.announced].second, ")")
                : ": every bucket was already announced"));
      }
      return;
    }
    ++s.announced;
  }
  s.cv.notify_all();
}

absl::Status OverlappedWarmup::End() {
  if (state_ == nullptr) return absl::OkStatus();
  State& s = *state_;
  std::unique_lock<std::mutex> lock(s.mu);
  if (!s.open) return absl::OkStatus();
  return Drain(lock, s.announced);  // the announced buckets, as the other ranks may run them
}

bool OverlappedWarmup::open() const {
  if (state_ == nullptr) return false;
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->open;
}

absl::StatusOr<const float*> OverlappedWarmup::Finish(int64_t step, const float* grad) {
  if (state_ == nullptr) return absl::FailedPreconditionError("overlap is not enabled");
  State& s = *state_;
  std::unique_lock<std::mutex> lock(s.mu);
  if (!s.open) return absl::FailedPreconditionError("no overlapped exchange is open");
  if (s.step != step || s.grad != grad) {
    const int64_t open_step = s.step;
    const absl::Status ended = Drain(lock, s.announced);
    return absl::FailedPreconditionError(absl::StrCat(
        "the warmup sum of step ", step, " does not match the open overlapped exchange (step ",
        open_step, ", or another gradient buffer)",
        ended.ok() ? "" : absl::StrCat("; that exchange failed: ", ended.message())));
  }
  // Every bucket is final now (the workload announces none, or stopped early).
  s.announced = s.buckets.size();
  ONEBIT_RETURN_IF_ERROR(Drain(lock, s.buckets.size()));
  return s.sum.data();
}

double OverlappedWarmup::busy_seconds() const {
  if (state_ == nullptr) return 0.0;
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->busy_seconds;
}

}  // namespace onebit
