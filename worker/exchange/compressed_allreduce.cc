#include "worker/exchange/compressed_allreduce.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace onebit {

absl::StatusOr<std::unique_ptr<CompressedAllreduce>> CompressedAllreduce::Create(
    kernels::Backend* backend, Transport* transport, size_t n, const Codec& codec) {
  ONEBIT_RETURN_IF_ERROR(CheckSameMemorySpace(*backend, *transport));
  std::unique_ptr<CompressedAllreduce> c(
      new CompressedAllreduce(backend, transport, n, codec));
  ONEBIT_RETURN_IF_ERROR(c->Init());
  return c;
}

CompressedAllreduce::CompressedAllreduce(kernels::Backend* backend, Transport* transport,
                                         size_t n, const Codec& codec)
    : backend_(backend),
      transport_(transport),
      world_size_(transport->world_size()),
      codec_(&codec),
      n_(n),
      n_pad_(PeerPaddedSize(n, transport->world_size())),
      chunk_(n_pad_ / static_cast<size_t>(world_size_)),
      block_bytes_(codec.BlockBytes(chunk_)) {}

absl::Status CompressedAllreduce::Init() {
  const size_t w = static_cast<size_t>(world_size_);
  ONEBIT_ASSIGN_OR_RETURN(worker_,
                          WorkerCompressor::Create(backend_, n_, w, chunk_, *codec_));
  ONEBIT_ASSIGN_OR_RETURN(server_, ChunkAggregator::Create(backend_, chunk_, *codec_));
  ONEBIT_ASSIGN_OR_RETURN(send_, kernels::Buffer<uint8_t>::Create(backend_, w * block_bytes_));
  ONEBIT_ASSIGN_OR_RETURN(received_,
                          kernels::Buffer<uint8_t>::Create(backend_, w * block_bytes_));
  ONEBIT_ASSIGN_OR_RETURN(server_out_, kernels::Buffer<uint8_t>::Create(backend_, block_bytes_));
  ONEBIT_ASSIGN_OR_RETURN(gathered_, kernels::Buffer<uint8_t>::Create(backend_, w * block_bytes_));
  return absl::OkStatus();
}

absl::Status CompressedAllreduce::Exchange() {
  // Worker -> server: block r of every worker reaches rank r.
  ONEBIT_RETURN_IF_ERROR(transport_->AllToAll(send_.data(), received_.data(), block_bytes_));
  {
    ScopedStepTime time(clock_, &compress_seconds_);
    ONEBIT_RETURN_IF_ERROR(server_->Aggregate(received_.data(), world_size_, server_out_.data()));
    ONEBIT_RETURN_IF_ERROR(FinishTimedDeviceWork(clock_, backend_));
  }
  // Server -> everyone.
  return transport_->AllGather(server_out_.data(), gathered_.data(), block_bytes_);
}

absl::Status CompressedAllreduce::Run(const float* in, float* out) {
  {
    ScopedStepTime time(clock_, &compress_seconds_);
    ONEBIT_RETURN_IF_ERROR(worker_->Compress(in, nullptr, 0.0f, send_.data()));
    ONEBIT_RETURN_IF_ERROR(FinishTimedDeviceWork(clock_, backend_));
  }
  ONEBIT_RETURN_IF_ERROR(Exchange());
  return DecodeResult(out);
}

absl::Status CompressedAllreduce::DecodeResult(float* out) {
  ScopedStepTime time(clock_, &compress_seconds_);
  ONEBIT_RETURN_IF_ERROR(
      codec_->Decode(*backend_, gathered_.data(), num_chunks(), chunk_, n_, out));
  return FinishTimedDeviceWork(clock_, backend_);
}

absl::Status CompressedAllreduce::RunMomentum(const float* m, const float* g, float beta1) {
  {
    ScopedStepTime time(clock_, &compress_seconds_);
    ONEBIT_RETURN_IF_ERROR(worker_->Compress(m, g, beta1, send_.data()));
    ONEBIT_RETURN_IF_ERROR(FinishTimedDeviceWork(clock_, backend_));
  }
  return Exchange();
}

}  // namespace onebit
