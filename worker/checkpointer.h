// A worker's side of checkpoints (DESIGN.md, two-phase commit).
//
// Save (after a checkpoint step S): this worker's part, <dir>/step-S/worker-R.part, holds
//   params, exp_avg, exp_avg_sq   the slice [R*n/W, (R+1)*n/W): every worker has the same
//                                 p, m and v, so the W parts together hold them once
//   worker_error (+ server_error in peer mode)   this worker's own error buffers, whole
// and meta (step, rank, world size, n, slice, topology). The file is written atomically,
// then reported to the coordinator with its size and CRC-32; the coordinator writes the
// manifest when every part is in.
//
// Restore (a resumed job): p, m and v are put together from every worker part the
// manifest lists (any former world size: each part says which slice it holds); this
// worker's own error buffers come from its own part unless the coordinator said the
// topology changed (ResumeFrom.reset_errors), in which case they start at zero.
//
// Thread safety: one thread at a time.
#ifndef ONEBIT_WORKER_CHECKPOINTER_H_
#define ONEBIT_WORKER_CHECKPOINTER_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "coordinator/coordinator_client.h"
#include "worker/exchange/exchange.h"
#include "worker/optim/onebit_adam.h"
#include "worker/trainer.h"

namespace onebit {

struct CheckpointerOptions {
  std::string dir;  // the job's checkpoint.dir
  int rank = 0;
  int world_size = 1;
  std::string instance_id;  // for CommitPart
  std::string topology;     // checkpoint::TopologyKey of the job
  // Called after the part is written and before it is reported (fault injection).
  std::function<void(int64_t step)> before_commit;
};

class WorkerCheckpointer : public CheckpointSink {
 public:
  // `client` is borrowed (null: parts are written but not reported, for tests).
  WorkerCheckpointer(const CheckpointerOptions& options, CoordinatorClient* client)
      : options_(options), client_(client) {}

  absl::Status Save(int64_t step, OnebitAdam& optimizer) override;

 private:
  CheckpointerOptions options_;
  CoordinatorClient* client_;
};

// Restores `optimizer` (and its exchange's error buffers) from the checkpoint `resume`
// names under `dir`. Errors name the file and what is wrong (DATA_LOSS for a damaged part,
// INVALID_ARGUMENT for one that does not fit this job).
absl::Status RestoreWorker(const std::string& dir, const v1::ResumeFrom& resume, int rank,
                           OnebitAdam& optimizer);

}  // namespace onebit

#endif  // ONEBIT_WORKER_CHECKPOINTER_H_
