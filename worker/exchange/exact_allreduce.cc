#include "worker/exchange/exact_allreduce.h"

#include <algorithm>

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

absl::Status ExactAllreduce::Shift(const uint8_t* send, size_t send_count, int to,
                                   uint8_t* recv, size_t recv_count, int from) {
  const size_t seg = options_.segment_elements;
  // Segments of the longest chunk: the same count on every rank.
  for (size_t off = 0; off < chunk_; off += seg) {
    const size_t out = off >= send_count ? 0 : std::min(seg, send_count - off);
    const size_t in = off >= recv_count ? 0 : std::min(seg, recv_count - off);
    ONEBIT_RETURN_IF_ERROR(transport_->SendRecv(send + WireBytes(off), WireBytes(out), to,
                                                recv + WireBytes(off), WireBytes(in), from));
  }
  return absl::OkStatus();
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
  uint8_t* rows = rows_.data();
  // Row j of rows_ is rank j's chunk r; this rank's own row is a local copy.
  ONEBIT_RETURN_IF_ERROR(backend_->Copy(rows + WireBytes(r * mine),
                                        wire_in + WireBytes(r * chunk_), WireBytes(mine)));
  // Reduce-scatter: step s sends chunk r+s to its owner and receives chunk r from r-s.
  for (size_t s = 1; s < w; ++s) {
    const size_t to = (r + s) % w, from = (r + w - s) % w;
    ONEBIT_RETURN_IF_ERROR(Shift(wire_in + WireBytes(to * chunk_), ChunkCount(to),
                                 static_cast<int>(to), rows + WireBytes(from * mine), mine,
                                 static_cast<int>(from)));
  }
  // Rank order from 0.0f, whatever order the rows arrived in.
  ONEBIT_RETURN_IF_ERROR(
      backend_->SumWireRows(dtype, rows, static_cast<int>(w), mine, summed_.data()));
  uint8_t* gathered = gathered_.data();
  ONEBIT_RETURN_IF_ERROR(
      backend_->ToWire(dtype, summed_.data(), mine, gathered + WireBytes(r * chunk_)));
  // All-gather: step s sends this rank's chunk to r+s and receives chunk r-s from r-s.
  for (size_t s = 1; s < w; ++s) {
    const size_t to = (r + s) % w, from = (r + w - s) % w;
    ONEBIT_RETURN_IF_ERROR(Shift(gathered + WireBytes(r * chunk_), mine, static_cast<int>(to),
                                 gathered + WireBytes(from * chunk_), ChunkCount(from),
                                 static_cast<int>(from)));
  }
  if (dtype != kernels::WireDtype::kFp32) {
    ONEBIT_RETURN_IF_ERROR(backend_->WireToFloat(dtype, gathered, n_, converted_.data()));
  }
  return absl::OkStatus();
}

}  // namespace onebit
