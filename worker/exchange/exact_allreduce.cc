#include "worker/exchange/exact_allreduce.h"

#include <algorithm>
#include <deque>
#include <functional>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace onebit {

namespace {

// SendRecv calls in flight, oldest first, each with what is to happen once it is done (a
// sum). Start waits for the oldest calls while `depth` are in flight or the new call's
// data is not ready yet. Calls still in flight when the window goes (after a failure) are
// waited for then, before their buffers can be touched again: the transport is broken by
// then, so that returns at once.
class CallWindow {
 public:
  CallWindow(Transport* transport, int depth) : transport_(transport), depth_(depth) {}
  ~CallWindow() {
    for (Call& call : calls_) call.pending->Wait().IgnoreError();
  }

  absl::Status Start(const std::function<bool()>& ready, const void* send, size_t send_bytes,
                     size_t to, void* recv, size_t recv_bytes, size_t from,
                     std::function<absl::Status()> done = nullptr) {
    while (!calls_.empty() && (static_cast<int>(calls_.size()) >= depth_ || !ready())) {
      ONEBIT_RETURN_IF_ERROR(WaitOldest());
    }
    if (!ready()) {
      return absl::InternalError("ExactAllreduce: a call's data is not ready with none in flight");
    }
    ONEBIT_ASSIGN_OR_RETURN(std::unique_ptr<Transport::PendingSendRecv> pending,
                            transport_->StartSendRecv(send, send_bytes, static_cast<int>(to),
                                                      recv, recv_bytes, static_cast<int>(from)));
    calls_.push_back({std::move(pending), std::move(done)});
    return absl::OkStatus();
  }

  absl::Status WaitAll() {
    while (!calls_.empty()) ONEBIT_RETURN_IF_ERROR(WaitOldest());
    return absl::OkStatus();
  }

 private:
  struct Call {
    std::unique_ptr<Transport::PendingSendRecv> pending;
    std::function<absl::Status()> done;
  };

  absl::Status WaitOldest() {
    Call call = std::move(calls_.front());
    calls_.pop_front();
    ONEBIT_RETURN_IF_ERROR(call.pending->Wait());
    return call.done ? call.done() : absl::OkStatus();
  }

  Transport* const transport_;
  const int depth_;
  std::deque<Call> calls_;
};

}  // namespace

absl::StatusOr<bool> AnyAcrossRanks(Transport* transport, kernels::Backend* backend,
                                    kernels::Buffer<float>* flag, bool local) {
  const size_t w = static_cast<size_t>(transport->world_size());
  if (flag->size() != 1 + w) {
    ONEBIT_ASSIGN_OR_RETURN(*flag, kernels::Buffer<float>::Create(backend, 1 + w));
  }
  std::vector<float> host(1 + w, 0.0f);
  host[0] = local ? 1.0f : 0.0f;
  ONEBIT_RETURN_IF_ERROR(flag->CopyFromHost(host.data(), host.size()));
  // Every rank's flag to every rank: one round where a ring allreduce takes 2(W-1).
  ONEBIT_RETURN_IF_ERROR(transport->AllGather(flag->data(), flag->data() + 1, sizeof(float)));
  ONEBIT_ASSIGN_OR_RETURN(std::vector<float> flags, flag->ToHost());
  return std::any_of(flags.begin() + 1, flags.end(), [](float f) { return f != 0.0f; });
}

absl::StatusOr<kernels::WireDtype> ParseWireDtype(absl::string_view name) {
  for (kernels::WireDtype d :
       {kernels::WireDtype::kFp32, kernels::WireDtype::kBf16, kernels::WireDtype::kFp16}) {
    if (name == kernels::WireDtypeName(d)) return d;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown wire dtype \"", name, "\" (fp32, bf16 or fp16)"));
}

absl::StatusOr<SumOrder> ParseSumOrder(absl::string_view name) {
  if (name == "rank") return SumOrder::kRank;
  if (name == "ring") return SumOrder::kRing;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown sum order \"", name, "\" (rank or ring)"));
}

