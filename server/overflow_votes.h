// fp16's overflow agreement on a shard (ParameterServer.AgreeOverflow): each of W workers
// votes, per step, whether its gradient overflowed; once all W have voted, every one of
// them is answered whether any did. Workers in ps mode have no transport between them, so
// shard 0 is where they meet (worker/exchange/ps_exchange.h asks it).
//
// IDEMPOTENT per (worker, step): the answers of the last `retained_steps` decided steps are
// kept, so a retried vote is answered again; a repeat with the other value is
// ALREADY_EXISTS (the worker changed its mind: nothing right can be answered). Steps need
// not be consecutive (a step that overflowed everywhere is never pushed, and 0/1 Adam's
// local steps do not vote), but a worker votes in increasing steps.
//
// VALIDATION, each leaving the votes untouched: INVALID_ARGUMENT for a worker outside
// [0, W) or a step < 1; FAILED_PRECONDITION for a step older than the retained window, or a
// step before this worker's last vote while that is still open.
//
// Thread safety: thread-safe.
#ifndef ONEBIT_SERVER_OVERFLOW_VOTES_H_
#define ONEBIT_SERVER_OVERFLOW_VOTES_H_

#include <cstdint>
#include <functional>
#include <map>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace onebit::server {

class OverflowVotes {
 public:
  explicit OverflowVotes(int num_workers, int retained_steps = 8);

  // Records the vote and waits until every worker voted on `step`: then whether any voted
  // true. UNAVAILABLE at `deadline` or once `cancelled()` (polled every ~50 ms) says the
  // caller went away, naming the workers still missing; the vote stays recorded.
  absl::StatusOr<bool> Vote(int worker, int64_t step, bool overflow, absl::Time deadline,
                            const std::function<bool()>& cancelled);

 private:
  struct Ballot {
    std::vector<int8_t> votes;  // -1: not yet; 0, 1
    int count = 0;
    bool any = false;
  };
  absl::Status Check(int worker, int64_t step) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Forget() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int num_workers_;
  const int retained_steps_;
  absl::Mutex mu_;
  absl::CondVar decided_;  // signalled when a step has all its votes
  std::map<int64_t, Ballot> ballots_ ABSL_GUARDED_BY(mu_);
  // Steps below this were forgotten.
  int64_t oldest_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace onebit::server

#endif  // ONEBIT_SERVER_OVERFLOW_VOTES_H_
