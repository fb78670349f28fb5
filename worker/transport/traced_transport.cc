#include "worker/transport/traced_transport.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace onebit {

// A started SendRecv whose line is written when it is waited for.
class TracedTransport::TracedPending final : public Transport::PendingSendRecv {
 public:
  TracedPending(TracedTransport* transport, Begun begun, std::unique_ptr<PendingSendRecv> inner)
      : transport_(transport), begun_(begun), inner_(std::move(inner)) {}

  absl::Status Wait() override {
    if (waited_) return status_;
    waited_ = true;
    status_ = transport_->End(begun_, inner_->Wait());
    return status_;
  }

 private:
  TracedTransport* const transport_;
  const Begun begun_;
  std::unique_ptr<PendingSendRecv> inner_;
  bool waited_ = false;
  absl::Status status_;
};

TracedTransport::TracedTransport(Transport* inner, std::ostream* out, Now now)
    : owned_trace_(std::make_unique<CallTrace>(out, std::move(now))),
      inner_(inner),
      trace_(owned_trace_.get()) {}

TracedTransport::TracedTransport(Transport* inner, CallTrace* trace)
    : inner_(inner), trace_(trace) {}

absl::StatusOr<std::unique_ptr<Transport>> TracedTransport::Create(
    std::unique_ptr<Transport> inner, const std::string& path) {
  absl::StatusOr<std::unique_ptr<CallTrace>> trace = CallTrace::Create(path);
  if (!trace.ok()) return trace.status();
  CallTrace* lines = trace->get();
  std::unique_ptr<TracedTransport> traced = Own(std::move(inner), lines);
  traced->owned_trace_ = *std::move(trace);
  return std::unique_ptr<Transport>(std::move(traced));
}

std::unique_ptr<Transport> TracedTransport::Create(std::unique_ptr<Transport> inner,
                                                   CallTrace* trace) {
  return Own(std::move(inner), trace);
}

std::unique_ptr<TracedTransport> TracedTransport::Own(std::unique_ptr<Transport> inner,
                                                      CallTrace* trace) {
  auto traced = std::make_unique<TracedTransport>(inner.get(), trace);
  traced->owned_inner_ = std::move(inner);
  return traced;
}

TracedTransport::Begun TracedTransport::Begin(absl::string_view op, int to, int from,
                                              size_t block_bytes, uint64_t wire_bytes) const {
  return Begun{op, to, from, block_bytes, wire_bytes, wire_bytes, trace_->now()};
}

TracedTransport::Begun TracedTransport::BeginSendRecv(size_t send_bytes, int to, size_t recv_bytes,
                                                      int from) const {
  Begun b = Begin("SendRecv", to, from, send_bytes, 0);
  b.sent = to == rank() ? 0 : send_bytes;
  b.received = from == rank() ? 0 : recv_bytes;
  return b;
}

uint64_t TracedTransport::BlockWireBytes(size_t block_bytes) const {
  return static_cast<uint64_t>(world_size() - 1) * block_bytes;
}

absl::Status TracedTransport::End(const Begun& begun, absl::Status status) {
  trace_->Write(CallLine{begun.op, begun.to, begun.from, begun.block_bytes, begun.sent,
                         begun.received, begun.start, trace_->now(), status.ok()});
  return status;
}

absl::Status TracedTransport::AllToAll(const void* send, void* recv, size_t block_bytes) {
  const Begun b = Begin("AllToAll", -1, -1, block_bytes, BlockWireBytes(block_bytes));
  return End(b, inner_->AllToAll(send, recv, block_bytes));
}

absl::Status TracedTransport::AllGather(const void* send, void* recv, size_t block_bytes) {
  const Begun b = Begin("AllGather", -1, -1, block_bytes, BlockWireBytes(block_bytes));
  return End(b, inner_->AllGather(send, recv, block_bytes));
}

absl::Status TracedTransport::AllReduceSum(float* data, size_t count) {
  const size_t bytes = count * sizeof(float);
  const Begun b = Begin("AllReduceSum", -1, -1, bytes, RingAllReduceWireBytes(bytes, world_size()));
  return End(b, inner_->AllReduceSum(data, count));
}

absl::Status TracedTransport::Barrier() {
  const Begun b = Begin("Barrier", -1, -1, 0, 0);
  return End(b, inner_->Barrier());
}

absl::Status TracedTransport::SendRecv(const void* send, size_t send_bytes, int to, void* recv,
                                       size_t recv_bytes, int from) {
  const Begun b = BeginSendRecv(send_bytes, to, recv_bytes, from);
  return End(b, inner_->SendRecv(send, send_bytes, to, recv, recv_bytes, from));
}

absl::StatusOr<std::unique_ptr<Transport::PendingSendRecv>> TracedTransport::StartSendRecv(
    const void* send, size_t send_bytes, int to, void* recv, size_t recv_bytes, int from) {
  const Begun b = BeginSendRecv(send_bytes, to, recv_bytes, from);
  absl::StatusOr<std::unique_ptr<PendingSendRecv>> inner =
      inner_->StartSendRecv(send, send_bytes, to, recv, recv_bytes, from);
  if (!inner.ok()) return End(b, inner.status());
  return std::unique_ptr<PendingSendRecv>(
      std::make_unique<TracedPending>(this, b, std::move(*inner)));
}

}  // namespace onebit