absl::StatusOr<std::unique_ptr<ExactAllreduce>> ExactAllreduce::Create(
    kernels::Backend* backend, Transport* transport, size_t n,
    const ExactAllreduceOptions& options) {
  if (options.segment_elements == 0) {
    return absl::InvalidArgumentError("ExactAllreduce: segment_elements must be >= 1");
  }
  if (options.max_in_flight < 1) {
    return absl::InvalidArgumentError("ExactAllreduce: max_in_flight must be >= 1");
  }
  ONEBIT_RETURN_IF_ERROR(CheckSameMemorySpace(*backend, *transport));
  const size_t w = static_cast<size_t>(transport->world_size());
  const size_t chunk = (n + w - 1) / w;
  std::unique_ptr<ExactAllreduce> a(new ExactAllreduce(backend, transport, n, chunk, options));
  using kernels::Buffer;
  const bool fp32 = options.wire_dtype == kernels::WireDtype::kFp32;
  if (options.order == SumOrder::kRing) {
    if (!fp32) {
      return absl::InvalidArgumentError(
          "ExactAllreduce: the ring order sums on the wire, so it takes the fp32 wire only");
    }
    ONEBIT_ASSIGN_OR_RETURN(a->partial_, Buffer<float>::Create(backend, n));
    const size_t slot = std::min(options.segment_elements, chunk);
    ONEBIT_ASSIGN_OR_RETURN(
        a->slots_, Buffer<float>::Create(backend, 2 * slot * options.max_in_flight));
    ONEBIT_ASSIGN_OR_RETURN(a->gathered_, Buffer<uint8_t>::Create(backend, a->WireBytes(n)));
    a->result_ = reinterpret_cast<const float*>(a->gathered_.data());
    return a;
  }
  const size_t mine = a->ChunkCount(static_cast<size_t>(transport->rank()));
  if (!fp32) {
    ONEBIT_ASSIGN_OR_RETURN(a->wire_in_, Buffer<uint8_t>::Create(backend, a->WireBytes(n)));
  }
  ONEBIT_ASSIGN_OR_RETURN(a->rows_, Buffer<uint8_t>::Create(backend, a->WireBytes(w * mine)));
  ONEBIT_ASSIGN_OR_RETURN(a->summed_, Buffer<float>::Create(backend, mine));
  ONEBIT_ASSIGN_OR_RETURN(a->gathered_, Buffer<uint8_t>::Create(backend, a->WireBytes(n)));
  if (fp32) {
    a->result_ = reinterpret_cast<const float*>(a->gathered_.data());
  } else {
    ONEBIT_ASSIGN_OR_RETURN(a->converted_, Buffer<float>::Create(backend, n));
    a->result_ = a->converted_.data();
  }
  return a;
}

absl::Status ExactAllreduce::SumSegment(size_t k) {
  const size_t w = static_cast<size_t>(transport_->world_size());
  const size_t r = static_cast<size_t>(transport_->rank());
  const size_t off = k * options_.segment_elements;
  const size_t count = SegmentCount(ChunkCount(r), k);
  if (count == 0) return absl::OkStatus();
  // Rank order from 0.0f, whatever order the rows arrived in.
  ONEBIT_RETURN_IF_ERROR(backend_->SumWireRows(options_.wire_dtype,
                                               rows_.data() + WireBytes(w * off),
                                               static_cast<int>(w), count, summed_.data() + off));
  return backend_->ToWire(options_.wire_dtype, summed_.data() + off, count,
                          gathered_.data() + WireBytes(r * chunk_ + off));
}

