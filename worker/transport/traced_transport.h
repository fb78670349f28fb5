// TracedTransport: a Transport that forwards every call to another and writes one CSV line
// per call to a trace (a worker's --transport_trace): what the call was, with whom, the
// bytes it put on and took off the wire, and when it started and ended (unix seconds, the
// clock of the worker's --history_csv), so that a run's message rounds and the time each
// phase of a step spends on the wire can be read off a real run (tools/bench/rounds.py).
//
//   op,to,from,block_bytes,sent,received,start_unix,end_unix
//
// op: AllToAll, AllGather, AllReduceSum, Barrier, SendRecv (to and from: the peers; -1 for
// the collectives); block_bytes: the block of an AllToAll or AllGather, the floats' bytes
// of an AllReduceSum, the sent bytes of a SendRecv; sent and received: what the call moves
// each way by Transport's byte contract, the amounts every transport's counters grow by
// (read from the call, not the counters: a started SendRecv is counted at its start by one
// transport and at its Wait by another, with other calls in flight; a failed call: 0). A
// started SendRecv is one line, written when it is waited for: it starts at StartSendRecv
// and ends when Wait returns. A failed call is written too, with op suffixed "!" (the trace
// of a run that broke shows where).
//
// Thread safety: as a Transport (one thread at a time). `inner` and `out` are borrowed and
// must outlive this transport; the stream is written by this transport alone.
#ifndef ONEBIT_WORKER_TRANSPORT_TRACED_TRANSPORT_H_
#define ONEBIT_WORKER_TRANSPORT_TRACED_TRANSPORT_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <ostream>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "worker/transport/call_trace.h"
#include "worker/transport/transport.h"

namespace onebit {

class TracedTransport final : public Transport {
 public:
  using Now = CallTrace::Now;

  // Writes the CSV header to `out` at once. `now` is the clock (injected by tests).
  TracedTransport(Transport* inner, std::ostream* out, Now now = &absl::Now);
  // Lines into `trace` (borrowed), which may be shared with the worker's other traced calls.
  TracedTransport(Transport* inner, CallTrace* trace);
  // Owns `inner` and a new file at `path` (truncated), for a worker's --transport_trace.
  // INVALID_ARGUMENT when the file cannot be opened.
  static absl::StatusOr<std::unique_ptr<Transport>> Create(std::unique_ptr<Transport> inner,
                                                           const std::string& path);
  // Owns `inner`; lines into `trace` (borrowed, shared with the worker's other traced calls).
  static std::unique_ptr<Transport> Create(std::unique_ptr<Transport> inner, CallTrace* trace);

  std::string name() const override { return inner_->name(); }
  int rank() const override { return inner_->rank(); }
  int world_size() const override { return inner_->world_size(); }
  kernels::MemorySpace memory_space() const override { return inner_->memory_space(); }

  absl::Status AllToAll(const void* send, void* recv, size_t block_bytes) override;
  absl::Status AllGather(const void* send, void* recv, size_t block_bytes) override;
  absl::Status AllReduceSum(float* data, size_t count) override;
  absl::Status Barrier() override;
  absl::Status SendRecv(const void* send, size_t send_bytes, int to, void* recv,
                        size_t recv_bytes, int from) override;
  absl::StatusOr<std::unique_ptr<PendingSendRecv>> StartSendRecv(const void* send,
                                                                  size_t send_bytes, int to,
                                                                  void* recv, size_t recv_bytes,
                                                                  int from) override;
  uint64_t bytes_sent() const override { return inner_->bytes_sent(); }
  uint64_t bytes_received() const override { return inner_->bytes_received(); }

 private:
  class TracedPending;
  // A TracedTransport that owns `inner` (the two Creates).
  static std::unique_ptr<TracedTransport> Own(std::unique_ptr<Transport> inner, CallTrace* trace);
  // What a call looked like when it started.
  struct Begun {
    absl::string_view op;
    int to, from;
    size_t block_bytes;
    uint64_t sent, received;  // what the call moves each way (Transport's byte contract)
    absl::Time start;
  };

  Begun Begin(absl::string_view op, int to, int from, size_t block_bytes,
              uint64_t wire_bytes) const;
  Begun BeginSendRecv(size_t send_bytes, int to, size_t recv_bytes, int from) const;
  // What an AllToAll or AllGather of `block_bytes` moves each way: W-1 blocks.
  uint64_t BlockWireBytes(size_t block_bytes) const;
  // Writes the line of `begun`, ended now, and hands `status` back.
  absl::Status End(const Begun& begun, absl::Status status);

  std::unique_ptr<Transport> owned_inner_;  // Create's
  std::unique_ptr<CallTrace> owned_trace_;  // Create's
  Transport* inner_;
  CallTrace* trace_;
};

}  // namespace onebit

#endif  // ONEBIT_WORKER_TRANSPORT_TRACED_TRANSPORT_H_
