// In-process Transport: the ranks of a group are threads of one process and collectives
// are memcpy between their host buffers. For tests and single-machine tools; it moves no
// bytes over a wire but counts them as if it did (transport.h), so tests of byte
// accounting run without a network.
//
// Usage:
//   ONEBIT_ASSIGN_OR_RETURN(std::shared_ptr<InprocHub> hub, InprocHub::Create(4));
//   // in rank r's thread:
//   ONEBIT_ASSIGN_OR_RETURN(std::unique_ptr<InprocTransport> t, hub->Connect(r));
//
// Failure model, mirroring the real transports:
//   - a rank that does not arrive at a collective within the hub's deadline makes every
//     waiting rank return kDeadlineExceeded naming the collective and the missing ranks;
//   - ranks that disagree on the call (kind or size; for SendRecv, peers that do not pair
//     up) all return kInvalidArgument;
//   - InprocHub::Abort(status) fails every pending and later call with `status`;
//   - destroying an InprocTransport aborts the hub with kUnavailable (a peer vanished).
// After an error a transport refuses further calls with the same status (transport.h).
#ifndef ONEBIT_WORKER_TRANSPORT_INPROC_TRANSPORT_H_
#define ONEBIT_WORKER_TRANSPORT_INPROC_TRANSPORT_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "worker/transport/transport.h"

namespace onebit {

class InprocTransport;

// The meeting point of one group. Shared (std::shared_ptr) by whoever created it and by
// every InprocTransport it handed out, so it outlives all of them.
//
// Thread safety: all public methods may be called from any thread.
class InprocHub : public std::enable_shared_from_this<InprocHub> {
 public:
  static constexpr absl::Duration kDefaultDeadline = absl::Seconds(60);

  // `deadline` bounds how long a rank waits at a collective for the others to arrive.
  static absl::StatusOr<std::shared_ptr<InprocHub>> Create(
      int world_size, absl::Duration deadline = kDefaultDeadline);

  InprocHub(const InprocHub&) = delete;
  InprocHub& operator=(const InprocHub&) = delete;

  int world_size() const { return world_size_; }

  // The transport of `rank`. Each rank can be connected once (kAlreadyExists after).
  absl::StatusOr<std::unique_ptr<InprocTransport>> Connect(int rank);

  // Connect() for every rank, in rank order: for tests that hand them to their threads.
  absl::StatusOr<std::vector<std::unique_ptr<InprocTransport>>> ConnectAll();

  // Fails every pending and future collective of this hub with `status` (an OK status
  // becomes kAborted). The first abort wins. A collective whose data exchange already
  // finished still returns OK.
  void Abort(absl::Status status) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  friend class InprocTransport;

  enum class Op { kAllToAll, kAllGather, kAllReduceSum, kBarrier, kSendRecv };

  // What one rank brings to a collective.
  struct Call {
    Op op = Op::kBarrier;
    size_t bytes = 0;  // block_bytes, the buffer size for AllReduceSum, send_bytes for SendRecv
    const void* send = nullptr;
    // SendRecv only: the peers, and what this rank expects to receive.
    int to = -1;
    int from = -1;
    size_t recv_bytes = 0;
  };

  // Runs on each rank once every rank has arrived with a matching call; calls[j] is
  // rank j's Call. Reading other ranks' `send` buffers is safe for the whole run.
  using Exchange = absl::FunctionRef<void(absl::Span<const Call> calls)>;

  InprocHub(int world_size, absl::Duration deadline);

  // One collective for `rank`: publish `call`, wait for every rank (up to the deadline),
  // check that all ranks made the same call, run `exchange`, and wait until every rank
  // has finished its exchange, so no rank returns (and frees or overwrites its buffer)
  // while another still reads it.
  absl::Status Collective(int rank, const Call& call, Exchange exchange)
      ABSL_LOCKS_EXCLUDED(mu_);

  // First half of Collective: the calls of every rank, or why the round cannot happen.
  absl::StatusOr<std::vector<Call>> Arrive(int rank, const Call& call)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Second half: waits for every rank to finish its exchange. No deadline: every rank has
  // arrived and is only copying memory, so this cannot hang.
  void Depart() ABSL_LOCKS_EXCLUDED(mu_);

  void AbortLocked(absl::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string MissingRanksLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  static absl::string_view OpName(Op op);

  const int world_size_;
  const absl::Duration deadline_;

  absl::Mutex mu_;
  absl::CondVar cv_;  // signalled on every change of the round state or abort
  std::vector<bool> connected_ ABSL_GUARDED_BY(mu_);
  absl::Status abort_status_ ABSL_GUARDED_BY(mu_);
  // The current round. It completes when the last rank arrives and ends (generation_
  // advances) when the last rank departs; no rank can arrive at the next round before.
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<Call> calls_ ABSL_GUARDED_BY(mu_);
  std::vector<bool> arrived_ ABSL_GUARDED_BY(mu_);
  int num_arrived_ ABSL_GUARDED_BY(mu_) = 0;
  int num_departed_ ABSL_GUARDED_BY(mu_) = 0;
  bool complete_ ABSL_GUARDED_BY(mu_) = false;
};

// One rank's view of an InprocHub. Buffers are host memory.
//
// Thread safety: collectives from one thread at a time (transport.h); the byte counters
// may be read from any thread (a metrics scraper).
class InprocTransport final : public Transport {
 public:
  // Aborts the hub with kUnavailable: the other ranks lost a peer.
  ~InprocTransport() override;

  std::string name() const override { return "inproc"; }
  int rank() const override { return rank_; }
  int world_size() const override { return hub_->world_size(); }
  kernels::MemorySpace memory_space() const override { return kernels::MemorySpace::kHost; }

  absl::Status AllToAll(const void* send, void* recv, size_t block_bytes) override;
  absl::Status AllGather(const void* send, void* recv, size_t block_bytes) override;
  absl::Status AllReduceSum(float* data, size_t count) override;
  absl::Status Barrier() override;
  absl::Status SendRecv(const void* send, size_t send_bytes, int to, void* recv,
                        size_t recv_bytes, int from) override;

  uint64_t bytes_sent() const override { return bytes_sent_.load(std::memory_order_relaxed); }
  uint64_t bytes_received() const override {
    return bytes_received_.load(std::memory_order_relaxed);
  }

 private:
  friend class InprocHub;
  InprocTransport(std::shared_ptr<InprocHub> hub, int rank);

  // Runs one collective on the hub; on success adds `sent` and `received` to the counters,
  // on failure makes the error sticky.
  absl::Status Run(const InprocHub::Call& call, InprocHub::Exchange exchange,
                   uint64_t sent, uint64_t received);

  const std::shared_ptr<InprocHub> hub_;
  const int rank_;
  absl::Status status_;  // first error; only touched by the calling thread
  std::atomic<uint64_t> bytes_sent_{0};
  std::atomic<uint64_t> bytes_received_{0};
};

}  // namespace onebit

#endif  // ONEBIT_WORKER_TRANSPORT_INPROC_TRANSPORT_H_
