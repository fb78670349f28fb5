#include "worker/transport/gloo_transport.h"

#include <chrono>
#include <cstring>
#include <exception>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "gloo/allreduce.h"
#include "gloo/barrier.h"
#include "gloo/common/error.h"
#include "gloo/common/logging.h"
#include "gloo/math.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/hash_store.h"
#include "gloo/transport/tcp/device.h"
#include "gloo/transport/unbound_buffer.h"
#include "gloo/types.h"

namespace onebit {
namespace {

std::chrono::milliseconds ToChrono(absl::Duration d) {
  return std::chrono::milliseconds(absl::ToInt64Milliseconds(d));
}

// gloo has no timeout exception type: its timeouts are IoExceptions whose messages say
// "Timed out waiting ...", "Read timeout", "Connect timeout", "Wait timeout for key(s)".
bool IsTimeoutMessage(absl::string_view message) {
  const std::string lower = absl::AsciiStrToLower(message);
  return absl::StrContains(lower, "timeout") || absl::StrContains(lower, "timed out");
}

// Call only inside a catch block: converts the exception in flight.
absl::Status StatusFromCurrentException(absl::string_view op) {
  try {
    throw;
  } catch (const gloo::IoException& e) {
    const std::string message = absl::StrCat("gloo ", op, ": ", e.what());
    return IsTimeoutMessage(e.what()) ? absl::DeadlineExceededError(message)
                                      : absl::UnavailableError(message);
  } catch (const gloo::EnforceNotMet& e) {  // a violated gloo precondition: our bug
    return absl::InternalError(absl::StrCat("gloo ", op, ": ", e.what()));
  } catch (const std::exception& e) {  // other gloo::Exceptions, std::system_error, ...
    return absl::InternalError(absl::StrCat("gloo ", op, ": ", e.what()));
  } catch (...) {
    return absl::InternalError(absl::StrCat("gloo ", op, ": unknown exception"));
  }
}

// Everything of Create that may throw.
std::shared_ptr<gloo::Context> ConnectFullMesh(gloo::rendezvous::Store& store, int rank,
                                               int world_size, const GlooOptions& options) {
  gloo::transport::tcp::attr attr;
  if (options.iface.empty()) {
    attr.hostname = options.hostname;
  } else {
    attr.iface = options.iface;
  }
  std::shared_ptr<gloo::transport::Device> device = gloo::transport::tcp::CreateDevice(attr);
  auto context = std::make_shared<gloo::rendezvous::Context>(rank, world_size);
  // Before connecting: the mesh setup waits on the store and on each peer with it.
  context->setTimeout(ToChrono(options.timeout));
  context->connectFullMesh(store, device);
  return context;
}

}  // namespace

std::shared_ptr<gloo::rendezvous::Store> NewInMemoryStore() {
  return std::make_shared<gloo::rendezvous::HashStore>();
}

absl::StatusOr<std::unique_ptr<GlooTransport>> GlooTransport::Create(
    std::shared_ptr<gloo::rendezvous::Store> store, int rank, int world_size,
    const GlooOptions& options) {
  if (store == nullptr) return absl::InvalidArgumentError("store is null");
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad rank ", rank, " for world_size ", world_size));
  }
  if (options.timeout < absl::Milliseconds(1)) {
    return absl::InvalidArgumentError("timeout must be at least 1 ms");
  }
  std::shared_ptr<gloo::Context> context;
  try {
    context = ConnectFullMesh(*store, rank, world_size, options);
  } catch (...) {
    return StatusFromCurrentException(absl::StrCat("connect rank ", rank));
  }
  // Not make_unique: the constructor is private.
  return std::unique_ptr<GlooTransport>(new GlooTransport(std::move(context), options.timeout));
}

GlooTransport::GlooTransport(std::shared_ptr<gloo::Context> context, absl::Duration timeout)
    : context_(std::move(context)),
      rank_(context_->rank),
      world_size_(context_->size),
      timeout_(timeout) {}

// The gloo context closes its sockets when destroyed ("soft" close: queued data is still
// delivered, then peers read EOF).
GlooTransport::~GlooTransport() = default;

