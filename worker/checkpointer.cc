#include "worker/checkpointer.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "absl/time/clock.h"

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "checkpoint/manifest.h"
#include "checkpoint/part.h"
#include "common/status_macros.h"

namespace onebit {
namespace {

// A worker's own (unshared) state tensor `name` is saved whole as kOwnPrefix + name; a
// shared one as the worker's slice under its plain name. Scalars are meta entries
// kScalarPrefix + name, printed with 17 significant digits (exact for a double).
constexpr absl::string_view kOwnPrefix = "own:";
constexpr absl::string_view kScalarPrefix = "scalar:";
// The trainer's scalars (fp16's loss scaler), the same way.
constexpr absl::string_view kTrainerScalarPrefix = "trainer:";

bool IsErrorTensor(const std::string& name) { return name.find("_error") != std::string::npos; }

// [begin, end) of rank's slice of n elements among world_size workers.
std::pair<size_t, size_t> Slice(size_t n, int rank, int world_size) {
  const size_t begin = n * static_cast<size_t>(rank) / static_cast<size_t>(world_size);
  const size_t end = n * static_cast<size_t>(rank + 1) / static_cast<size_t>(world_size);
  return {begin, end};
}

// The elements of every shared tensor this worker saves. Unsharded: its slice
// Slice(n, rank, W) of the whole tensor (every worker has all of it). Sharded
// (Exchange::state_shard): its node's share of its state range, Slice(state_count,
// node, nodes) from state_begin; each slice is held by the same local rank of every node,
// so the parts of all workers again cover [0, n) once.
std::pair<size_t, size_t> SavedRange(Optimizer& optimizer, int rank, int world_size) {
  const std::optional<StateShard> shard = optimizer.exchange().state_shard();
  if (!shard.has_value()) return Slice(optimizer.size(), rank, world_size);
  const auto [begin, end] = Slice(optimizer.state_count(), shard->replica, shard->replicas);
  return {optimizer.state_begin() + begin, optimizer.state_begin() + end};
}

// [slice_begin, slice_end) of a worker part, checked against a checkpoint of `step` of n
// parameters.
absl::StatusOr<std::pair<size_t, size_t>> PartRange(const std::string& path,
                                                   const checkpoint::Part& part, int64_t step,
                                                   size_t n) {
  ONEBIT_ASSIGN_OR_RETURN(int64_t begin, part.MetaInt("slice_begin"));
  ONEBIT_ASSIGN_OR_RETURN(int64_t end, part.MetaInt("slice_end"));
  ONEBIT_ASSIGN_OR_RETURN(int64_t saved_step, part.MetaInt("step"));
  if (saved_step != step || begin < 0 || end < begin || static_cast<uint64_t>(end) > n) {
    return absl::DataLossError(absl::StrCat(path, ": step ", saved_step, ", slice [", begin, ", ",
                                            end, ") does not fit a checkpoint of step ", step,
                                            " of ", n, " parameters"));
  }
  return std::make_pair(static_cast<size_t>(begin), static_cast<size_t>(end));
}

// The part's meta entries `prefix` + name as numbers, by name.
absl::StatusOr<StateScalars> MetaScalars(const std::string& path, const checkpoint::Part& part,
                                         absl::string_view prefix) {
  StateScalars scalars;
  for (const auto& [key, value] : part.meta) {
    if (!absl::StartsWith(key, prefix)) continue;
    double parsed = 0;
    if (!absl::SimpleAtod(value, &parsed)) {
      return absl::DataLossError(absl::StrCat(path, ": ", key, " is not a number: ", value));
    }
    scalars[key.substr(prefix.size())] = parsed;
  }
  return scalars;
}

}  // namespace

WorkerCheckpointer::WorkerCheckpointer(const CheckpointerOptions& options, CoordinatorClient* client)
    : options_(options), client_(client) {
  thread_ = std::thread([this] { Run(); });
}

WorkerCheckpointer::~WorkerCheckpointer() {
  (void)Flush();
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
}

absl::Status WorkerCheckpointer::Save(int64_t step, Optimizer& optimizer,
                                      const StateScalars& trainer_scalars) {
  // One snapshot in memory at a time: wait for the previous part first.
  ONEBIT_RETURN_IF_ERROR(Flush());
  const size_t n = optimizer.size();
  const auto [begin, end] = SavedRange(optimizer, options_.rank, options_.world_size);
  Pending pending;
  pending.step = step;
  checkpoint::Part& part = pending.part;
  part.meta["role"] = "worker";
  part.meta["topology"] = options_.topology;
  part.PutMetaInt("step", step);
  part.PutMetaInt("rank", options_.rank);
  part.PutMetaInt("world_size", options_.world_size);
  part.PutMetaInt("num_parameters", static_cast<int64_t>(n));
  part.PutMetaInt("slice_begin", static_cast<int64_t>(begin));
  part.PutMetaInt("slice_end", static_cast<int64_t>(end));
  part.PutMetaInt("freeze_step", optimizer.freeze_step());
  for (const StateSpec& state : optimizer.CheckpointStates()) {
    if (state.shared) {
      ONEBIT_ASSIGN_OR_RETURN(std::vector<float> slice, optimizer.StateToHost(state.name, begin, end));
      part.Put(state.name, std::move(slice));
    } else {
      ONEBIT_ASSIGN_OR_RETURN(std::vector<float> whole, optimizer.StateToHost(state.name, 0, n));
      part.Put(absl::StrCat(kOwnPrefix, state.name), std::move(whole));
    }
  }
  for (const auto& [name, value] : optimizer.CheckpointScalars()) {
    part.meta[absl::StrCat(kScalarPrefix, name)] = absl::StrFormat("%.17g", value);
  }
  for (const auto& [name, value] : trainer_scalars) {
    part.meta[absl::StrCat(kTrainerScalarPrefix, name)] = absl::StrFormat("%.17g", value);
  }
  ONEBIT_ASSIGN_OR_RETURN(ErrorState errors, optimizer.exchange().SaveErrors());
  for (auto& [name, values] : errors) part.Put(name, std::move(values));
  {
    absl::MutexLock lock(&mu_);
    pending_ = std::move(pending);
  }
  return options_.async ? absl::OkStatus() : Flush();
}

absl::Status WorkerCheckpointer::Flush() {
  absl::MutexLock lock(&mu_);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !pending_.has_value() && !writing_; };
  mu_.Await(absl::Condition(&idle));
  return status_;
}

