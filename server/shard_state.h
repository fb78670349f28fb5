// The state of one parameter-server shard, without any gRPC: it takes the pushes of W
// workers for its chunk, step by step, and computes each step's result once all W have
// pushed (compression/layout.h has the layout; docs/algorithms.md the math).
//
//   fp32 step (warmup):        result = sum of the W runs in worker-rank order, bit for bit
//                              the float sum Backend::SumRows gives (0 + r0 + r1 + ...)
//   onebit step (compression): result = ChunkAggregator over the W blocks in rank order;
//                              the server error changes here and nowhere else (the blocks
//                              in the 1-bit or the int8 format: ShardConfig::compressor)
//
// STEPS. Steps are numbered from 1 and each has one kind. The shard has at most one open
// step: a worker only pushes step t+1 after it has the result of step t, which exists only
// once every worker pushed step t, so the W workers are never more than one step apart.
// A fresh shard opens at whatever step comes first (a resumed job need not start at 1);
// after that, step t+1 opens only after step t completed.
//
// Thread safety: all methods are thread-safe. The backend (host memory) and the observer
// are borrowed; the observer is called with the shard's lock held and must not call back.
#ifndef ONEBIT_SERVER_SHARD_STATE_H_
#define ONEBIT_SERVER_SHARD_STATE_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/cord.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "kernels/buffer.h"
#include "kernels/kernels.h"
#include "compression/chunk_aggregator.h"
#include "compression/codec.h"
#include "compression/codec_registry.h"
#include "compression/layout.h"

namespace onebit::server {

struct ShardConfig {
  int shard = 0;        // this shard's index in [0, num_shards)
  int num_shards = 1;   // S
  int num_workers = 1;  // W
  size_t n = 0;         // parameters of the whole tensor
  // Finished steps whose results are kept for retries; at least 2 (while step t+1 is open
  // a slow worker may still be asking for step t).
  int retained_steps = 2;
  // Called when a step pushed with the checkpoint flag completes, with the server error as
  // it stands after that step (host copy). Runs with the shard's lock held: it must only
  // hand the data on (a queue), never block or call back.
  std::function<void(int64_t step, std::vector<float> server_error)> on_checkpoint;
  // The step a fresh shard opens at: 0 any (standalone shards, tests); > 0 exactly that one;
  // < 0 none yet: pushes wait (up to 60 s) until SetFirstStep says it. A shard of a job
  // starts closed and learns its first step from the coordinator (1, or after the
  // checkpoint it resumes from), so a stray client cannot pin it to a far-future step.
  int64_t first_step = 0;
  // Called after every completed step, with the lock held (fault injection).
  std::function<void(int64_t step)> on_step_completed;
  // The compressed blocks' format (job config exchange.compressor); the workers' must match.
  // Not owned (codecs live for the whole process).
  const Codec* codec = &OnebitCodec();
  // Steps must only increase, not follow one another: 0/1 Adam's local steps exchange
  // nothing (optimizer.type ZeroOneAdam). Off: each step is the one after the last, and a
  // resumed job's first push is at its first step.
  bool allow_step_gaps = false;
};

// Why a push was rejected: the label of onebit_server_rejected_pushes_total.
enum class RejectReason {
  kBadKind,
  kUnknownWorker,
  kWrongChunk,
  kBadStep,
  kWrongSize,
  kBadScale,
  kStaleStep,
  kStepAhead,
  kKindMismatch,
  kConflictingDuplicate,
};
const char* RejectReasonName(RejectReason reason);  // "bad_kind", "unknown_worker", ...

// Hooks for metrics. Every method has an empty default.
class ShardObserver {
 public:
  virtual ~ShardObserver() = default;
  virtual void OnRejected(RejectReason /*reason*/) {}
  virtual void OnDuplicate(ChunkKind /*kind*/) {}
  // `open_for`: from the step's first push to its result (the wait for the slowest
  // worker plus the aggregation).
  virtual void OnStepCompleted(ChunkKind /*kind*/, int64_t /*step*/, absl::Duration /*open_for*/) {}
  // After every onebit step: ||server error||_2.
  virtual void OnServerErrorNorm(double /*norm*/) {}
};

// A step's result payload, shared by everyone who asks for it.
using ResultPayload = std::shared_ptr<const std::string>;

// MEMORY (fp32 steps): the sum is streamed in rank order. Rank r's run is added into the
// step's result as soon as ranks < r are in; a run that arrives before its turn is kept
// (the payload's string or receive slices themselves, not copied) until then, and dropped
// once added. So the shard holds one chunk for the sum plus only the runs that came early, never W rows
// of its own; and the last push of a step costs one addition, not W. A result that left
// the retained window becomes a later step's sum once no reply holds it (a few are kept
// aside for that), so a steady run allocates no chunk-sized buffer per step.
class ShardState {
 public:
  static absl::StatusOr<std::unique_ptr<ShardState>> Create(kernels::Backend* backend,
                                                            const ShardConfig& config,
                                                            ShardObserver* observer = nullptr);