absl::Status ExactAllreduce::Run(const float* in) {
  const size_t w = static_cast<size_t>(transport_->world_size());
  const size_t r = static_cast<size_t>(transport_->rank());
  if (n_ == 0) return absl::OkStatus();  // on every rank
  if (options_.order == SumOrder::kRing) return RunRing(in);
  const kernels::WireDtype dtype = options_.wire_dtype;
  const uint8_t* wire_in = reinterpret_cast<const uint8_t*>(in);
  if (dtype != kernels::WireDtype::kFp32) {
    ONEBIT_RETURN_IF_ERROR(backend_->ToWire(dtype, in, n_, wire_in_.data()));
    wire_in = wire_in_.data();
  }
  const size_t mine = ChunkCount(r);
  const size_t segments = NumSegments();
  const size_t seg = options_.segment_elements;
  uint8_t* rows = rows_.data();
  uint8_t* gathered = gathered_.data();
  // This rank's own row of each segment is a local copy.
  for (size_t k = 0; k < segments; ++k) {
    const size_t count = SegmentCount(mine, k);
    if (count == 0) continue;
    ONEBIT_RETURN_IF_ERROR(backend_->Copy(rows + WireBytes(w * k * seg + r * count),
                                          wire_in + WireBytes(r * chunk_ + k * seg),
                                          WireBytes(count)));
  }
  // Rows of segment k still on their way; at 0 the segment is summed.
  std::vector<size_t> rows_missing(segments, w - 1);
  std::vector<bool> summed(segments, false);
  CallWindow window(transport_, options_.max_in_flight);
  for (int phase = 0; phase < 2; ++phase) {
    const bool reduce_scatter = phase == 0;
    for (size_t i = 1; i < w; ++i) {
      // The all-gather's steps in reverse: its first peer is the reduce-scatter's last,
      // and its last the next call's first, so the link changes peer 2W-4 times a call
      // rather than 2W-3 (each change costs a ramp-up of the new TCP flow).
      const size_t s = reduce_scatter ? i : w - i;
      const size_t to = (r + s) % w, from = (r + w - s) % w;
      for (size_t k = 0; k < segments; ++k) {
        if (reduce_scatter) {
          // Segment k of chunk `to` goes to its owner; row `from` of segment k comes in,
          // the segment's last one makes it summed.
          const size_t in = SegmentCount(mine, k);
          ONEBIT_RETURN_IF_ERROR(window.Start(
              [] { return true; }, wire_in + WireBytes(to * chunk_ + k * seg),
              WireBytes(SegmentCount(ChunkCount(to), k)), to,
              rows + WireBytes(w * k * seg + from * in), WireBytes(in), from,
              [&, k]() -> absl::Status {
                if (--rows_missing[k] > 0) return absl::OkStatus();
                ONEBIT_RETURN_IF_ERROR(SumSegment(k));
                summed[k] = true;
                return absl::OkStatus();
              }));
        } else {
          // Segment k of this rank's sum goes out; segment k of chunk `from` comes in.
          ONEBIT_RETURN_IF_ERROR(window.Start(
              [&, k] { return static_cast<bool>(summed[k]); },
              gathered + WireBytes(r * chunk_ + k * seg), WireBytes(SegmentCount(mine, k)), to,
              gathered + WireBytes(from * chunk_ + k * seg),
              WireBytes(SegmentCount(ChunkCount(from), k)), from));
        }
      }
    }
  }
  ONEBIT_RETURN_IF_ERROR(window.WaitAll());
  for (size_t k = 0; k < segments; ++k) {  // W == 1: no calls, only sums
    if (!summed[k]) ONEBIT_RETURN_IF_ERROR(SumSegment(k));
  }
  if (dtype != kernels::WireDtype::kFp32) {
    ONEBIT_RETURN_IF_ERROR(backend_->WireToFloat(dtype, gathered, n_, converted_.data()));
  }
  return absl::OkStatus();
}

