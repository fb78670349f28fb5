#include "server/shard_state.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <utility>
#include <vector>

#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace onebit::server {
namespace {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "the wire format is little-endian; this code reads it in place");

// How often a waiter with a cancellation hook looks at it.
constexpr absl::Duration kCancelPoll = absl::Milliseconds(50);

// Dropped fp32 results kept for reuse as a later step's sum (ShardState::released_sums_).
constexpr size_t kMaxReleasedSums = 3;

// More workers than this is a configuration mistake.
constexpr int kMaxWorkers = 65536;

// The same for every slicing of the same bytes (absl hashes a Cord piecewise as if flat).
size_t Fingerprint(const absl::Cord& bytes) { return absl::Hash<absl::Cord>{}(bytes); }

// sum[i] += run[i] over `count` floats (run as little-endian bytes, any alignment): one
// step of the rank-order sum, the same float additions, in the same order, as SumRows.
void AddRun(float* __restrict sum, const char* __restrict run, size_t count) {
  for (size_t i = 0; i < count; ++i) {
    float x;
    std::memcpy(&x, run + i * sizeof(float), sizeof(float));
    sum[i] += x;
  }
}

// The same over a run in pieces of any length (a float may straddle two of them); each
// element gets the same single addition, so the result is the same bits.
void AddRun(float* sum, const absl::Cord& run) {
  char partial[sizeof(float)];
  size_t have = 0;  // bytes of a straddling float in `partial`
  for (absl::string_view piece : run.Chunks()) {
    const char* p = piece.data();
    size_t left = piece.size();
    if (have > 0) {
      const size_t take = std::min(sizeof(float) - have, left);
      std::memcpy(partial + have, p, take);
      have += take;
      p += take;
      left -= take;
      if (have < sizeof(float)) continue;
      AddRun(sum++, partial, 1);
      have = 0;
    }
    const size_t whole = left / sizeof(float);
    AddRun(sum, p, whole);
    sum += whole;
    p += whole * sizeof(float);
    left -= whole * sizeof(float);
    std::memcpy(partial, p, left);
    have = left;
  }
}

void CopyCord(const absl::Cord& cord, void* dst) {
  char* out = static_cast<char*>(dst);
  for (absl::string_view piece : cord.Chunks()) {
    std::memcpy(out, piece.data(), piece.size());
    out += piece.size();
  }
}

}  // namespace

const char* RejectReasonName(RejectReason reason) {
  switch (reason) {
    case RejectReason::kBadKind:
      return "bad_kind";
    case RejectReason::kUnknownWorker:
      return "unknown_worker";
    case RejectReason::kWrongChunk:
      return "wrong_chunk";
    case RejectReason::kBadStep:
      return "bad_step";
    case RejectReason::kWrongSize:
      return "wrong_size";
    case RejectReason::kBadScale:
      return "bad_scale";
    case RejectReason::kStaleStep:
      return "stale_step";
    case RejectReason::kStepAhead:
      return "step_ahead";
    case RejectReason::kKindMismatch:
      return "kind_mismatch";
    case RejectReason::kConflictingDuplicate:
      return "conflicting_duplicate";
  }
  return "unknown";
}

absl::StatusOr<std::unique_ptr<ShardState>> ShardState::Create(kernels::Backend* backend,
                                                               const ShardConfig& config,
                                                               ShardObserver* observer) {
  if (backend->memory_space() != kernels::MemorySpace::kHost) {
    return absl::InvalidArgumentError(
        absl::StrCat("a shard needs a host-memory backend, got ", backend->name()));
  }
  ONEBIT_ASSIGN_OR_RETURN(PsLayout layout,
                          PsLayout::Create(config.n, config.num_shards, *config.codec));
  if (config.shard < 0 || config.shard >= config.num_shards) {
    return absl::InvalidArgumentError(
        absl::StrCat("shard index ", config.shard, " is outside [0, ", config.num_shards, ")"));
  }
  if (config.num_workers < 1 || config.num_workers > kMaxWorkers) {
    return absl::InvalidArgumentError(
        absl::StrCat("worker count must be in [1, ", kMaxWorkers, "], got ", config.num_workers));
  }
  if (config.retained_steps < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("retained_steps must be >= 2, got ", config.retained_steps));
  }
  std::unique_ptr<ShardState> state(new ShardState(backend, config, layout, observer));
  ONEBIT_RETURN_IF_ERROR(state->Init());
  return state;
}

