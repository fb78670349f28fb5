// The coordinator's side of the two-phase checkpoint commit: which steps take a checkpoint
// and why, the parts that came in for each, the manifest once a checkpoint is complete, and
// the committed ones (retention, listing, what a recovery forgets).
//
// Phase one is each member's: it writes its part file, then reports it (CommitPart). Phase
// two is here: when the last expected part is in, the manifest is written (the injected
// `commit`), and only then does the checkpoint exist.
//
// The manifest is written outside the Coordinator's mutex, because its I/O (an fsync that
// flushes the parts' dirty pages, retention's deletions) took tens of milliseconds at 1,024
// members and held up every other call. So phase two has three calls:
//   AddPart (under the mutex): the last part hands out a ManifestWrite;
//   Write (without it): writes that manifest, one at a time, unless a recovery began;
//   Finish (under it again): the checkpoint counts as committed.
// Everything else is not thread-safe: the Coordinator's mutex guards it. It reads the job's
// moving facts (members, switch step) from the CheckpointFacts each call passes, so it
// holds no pointer into the coordinator.
#ifndef ONEBIT_COORDINATOR_CHECKPOINT_COMMITS_H_
#define ONEBIT_COORDINATOR_CHECKPOINT_COMMITS_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
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

// A complete checkpoint whose manifest is to be written: from AddPart, through Write, to
// Finish.
struct ManifestWrite {
  v1::CheckpointManifest manifest;
  uint64_t epoch = 0;         // the recoveries begun when AddPart made it
  absl::Status written;       // Write's outcome
  double write_seconds = 0;   // how long Write took
};

class CheckpointCommits {
 public:
  // `clock` and `metrics` are not owned; metrics may be null.
  CheckpointCommits(CheckpointCommitsOptions options, Clock* clock, CoordinatorMetrics* metrics);

  // A part's fields on their face (role, file name, size), before any state is looked at.
  static absl::Status ValidatePart(const v1::CheckpointPart& part);

  // FAILED_PRECONDITION when the job takes no checkpoints.
  absl::Status CheckEnabled() const;

  // The committed checkpoints on disk, oldest first: at start, and at a recovery, which
  // read them again (a manifest written just before it counts from there).
  void SetFound(const std::vector<v1::CheckpointManifest>& found);
  // Drops the committed checkpoints after `step`, where this run starts: an earlier run's
  // (one that went further, or whose newest is damaged). Otherwise the job would count
  // them as its own, end before writing its last one, and answer their parts "committed"
  // without a manifest of its own.
  void ForgetAfter(int64_t step);
  // Before a recovery reads the committed checkpoints from disk: waits for a manifest
  // being written, and no manifest made before this call is written after it (Write
  // skips it, like a crash between the parts and the manifest). Thread-safe.
  void BeginRecovery();
  // A recovery: the pending and the requested checkpoints belong to the old generation.
  void ClearPending();

  // Why a checkpoint is taken after `step` ("every 10 steps", "operator"); "" if none is.
  std::string Reason(int64_t step, const CheckpointFacts& facts) const;

  // Records a part of a member already checked as one of the job's (ValidatePart passed).
  // When it completes its checkpoint, *write is set: the caller passes it to Write and
  // then to Finish, whose answer is this part's. Until Finish, the step's parts are
  // answered "not committed" and the job is not finished. INVALID_ARGUMENT for a step
  // without a checkpoint, or a shard part where the shards hold no state.
  absl::StatusOr<v1::CommitPartResponse> AddPart(int64_t step, const v1::CheckpointPart& part,
                                                 const CheckpointFacts& facts,
                                                 std::optional<ManifestWrite>* write);
  // Writes the manifest (the injected `commit`) into write->written, one manifest at a
  // time; ABORTED without writing when a recovery began after AddPart. Thread-safe: call
  // it without the lock that guards the rest.
  void Write(ManifestWrite* write);
  // The checkpoint is committed (*committed_now) if its manifest was written and no
  // recovery began since AddPart (a recovery counts it from the disk). The answer to the
  // last part: committed, or the commit's own error (the parts of that step are dropped).
  absl::StatusOr<v1::CommitPartResponse> Finish(const ManifestWrite& write,
                                                const CheckpointFacts& facts,
                                                bool* committed_now);

  // An operator's request for a checkpoint after `step` (the stage machine chose the step).
  v1::CheckpointInfo Request(int64_t step, const CheckpointFacts& facts);

  // Committed (oldest first), then pending, then requested ones not yet started.
  v1::ListCheckpointsResponse List(const CheckpointFacts& facts) const;

  int64_t last_committed_step() const { return committed_.empty() ? 0 : committed_.back().step(); }
  bool has_pending() const { return !pending_.empty() || !writing_.empty(); }
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
  std::map<int64_t, Pending> writing_;  // complete, between AddPart and Finish
  std::map<int64_t, std::string> requested_;  // step -> reason
  std::vector<v1::CheckpointInfo> committed_;  // oldest first
  // Write's side, which runs without the coordinator's lock.
  absl::Mutex write_mu_;  // one manifest at a time; BeginRecovery waits for it
  std::atomic<uint64_t> epoch_{0};  // recoveries begun; changed under write_mu_
};

}  // namespace onebit

#endif  // ONEBIT_COORDINATOR_CHECKPOINT_COMMITS_H_
