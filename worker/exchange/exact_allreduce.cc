#include "worker/exchange/exact_allreduce.h"

#include <algorithm>
#include <deque>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace onebit {

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
  if (backend->memory_space() != transport->memory_space()) {
    return absl::InvalidArgumentError(
        absl::StrCat("ExactAllreduce: backend ", backend->name(), " and transport ",
                     transport->name(), " use different memory"));
  }
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
  // The calls in flight, oldest first, with the segment whose row each reduce-scatter
  // call brings (none for the all-gather's).
  struct InFlight {
    std::unique_ptr<Transport::PendingSendRecv> pending;
    bool reduce_scatter;
    size_t segment;
  };
  std::deque<InFlight> in_flight;
  // Waits for the oldest call; sums its segment once the segment's last row is in.
  auto wait_oldest = [&]() -> absl::Status {
    InFlight call = std::move(in_flight.front());
    in_flight.pop_front();
    ONEBIT_RETURN_IF_ERROR(call.pending->Wait());
    if (call.reduce_scatter && --rows_missing[call.segment] == 0) {
      ONEBIT_RETURN_IF_ERROR(SumSegment(call.segment));
      summed[call.segment] = true;
    }
    return absl::OkStatus();
  };
  auto run_schedule = [&]() -> absl::Status {
    for (int phase = 0; phase < 2; ++phase) {
      const bool reduce_scatter = phase == 0;
      for (size_t i = 1; i < w; ++i) {
        // The all-gather's steps in reverse: its first peer is the reduce-scatter's last,
        // and its last the next call's first, so the link changes peer 2W-4 times a call
        // rather than 2W-3 (each change costs a ramp-up of the new TCP flow).
        const size_t s = reduce_scatter ? i : w - i;
        const size_t to = (r + s) % w, from = (r + w - s) % w;
        for (size_t k = 0; k < segments; ++k) {
          while (static_cast<int>(in_flight.size()) >= options_.max_in_flight ||
                 (!reduce_scatter && !summed[k])) {
            ONEBIT_RETURN_IF_ERROR(wait_oldest());
          }
          const uint8_t* send;
          uint8_t* recv;
          size_t out, in;
          if (reduce_scatter) {
            // Segment k of chunk `to` goes to its owner; row `from` of segment k comes in.
            out = SegmentCount(ChunkCount(to), k);
            in = SegmentCount(mine, k);
            send = wire_in + WireBytes(to * chunk_ + k * seg);
            recv = rows + WireBytes(w * k * seg + from * in);
          } else {
            // Segment k of this rank's sum goes out; segment k of chunk `from` comes in.
            out = SegmentCount(mine, k);
            in = SegmentCount(ChunkCount(from), k);
            send = gathered + WireBytes(r * chunk_ + k * seg);
            recv = gathered + WireBytes(from * chunk_ + k * seg);
          }
          ONEBIT_ASSIGN_OR_RETURN(
              std::unique_ptr<Transport::PendingSendRecv> pending,
              transport_->StartSendRecv(send, WireBytes(out), static_cast<int>(to), recv,
                                        WireBytes(in), static_cast<int>(from)));
          in_flight.push_back({std::move(pending), reduce_scatter, k});
        }
      }
    }
    while (!in_flight.empty()) ONEBIT_RETURN_IF_ERROR(wait_oldest());
    return absl::OkStatus();
  };
  const absl::Status status = run_schedule();
  // After a failure the calls still in flight are waited for (the transport is broken, so
  // they return at once) before their buffers can be touched again.
  for (InFlight& call : in_flight) call.pending->Wait().IgnoreError();
  ONEBIT_RETURN_IF_ERROR(status);
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
  const size_t slot = std::min(seg, chunk_);
  const int to = static_cast<int>((r + 1) % w), from = static_cast<int>((r + w - 1) % w);
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
  struct InFlight {
    std::unique_ptr<Transport::PendingSendRecv> pending;
    bool reduce_scatter;
    size_t step, segment;
    float* slot;  // reduce-scatter: the received partial, then this rank's values
  };
  std::deque<InFlight> in_flight;
  auto wait_oldest = [&]() -> absl::Status {
    InFlight call = std::move(in_flight.front());
    in_flight.pop_front();
    ONEBIT_RETURN_IF_ERROR(call.pending->Wait());
    const size_t k = call.segment;
    if (!call.reduce_scatter) {
      ++gathered_steps[k];
      return absl::OkStatus();
    }
    const size_t c = rs_recv(call.step), len = count(c, k);
    if (len > 0) {
      // (partial) + x_r: the received partial is never -0 (a sum from +0 cannot be), so
      // SumWireRows' 0.0f + partial is the partial itself.
      ONEBIT_RETURN_IF_ERROR(
          backend_->Copy(call.slot + len, in + at(c, k), len * sizeof(float)));
      float* out = call.step + 2 == w ? gathered : partial;
      ONEBIT_RETURN_IF_ERROR(backend_->SumWireRows(kernels::WireDtype::kFp32, call.slot, 2,
                                                   len, out + at(c, k)));
    }
    ++added[k];
    return absl::OkStatus();
  };
  auto run_schedule = [&]() -> absl::Status {
    size_t calls = 0;
    for (int phase = 0; phase < 2; ++phase) {
      const bool reduce_scatter = phase == 0;
      for (size_t t = 0; t + 1 < w; ++t) {
        for (size_t k = 0; k < segments; ++k, ++calls) {
          // What this call sends must be complete: the partial of the step before, the
          // whole sum, or the sum received in the all-gather step before.
          const size_t need = reduce_scatter ? t : (t == 0 ? w - 1 : t);
          while (static_cast<int>(in_flight.size()) >= options_.max_in_flight ||
                 (reduce_scatter ? added[k] : (t == 0 ? added[k] : gathered_steps[k])) <
                     need) {
            ONEBIT_RETURN_IF_ERROR(wait_oldest());
          }
          InFlight call{nullptr, reduce_scatter, t, k, nullptr};
          const float* send;
          float* recv;
          size_t out, in_count;
          if (reduce_scatter) {
            const size_t cs = rs_send(t), cr = rs_recv(t);
            if (t == 0) ONEBIT_RETURN_IF_ERROR(start_sum(cs, k, partial));
            out = count(cs, k);
            in_count = count(cr, k);
            send = partial + at(cs, k);
            call.slot = slots_.data() + 2 * slot * (calls % options_.max_in_flight);
            recv = call.slot;
          } else {
            const size_t cs = ag_send(t), cr = ag_recv(t);
            out = count(cs, k);
            in_count = count(cr, k);
            send = gathered + at(cs, k);
            recv = gathered + at(cr, k);
          }
          ONEBIT_ASSIGN_OR_RETURN(call.pending,
                                  transport_->StartSendRecv(send, out * sizeof(float), to, recv,
                                                            in_count * sizeof(float), from));
          in_flight.push_back(std::move(call));
        }
      }
    }
    while (!in_flight.empty()) ONEBIT_RETURN_IF_ERROR(wait_oldest());
    return absl::OkStatus();
  };
  const absl::Status status = run_schedule();
  for (InFlight& call : in_flight) call.pending->Wait().IgnoreError();
  return status;
}

}  // namespace onebit
