// The fp8 kernels on a CUDA stream (fp8_e4m3.h is the contract): the same bits as the host
// loops (fp8_cpu.h), element for element, because both evaluate fp8_e4m3.h's functions.
// `stream` is a cudaStream_t (void* keeps CUDA headers out of this header); each function
// makes the stream's device current, queues its kernels on the stream and returns without
// waiting. The pointers are device memory; the arguments are the codec's, already checked.
//
// In a build without CUDA (kernels/cuda.bzl) they come from fp8_cuda_stub.cc and fail with
// FAILED_PRECONDITION; such a build has no CUDA backend to call them with anyway.
#ifndef ONEBIT_COMPRESSION_FP8_FP8_CUDA_H_
#define ONEBIT_COMPRESSION_FP8_FP8_CUDA_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"

namespace onebit::fp8::cuda {

absl::Status CompressWorker(void* stream, const float* m, const float* g, float beta1, size_t n,
                            size_t num_chunks, size_t chunk, float* err, uint8_t* out);

absl::Status ServerAggregate(void* stream, const uint8_t* blocks, int num_workers, size_t chunk,
                             float* err, uint8_t* out);

absl::Status Decode(void* stream, const uint8_t* blocks, size_t num_chunks, size_t chunk,
                    size_t n, float* out);

}  // namespace onebit::fp8::cuda

#endif  // ONEBIT_COMPRESSION_FP8_FP8_CUDA_H_
