#include "coordinator/checkpoint_commits.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "checkpoint/manifest.h"
#include "coordinator/log.h"
#include "coordinator/membership.h"

namespace onebit {

CheckpointCommits::CheckpointCommits(CheckpointCommitsOptions options, Clock* clock,
                                     CoordinatorMetrics* metrics)
    : options_(std::move(options)), clock_(clock), metrics_(metrics) {}

absl::Status CheckpointCommits::ValidatePart(const v1::CheckpointPart& part) {
  if (part.role() != v1::ROLE_WORKER && part.role() != v1::ROLE_SERVER) {
    return absl::InvalidArgumentError("part.role must be ROLE_WORKER or ROLE_SERVER");
  }
  // The coordinator names the files: a member cannot point a manifest anywhere else.
  const std::string expected_file = checkpoint::PartFileName(part.role(), part.rank());
  if (part.file() != expected_file) {
    return absl::InvalidArgumentError(absl::StrCat("part.file must be '", expected_file, "' for ",
                                                   RoleName(part.role()), " ", part.rank()));
  }
  if (part.bytes() == 0) return absl::InvalidArgumentError("part.bytes must be > 0");
  return absl::OkStatus();
}

absl::Status CheckpointCommits::CheckEnabled() const {
  if (enabled()) return absl::OkStatus();
  return absl::FailedPreconditionError(
      "this job takes no checkpoints (onebit.checkpoint.dir is empty)");
}

void CheckpointCommits::SetFound(const std::vector<v1::CheckpointManifest>& found) {
  committed_.clear();
  for (const v1::CheckpointManifest& m : found) {
    v1::CheckpointInfo info;
    info.set_step(m.step());
    info.set_name(checkpoint::StepDirName(m.step()));
    info.set_committed(true);
    info.set_parts_done(m.parts_size());
    info.set_parts_expected(m.parts_size());
    info.set_reason(m.reason());
    info.set_created_unix_ms(m.created_unix_ms());
    committed_.push_back(info);
  }
}

void CheckpointCommits::ForgetAfter(int64_t step) {
  const auto newer = [step](const v1::CheckpointInfo& c) { return c.step() > step; };
  const size_t before = committed_.size();
  committed_.erase(std::remove_if(committed_.begin(), committed_.end(), newer), committed_.end());
  if (committed_.size() != before) {
    LogLine(absl::StrCat(before - committed_.size(), " committed checkpoint(s) after step ", step,
                         " belong to an earlier run (or are damaged): this run writes those "
                         "steps again"));
  }
}

void CheckpointCommits::BeginRecovery() {
  absl::MutexLock lock(&write_mu_);
  epoch_.fetch_add(1);
}

void CheckpointCommits::ClearPending() {
  pending_.clear();
  writing_.clear();
  requested_.clear();
}

std::string CheckpointCommits::Reason(int64_t step, const CheckpointFacts& facts) const {
  if (auto it = requested_.find(step); it != requested_.end()) return it->second;
  const int64_t every = facts.checkpoint_every;
  if (every > 0 && step > 0 && step % every == 0) return absl::StrCat("every ", every, " steps");
  return "";
}

bool CheckpointCommits::ServersHoldStateAt(int64_t step, const CheckpointFacts& facts) {
  if (!facts.shards_skip_warmup) return true;
  return facts.freeze_step >= 0 && step > facts.freeze_step;
}

int CheckpointCommits::ExpectedParts(int64_t step, const CheckpointFacts& facts) {
  return facts.world_size + (ServersHoldStateAt(step, facts) ? facts.num_servers : 0);
}

v1::CheckpointInfo CheckpointCommits::Info(int64_t step, const Pending& p,
                                           const CheckpointFacts& facts) {
  v1::CheckpointInfo info;
  info.set_step(step);
  info.set_name(checkpoint::StepDirName(step));
  info.set_committed(false);
  info.set_parts_done(static_cast<int>(p.parts.size()));
  info.set_parts_expected(ExpectedParts(step, facts));
  info.set_reason(p.reason);
  return info;
}

absl::StatusOr<v1::CommitPartResponse> CheckpointCommits::AddPart(
    int64_t step, const v1::CheckpointPart& part, const CheckpointFacts& facts,
    std::optional<ManifestWrite>* write) {
  write->reset();
  const std::string reason = Reason(step, facts);
  if (reason.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("no checkpoint is scheduled after step ", step));
  }
  v1::CommitPartResponse response;
  if (!committed_.empty() && step <= committed_.back().step()) {
    // A retry after the manifest was written, or a part of a checkpoint already superseded.
    response.set_committed(step == committed_.back().step());
    return response;
  }
  // A retry while the manifest is being written: not committed yet.
  if (writing_.count(step) > 0) return response;
  if (part.role() == v1::ROLE_SERVER && !ServersHoldStateAt(step, facts)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the checkpoint after step ", step, " has no shard parts: it is in the warmup, which "
        "goes between the workers (onebit.exchange.warmup_over workers)"));
  }
  Pending& pending = pending_[step];
  pending.reason = reason;
  pending.parts[{part.role(), part.rank()}] = part;
  if (static_cast<int>(pending.parts.size()) < ExpectedParts(step, facts)) return response;

  // Phase two: every part is on disk; the manifest makes the checkpoint exist.
  ManifestWrite& w = write->emplace();
  w.epoch = epoch_.load();
  v1::CheckpointManifest& manifest = w.manifest;
  manifest.set_version(checkpoint::kManifestVersion);
  manifest.set_job_id(options_.job_id);
  manifest.set_step(step);
  manifest.set_freeze_step(facts.freeze_step);
  manifest.set_world_size(facts.world_size);
  manifest.set_num_servers(facts.num_servers);
  manifest.set_exchange_mode(options_.topology);
  manifest.set_num_parameters(facts.num_parameters);
  manifest.set_optimizer(options_.optimizer);
  manifest.set_created_unix_ms(absl::ToUnixMillis(clock_->Now()));
  manifest.set_reason(reason);
  for (const auto& [key, p] : pending.parts) *manifest.add_parts() = p;
  writing_[step] = std::move(pending);
  pending_.erase(step);
  return response;
}

