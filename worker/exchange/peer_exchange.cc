#include "worker/exchange/peer_exchange.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace onebit {

struct PeerExchange::Overlap {
  std::vector<std::pair<size_t, size_t>> buckets;
  std::vector<std::unique_ptr<ExactAllreduce>> allreduces;  // one per bucket
  kernels::Buffer<float> sum;                               // the buckets' sums, n elements
  std::thread thread;

  std::mutex mu;
  std::condition_variable cv;
  // Guarded by mu.
  bool stop = false;
  bool open = false;  // a step is open (BeginOverlap .. SumGradients/EndOverlap)
  int64_t step = 0;
  const float* grad = nullptr;
  size_t announced = 0;  // buckets whose gradient is final
  size_t started = 0;    // buckets taken by a thread (in order: the transport's order)
  size_t done = 0;       // buckets finished (or skipped); started - done <= 1
  // SumGradients takes the buckets not started yet itself (no hand-off to the exchange
  // thread and back: under load each costs a scheduling delay).
  bool draining = false;
  absl::Status status;   // the open step's first error
  double busy_seconds = 0.0;
};

absl::StatusOr<std::unique_ptr<PeerExchange>> PeerExchange::Create(
    kernels::Backend* backend, Transport* transport, size_t n,
    const ExactAllreduceOptions& exact, kernels::Compressor compressor) {
  ONEBIT_RETURN_IF_ERROR(CheckSameMemorySpace(*backend, *transport));
  std::unique_ptr<PeerExchange> e(new PeerExchange(backend, transport, n, exact));
  ONEBIT_ASSIGN_OR_RETURN(e->exact_, ExactAllreduce::Create(backend, transport, n, exact));
  ONEBIT_ASSIGN_OR_RETURN(e->compressed_,
                          CompressedAllreduce::Create(backend, transport, n, compressor));
  if (compressor == kernels::Compressor::kInt8) {
    ONEBIT_ASSIGN_OR_RETURN(e->decoded_, kernels::Buffer<float>::Create(backend, n));
  }
  return e;
}

PeerExchange::PeerExchange(kernels::Backend* backend, Transport* transport, size_t n,
                           const ExactAllreduceOptions& exact)
    : backend_(backend), transport_(transport), n_(n), exact_options_(exact) {}

PeerExchange::~PeerExchange() {
  if (overlap_ == nullptr) return;
  {
    std::lock_guard<std::mutex> lock(overlap_->mu);
    overlap_->stop = true;
  }
  overlap_->cv.notify_all();
  overlap_->thread.join();  // a bucket in flight ends, at worst with the transport's timeout
}

absl::Status PeerExchange::EnableOverlap(const std::vector<std::pair<size_t, size_t>>& buckets) {
  if (overlap_ != nullptr) return absl::FailedPreconditionError("overlap is already enabled");
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
  auto o = std::make_unique<Overlap>();
  o->buckets = buckets;
  for (const auto& [begin, end] : buckets) {
    ONEBIT_ASSIGN_OR_RETURN(std::unique_ptr<ExactAllreduce> a,
                            ExactAllreduce::Create(backend_, transport_, end - begin,
                                                   exact_options_));
    o->allreduces.push_back(std::move(a));
  }
  ONEBIT_ASSIGN_OR_RETURN(o->sum, kernels::Buffer<float>::Create(backend_, n_));
  overlap_ = std::move(o);
  overlap_->thread = std::thread([this] { OverlapLoop(); });
  return absl::OkStatus();
}

absl::Status PeerExchange::RunBucket(size_t i, const float* grad, int64_t step) {
  Overlap& o = *overlap_;
  const auto [begin, end] = o.buckets[i];
  absl::Status status = o.allreduces[i]->Run(grad + begin);
  if (status.ok()) {
    status = backend_->Copy(o.sum.data() + begin, o.allreduces[i]->result(),
                            (end - begin) * sizeof(float));
  }
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrCat("overlapped exchange of gradient [", begin,
                                                  ", ", end, ") of step ", step, ": ",
                                                  status.message()));
}

// Takes the next bucket (lock held; one at a time, in order) and runs it (lock released).
void PeerExchange::RunNextBucket(std::unique_lock<std::mutex>& lock) {
  Overlap& o = *overlap_;
  const size_t i = o.started++;
  const float* grad = o.grad;
  const int64_t step = o.step;
  const bool skip = !o.status.ok();  // after an error the transport is not to be trusted
  lock.unlock();
  absl::Status status;
  double seconds = 0.0;
  if (!skip) {
    ScopedStepTime time(step_clock(), &seconds);
    status = RunBucket(i, grad, step);
  }
  lock.lock();
  o.busy_seconds += seconds;
  if (!status.ok() && o.status.ok()) o.status = status;
  ++o.done;
  o.cv.notify_all();
}

void PeerExchange::OverlapLoop() {
  Overlap& o = *overlap_;
  std::unique_lock<std::mutex> lock(o.mu);
  while (true) {
    o.cv.wait(lock, [&] {
      return o.stop || (o.open && !o.draining && o.started == o.done && o.started < o.announced);
    });
    if (o.stop) return;
    RunNextBucket(lock);
  }
}

absl::Status PeerExchange::Drain(std::unique_lock<std::mutex>& lock, size_t last) {
  Overlap& o = *overlap_;
  o.draining = true;
  o.cv.wait(lock, [&] { return o.started == o.done; });  // the bucket in flight, if any
  while (o.started < last) RunNextBucket(lock);
  o.draining = false;
  o.open = false;
  return std::exchange(o.status, absl::OkStatus());
}

