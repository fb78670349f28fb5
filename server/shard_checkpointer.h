// A shard's side of checkpoints (docs/design.md, "Two-phase checkpoint commit"): the
// server error after a checkpoint step goes to <dir>/step-S/server-I.part (I: the job-wide shard index), then
// to the coordinator with its size and CRC-32. The shard hands the error over from under
// its lock (ShardConfig::on_checkpoint); a thread of this class writes and reports it, so
// the shard never waits on the disk or the coordinator.
//
// Thread safety: Enqueue and Start from any thread. Finish (or the destructor) drains the
// queue for a bounded time: a shard stopping must not wait on a coordinator that is gone.
#ifndef ONEBIT_SERVER_SHARD_CHECKPOINTER_H_
#define ONEBIT_SERVER_SHARD_CHECKPOINTER_H_

#include <cstdint>
#include <deque>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "coordinator/coordinator_client.h"
#include "server/shard_state.h"

namespace onebit::server {

class ShardCheckpointer {
 public:
  // `index`: the job-wide shard index the coordinator knows this shard by.
  ShardCheckpointer(std::string dir, int index, std::string topology);
  ~ShardCheckpointer();

  // ShardConfig::on_checkpoint: queues the part; returns at once.
  void Enqueue(int64_t step, std::vector<float> server_error) ABSL_LOCKS_EXCLUDED(mu_);
  // Starts writing (parts queued before wait for this). `client` is borrowed.
  void Start(CoordinatorClient* client, std::string instance_id) ABSL_LOCKS_EXCLUDED(mu_);
  // Writes and reports what is queued for up to `budget`; then cancels the client's calls
  // (a coordinator that is gone or hangs: CoordinatorClient::Cancel), drops the parts not
  // yet written, and joins. Returns how many parts were dropped. Idempotent; the
  // destructor calls it with kFinishBudget.
  int Finish(absl::Duration budget) ABSL_LOCKS_EXCLUDED(mu_);
  static constexpr absl::Duration kFinishBudget = absl::Seconds(2);
  // The first failure to write or report a part; OK while none.
  absl::Status status() const ABSL_LOCKS_EXCLUDED(mu_);

  // A resumed job: the server error of this shard's part of the checkpoint `resume`.
  static absl::Status Restore(const std::string& dir, const v1::ResumeFrom& resume, int index,
                              ShardState& state);

 private:
  void Run();
  absl::Status Write(int64_t step, std::vector<float> server_error);

  const std::string dir_;
  const int index_;
  const std::string topology_;
  mutable absl::Mutex mu_;
  std::deque<std::pair<int64_t, std::vector<float>>> queue_ ABSL_GUARDED_BY(mu_);
  CoordinatorClient* client_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::string instance_id_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;  // Finish ran out of time
  bool done_ ABSL_GUARDED_BY(mu_) = false;       // Run returned
  int dropped_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace onebit::server

#endif  // ONEBIT_SERVER_SHARD_CHECKPOINTER_H_
