// The collective transport that CompressedAllreduce and ExactAllreduce are written against. Implementations:
// in-process (ranks as threads, for tests), gloo over TCP (CPUs), NCCL (GPUs).
//
// Contract: every call is a collective. All ranks make the same calls in the same order
// with the same sizes. Buffers live in memory_space() (host for in-process and gloo,
// device memory for NCCL). A call that cannot complete (a peer vanished, a deadline
// passed) returns an error instead of hanging; after an error the transport is unusable.
// A Transport is used by one thread at a time.
#ifndef ONEBIT_WORKER_TRANSPORT_TRANSPORT_H_
#define ONEBIT_WORKER_TRANSPORT_TRANSPORT_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "kernels/kernels.h"

namespace onebit {

class Transport {
 public:
  virtual ~Transport() = default;

  virtual std::string name() const = 0;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  virtual kernels::MemorySpace memory_space() const = 0;

  // `send` holds world_size() blocks of block_bytes; block j goes to rank j. Block j of
  // `recv` is what rank j sent to this rank. send and recv must not overlap.
  virtual absl::Status AllToAll(const void* send, void* recv, size_t block_bytes) = 0;

  // Block j of `recv` (world_size() blocks of block_bytes) is rank j's `send`.
  virtual absl::Status AllGather(const void* send, void* recv, size_t block_bytes) = 0;

  // In place: data[i] = sum over ranks of data[i].
  virtual absl::Status AllReduceSum(float* data, size_t count) = 0;

  virtual absl::Status Barrier() = 0;

  // Point-to-point, as one step of a permutation every rank takes part in (a ring shift,
  // say): sends send_bytes from `send` to rank `to` and receives recv_bytes from rank
  // `from` into `recv`, both at once; returns when both are done. Ordered like a
  // collective: every rank calls SendRecv at the same point of its sequence of calls, and
  // the calls pair up (rank `to` names this rank as its `from`, with recv_bytes equal to
  // this rank's send_bytes). to == rank() (and then from == rank()) is a local copy that
  // puts nothing on the wire. send and recv must not overlap; zero-byte sides are allowed
  // (their pointers may be null). Counts send_bytes sent and recv_bytes received, unless
  // the peer is this rank.
  virtual absl::Status SendRecv(const void* send, size_t send_bytes, int to, void* recv,
                                size_t recv_bytes, int from) = 0;

  // A SendRecv started by StartSendRecv.
  class PendingSendRecv {
   public:
    virtual ~PendingSendRecv() = default;
    // Returns when both sides are done (or failed; the transport is then unusable, as
    // after any failed call). The byte counters move here. Waiting again returns the
    // first wait's status.
    virtual absl::Status Wait() = 0;
  };

  // SendRecv without waiting, so that a caller keeps the link busy with the next message
  // (and computes) while one is on the wire. The same rules as SendRecv, plus: the
  // started calls count, in the order they were started, as calls of the collective
  // sequence; several may be in flight; every one must be waited for before any other
  // call on this transport and before the transport is destroyed; the buffers must stay
  // valid and untouched until then. An error either comes back here (nothing was posted)
  // or from Wait.
  //
  // The default runs SendRecv at once and hands back its status: correct for every
  // transport, overlapping nothing. GlooTransport really posts both sides.
  virtual absl::StatusOr<std::unique_ptr<PendingSendRecv>> StartSendRecv(const void* send,
                                                                          size_t send_bytes,
                                                                          int to, void* recv,
                                                                          size_t recv_bytes,
                                                                          int from);

  // Payload bytes this rank has put on (taken off) the wire so far, as the algorithm moves
  // them: copies to itself do not count; an allreduce counts as a ring allreduce,
  // 2*(W-1)/W of the buffer each way (RingAllReduceWireBytes below), whatever algorithm
  // the library really runs, so that every transport reports the same numbers.
  virtual uint64_t bytes_sent() const = 0;
  virtual uint64_t bytes_received() const = 0;
};

namespace internal {
// A PendingSendRecv that is already done: Wait() returns the status it was made with.
class DonePendingSendRecv final : public Transport::PendingSendRecv {
 public:
  explicit DonePendingSendRecv(absl::Status status) : status_(std::move(status)) {}
  absl::Status Wait() override { return status_; }

 private:
  absl::Status status_;
};
}  // namespace internal

inline absl::StatusOr<std::unique_ptr<Transport::PendingSendRecv>> Transport::StartSendRecv(
    const void* send, size_t send_bytes, int to, void* recv, size_t recv_bytes, int from) {
  return std::unique_ptr<PendingSendRecv>(std::make_unique<internal::DonePendingSendRecv>(
      SendRecv(send, send_bytes, to, recv, recv_bytes, from)));
}

// What bytes_sent() (and bytes_received()) grow by for an allreduce of `bytes` over
// `world_size` ranks: a ring's reduce-scatter then all-gather, each moving (W-1)/W of the
// buffer. Rounded down once, over the whole product, so that every rank counts the same.
inline uint64_t RingAllReduceWireBytes(size_t bytes, int world_size) {
  return 2 * static_cast<uint64_t>(world_size - 1) * bytes / world_size;
}

// OK when `transport` moves buffers in `backend`'s memory (what every collective over the
// two needs); INVALID_ARGUMENT naming both otherwise.
inline absl::Status CheckSameMemorySpace(const kernels::Backend& backend,
                                         const Transport& transport) {
  if (backend.memory_space() == transport.memory_space()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("backend ", backend.name(), " and transport ",
                                                 transport.name(),
                                                 " use different memory spaces"));
}

}  // namespace onebit

#endif  // ONEBIT_WORKER_TRANSPORT_TRANSPORT_H_
