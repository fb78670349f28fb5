#include "compression/worker_compressor.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace onebit {

absl::StatusOr<std::unique_ptr<WorkerCompressor>> WorkerCompressor::Create(
    kernels::Backend* backend, size_t n, size_t num_chunks, size_t chunk,
    const Codec& codec) {
  if (chunk % codec.alignment() != 0 || num_chunks == 0 || n > num_chunks * chunk) {
    return absl::InvalidArgumentError(absl::StrCat("bad layout: ", n, " elements in ",
                                                   num_chunks, " chunks of ", chunk));
  }
  ONEBIT_ASSIGN_OR_RETURN(kernels::Buffer<float> error,
                          kernels::Buffer<float>::Create(backend, num_chunks * chunk));
  return std::unique_ptr<WorkerCompressor>(
      new WorkerCompressor(backend, n, num_chunks, chunk, codec, std::move(error)));
}

absl::Status WorkerCompressor::Compress(const float* m, const float* g, float beta1,
                                        uint8_t* out) {
  return codec_->Compress(*backend_, m, g, beta1, n_, num_chunks_, chunk_, error_.data(), out);
}

absl::StatusOr<double> WorkerCompressor::ErrorNorm() const {
  return kernels::L2Norm(backend_, error_);
}

}  // namespace onebit
