// The parameter-server exchange: this worker's side of ps mode. Every step it pushes one
// payload to each of the S onebit-server shards over a gRPC bidi stream per shard and
// assembles the S results in shard order. compression/layout.h is the layout; with S == W
// the results are bit-identical to PeerExchange, and warmup sums are identical for any S.
//
//   warmup       SumGradients: shard s gets this worker's fp32 run s of the gradient and
//                returns the rank-order sum of that run over all workers.
//   compression  AverageMomentum: the local momentum is compressed once (WorkerCompressor
//                over S chunks, one scale), block s goes to shard s, shard s returns its
//                recompressed average; the S blocks are the result.
//
// Streams are opened lazily, kept across steps and reopened when one breaks; the S results
// are read as they come (one completion queue, no threads). Small pushes are written all
// at once, large ones staggered (PsExchangeOptions::stagger_min_bytes, PlanPushes).
//
// Thread safety: one thread at a time. The backend (host or device memory) is borrowed.
#ifndef ONEBIT_WORKER_EXCHANGE_PS_EXCHANGE_H_
#define ONEBIT_WORKER_EXCHANGE_PS_EXCHANGE_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "kernels/buffer.h"
#include "kernels/kernels.h"
#include "onebit/v1/exchange.grpc.pb.h"
#include "compression/layout.h"
#include "worker/exchange/exchange.h"
#include "compression/worker_compressor.h"
#include "security/tls_options.h"
#include "worker/transport/call_trace.h"