void CheckpointCommits::Write(ManifestWrite* write) {
  absl::MutexLock lock(&write_mu_);
  if (write->epoch != epoch_.load()) {
    write->written = absl::AbortedError("a recovery began before its manifest was written");
    return;
  }
  const absl::Time start = clock_->Now();
  write->written = options_.commit(write->manifest);
  write->write_seconds = absl::ToDoubleSeconds(clock_->Now() - start);
}

absl::StatusOr<v1::CommitPartResponse> CheckpointCommits::Finish(const ManifestWrite& write,
                                                                 const CheckpointFacts& facts,
                                                                 bool* committed_now) {
  *committed_now = false;
  const int64_t step = write.manifest.step();
  if (write.epoch != epoch_.load()) {
    // A recovery began meanwhile: it read the committed checkpoints from disk, this one
    // among them if its manifest was written first, and forgot the pending ones.
    LogLine(absl::StrCat("checkpoint of step ", step, ": a recovery began while its manifest was ",
                         write.written.ok() ? "written (the recovery counts it from the disk)"
                                            : "due (not written)"));
    if (!write.written.ok()) return write.written;
    v1::CommitPartResponse response;
    response.set_committed(true);
    return response;
  }
  auto it = writing_.find(step);
  const Pending pending = it != writing_.end() ? std::move(it->second) : Pending{};
  if (it != writing_.end()) writing_.erase(it);
  if (!write.written.ok()) {
    LogLine(absl::StrCat("checkpoint of step ", step, " NOT committed: ", write.written.message()));
    if (metrics_ != nullptr) metrics_->CheckpointFailed();
    return write.written;
  }
  v1::CommitPartResponse response;
  response.set_committed(true);
  // A newer checkpoint whose manifest was written first supersedes this one.
  if (!committed_.empty() && step <= committed_.back().step()) return response;
  v1::CheckpointInfo info = Info(step, pending, facts);
  info.set_committed(true);
  info.set_created_unix_ms(write.manifest.created_unix_ms());
  committed_.push_back(info);
  // Older pending ones can never complete now; retention keeps the newest `keep`.
  pending_.erase(pending_.begin(), pending_.upper_bound(step));
  const size_t keep = static_cast<size_t>(std::max(1, options_.keep));
  if (committed_.size() > keep) committed_.erase(committed_.begin(), committed_.end() - keep);
  LogLine(absl::StrCat("checkpoint of step ", step, " committed (", write.manifest.reason(),
                       "): ", write.manifest.parts_size(), " parts, manifest written in ",
                       absl::StrFormat("%.1f", write.write_seconds * 1e3), " ms"));
  if (metrics_ != nullptr) metrics_->CheckpointCommitted(step, write.write_seconds);
  *committed_now = true;
  return response;
}

v1::CheckpointInfo CheckpointCommits::Request(int64_t step, const CheckpointFacts& facts) {
  if (Reason(step, facts).empty()) requested_[step] = "operator";
  LogLine(absl::StrCat("operator: checkpoint after step ", step));
  Pending pending;
  pending.reason = Reason(step, facts);
  return Info(step, pending, facts);
}

v1::ListCheckpointsResponse CheckpointCommits::List(const CheckpointFacts& facts) const {
  v1::ListCheckpointsResponse response;
  for (const v1::CheckpointInfo& info : committed_) *response.add_checkpoints() = info;
  for (const auto* in : {&writing_, &pending_}) {
    for (const auto& [step, pending] : *in) *response.add_checkpoints() = Info(step, pending, facts);
  }
  const int64_t last_committed = last_committed_step();
  for (const auto& [step, reason] : requested_) {
    if (step > last_committed && step > facts.max_reported_step && !pending_.count(step) &&
        !writing_.count(step)) {
      Pending scheduled;
      scheduled.reason = reason;
      *response.add_checkpoints() = Info(step, scheduled, facts);
    }
  }
  return response;
}

}  // namespace onebit