  // IDEMPOTENCY per (worker, step, chunk): the results of the last `retained_steps` steps are
  // kept, so a retried push of a finished step gets the same result again and changes
  // nothing; so does a repeated push of the open step. A repeat whose payload differs from
  // the first push (a compressed block compared byte for byte on the open step; an fp32 run,
  // which is not kept once added, and every push of a finished step by a 64-bit hash) is
  // ALREADY_EXISTS: the worker re-ran its compressor, so its worker error has moved on and
  // no answer is right.
  struct PushOutcome {
    bool duplicate = false;  // seen before: nothing changed
    ResultPayload result;    // the step's result if it is complete, null while it is open
  };
  // VALIDATION, every failure leaving the state untouched:
  //   INVALID_ARGUMENT     kind not fp32/onebit, worker outside [0, W), chunk != shard,
  //                        step < 1, payload of the wrong size (the message names expected
  //                        and got, and says so when the size is the other compressor's: a
  //                        worker whose exchange.compressor differs from the shard's), a
  //                        compressed block whose scale is negative, NaN or infinite, or
  //                        (int8) whose offset is NaN or infinite (it would poison the server
  //                        error for good)
  //   FAILED_PRECONDITION  a step older than the retained window, a step ahead of the open
  //                        one (or skipping one), a kind that differs from the step's kind
  //   ALREADY_EXISTS       a repeated push with a different payload (see above)
  //   UNAVAILABLE          after Shutdown()
  // fp32 values are not checked: a non-finite gradient is the worker's business and leaves
  // no state behind on the shard. Finite scales whose average overflows float32 would poison
  // the server error all the same: that step fails, and the shard with it (INTERNAL).
  // Validates and records one push; completes the step when it is the W-th. Never waits
  // for other workers.
  // `checkpoint`: the job checkpoints after this step (any worker's flag counts).
  // `reset_errors`: the server error is zeroed before this step is aggregated (any
  // worker's flag counts).
  absl::StatusOr<PushOutcome> Push(int worker, int64_t step, int chunk, ChunkKind kind,
                                   absl::string_view payload, bool checkpoint = false,
                                   bool reset_errors = false);
  // The same, taking the payload's string: an fp32 run that must wait for its turn is kept
  // as it is instead of copied (the gRPC service moves the parsed message's bytes in).
  absl::StatusOr<PushOutcome> PushOwned(int worker, int64_t step, int chunk, ChunkKind kind,
                                        std::string&& payload, bool checkpoint = false,
                                        bool reset_errors = false);
  // The same over a Cord, which may be the network's receive slices by reference (the
  // gRPC service): an fp32 run is added chunk by chunk straight from them, and one that
  // must wait for its turn is kept as that Cord (no copy either way).
  absl::StatusOr<PushOutcome> PushCord(int worker, int64_t step, int chunk, ChunkKind kind,
                                       absl::Cord payload, bool checkpoint = false,
                                       bool reset_errors = false);

  // The result of `step`, waiting for it while it is open (or, when no step is open, is the
  // next one) until `deadline` (DEADLINE_EXCEEDED) or until `cancelled` returns true
  // (CANCELLED; polled every few tens of milliseconds). worker, chunk and kind are checked
  // as for Push.
  absl::StatusOr<ResultPayload> AwaitResult(int worker, int64_t step, int chunk, ChunkKind kind,
                                            absl::Time deadline,
                                            const std::function<bool()>& cancelled = nullptr);

  // Wakes every waiter with UNAVAILABLE; later calls fail the same way.
  void Shutdown();

