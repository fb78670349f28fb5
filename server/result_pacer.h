// ResultPacer: the order in which a shard writes one step's large result to its workers.
//
// When a step completes, every worker's stream has the result to write at once; written
// together they converge on the links: each shard's uplink carries W flows, and each
// worker's downlink takes every shard's result at once, which shaped links serve far below
// their rate (BENCHMARKS.md, "ps shards beside the workers"; the same as gloo's all-at-once
// alltoall against one shift at a time). Paced, the writes go one at a time in a rotated
// order, first_worker, first_worker + 1, ... (mod W): with shard s starting at worker
// s + 1, in every round each shard sends to one worker and each worker hears from one
// shard, like the shifts of the peer exchange, and a shard beside worker s (one on each
// worker's node) serves its own worker, over no link, last.
//
// A worker waits for the writes before its turn, at most `max_wait` in all: a worker that
// stops reading (or a write stuck behind flow control) costs the others that much, not
// the step. Results of an earlier step than the latest (a retry) are written at once.
//
// Thread safety: thread-safe; one thread per worker stream calls AwaitTurn and Done.
#ifndef ONEBIT_SERVER_RESULT_PACER_H_
#define ONEBIT_SERVER_RESULT_PACER_H_

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace onebit::server {

class ResultPacer {
 public:
  // num_workers >= 1; first_worker is taken mod num_workers.
  ResultPacer(int num_workers, int first_worker, absl::Duration max_wait);

  // Returns when `worker` may write its result of `step`: every worker before it in the
  // order has called Done for that step, or max_wait passed, or cancelled() (read every
  // 50 ms) said the stream is gone. Returns whether it was the worker's turn (false: it
  // timed out or was cancelled; the caller writes anyway, or gives up if cancelled).
  bool AwaitTurn(int64_t step, int worker, const std::function<bool()>& cancelled);

  // `worker` has written its result of `step` (or failed to): the next one may go.
  void Done(int64_t step, int worker);

 private:
  int Position(int worker) const;
  // Opens `step` if it is newer than the current one.
  void AdvanceTo(int64_t step) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int num_workers_;
  const int first_worker_;
  const absl::Duration max_wait_;
  absl::Mutex mu_;
  int64_t step_ ABSL_GUARDED_BY(mu_) = -1;
  std::vector<bool> done_ ABSL_GUARDED_BY(mu_);  // by position in the order
  int next_ ABSL_GUARDED_BY(mu_) = 0;            // the first position not yet done
};

}  // namespace onebit::server

#endif  // ONEBIT_SERVER_RESULT_PACER_H_