template <typename Fn>
absl::Status GlooTransport::Run(absl::string_view op, uint64_t sent, uint64_t received,
                                Fn&& collective) {
  if (!status_.ok()) return status_;
  try {
    collective();
  } catch (...) {
    status_ = StatusFromCurrentException(op);
    // Hard-close every connection: a peer blocked on this rank (say, the next rank of a
    // ring) then fails now with kUnavailable instead of at its own timeout.
    try {
      context_->closeConnections();
    } catch (...) {
      // Already failing; the first status is the one to report.
    }
    return status_;
  }
  bytes_sent_.fetch_add(sent, std::memory_order_relaxed);
  bytes_received_.fetch_add(received, std::memory_order_relaxed);
  return absl::OkStatus();
}

absl::Status GlooTransport::AllToAll(const void* send, void* recv, size_t block_bytes) {
  const uint8_t* in = static_cast<const uint8_t*>(send);
  return Shifts([&](int to) { return in + to * block_bytes; }, recv, block_bytes);
}

absl::Status GlooTransport::AllGather(const void* send, void* recv, size_t block_bytes) {
  const uint8_t* in = static_cast<const uint8_t*>(send);
  return Shifts([&](int) { return in; }, recv, block_bytes);
}

absl::Status GlooTransport::Shifts(const std::function<const uint8_t*(int to)>& block_for,
                                   void* recv, size_t block_bytes) {
  if (!status_.ok()) return status_;
  if (block_bytes == 0) return absl::OkStatus();
  uint8_t* out = static_cast<uint8_t*>(recv);
  std::memmove(out + rank_ * block_bytes, block_for(rank_), block_bytes);
  const size_t window = block_bytes <= kAllInFlightMaxBlockBytes ? world_size_ : 1;
  // Every rank calls StartSendRecv W-1 times, in the same order, so the tags stay equal
  // across ranks.
  std::vector<std::unique_ptr<PendingSendRecv>> pending;
  size_t waited = 0;
  absl::Status status;
  for (int s = 1; s < world_size_ && status.ok(); ++s) {
    if (pending.size() - waited >= window) {
      status = pending[waited++]->Wait();
      if (!status.ok()) break;
    }
    const int to = (rank_ + s) % world_size_, from = (rank_ + world_size_ - s) % world_size_;
    auto p = StartSendRecv(block_for(to), block_bytes, to, out + from * block_bytes, block_bytes,
                           from);
    if (p.ok()) {
      pending.push_back(std::move(*p));
    } else {
      status = p.status();
    }
  }
  for (; waited < pending.size(); ++waited) {
    const absl::Status w = pending[waited]->Wait();
    if (status.ok()) status = w;
  }
  return status;
}

absl::Status GlooTransport::AllReduceSum(float* data, size_t count) {
  const uint32_t tag = NextTag();
  const uint64_t wire = RingAllReduceWireBytes(count * sizeof(float), world_size_);
  return Run("AllReduceSum", wire, wire, [&] {
    if (count == 0) return;
    gloo::AllreduceOptions opts(context_);
    // Ring explicitly: the byte counters assume a ring, and in a ring each chunk is summed
    // on one rank and then copied, so all ranks hold the same bits.
    opts.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
    opts.setOutput(data, count);  // no input: in place
    // gloo::sum is overloaded; pick the type-erased (out, in1, in2, n) form.
    opts.setReduceFunction(
        static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
    opts.setTag(tag);
    opts.setTimeout(ToChrono(timeout_));
    gloo::allreduce(opts);
  });
}

absl::Status GlooTransport::Barrier() {
  const uint32_t tag = NextTag();
  return Run("Barrier", 0, 0, [&] {
    gloo::BarrierOptions opts(context_);
    opts.setTag(tag);
    opts.setTimeout(ToChrono(timeout_));
    gloo::barrier(opts);
  });
}

absl::Status GlooTransport::CheckSendRecvPeers(int to, size_t send_bytes, int from,
                                               size_t recv_bytes) const {
  if (to < 0 || to >= world_size_ || from < 0 || from >= world_size_ ||
      (to == rank_) != (from == rank_)) {
    // Our bug, not the network's: nothing was posted, the connections stay usable.
    return absl::InvalidArgumentError(absl::StrCat(
        "SendRecv: rank ", rank_, " of ", world_size_, " cannot send to ", to,
        " and receive from ", from));
  }
  if (to == rank_ && send_bytes != recv_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("SendRecv to itself: sends ", send_bytes,
                                                   " bytes but receives ", recv_bytes));
  }
  return absl::OkStatus();
}