void WorkerCheckpointer::Run() {
  for (;;) {
    Pending pending;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || pending_.has_value(); };
      mu_.Await(absl::Condition(&ready));
      if (!pending_.has_value()) return;  // stopping, nothing left
      pending = *std::move(pending_);
      pending_.reset();
      writing_ = true;
    }
    const int64_t step = pending.step;
    const absl::Status status = Write(std::move(pending));
    absl::MutexLock lock(&mu_);
    writing_ = false;
    if (!status.ok() && status_.ok()) {
      status_ = absl::Status(status.code(), absl::StrCat("checkpoint part of step ", step, ": ",
                                                         status.message()));
    }
  }
}

absl::Status WorkerCheckpointer::Write(Pending pending) {
  const int64_t step = pending.step;
  const absl::Time start = absl::Now();
  ONEBIT_ASSIGN_OR_RETURN(std::string dir, checkpoint::MakeStepDir(options_.dir, step));
  const std::string file = checkpoint::PartFileName(v1::ROLE_WORKER, options_.rank);
  ONEBIT_ASSIGN_OR_RETURN(checkpoint::WrittenFile written,
                          checkpoint::WritePart(checkpoint::JoinPath(dir, file), pending.part));
  if (options_.before_commit) options_.before_commit(step);
  if (client_ == nullptr) return absl::OkStatus();
  v1::CommitPartRequest request;
  request.set_instance_id(options_.instance_id);
  request.set_step(step);
  v1::CheckpointPart* p = request.mutable_part();
  p->set_role(v1::ROLE_WORKER);
  p->set_rank(options_.rank);
  p->set_file(file);
  p->set_bytes(written.bytes);
  p->set_crc32(written.crc32);
  ONEBIT_RETURN_IF_ERROR(client_->CommitPart(request).status());
  std::fprintf(stderr, "worker rank %d: checkpoint part of step %lld: %.1f MB written and reported in %.1f ms\n",
               options_.rank, static_cast<long long>(step), written.bytes / 1e6,
               absl::ToDoubleMilliseconds(absl::Now() - start));
  return absl::OkStatus();
}