namespace onebit {

struct PsExchangeOptions {
  // Longest a SumGradients/AverageMomentum call may take, waiting for the other workers
  // included; then UNAVAILABLE.
  absl::Duration step_deadline = absl::Seconds(120);
  // Streams tried per shard within one call (the first included).
  int max_attempts = 3;
  // Pause before the second attempt; doubled for each further one.
  absl::Duration retry_backoff = absl::Milliseconds(100);
  // Pushes of at least this many payload bytes (the warmup's fp32 runs, not the
  // compressed blocks) are written one shard after another, each once the one before it
  // has been written; smaller ones all at once. 0: always all at once.
  size_t stagger_min_bytes = size_t{256} << 10;
  // The order of the staggered pushes: a permutation of [0, S) (PlanPushes); empty: shard
  // 0, 1, ..., S-1, which suits shards apart from the workers (shard 0 answers first, its
  // results come down while the next pushes go up). Written all at once, large pushes
  // would keep a link's uplink busy before its downlink instead of both together.
  std::vector<int> push_order;
  // Shards on this worker's host (PlanPushes): their pushes cross no link, so they are
  // written at once rather than in the staggered order, where the last would end the push
  // phase with a copy through the loopback that the results wait for.
  std::vector<int> local_shards;
  // TLS to the shards (security/tls.h): the CA that verifies them and this worker's
  // certificate for mutual TLS. Off: plaintext. Only the address overload of Create uses it.
  security::TlsOptions tls;
  // The compressed blocks' format (job config exchange.compressor); the shards must use
  // the same, or they reject the pushes (a block of another format's size). Not owned
  // (codecs live for the whole process).
  const Codec* codec = &OnebitCodec();
  // Where to write a line per push and per result; borrowed, must outlive the exchange.
  // nullptr: no trace. Per shard and attempt, a "Push" line (to = the shard; from the
  // write's start to its completion, when gRPC has taken the message) and a "Result" line
  // (from = the shard; from the push's completion, or its start if it never completed, to
  // the result's arrival), as tools/bench/rounds.py reads a peer step's.
  CallTrace* trace = nullptr;
};

// Where a worker on `host` (its --host; empty: unknown) sends its staggered pushes, from
// the shards' addresses ("host:port"). The shards are grouped by host, and the k-th shard
// of every host is part k. Pushes go part by part; within a part, to the hosts after this
// worker's own (in order of first appearance), its own host last:
//
//   shards apart (one host, or none is the worker's): 0, 1, ..., S-1
//   one shard beside each worker (S = W): worker i pushes i+1, i+2, ..., i
//   P shards on each worker's host: part 0 of hosts i+1, ..., i, then part 1, ...
//
// With a shard on every worker's host, each round of pushes sends each host's uplink one
// push and each downlink one push (like the peer exchange's shifts); with several parts, a
// part's shards have all of their pushes (and answer) while the next part's go up, so
// results come down while pushes go up. `local` is the shards on `host`.
struct PushPlan {
  std::vector<int> order;
  std::vector<int> local;
};
PushPlan PlanPushes(const std::string& host, const std::vector<std::string>& shard_addresses);

// Errors: a shard that is down, or that gives no result within step_deadline (the wait
// for the slowest worker included), makes the call fail with UNAVAILABLE, never hang. A
// rejection by a shard (INVALID_ARGUMENT, FAILED_PRECONDITION, ALREADY_EXISTS) is returned
// as it came, prefixed with the shard; a malformed result is INTERNAL. A failed call
// leaves no operation in flight; the next call reopens what is broken.
//
// Retries: a push is idempotent per (worker, step, chunk), so after a broken stream the
// same bytes go again on a new one (at most max_attempts streams per shard and step, with
// backoff). When AverageMomentum(t) fails, the next AverageMomentum(t) re-sends the blocks
// it made rather than compressing again, so the worker error moves once per step (after
// restoring the worker error from a checkpoint, make a new PsExchange).
//
// Copies: a push is the payload copied once into a gRPC slice plus a few header bytes
// (proto/exchange_wire.h), a result is read straight from the received slices: one copy
// each way. On a GPU backend the compression, the worker error and the results stay in
// device memory; only what goes on the wire crosses PCIe (through pinned memory): never
// the fp32 momentum.
class PsExchange : public Exchange {
 public:
  // `shard_addresses[s]` is shard s's gRPC "host:port". Channels get
  // ChannelArguments(layout, options.tls); a TLS file that does not load is an error.
  static absl::StatusOr<std::unique_ptr<PsExchange>> Create(
      kernels::Backend* backend, int rank, int world_size, size_t n,
      const std::vector<std::string>& shard_addresses, const PsExchangeOptions& options = {});
  // The same over channels made by the caller (they must allow messages of a whole fp32
  // run: see ChannelArguments(layout)).
  static absl::StatusOr<std::unique_ptr<PsExchange>> Create(
      kernels::Backend* backend, int rank, int world_size, size_t n,
      std::vector<std::shared_ptr<grpc::Channel>> channels, const PsExchangeOptions& options = {});
  ~PsExchange() override;

  // Messages both ways up to layout.max_message_bytes() (the largest push or result of
  // the layout plus room for the other fields; the shard has the same bound), reconnects
  // after 0.1..1 s instead of gRPC's 1..120 s, so a restarted shard is found again within
  // a retry; a connection of its own per exchange; with `tls`, the server name override
  // and room for the handshake (security/tls.h).
  static grpc::ChannelArguments ChannelArguments(const PsLayout& layout,
                                                 const security::TlsOptions& tls = {});

  int world_size() const override { return world_size_; }
  absl::StatusOr<const float*> SumGradients(int64_t step, const float* grad) override;
  absl::StatusOr<CompressedResult> AverageMomentum(int64_t step, const float* m, const float* g,
                                                   float beta1) override;
  absl::StatusOr<CompressedResult> CompressedAverage(int64_t step, const float* x) override;
  absl::Status ResetErrors(int64_t step) override;
  // A vote to shard 0 (ParameterServer.AgreeOverflow), retried like a push: UNAVAILABLE
  // after step_deadline.
  absl::StatusOr<bool> AnyOverflow(int64_t step, bool local_overflow) override;
  WorkerCompressor& worker_compressor() override { return *compressor_; }
  // The pushes of `step` ask every shard to write its server error after the step.
  void ScheduleCheckpoint(int64_t step) override { checkpoint_step_ = step; }
  // The payload fields of the pushes written and the results read (retries included),
  // nothing else.
  uint64_t bytes_sent() const override { return bytes_sent_.load(); }
  uint64_t bytes_received() const override { return bytes_received_.load(); }
  // The worker error and the block and sum buffers (backend memory; not the host staging
  // of device results, nor gRPC's own).
  uint64_t buffer_bytes() const override {
    return compressor_->error().bytes() + sum_.bytes() + blocks_.bytes() + gathered_.bytes();
  }