absl::Status ShardState::Init() {
  absl::MutexLock lock(&mu_);
  first_step_ = config_.first_step;
  const size_t w = static_cast<size_t>(config_.num_workers);
  ONEBIT_ASSIGN_OR_RETURN(aggregator_,
                          ChunkAggregator::Create(backend_, layout_.chunk(), *config_.codec));
  ONEBIT_ASSIGN_OR_RETURN(onebit_rows_,
                          kernels::Buffer<uint8_t>::Create(backend_, w * layout_.block_bytes()));
  return absl::OkStatus();
}

absl::Status ShardState::Reject(RejectReason reason, absl::Status status) const {
  if (observer_ != nullptr) observer_->OnRejected(reason);
  return status;
}

absl::Status ShardState::ValidateRequest(int worker, int64_t step, int chunk, ChunkKind kind,
                                         RejectReason* reason) const {
  if (kind != ChunkKind::kFp32 && kind != ChunkKind::kOnebit) {
    *reason = RejectReason::kBadKind;
    return absl::InvalidArgumentError(
        absl::StrCat("chunk kind must be CHUNK_KIND_FP32 (1) or CHUNK_KIND_ONEBIT (2), got ",
                     static_cast<int>(kind)));
  }
  if (worker < 0 || worker >= config_.num_workers) {
    *reason = RejectReason::kUnknownWorker;
    return absl::InvalidArgumentError(absl::StrCat("unknown worker ", worker, ": this job has ",
                                                   config_.num_workers, " workers"));
  }
  if (chunk != config_.shard) {
    *reason = RejectReason::kWrongChunk;
    return absl::InvalidArgumentError(absl::StrCat(
        "chunk ", chunk, " sent to shard ", config_.shard, " (of ", config_.num_shards, ")"));
  }
  if (step < 1) {
    *reason = RejectReason::kBadStep;
    return absl::InvalidArgumentError(absl::StrCat("steps are numbered from 1, got ", step));
  }
  return absl::OkStatus();
}