absl::Status RestoreWorker(const std::string& root, const v1::ResumeFrom& resume, int rank,
                           Optimizer& optimizer, StateScalars* trainer_scalars) {
  const std::string dir = checkpoint::JoinPath(root, checkpoint::StepDirName(resume.step()));
  ONEBIT_ASSIGN_OR_RETURN(v1::CheckpointManifest manifest, checkpoint::ReadManifest(dir));
  const size_t n = optimizer.size();
  if (manifest.num_parameters() != n) {
    return absl::InvalidArgumentError(absl::StrCat(dir, ": ", manifest.num_parameters(),
                                                   " parameters, this model has ", n));
  }
  // This worker's state range: [0, n), or its shard's.
  const size_t lo = optimizer.state_begin();
  const size_t count = optimizer.state_count();
  if (lo > n || count > n - lo) {
    return absl::InternalError(absl::StrCat("the optimizer's state range [", lo, ", ", lo + count,
                                            ") is not within its ", n, " parameters"));
  }
  // Shared tensors are put together over the state range from the parts that overlap it
  // (a part that does not is read only up to its tensors' shapes); this worker's own
  // tensors, errors and scalars come from its part. A worker the saved job did not have
  // (a larger local size; its errors reset) takes the optimizer's scalars from the first
  // part: they are the job's (schedules, and reductions every worker shares), not a
  // worker's.
  StateTensors states;
  std::map<std::string, std::vector<bool>> covered;
  auto shared = [&](const std::string& name) -> std::vector<float>& {
    auto [it, added] = states.try_emplace(name);
    if (added) {
      it->second.resize(count);
      covered[name].assign(count, false);
    }
    return it->second;
  };
  StateScalars scalars;
  std::optional<StateScalars> first_scalars;
  bool own_part_read = false;
  bool trainer_read = false;
  for (const v1::CheckpointPart& entry : manifest.parts()) {
    if (entry.role() != v1::ROLE_WORKER) continue;
    const std::string path = checkpoint::JoinPath(dir, entry.file());
    ONEBIT_ASSIGN_OR_RETURN(checkpoint::Part head, checkpoint::ReadPartHead(path));
    ONEBIT_ASSIGN_OR_RETURN(auto range, PartRange(path, head, resume.step(), n));
    // Every shared tensor of the checkpoint is restored, even over an empty state range.
    for (const auto& [name, t] : head.tensors) {
      if (!IsErrorTensor(name) && !absl::StartsWith(name, kOwnPrefix)) shared(name);
    }
    if (!first_scalars.has_value()) {
      ONEBIT_ASSIGN_OR_RETURN(first_scalars, MetaScalars(path, head, kScalarPrefix));
    }
    if (trainer_scalars != nullptr && !trainer_read) {
      ONEBIT_ASSIGN_OR_RETURN(*trainer_scalars, MetaScalars(path, head, kTrainerScalarPrefix));
      trainer_read = !trainer_scalars->empty();
    }
    const bool own = entry.rank() == rank;
    if (!own && std::max(range.first, lo) >= std::min(range.second, lo + count)) continue;
    ONEBIT_ASSIGN_OR_RETURN(checkpoint::Part part, checkpoint::ReadPart(path));
    ONEBIT_ASSIGN_OR_RETURN(range, PartRange(path, part, resume.step(), n));
    const auto [begin, end] = range;
    const size_t from = std::max(begin, lo), to = std::min(end, lo + count);  // overlap
    ErrorState errors;
    for (auto& [name, t] : part.tensors) {
      if (IsErrorTensor(name)) {
        if (own) errors[name] = std::move(t.data);
      } else if (absl::StartsWith(name, kOwnPrefix)) {
        if (!own) continue;
        if (t.data.size() != n) {
          return absl::DataLossError(
              absl::StrCat(path, ": ", name, " has ", t.data.size(), " elements, not ", n));
        }
        states[name.substr(kOwnPrefix.size())] = std::move(t.data);
      } else {
        if (t.data.size() != end - begin) {
          return absl::DataLossError(absl::StrCat(path, ": ", name, " has ", t.data.size(),
                                                  " elements for a slice of ", end - begin));
        }
        std::vector<float>& values = shared(name);
        if (from >= to) continue;  // this worker's own part, outside its state range
        std::copy(t.data.begin() + (from - begin), t.data.begin() + (to - begin),
                  values.begin() + (from - lo));
        std::vector<bool>& done = covered[name];
        std::fill(done.begin() + (from - lo), done.begin() + (to - lo), true);
      }
    }
    if (!own) continue;
    own_part_read = true;
    ONEBIT_ASSIGN_OR_RETURN(scalars, MetaScalars(path, part, kScalarPrefix));
    if (!resume.reset_errors()) {
      absl::Status restored = optimizer.exchange().RestoreErrors(errors);
      if (!restored.ok()) {
        return absl::InvalidArgumentError(absl::StrCat(path, ": ", restored.message()));
      }
    }
  }
  for (const auto& [name, done] : covered) {
    for (size_t i = 0; i < count; ++i) {
      if (!done[i]) {
        return absl::DataLossError(
            absl::StrCat(dir, ": no worker part holds ", name, " element ", lo + i));
      }
    }
  }
  if (!resume.reset_errors() && !own_part_read) {
    return absl::DataLossError(absl::StrCat(dir, ": no part of worker ", rank, " to restore its errors from"));
  }
  if (!own_part_read && first_scalars.has_value()) scalars = *std::move(first_scalars);
  absl::Status restored = optimizer.Restore(resume.step(), manifest.freeze_step(), states, scalars);
  if (!restored.ok()) return absl::Status(restored.code(), absl::StrCat(dir, ": ", restored.message()));
  return absl::OkStatus();
}

}  // namespace onebit