absl::Status ExactAllreduce::RunRing(const float* in) {
  const size_t w = static_cast<size_t>(transport_->world_size());
  const size_t r = static_cast<size_t>(transport_->rank());
  const size_t segments = NumSegments();
  const size_t seg = options_.segment_elements;
  const size_t slot_elements = std::min(seg, chunk_);
  const size_t to = (r + 1) % w, from = (r + w - 1) % w;
  float* partial = partial_.data();
  float* gathered = reinterpret_cast<float*>(gathered_.data());
  // Element offset of segment k of chunk c, and its length.
  auto at = [&](size_t c, size_t k) { return c * chunk_ + k * seg; };
  auto count = [&](size_t c, size_t k) { return SegmentCount(ChunkCount(c), k); };
  // 0.0f + x: the first term of every sum (turns -0 into +0, as the rank order does).
  auto start_sum = [&](size_t c, size_t k, float* out) -> absl::Status {
    if (count(c, k) == 0) return absl::OkStatus();
    return backend_->SumWireRows(kernels::WireDtype::kFp32, in + at(c, k), 1, count(c, k),
                                 out + at(c, k));
  };
  if (w == 1) {
    for (size_t k = 0; k < segments; ++k) ONEBIT_RETURN_IF_ERROR(start_sum(0, k, gathered));
    return absl::OkStatus();
  }
  // Reduce-scatter step t (0..W-2) sends chunk r-t-1 and receives chunk r-t-2, which it
  // adds to; the last step receives chunk r itself, whose sum is then complete. All-gather
  // step t sends chunk r-t and receives chunk r-t-1.
  auto rs_send = [&](size_t t) { return (r + 2 * w - t - 1) % w; };
  auto rs_recv = [&](size_t t) { return (r + 2 * w - t - 2) % w; };
  auto ag_send = [&](size_t t) { return (r + 2 * w - t) % w; };
  auto ag_recv = [&](size_t t) { return (r + 2 * w - t - 1) % w; };
  // Per segment: reduce-scatter steps added, all-gather steps received.
  std::vector<size_t> added(segments, 0), gathered_steps(segments, 0);
  CallWindow window(transport_, options_.max_in_flight);
  size_t calls = 0;
  for (size_t t = 0; t + 1 < w; ++t) {
    for (size_t k = 0; k < segments; ++k, ++calls) {
      const size_t cs = rs_send(t), cr = rs_recv(t);
      // Step t sends the partial of the step before (step 0: 0.0f + x); the partial that
      // comes in lands in a slot, this rank's values are put beside it, and the two rows
      // are summed: (0.0f + partial) + x, where 0.0f + partial is the partial itself (a
      // sum from +0 is never -0). The last step's sum is the result.
      if (t == 0) ONEBIT_RETURN_IF_ERROR(start_sum(cs, k, partial));
      float* slot = slots_.data() + 2 * slot_elements * (calls % options_.max_in_flight);
      const size_t len = count(cr, k);
      ONEBIT_RETURN_IF_ERROR(window.Start(
          [&, t, k] { return added[k] >= t; }, partial + at(cs, k),
          count(cs, k) * sizeof(float), to, slot, len * sizeof(float), from,
          [&, t, k, cr, len, slot]() -> absl::Status {
            ++added[k];
            if (len == 0) return absl::OkStatus();
            ONEBIT_RETURN_IF_ERROR(
                backend_->Copy(slot + len, in + at(cr, k), len * sizeof(float)));
            float* out = t + 2 == w ? gathered : partial;
            return backend_->SumWireRows(kernels::WireDtype::kFp32, slot, 2, len,
                                         out + at(cr, k));
          }));
    }
  }
  for (size_t t = 0; t + 1 < w; ++t) {
    for (size_t k = 0; k < segments; ++k) {
      // Step 0 sends this rank's whole sum; step t the sum received in step t-1.
      const size_t cs = ag_send(t), cr = ag_recv(t);
      ONEBIT_RETURN_IF_ERROR(window.Start(
          [&, t, k] { return t == 0 ? added[k] == w - 1 : gathered_steps[k] >= t; },
          gathered + at(cs, k), count(cs, k) * sizeof(float), to, gathered + at(cr, k),
          count(cr, k) * sizeof(float), from, [&, k]() -> absl::Status {
            ++gathered_steps[k];
            return absl::OkStatus();
          }));
    }
  }
  return window.WaitAll();
}

}  // namespace onebit
