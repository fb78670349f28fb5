#include "compression/chunk_aggregator.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace onebit {

absl::StatusOr<std::unique_ptr<ChunkAggregator>> ChunkAggregator::Create(
    kernels::Backend* backend, size_t chunk, const Codec& codec) {
  if (chunk % codec.alignment() != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk ", chunk, " is not a multiple of ", codec.alignment()));
  }
  ONEBIT_ASSIGN_OR_RETURN(kernels::Buffer<float> error,
                          kernels::Buffer<float>::Create(backend, chunk));
  return std::unique_ptr<ChunkAggregator>(new ChunkAggregator(backend, codec, std::move(error)));
}

absl::Status ChunkAggregator::Aggregate(const uint8_t* blocks, int num_workers, uint8_t* out) {
  if (num_workers < 1) {
    return absl::InvalidArgumentError(absl::StrCat("bad worker count ", num_workers));
  }
  return codec_->Aggregate(*backend_, blocks, num_workers, chunk(), error_.data(), out);
}

absl::StatusOr<double> ChunkAggregator::ErrorNorm() const {
  return kernels::L2Norm(backend_, error_);
}

}  // namespace onebit