  const ShardConfig& config() const { return config_; }
  const PsLayout& layout() const { return layout_; }
  // 0 when none.
  int64_t last_completed_step() const;
  int64_t open_step() const;
  // For checkpoints, metrics and tests.
  absl::StatusOr<std::vector<float>> ServerErrorToHost() const;
  absl::StatusOr<double> ServerErrorNorm() const;
  // A resumed job: the server error of the checkpoint. Only before the first push
  // (FAILED_PRECONDITION after), of the chunk's size and finite (INVALID_ARGUMENT otherwise).
  absl::Status RestoreServerError(const std::vector<float>& error);
  // Opens a closed shard (ShardConfig::first_step < 0) at `step` (>= 1); FAILED_PRECONDITION
  // once anything was pushed.
  absl::Status SetFirstStep(int64_t step);

 private:
  struct OpenStep {
    int64_t step = 0;
    ChunkKind kind = ChunkKind::kUnspecified;
    std::vector<bool> pushed;  // by worker
    int num_pushed = 0;
    absl::Time opened_at;
    bool checkpoint = false;
    bool reset_errors = false;
    std::vector<size_t> fingerprints;  // by worker, of the pushes so far
    // fp32: the sum so far (the step's result once all are in), the ranks added to it
    // (0..summed-1), and the runs that came before their turn, by worker.
    std::shared_ptr<std::string> sum;
    int summed = 0;
    std::vector<absl::Cord> early;
  };
  struct FinishedStep {
    int64_t step = 0;
    ChunkKind kind = ChunkKind::kUnspecified;
    ResultPayload result;
    std::vector<size_t> fingerprints;  // hash of each worker's payload
  };

  ShardState(kernels::Backend* backend, const ShardConfig& config, const PsLayout& layout,
             ShardObserver* observer)
      : backend_(backend), config_(config), layout_(layout), observer_(observer) {}
  absl::Status Init();

  // Checks that need no state: INVALID_ARGUMENT, with the reason in *reason.
  absl::Status ValidateRequest(int worker, int64_t step, int chunk, ChunkKind kind,
                               RejectReason* reason) const;
  absl::Status ValidatePayload(ChunkKind kind, const absl::Cord& payload,
                               RejectReason* reason) const;
  // Reports a rejected push to the observer and returns `status`.
  absl::Status Reject(RejectReason reason, absl::Status status) const;

  // Where `step` stands: finished and retained (returned), open or the next to open
  // (nullptr), or impossible (FAILED_PRECONDITION, with the reason in *reason).
  absl::StatusOr<const FinishedStep*> Locate(int64_t step, ChunkKind kind,
                                             RejectReason* reason) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Push with the payload as a Cord; `owned`: it may be kept as it is (else it only
  // lives for the call and a kept run is copied).
  absl::StatusOr<PushOutcome> PushImpl(int worker, int64_t step, int chunk, ChunkKind kind,
                                       const absl::Cord& payload, bool owned, bool checkpoint,
                                       bool reset_errors);
  // The open fp32 step: adds every run whose turn has come (rank order) into the sum.
  void AddRunsInOrder(const absl::Cord& payload, int worker, bool owned)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint8_t* OnebitRow(int worker) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status Complete() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  kernels::Backend* const backend_;
  const ShardConfig config_;
  const PsLayout layout_;
  ShardObserver* const observer_;

  mutable absl::Mutex mu_;
  absl::CondVar step_done_;  // signalled when a step completes and on Shutdown
  std::unique_ptr<ChunkAggregator> aggregator_ ABSL_GUARDED_BY(mu_);
  // The open onebit step's blocks, one row per worker, in rank order (1/32 of an fp32 run
  // each; the aggregator reads them all at once).
  kernels::Buffer<uint8_t> onebit_rows_ ABSL_GUARDED_BY(mu_);
  std::optional<OpenStep> open_ ABSL_GUARDED_BY(mu_);
  std::deque<FinishedStep> finished_ ABSL_GUARDED_BY(mu_);  // oldest first
  // Dropped fp32 results, reused as a later step's sum once no reply holds them.
  std::vector<std::shared_ptr<std::string>> released_sums_ ABSL_GUARDED_BY(mu_);
  int64_t last_completed_ ABSL_GUARDED_BY(mu_) = 0;
  bool any_push_ ABSL_GUARDED_BY(mu_) = false;
  int64_t first_step_ ABSL_GUARDED_BY(mu_) = 0;  // see ShardConfig::first_step
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
  // A failed aggregation leaves the server error in an unknown state: stop serving.
  absl::Status broken_ ABSL_GUARDED_BY(mu_);
};

}  // namespace onebit::server

#endif  // ONEBIT_SERVER_SHARD_STATE_H_
