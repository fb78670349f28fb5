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

}  // namespace onebit
