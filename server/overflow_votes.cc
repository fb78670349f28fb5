#include "server/overflow_votes.h"

#include <algorithm>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace onebit::server {

OverflowVotes::OverflowVotes(int num_workers, int retained_steps)
    : num_workers_(std::max(1, num_workers)), retained_steps_(std::max(2, retained_steps)) {}

absl::Status OverflowVotes::Check(int worker, int64_t step) const {
  if (worker < 0 || worker >= num_workers_) {
    return absl::InvalidArgumentError(
        absl::StrCat("worker ", worker, " is not in [0, ", num_workers_, ")"));
  }
  if (step < 1) return absl::InvalidArgumentError(absl::StrCat("step ", step, " < 1"));
  if (step < oldest_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "overflow vote for step ", step, ", older than the steps kept (from ", oldest_, ")"));
  }
  // Another open step this worker voted on and that is later: it went backwards.
  for (auto it = ballots_.upper_bound(step); it != ballots_.end(); ++it) {
    if (it->second.count < num_workers_ && it->second.votes[worker] >= 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "worker ", worker, " votes on step ", step, " after voting on step ", it->first));
    }
  }
  return absl::OkStatus();
}

void OverflowVotes::Forget() {
  // Keep the retained_steps newest decided steps and every open one.
  int decided = 0;
  for (auto it = ballots_.rbegin(); it != ballots_.rend(); ++it) {
    if (it->second.count == num_workers_ && ++decided > retained_steps_) {
      oldest_ = it->first + 1;
      ballots_.erase(ballots_.begin(), it.base());  // up to and including *it
      return;
    }
  }
}

absl::StatusOr<bool> OverflowVotes::Vote(int worker, int64_t step, bool overflow,
                                         absl::Time deadline,
                                         const std::function<bool()>& cancelled) {
  absl::MutexLock lock(&mu_);
  auto found = ballots_.find(step);
  if (found == ballots_.end() || worker < 0 || worker >= num_workers_) {
    if (absl::Status s = Check(worker, step); !s.ok()) return s;
    Ballot ballot;
    ballot.votes.assign(num_workers_, -1);
    found = ballots_.emplace(step, std::move(ballot)).first;
  }
  Ballot& b = found->second;
  const int8_t mine = overflow ? 1 : 0;
  if (b.votes[worker] >= 0 && b.votes[worker] != mine) {
    return absl::AlreadyExistsError(absl::StrCat("worker ", worker, " voted ",
                                                 b.votes[worker] ? "overflow" : "no overflow",
                                                 " on step ", step, " already"));
  }
  if (b.votes[worker] < 0) {
    if (absl::Status s = Check(worker, step); !s.ok()) return s;
    b.votes[worker] = mine;
    ++b.count;
    b.any = b.any || overflow;
    if (b.count == num_workers_) {
      Forget();
      decided_.SignalAll();
    }
  }
  // Looked up again after every wait: Forget may drop a step decided long ago.
  while (true) {
    auto it = ballots_.find(step);
    if (it == ballots_.end()) {
      return absl::FailedPreconditionError(
          absl::StrCat("overflow vote for step ", step, " was forgotten"));
    }
    if (it->second.count == num_workers_) return it->second.any;
    if (absl::Now() >= deadline || (cancelled && cancelled())) {
      std::vector<int> missing;
      for (int w = 0; w < num_workers_; ++w) {
        if (it->second.votes[w] < 0) missing.push_back(w);
      }
      return absl::UnavailableError(absl::StrCat("overflow vote of step ", step,
                                                 ": no vote yet from worker(s) ",
                                                 absl::StrJoin(missing, ", ")));
    }
    decided_.WaitWithDeadline(&mu_, std::min(deadline, absl::Now() + absl::Milliseconds(50)));
  }
}

}  // namespace onebit::server
