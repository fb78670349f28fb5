// A worker's side of checkpoints (docs/design.md, "Two-phase checkpoint commit").
//
// Save (after a checkpoint step S) snapshots the state to host memory on the training
// thread; a writer thread encodes, writes and reports it. Save returns once the part is
// reported, or with `async` at once (it waits for the previous part first, so at most one
// snapshot is in memory; Flush waits for the last: call it before the process exits).
// This worker's part, <dir>/step-S/worker-R.part, holds
//   params, exp_avg, exp_avg_sq   the slice [R*n/W, (R+1)*n/W): every worker has the same
//                                 p, m and v, so the W parts together hold them once.
//                                 SHARDED STATE (Exchange::state_shard): node j's share
//                                 of its state range, Slice(state_count, j, nodes) from
//                                 state_begin; the W parts again hold [0, n) once
//   worker_error (+ server_error in peer mode)   this worker's own error buffers, whole
// and meta (step, rank, world size, n, slice, topology). The file is written atomically,
// then reported to the coordinator with its size and CRC-32; the coordinator writes the
// manifest when every part is in.
//
// Restore (a resumed job): p, m and v are put together over the optimizer's state range
// (all n, or a sharded worker's own) from the worker parts the manifest lists that overlap
// it (any former world size, local size or sharding: each part says which slice it holds;
// the others are read only up to their tensors' shapes); this worker's own error buffers
// come from its own part unless the coordinator said the topology changed
// (ResumeFrom.reset_errors), in which case they start at zero.
//
// Thread safety: one thread at a time.
#ifndef ONEBIT_WORKER_CHECKPOINTER_H_
#define ONEBIT_WORKER_CHECKPOINTER_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "checkpoint/part.h"
#include "coordinator/coordinator_client.h"
#include "worker/exchange/exchange.h"
#include "worker/optim/optimizer.h"
#include "worker/trainer.h"

namespace onebit {

struct CheckpointerOptions {
  std::string dir;  // the job's checkpoint.dir
  int rank = 0;
  int world_size = 1;
  std::string instance_id;  // for CommitPart
  std::string topology;     // checkpoint::TopologyKey of the job
  bool async = false;  // onebit.checkpoint.async
  // Called after the part is written and before it is reported (fault injection).
  std::function<void(int64_t step)> before_commit;
};

class WorkerCheckpointer : public CheckpointSink {
 public:
  // `client` is borrowed (null: parts are written but not reported, for tests).
  WorkerCheckpointer(const CheckpointerOptions& options, CoordinatorClient* client);
  ~WorkerCheckpointer() override;  // flushes

  // Snapshots and queues; the error of an earlier part's write, if one failed.
  absl::Status Save(int64_t step, Optimizer& optimizer,
                    const StateScalars& trainer_scalars) override;
  // Waits until every queued part is written and reported; the first error, if any.
  absl::Status Flush();

 private:
  struct Pending {
    int64_t step = 0;
    checkpoint::Part part;
  };
  void Run();
  absl::Status Write(Pending pending);

  CheckpointerOptions options_;
  CoordinatorClient* client_;
  absl::Mutex mu_;
  std::optional<Pending> pending_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

// Restores `optimizer` (and its exchange's error buffers) from the checkpoint `resume`
// names under `dir`. Errors name the file and what is wrong (DATA_LOSS for a damaged part,
// INVALID_ARGUMENT for one that does not fit this job). A sharded optimizer's Restore
// all-gathers p inside the node: every local worker calls this at the same point (every
// worker of a resumed job does, at start).
// `trainer_scalars` (may be null) gets the trainer's scalars (Trainer::RestoreScalars), from
// the first worker part that has them: every worker saves the same, and a worker of a
// larger world has no part of its own.
absl::Status RestoreWorker(const std::string& dir, const v1::ResumeFrom& resume, int rank,
                           Optimizer& optimizer, StateScalars* trainer_scalars = nullptr);

}  // namespace onebit

#endif  // ONEBIT_WORKER_CHECKPOINTER_H_
