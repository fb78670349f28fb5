// A checkpoint directory tree, as the coordinator manages it (docs/design.md, "Two-phase
// checkpoint commit"):
//
//   <root>/step-000000010/worker-00000.part   parts, written by their processes (part.h)
//   <root>/step-000000010/server-00001.part
//   <root>/step-000000010/MANIFEST.json       written last, atomically, by the coordinator
//
// A directory without a manifest (a checkpoint that never completed) does not exist: it is
// listed nowhere, never resumed from, and removed by RemoveUncommitted. A committed one is
// only trusted after VerifyCheckpoint has re-read every part against the sizes and CRC-32s
// the manifest recorded.
//
// Thread safety: free functions; callers serialise work on one root.
#ifndef ONEBIT_CHECKPOINT_MANIFEST_H_
#define ONEBIT_CHECKPOINT_MANIFEST_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "config/job_config.h"
#include "onebit/v1/coordinator.pb.h"

namespace onebit::checkpoint {

inline constexpr uint32_t kManifestVersion = 1;
inline constexpr char kManifestFile[] = "MANIFEST.json";

// "step-000000010".
std::string StepDirName(int64_t step);
// "worker-00003.part" / "server-00001.part".
std::string PartFileName(v1::Role role, int rank);
// root + "/" + name.
std::string JoinPath(const std::string& a, const std::string& b);

// Creates <root>/<StepDirName(step)> (and root) if missing; returns its path.
absl::StatusOr<std::string> MakeStepDir(const std::string& root, int64_t step);

// Writes MANIFEST.json into `dir` atomically (temp file, fsync, rename, fsync of dir).
absl::Status WriteManifest(const std::string& dir, const v1::CheckpointManifest& manifest);
// Reads and checks it: NOT_FOUND without one, DATA_LOSS if it does not parse or is
// inconsistent (version, step, parts named outside the directory).
absl::StatusOr<v1::CheckpointManifest> ReadManifest(const std::string& dir);

// Every committed checkpoint under root (a manifest that reads), oldest step first. A
// manifest that does not read is skipped with a log line in *skipped (may be null).
std::vector<v1::CheckpointManifest> ListCommitted(const std::string& root,
                                                  std::vector<std::string>* skipped = nullptr);

// Re-reads every part the manifest names and compares size and CRC-32. DATA_LOSS naming
// the first part that differs, is missing or is truncated.
absl::Status VerifyCheckpoint(const std::string& root, const v1::CheckpointManifest& manifest);

// Removes step directories without a manifest whose step is below `before_step` (later
// ones may still be in flight). Returns the names removed.
std::vector<std::string> RemoveUncommitted(const std::string& root, int64_t before_step);
// Removes all but the newest `keep` committed checkpoints. Returns the names removed.
std::vector<std::string> ApplyRetention(const std::string& root, int keep);

// Phase two of a checkpoint whose parts are all written: the manifest in its directory,
// then retention (the newest `keep` stay) and removal of older uncommitted directories.
absl::Status CommitCheckpoint(const std::string& root, const v1::CheckpointManifest& manifest,
                              int keep);

// What the error buffers depend on besides the parameter count: the exchange and its
// shape ("peer", "ps servers=2", "hierarchical local_size=2 inter=ps servers=4"). Worker
// and server errors only carry over between runs with the same key and world size.
std::string TopologyKey(const JobConfig& config);

// Where a starting job resumes from: the newest committed checkpoint under
// config.checkpoint.dir whose parts all verify. Older ones are tried in turn; each one
// passed over is said in `log` with the reason.
struct ResumePlan {
  std::optional<v1::ResumeFrom> resume;  // none: start from step 1
  int64_t freeze_step = -1;              // the manifest's
  std::vector<v1::CheckpointManifest> committed;  // every committed one, oldest first
  std::vector<std::string> log;
};
// FAILED_PRECONDITION when the newest valid checkpoint is of another model (its parameter
// count differs from `num_parameters`) or optimizer: resuming it would be wrong, starting
// over would silently discard it.
absl::StatusOr<ResumePlan> PlanResume(const JobConfig& config, uint64_t num_parameters);

}  // namespace onebit::checkpoint

#endif  // ONEBIT_CHECKPOINT_MANIFEST_H_