absl::Status PeerExchange::BeginOverlap(int64_t step, const float* grad) {
  if (overlap_ == nullptr) return absl::FailedPreconditionError("overlap is not enabled");
  std::lock_guard<std::mutex> lock(overlap_->mu);
  if (overlap_->open) {
    return absl::FailedPreconditionError(
        absl::StrCat("the overlapped exchange of step ", overlap_->step, " is still open"));
  }
  overlap_->open = true;
  overlap_->step = step;
  overlap_->grad = grad;
  overlap_->announced = overlap_->started = overlap_->done = 0;
  overlap_->draining = false;
  overlap_->status = absl::OkStatus();
  return absl::OkStatus();
}

void PeerExchange::BucketReady(size_t begin, size_t end) {
  if (overlap_ == nullptr) return;
  Overlap& o = *overlap_;
  {
    std::lock_guard<std::mutex> lock(o.mu);
    if (!o.open) return;
    if (o.announced >= o.buckets.size() ||
        o.buckets[o.announced] != std::make_pair(begin, end)) {
      if (o.status.ok()) {
        o.status = absl::InternalError(absl::StrCat(
            "gradient [", begin, ", ", end, ") announced out of order at step ", o.step,
            o.announced < o.buckets.size()
                ? absl::StrCat(": expected [", o.buckets[o.announced].first, ", ",
                               o.buckets[o.announced].second, ")")
                : ": every bucket was already announced"));
      }
      return;
    }
    ++o.announced;
  }
  o.cv.notify_all();
}

absl::Status PeerExchange::EndOverlap() {
  if (overlap_ == nullptr) return absl::OkStatus();
  Overlap& o = *overlap_;
  std::unique_lock<std::mutex> lock(o.mu);
  if (!o.open) return absl::OkStatus();
  return Drain(lock, o.announced);  // the announced buckets, as the other ranks may run them
}

double PeerExchange::overlap_busy_seconds() const {
  if (overlap_ == nullptr) return 0.0;
  std::lock_guard<std::mutex> lock(overlap_->mu);
  return overlap_->busy_seconds;
}

absl::StatusOr<const float*> PeerExchange::SumGradients(int64_t step, const float* grad) {
  if (overlap_ != nullptr) {
    Overlap& o = *overlap_;
    std::unique_lock<std::mutex> lock(o.mu);
    if (o.open) {
      if (o.step != step || o.grad != grad) {
        const int64_t open_step = o.step;
        lock.unlock();
        const absl::Status ended = EndOverlap();
        return absl::FailedPreconditionError(absl::StrCat(
            "the warmup sum of step ", step, " does not match the open overlapped exchange (step ",
            open_step, ", or another gradient buffer)",
            ended.ok() ? "" : absl::StrCat("; that exchange failed: ", ended.message())));
      }
      // Every bucket is final now (the workload announces none, or stopped early): this
      // thread runs, in order, the ones the exchange thread has not started.
      o.announced = o.buckets.size();
      ONEBIT_RETURN_IF_ERROR(Drain(lock, o.buckets.size()));
      return o.sum.data();
    }
  }
  ONEBIT_RETURN_IF_ERROR(exact_->Run(grad));
  return exact_->result();
}

absl::StatusOr<CompressedResult> PeerExchange::AverageMomentum(int64_t /*step*/, const float* m,
                                                               const float* g, float beta1) {
  ONEBIT_RETURN_IF_ERROR(compressed_->RunMomentum(m, g, beta1));
  CompressedResult r{compressed_->result_blocks(), compressed_->num_chunks(),
                     compressed_->chunk()};
  r.compressor = compressed_->compressor();
  if (r.compressor == kernels::Compressor::kInt8) {  // see CompressedResult
    ONEBIT_RETURN_IF_ERROR(compressed_->DecodeResult(decoded_.data()));
    r.momentum = decoded_.data();
  }
  return r;
}

absl::StatusOr<CompressedResult> PeerExchange::CompressedAverage(int64_t step, const float* x) {
  // Without a gradient the compressor takes its input as it is.
  return AverageMomentum(step, x, nullptr, 0.0f);
}

absl::Status PeerExchange::ResetErrors(int64_t /*step*/) {
  ONEBIT_RETURN_IF_ERROR(compressed_->mutable_worker().ResetError());
  return compressed_->mutable_server().ResetError();
}

absl::StatusOr<bool> PeerExchange::AnyOverflow(int64_t /*step*/, bool local_overflow) {
  return AnyAcrossRanks(transport_, backend_, &flag_, local_overflow);
}

absl::StatusOr<ErrorState> PeerExchange::SaveErrors() {
  ONEBIT_ASSIGN_OR_RETURN(ErrorState state, Exchange::SaveErrors());
  ONEBIT_ASSIGN_OR_RETURN(state["server_error"], compressed_->server().error().ToHost());
  return state;
}

absl::Status PeerExchange::RestoreErrors(const ErrorState& state) {
  ONEBIT_ASSIGN_OR_RETURN(const std::vector<float>* server, FindError(state, "server_error"));
  if (server->size() != compressed_->server().chunk()) {
    return absl::InvalidArgumentError(absl::StrCat("server_error has ", server->size(),
                                                   " elements, this rank's chunk ",
                                                   compressed_->server().chunk()));
  }
  ONEBIT_RETURN_IF_ERROR(Exchange::RestoreErrors(state));
  return compressed_->mutable_server().RestoreError(*server);
}

}  // namespace onebit
