// Transport over gloo's TCP device (Debian libgloo, snapshot 20220518): the CPU transport
// of peer mode. Buffers are host memory.
//
// Bootstrap is separate from data transport (as in NCCL): ranks find each other through a
// gloo::rendezvous::Store (the coordinator's rendezvous in a job, NewInMemoryStore() for
// threads of one process), then talk over a full mesh of TCP connections.
//
// Errors: gloo reports failures by throwing. Nothing escapes this class: every exception
// becomes an absl::Status (kUnavailable: a peer vanished or the network failed;
// kDeadlineExceeded: options.timeout passed; kInternal: anything else). After the first
// error the transport closes its connections, so that peers blocked on it fail promptly
// rather than at their own timeout, and refuses every later call with the same status.
#ifndef ONEBIT_WORKER_TRANSPORT_GLOO_TRANSPORT_H_
#define ONEBIT_WORKER_TRANSPORT_GLOO_TRANSPORT_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "gloo/rendezvous/store.h"
#include "worker/transport/transport.h"

namespace gloo {
class Context;
}  // namespace gloo

namespace onebit {

struct GlooOptions {
  // Address to bind and advertise to peers: a hostname or an IP address.
  std::string hostname = "127.0.0.1";
  // Network interface to bind instead (e.g. "eth0"); takes precedence when non-empty.
  std::string iface;
  // Bounds connecting the mesh and each collective. Must be positive: this gloo treats a
  // zero timeout literally (every wait expires at once), not as "no timeout".
  absl::Duration timeout = absl::Seconds(30);
};

// Thread safety: collectives from one thread at a time (transport.h); the byte counters
// may be read from any thread (a metrics scraper).
class GlooTransport final : public Transport {
 public:
  // Collective and blocking: each of the world_size ranks calls Create with the same store,
  // in its own thread or process, and it returns once all are connected (or fails after
  // options.timeout). The store is only used during Create. A store serves one group:
  // gloo writes fixed keys ("0", "rank_0", ...) and a HashStore refuses to overwrite
  // them, so give each group its own store or a gloo::rendezvous::PrefixStore.
  static absl::StatusOr<std::unique_ptr<GlooTransport>> Create(
      std::shared_ptr<gloo::rendezvous::Store> store, int rank, int world_size,
      const GlooOptions& options = GlooOptions());

  // Closes the connections; peers see kUnavailable on their next collective.
  ~GlooTransport() override;

  std::string name() const override { return "gloo"; }
  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  kernels::MemorySpace memory_space() const override { return kernels::MemorySpace::kHost; }

  // Zero-byte calls return at once without touching the network: all ranks pass the same
  // sizes (transport.h), so all ranks skip together.
  //
  // AllToAll and AllGather are W-1 shifts of point-to-point messages (shift s: this rank's
  // block for rank + s goes there, rank - s's block for this rank comes in). Blocks of at
  // most kAllInFlightMaxBlockBytes: every shift posted at once, one round on the wire (the
  // compressed exchange's blocks of a small model are a few kB: latency, not flows, is
  // their cost). Larger blocks: one shift at a time, so that each link carries one flow
  // each way as in a ring, but nothing is forwarded: a late rank delays the shifts it is
  // in, not every later one.
  static constexpr size_t kAllInFlightMaxBlockBytes = size_t{256} << 10;
  absl::Status AllToAll(const void* send, void* recv, size_t block_bytes) override;
  absl::Status AllGather(const void* send, void* recv, size_t block_bytes) override;
  // gloo's ring algorithm; every rank ends with bit-identical sums.
  absl::Status AllReduceSum(float* data, size_t count) override;
  absl::Status Barrier() override;
  // gloo unbound buffers: the send and the receive are posted together, then both waited
  // for (each within options.timeout).
  absl::Status SendRecv(const void* send, size_t send_bytes, int to, void* recv,
                        size_t recv_bytes, int from) override;
  // Posts both sides and returns; gloo's device thread moves the bytes while the caller
  // goes on. Wait() waits for each side within options.timeout. A pending call destroyed
  // without Wait() is waited for then (its status dropped).
  absl::StatusOr<std::unique_ptr<PendingSendRecv>> StartSendRecv(const void* send,
                                                                  size_t send_bytes, int to,
                                                                  void* recv, size_t recv_bytes,
                                                                  int from) override;

  uint64_t bytes_sent() const override { return bytes_sent_.load(std::memory_order_relaxed); }
  uint64_t bytes_received() const override {
    return bytes_received_.load(std::memory_order_relaxed);
  }

 private:
  GlooTransport(std::shared_ptr<gloo::Context> context, absl::Duration timeout);

  // Runs `collective` (which calls gloo and may throw) unless the transport is already
  // broken; converts an exception into the sticky status; on success adds `sent` and
  // `received` to the counters.
  template <typename Fn>
  absl::Status Run(absl::string_view op, uint64_t sent, uint64_t received, Fn&& collective);

  class GlooPendingSendRecv;

  // The W-1 shifts of AllToAll and AllGather through StartSendRecv: shift s sends
  // block_for(rank + s) and receives rank - s's block into recv (block `from`); all in
  // flight at once, or one at a time (above kAllInFlightMaxBlockBytes). Copies this rank's
  // own block (block_for(rank)) into place.
  absl::Status Shifts(const std::function<const uint8_t*(int to)>& block_for, void* recv,
                      size_t block_bytes);

  // Checks a SendRecv's peers; InvalidArgument (nothing posted, connections usable).
  absl::Status CheckSendRecvPeers(int to, size_t send_bytes, int from, size_t recv_bytes) const;

  // A fresh tag per call, advanced on every call including the zero-byte ones that skip
  // gloo, so tags stay equal across ranks. Distinct tags keep a rank that fell out of step
  // from matching another call's messages: it times out instead of reading wrong data.
  uint32_t NextTag() { return next_tag_++; }

  const std::shared_ptr<gloo::Context> context_;
  const int rank_;
  const int world_size_;
  const absl::Duration timeout_;
  uint32_t next_tag_ = 0;
  absl::Status status_;  // first error; only touched by the calling thread
  std::atomic<uint64_t> bytes_sent_{0};
  std::atomic<uint64_t> bytes_received_{0};
};

// A gloo::rendezvous::HashStore: a store for ranks that are threads of one process.
std::shared_ptr<gloo::rendezvous::Store> NewInMemoryStore();

}  // namespace onebit

#endif  // ONEBIT_WORKER_TRANSPORT_GLOO_TRANSPORT_H_
