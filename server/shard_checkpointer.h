// A shard's side of checkpoints (DESIGN.md, two-phase commit): the server error after a
// checkpoint step goes to <dir>/step-S/server-I.part (I: the job-wide shard index), then
// to the coordinator with its size and CRC-32. The shard hands the error over from under
// its lock (ShardConfig::on_checkpoint); a thread of this class writes and reports it, so
// the shard never waits on the disk or the coordinator.
//
// Thread safety: Enqueue and Start from any thread; the destructor drains the queue.
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
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace onebit::server

#endif  // ONEBIT_SERVER_SHARD_CHECKPOINTER_H_
