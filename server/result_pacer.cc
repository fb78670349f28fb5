#include "server/result_pacer.h"

#include <algorithm>

#include "absl/time/clock.h"

namespace onebit::server {

ResultPacer::ResultPacer(int num_workers, int first_worker, absl::Duration max_wait)
    : num_workers_(std::max(1, num_workers)),
      first_worker_(((first_worker % num_workers_) + num_workers_) % num_workers_),
      max_wait_(max_wait),
      done_(num_workers_, false) {}

int ResultPacer::Position(int worker) const {
  return ((worker - first_worker_) % num_workers_ + num_workers_) % num_workers_;
}

void ResultPacer::AdvanceTo(int64_t step) {
  if (step <= step_) return;
  step_ = step;
  done_.assign(num_workers_, false);
  next_ = 0;
}

bool ResultPacer::AwaitTurn(int64_t step, int worker, const std::function<bool()>& cancelled) {
  const int position = Position(worker);
  const absl::Time give_up = absl::Now() + max_wait_;
  absl::MutexLock lock(&mu_);
  if (step < step_) return true;  // a retry of an older step: nothing to pace
  AdvanceTo(step);
  auto turn = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return step_ != step || next_ >= position;
  };
  while (!turn()) {
    if (cancelled()) return false;
    const absl::Time now = absl::Now();
    if (now >= give_up) return false;
    mu_.AwaitWithDeadline(absl::Condition(&turn), std::min(give_up, now + absl::Milliseconds(50)));
  }
  return true;
}

void ResultPacer::Done(int64_t step, int worker) {
  absl::MutexLock lock(&mu_);
  AdvanceTo(step);
  if (step != step_) return;
  done_[Position(worker)] = true;
  while (next_ < num_workers_ && done_[next_]) ++next_;
}

}  // namespace onebit::server