absl::Status ShardState::ValidatePayload(ChunkKind kind, const absl::Cord& payload,
                                         RejectReason* reason) const {
  const size_t expected = layout_.payload_bytes(kind, config_.shard);
  if (payload.size() != expected) {
    *reason = RejectReason::kWrongSize;
    std::string why;
    if (kind == ChunkKind::kOnebit) {
      for (const Codec* other : AllCodecs()) {
        if (other == config_.codec || payload.size() != other->BlockBytes(layout_.chunk())) {
          continue;
        }
        why = absl::StrCat(": the block size of compressor ", other->name(),
                           ", but this shard's job compresses with ", config_.codec->name(),
                           " (onebit.exchange.compressor must be the same for workers and shards)");
        break;
      }
    }
    return absl::InvalidArgumentError(absl::StrCat(
        ChunkKindName(kind), " payload for shard ", config_.shard, " must be ", expected,
        " bytes, got ", payload.size(),
        kind == ChunkKind::kOnebit ? absl::StrCat(" (", config_.codec->name(),
                                                  " blocks of ", layout_.chunk(), " elements)")
                                   : std::string(),
        why));
  }
  if (kind == ChunkKind::kOnebit) {
    std::vector<uint8_t> header(config_.codec->header_bytes());
    CopyCord(payload.Subcord(0, header.size()), header.data());
    if (const std::optional<HeaderFault> fault = config_.codec->CheckHeader(header.data())) {
      *reason = RejectReason::kBadScale;
      return absl::InvalidArgumentError(absl::StrCat(config_.codec->name(), " block ",
                                                     fault->field, " must be ", fault->rule,
                                                     ", got ", fault->value));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<const ShardState::FinishedStep*> ShardState::Locate(int64_t step, ChunkKind kind,
                                                                   RejectReason* reason) const {
  auto kind_mismatch = [&](ChunkKind step_kind) {
    *reason = RejectReason::kKindMismatch;
    return absl::FailedPreconditionError(absl::StrCat(
        "step ", step, " is ", ChunkKindName(step_kind), ", got ", ChunkKindName(kind)));
  };
  auto stale = [&]() {
    *reason = RejectReason::kStaleStep;
    return absl::FailedPreconditionError(absl::StrCat(
        "step ", step, " is older than the steps this shard keeps (",
        finished_.empty() ? std::string("none")
                          : absl::StrCat(finished_.front().step, "..", finished_.back().step),
        open_.has_value() ? absl::StrCat("; step ", open_->step, " is open") : "", ")"));
  };
  for (const FinishedStep& f : finished_) {
    if (f.step != step) continue;
    if (f.kind != kind) return kind_mismatch(f.kind);
    return &f;
  }
  if (open_.has_value()) {
    if (step == open_->step) {
      if (open_->kind != kind) return kind_mismatch(open_->kind);
      return nullptr;
    }
    if (step < open_->step) return stale();
    *reason = RejectReason::kStepAhead;
    return absl::FailedPreconditionError(
        absl::StrCat("step ", step, " pushed while step ", open_->step,
                     " is open: workers can be at most one step apart"));
  }
  // Nothing open: a fresh shard opens at its first step (any, if none was set), a running
  // one at the next.
  if (config_.allow_step_gaps) {
    if (step < std::max<int64_t>(first_step_, last_completed_ + 1)) return stale();
    return nullptr;
  }
  if (last_completed_ == 0 && first_step_ > 0 && step != first_step_) {
    *reason = step < first_step_ ? RejectReason::kStaleStep : RejectReason::kStepAhead;
    return absl::FailedPreconditionError(
        absl::StrCat("step ", step, " pushed to a shard whose job starts at step ", first_step_));
  }
  if (last_completed_ == 0 || step == last_completed_ + 1) return nullptr;
  if (step <= last_completed_) return stale();
  *reason = RejectReason::kStepAhead;
  return absl::FailedPreconditionError(
      absl::StrCat("step ", step, " skips ahead: the last finished step is ", last_completed_));
}

uint8_t* ShardState::OnebitRow(int worker) {
  return onebit_rows_.data() + static_cast<size_t>(worker) * layout_.block_bytes();
}

absl::StatusOr<ShardState::PushOutcome> ShardState::Push(int worker, int64_t step, int chunk,
                                                         ChunkKind kind,
                                                         absl::string_view payload,
                                                         bool checkpoint, bool reset_errors) {
  // The caller's bytes, by reference for the call only.
  return PushImpl(worker, step, chunk, kind, absl::MakeCordFromExternal(payload, [] {}),
                  /*owned=*/false, checkpoint, reset_errors);
}

absl::StatusOr<ShardState::PushOutcome> ShardState::PushOwned(int worker, int64_t step,
                                                              int chunk, ChunkKind kind,
                                                              std::string&& payload,
                                                              bool checkpoint, bool reset_errors) {
  // A Cord takes a large string over without copying it.
  return PushImpl(worker, step, chunk, kind, absl::Cord(std::move(payload)), /*owned=*/true,
                  checkpoint, reset_errors);
}

absl::StatusOr<ShardState::PushOutcome> ShardState::PushCord(int worker, int64_t step,
                                                             int chunk, ChunkKind kind,
                                                             absl::Cord payload,
                                                             bool checkpoint, bool reset_errors) {
  return PushImpl(worker, step, chunk, kind, payload, /*owned=*/true, checkpoint, reset_errors);
}

void ShardState::AddRunsInOrder(const absl::Cord& payload, int worker, bool owned) {
  OpenStep& open = *open_;
  if (worker != open.summed) {  // not its turn: keep it (by reference when it may be kept)
    open.early[worker] = owned ? payload : absl::Cord(std::string(payload));
    return;
  }
  float* sum = reinterpret_cast<float*>(open.sum->data());
  AddRun(sum, payload);
  ++open.summed;
  while (open.summed < config_.num_workers && open.pushed[open.summed]) {
    absl::Cord& early = open.early[open.summed];
    AddRun(sum, early);
    early.Clear();  // the memory goes back now
    ++open.summed;
  }
}

absl::StatusOr<ShardState::PushOutcome> ShardState::PushImpl(int worker, int64_t step, int chunk,
                                                             ChunkKind kind,
                                                             const absl::Cord& payload,
                                                             bool owned, bool checkpoint,
                                                             bool reset_errors) {
  RejectReason reason;
  if (absl::Status s = ValidateRequest(worker, step, chunk, kind, &reason); !s.ok()) {
    return Reject(reason, s);
  }
  if (absl::Status s = ValidatePayload(kind, payload, &reason); !s.ok()) return Reject(reason, s);

  absl::MutexLock lock(&mu_);
  if (first_step_ < 0) {
    // Closed until the coordinator said where the job starts.
    auto open = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return first_step_ >= 0 || shutdown_; };
    if (!mu_.AwaitWithTimeout(absl::Condition(&open), absl::Seconds(60))) {
      return absl::UnavailableError("the shard has not learned the job's first step yet");
    }
  }
  if (!broken_.ok()) return broken_;
  if (shutdown_) return absl::UnavailableError("the shard is shutting down");
  absl::StatusOr<const FinishedStep*> finished = Locate(step, kind, &reason);
  if (!finished.ok()) return Reject(reason, finished.status());

  if (*finished != nullptr) {  // a retry of a finished step
    if (Fingerprint(payload) != (*finished)->fingerprints[worker]) {
      return Reject(RejectReason::kConflictingDuplicate,
                    absl::AlreadyExistsError(absl::StrCat(
                        "worker ", worker, " already pushed a different payload for step ", step)));
    }
    if (observer_ != nullptr) observer_->OnDuplicate(kind);
    return PushOutcome{true, (*finished)->result};
  }

  if (open_.has_value() && open_->pushed[worker]) {
    const bool differs =
        kind == ChunkKind::kFp32
            ? Fingerprint(payload) != open_->fingerprints[worker]
            : payload != absl::string_view(reinterpret_cast<const char*>(OnebitRow(worker)),
                                           payload.size());
    if (differs) {
      return Reject(RejectReason::kConflictingDuplicate,
                    absl::AlreadyExistsError(absl::StrCat(
                        "worker ", worker, " already pushed a different payload for step ", step)));
    }
    if (observer_ != nullptr) observer_->OnDuplicate(kind);
    return PushOutcome{true, nullptr};
  }

  // Accepted: from here on the push changes the state.
  if (!open_.has_value()) {
    open_ = OpenStep{step, kind, std::vector<bool>(config_.num_workers, false), 0, absl::Now()};
    open_->fingerprints.assign(config_.num_workers, 0);
    if (kind == ChunkKind::kFp32) {
      // Zeros, then + r0 + r1 + ...: SumRows' order, so the same bits.
      const size_t bytes = layout_.payload_bytes(kind, config_.shard);
      for (auto it = released_sums_.begin(); it != released_sums_.end(); ++it) {
        if (it->use_count() == 1 && (*it)->size() == bytes) {
          open_->sum = std::move(*it);
          released_sums_.erase(it);
          std::fill(open_->sum->begin(), open_->sum->end(), '\0');
          break;
        }
      }
      if (open_->sum == nullptr) open_->sum = std::make_shared<std::string>(bytes, '\0');
      open_->early.resize(config_.num_workers);
    }
  }
  open_->fingerprints[worker] = Fingerprint(payload);
  if (kind == ChunkKind::kFp32) {
    AddRunsInOrder(payload, worker, owned);
  } else {
    CopyCord(payload, OnebitRow(worker));
  }
  open_->pushed[worker] = true;
  open_->checkpoint = open_->checkpoint || checkpoint;
  open_->reset_errors = open_->reset_errors || reset_errors;
  any_push_ = true;
  if (++open_->num_pushed < config_.num_workers) return PushOutcome{false, nullptr};
  ONEBIT_RETURN_IF_ERROR(Complete());
  return PushOutcome{false, finished_.back().result};
}

absl::Status ShardState::Complete() {
  OpenStep open = *std::move(open_);
  const size_t bytes = layout_.payload_bytes(open.kind, config_.shard);
  std::shared_ptr<std::string> result;
  absl::Status status;
  if (open.kind == ChunkKind::kFp32) {
    // Every run was added as its turn came (AddRunsInOrder): the sum is the result.
    if (open.summed != config_.num_workers) {
      status = absl::InternalError(absl::StrCat("the sum holds ", open.summed, " of ",
                                                config_.num_workers, " runs"));
    }
    result = std::move(open.sum);
  } else {
    result = std::make_shared<std::string>(bytes, '\0');
    if (open.reset_errors) status = aggregator_->ResetError();
    if (status.ok()) status = aggregator_->Aggregate(onebit_rows_.data(), config_.num_workers,
                                    reinterpret_cast<uint8_t*>(result->data()));
    // Finite scales can still overflow their sum (W scales near FLT_MAX): the server error
    // is then infinite or NaN, and no worker would accept the result.
    if (status.ok()) {
      if (const std::optional<HeaderFault> fault = config_.codec->CheckHeader(
              reinterpret_cast<const uint8_t*>(result->data()))) {
        status = absl::OutOfRangeError(
            absl::StrCat("the average of the workers' blocks overflowed float32 (result ",
                         fault->field, " ", fault->value, ")"));
      }
    }
  }
  if (!status.ok()) {
    broken_ = absl::InternalError(
        absl::StrCat("shard ", config_.shard, " failed step ", open.step, ": ", status.message()));
    step_done_.SignalAll();
    return broken_;
  }

  finished_.push_back(
      FinishedStep{open.step, open.kind, std::move(result), std::move(open.fingerprints)});
  while (finished_.size() > static_cast<size_t>(config_.retained_steps)) {
    // An fp32 result nobody holds any more (no reply still being sent) becomes the next
    // sum's memory: a fresh chunk-sized allocation each step costs more in page faults
    // than the additions.
    // Replies may still hold it (gRPC lets go of sent slices a little later): kept aside
    // until they do, a few at most.
    FinishedStep& oldest = finished_.front();
    if (oldest.kind == ChunkKind::kFp32) {
      if (released_sums_.size() >= kMaxReleasedSums) released_sums_.erase(released_sums_.begin());
      released_sums_.push_back(std::const_pointer_cast<std::string>(std::move(oldest.result)));
    }
    finished_.pop_front();
  }
  last_completed_ = open.step;
  open_.reset();

  if (observer_ != nullptr) {
    observer_->OnStepCompleted(open.kind, open.step, absl::Now() - open.opened_at);
    if (open.kind == ChunkKind::kOnebit) {
      absl::StatusOr<double> norm = aggregator_->ErrorNorm();
      if (norm.ok()) observer_->OnServerErrorNorm(*norm);
    }
  }
  if (open.checkpoint && config_.on_checkpoint) {
    absl::StatusOr<std::vector<float>> error = aggregator_->error().ToHost();
    if (!error.ok()) {
      broken_ = absl::InternalError(absl::StrCat("shard ", config_.shard, ": cannot copy the server error for the checkpoint of step ", open.step, ": ", error.status().message()));
      step_done_.SignalAll();
      return broken_;
    }
    config_.on_checkpoint(open.step, *std::move(error));
  }
  if (config_.on_step_completed) config_.on_step_completed(open.step);
  step_done_.SignalAll();
  return absl::OkStatus();
}

absl::Status ShardState::SetFirstStep(int64_t step) {
  if (step < 1) return absl::InvalidArgumentError(absl::StrCat("first step must be >= 1, got ", step));
  absl::MutexLock lock(&mu_);
  if (any_push_) return absl::FailedPreconditionError("the shard has taken pushes already");
  first_step_ = step;
  return absl::OkStatus();
}

absl::Status ShardState::RestoreServerError(const std::vector<float>& error) {
  absl::MutexLock lock(&mu_);
  if (any_push_) {
    return absl::FailedPreconditionError(
        "the server error can only be restored before the first push");
  }
  if (error.size() != aggregator_->chunk()) {
    return absl::InvalidArgumentError(absl::StrCat("server_error has ", error.size(),
                                                   " elements, this shard's chunk ",
                                                   aggregator_->chunk()));
  }
  for (size_t i = 0; i < error.size(); ++i) {
    if (!std::isfinite(error[i])) {
      return absl::InvalidArgumentError(
          absl::StrCat("server_error[", i, "] is ", error[i], ": it must be finite"));
    }
  }
  return aggregator_->RestoreError(error);
}

absl::StatusOr<ResultPayload> ShardState::AwaitResult(int worker, int64_t step, int chunk,
                                                      ChunkKind kind, absl::Time deadline,
                                                      const std::function<bool()>& cancelled) {
  RejectReason reason;  // pulls are not counted as rejected pushes
  ONEBIT_RETURN_IF_ERROR(ValidateRequest(worker, step, chunk, kind, &reason));
  absl::MutexLock lock(&mu_);
  while (true) {
    if (!broken_.ok()) return broken_;
    if (shutdown_) return absl::UnavailableError("the shard is shutting down");
    ONEBIT_ASSIGN_OR_RETURN(const FinishedStep* finished, Locate(step, kind, &reason));
    if (finished != nullptr) return finished->result;
    const absl::Time now = absl::Now();
    if (now >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("step ", step, " is still waiting for workers"));
    }
    if (cancelled && cancelled()) return absl::CancelledError("the caller went away");
    step_done_.WaitWithDeadline(&mu_, cancelled ? std::min(deadline, now + kCancelPoll) : deadline);
  }
}

void ShardState::Shutdown() {
  absl::MutexLock lock(&mu_);
  shutdown_ = true;
  step_done_.SignalAll();
}

int64_t ShardState::last_completed_step() const {
  absl::MutexLock lock(&mu_);
  return last_completed_;
}

int64_t ShardState::open_step() const {
  absl::MutexLock lock(&mu_);
  return open_.has_value() ? open_->step : 0;
}

absl::StatusOr<std::vector<float>> ShardState::ServerErrorToHost() const {
  absl::MutexLock lock(&mu_);
  return aggregator_->error().ToHost();
}

absl::StatusOr<double> ShardState::ServerErrorNorm() const {
  absl::MutexLock lock(&mu_);
  return aggregator_->ErrorNorm();
}

}  // namespace onebit::server