  int rank() const { return rank_; }
  // The staggered pushes' order (options.push_order, or 0..S-1).
  const std::vector<int>& push_order() const { return push_order_; }
  int num_shards() const { return layout_.num_shards(); }
  const PsLayout& layout() const { return layout_; }

 private:
  struct Shard;  // one shard's channel, stream and call state (ps_exchange.cc)
  struct Op;

  PsExchange(kernels::Backend* backend, int rank, int world_size, const PsLayout& layout,
             const PsExchangeOptions& options);
  absl::Status Init(std::vector<std::shared_ptr<grpc::Channel>> channels);

  // Pushes Shard::push to every shard and waits for every Shard::result.
  absl::Status RoundTrip(int64_t step, ChunkKind kind);
  void StartAttempt(Shard& shard);
  void HandleEvent(Op& op, bool ok, int64_t step, ChunkKind kind);
  // The trace's line for shard's result (bytes read, or a failure).
  void TraceResult(const Shard& shard, size_t bytes, bool ok);
  void FinishIfBroken(Shard& shard);
  bool Busy(const Shard& shard) const;
  // Cancels every stream with work in flight and waits until none is left.
  void CancelAndDrain();
  absl::Status ValidateResult(const Shard& shard, int64_t step, ChunkKind kind) const;
  // One copy of `data` (backend memory) in a slice for shard's push (reusing the last
  // one's memory).
  absl::StatusOr<grpc::Slice> PayloadSlice(Shard& shard, const void* data, size_t bytes);
  // Every shard's result payload into `dst` (backend memory, `bytes` in all) at
  // offset(shard index) bytes, then ReleaseResults. On a device, through result_stage_.
  absl::Status CopyResults(void* dst, size_t bytes, const std::function<size_t(int)>& offset);
  // Encodes shard's push of `step` around `payload`.
  void SetPush(Shard& shard, int64_t step, ChunkKind kind, const grpc::Slice& payload);
  // Drops the pushes and the results' slices once the results are copied out.
  void ReleaseResults();

  kernels::Backend* const backend_;
  const int rank_;
  const int world_size_;
  const PsLayout layout_;
  const PsExchangeOptions options_;
  std::vector<int> push_order_;      // a permutation of [0, S)
  std::vector<bool> local_shard_;    // by shard: options_.local_shards

  std::unique_ptr<WorkerCompressor> compressor_;
  int64_t checkpoint_step_ = -1;  // the latest step scheduled for a checkpoint
  int64_t reset_step_ = -1;       // the step whose pushes ask the shards to zero their errors
  kernels::Buffer<float> sum_;         // SumGradients' result, n values (made by its first call)
  kernels::Buffer<uint8_t> blocks_;    // the S compressed blocks this worker pushes
  kernels::Buffer<uint8_t> gathered_;  // the S result blocks
  kernels::StagingBuffer result_stage_;  // device backends: the results on their way up
  // The step of a failed AverageMomentum whose blocks_ a retry must push again; 0: none.
  int64_t failed_step_ = 0;

  std::unique_ptr<grpc::CompletionQueue> cq_;
  std::vector<std::unique_ptr<Shard>> shards_;
  std::unique_ptr<v1::ParameterServer::Stub> agree_stub_;  // shard 0, made on first use
  std::atomic<uint64_t> bytes_sent_{0}, bytes_received_{0};
};

}  // namespace onebit

#endif  // ONEBIT_WORKER_EXCHANGE_PS_EXCHANGE_H_