absl::Status GlooTransport::SendRecv(const void* send, size_t send_bytes, int to, void* recv,
                                     size_t recv_bytes, int from) {
  ONEBIT_ASSIGN_OR_RETURN(std::unique_ptr<PendingSendRecv> pending,
                          StartSendRecv(send, send_bytes, to, recv, recv_bytes, from));
  return pending->Wait();
}

// Both unbound buffers of one SendRecv, posted. Every gloo call runs under Run, so a
// failure breaks the transport as any collective's does.
class GlooTransport::GlooPendingSendRecv final : public Transport::PendingSendRecv {
 public:
  GlooPendingSendRecv(GlooTransport* transport, int to, size_t send_bytes, int from,
                      size_t recv_bytes)
      : transport_(transport),
        to_(to),
        from_(from),
        send_bytes_(send_bytes),
        recv_bytes_(recv_bytes) {}
  ~GlooPendingSendRecv() override { Wait().IgnoreError(); }

  // Posts both sides (may throw: call it under Run).
  void Post(const void* send, void* recv, uint32_t tag) {
    // A prefix of our own beside gloo's collective ones (1..8), so these slots never meet
    // a collective's messages.
    constexpr uint8_t kSendRecvSlotPrefix = 0x20;
    const uint64_t slot = gloo::Slot::build(kSendRecvSlotPrefix, tag);
    gloo::Context& context = *transport_->context_;
    if (recv_bytes_ > 0) {
      in_ = context.createUnboundBuffer(recv, recv_bytes_);
      in_->recv(from_, slot);
    }
    if (send_bytes_ > 0) {
      // Unbound buffers take non-const pointers; `send` is only read.
      out_ = context.createUnboundBuffer(const_cast<void*>(send), send_bytes_);
      out_->send(to_, slot);
    }
  }

  // gloo counts completions (a second waitRecv would wait for a second message), so the
  // buffers are waited for once and the status kept. A broken transport returns its
  // status without waiting.
  absl::Status Wait() override {
    if (waited_) return status_;
    waited_ = true;
    status_ = transport_->Run("SendRecv", send_bytes_, recv_bytes_, [&] {
      const auto timeout = ToChrono(transport_->timeout_);
      if (in_ != nullptr && !in_->waitRecv(timeout)) {
        throw gloo::IoException(
            absl::StrCat("SendRecv: receive from rank ", from_, " aborted"));
      }
      if (out_ != nullptr && !out_->waitSend(timeout)) {
        throw gloo::IoException(absl::StrCat("SendRecv: send to rank ", to_, " aborted"));
      }
    });
    return status_;
  }

 private:
  GlooTransport* const transport_;
  const int to_, from_;
  const size_t send_bytes_, recv_bytes_;
  std::unique_ptr<gloo::transport::UnboundBuffer> in_, out_;
  bool waited_ = false;
  absl::Status status_;
};

absl::StatusOr<std::unique_ptr<Transport::PendingSendRecv>> GlooTransport::StartSendRecv(
    const void* send, size_t send_bytes, int to, void* recv, size_t recv_bytes, int from) {
  const uint32_t tag = NextTag();
  if (!status_.ok()) return status_;
  ONEBIT_RETURN_IF_ERROR(CheckSendRecvPeers(to, send_bytes, from, recv_bytes));
  if (to == rank_) {
    if (send_bytes > 0) std::memcpy(recv, send, send_bytes);
    return std::unique_ptr<PendingSendRecv>(
        std::make_unique<internal::DonePendingSendRecv>(absl::OkStatus()));
  }
  auto pending = std::make_unique<GlooPendingSendRecv>(this, to, send_bytes, from, recv_bytes);
  // Posting counts no bytes; Wait() counts them once both sides are done.
  ONEBIT_RETURN_IF_ERROR(Run("SendRecv", 0, 0, [&] { pending->Post(send, recv, tag); }));
  return std::unique_ptr<PendingSendRecv>(std::move(pending));
}

}  // namespace onebit
