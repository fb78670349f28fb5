// The coordinator's side of the two-phase checkpoint commit: which steps take a checkpoint
// and why, the parts that came in for each, the manifest once a checkpoint is complete, and
// the committed ones (retention, listing, what a recovery forgets).
//
// Phase one is each member's: it writes its part file, then reports it (CommitPart). Phase
// two is here: when the last expected part is in, the manifest is written (the injected
// `commit`), and only then does the checkpoint exist.
//
// Not thread-safe: the Coordinator's mutex guards it. It reads the job's moving facts
// (members, switch step) from the CheckpointFacts each call passes, so it holds no pointer
// into the coordinator.
#ifndef ONEBIT_COORDINATOR_CHECKPOINT_COMMITS_H_
#define ONEBIT_COORDINATOR_CHECKPOINT_COMMITS_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "coordinator/clock.h"
#include "coordinator/metrics.h"
#include "onebit/v1/coordinator.pb.h"

namespace onebit {

// What a checkpoint depends on that changes while the job runs.
struct CheckpointFacts {
  int world_size = 0;
  int num_servers = 0;
  // The warmup goes between the workers (exchange.warmup_over "workers"): the shards hold
  // no state until the switch, and a checkpoint in the warmup has no shard parts.
  bool shards_skip_warmup = false;
  int64_t freeze_step = -1;  // the stage machine's; -1: not decided yet
  int64_t checkpoint_every = 0;  // 0: only requested checkpoints
  int64_t max_reported_step = 0;
  uint64_t num_parameters = 0;
};

struct CheckpointCommitsOptions {
  std::string job_id;
  std::string topology;   // checkpoint::TopologyKey of the job's config
  std::string optimizer;  // the optimizer's name, as the manifest records it
  int keep = 1;           // committed checkpoints kept (at least 1)
  // Writes the manifest atomically and applies retention on disk. Null: the job takes no
  // checkpoints, and every call that needs one fails with FAILED_PRECONDITION.
  std::function<absl::Status(const v1::CheckpointManifest&)> commit;
};

class CheckpointCommits {
 public:
  // `clock` and `metrics` are not owned; metrics may be null.
  CheckpointCommits(CheckpointCommitsOptions options, Clock* clock, CoordinatorMetrics* metrics);

  // A part's fields on their face (role, file name, size), before any state is looked at.
  static absl::Status ValidatePart(const v1::CheckpointPart& part);

  // FAILED_PRECONDITION when the job takes no checkpoints.
  absl::Status CheckEnabled() const;

  // The committed checkpoints found at start, oldest first.
  void AddFound(const std::vector<v1::CheckpointManifest>& found);
  // Drops the committed checkpoints after `step`, where this run starts: an earlier run's
  // (one that went further, or whose newest is damaged). Otherwise the job would count
  // them as its own, end before writing its last one, and answer their parts "committed"
  // without a manifest of its own.
  void ForgetAfter(int64_t step);
  // A recovery: the pending and the requested checkpoints belong to the old generation.
  void ClearPending();

  // Why a checkpoint is taken after `step` ("every 10 steps", "operator"); "" if none is.
  std::string Reason(int64_t step, const CheckpointFacts& facts) const;

  // Records a part of a member already checked as one of the job's (ValidatePart passed).
  // When it completes its checkpoint, writes the manifest; *committed_now is then true.
  // INVALID_ARGUMENT for a step without a checkpoint, or a shard part where the shards hold
  // no state; the commit's own error when the manifest cannot be written (the parts of
  // that step are dropped).
  absl::StatusOr<v1::CommitPartResponse> AddPart(int64_t step, const v1::CheckpointPart& part,
                                                 const CheckpointFacts& facts,
                                                 bool* committed_now);

  // An operator's request for a checkpoint after `step` (the stage machine chose the step).
  v1::CheckpointInfo Request(int64_t step, const CheckpointFacts& facts);

  // Committed (oldest first), then pending, then requested ones not yet started.
  v1::ListCheckpointsResponse List(const CheckpointFacts& facts) const;

  int64_t last_committed_step() const { return committed_.empty() ? 0 : committed_.back().step(); }
  bool has_pending() const { return !pending_.empty(); }
  bool enabled() const { return static_cast<bool>(options_.commit); }

 private:
  struct Pending {
    std::string reason;
    std::map<std::pair<int, int>, v1::CheckpointPart> parts;  // by (role, rank)
  };
  // Whether the shards hold state after `step`: always, unless they skip the warmup and
  // `step` is in it (the switch, once a lease passed `step`, never moves before it).
  static bool ServersHoldStateAt(int64_t step, const CheckpointFacts& facts);
  // Every worker's part, and the shards' where they hold state.
  static int ExpectedParts(int64_t step, const CheckpointFacts& facts);
  static v1::CheckpointInfo Info(int64_t step, const Pending& p, const CheckpointFacts& facts);

  const CheckpointCommitsOptions options_;
  Clock* const clock_;
  CoordinatorMetrics* const metrics_;
  std::map<int64_t, Pending> pending_;
  std::map<int64_t, std::string> requested_;  // step -> reason
  std::vector<v1::CheckpointInfo> committed_;  // oldest first
};

}  // namespace onebit

#endif  // ONEBIT_COORDINATOR_CHECKPOINT_COMMITS_H_
