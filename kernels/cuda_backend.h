// The CUDA implementation of kernels::Backend (kernels.h is the contract).
//
// A build without CUDA (kernels/cuda.bzl: no /usr/local/cuda/bin/nvcc where it was built,
// or --repo_env=ONEBIT_CUDA=off) links these functions from cuda_backend_stub.cc:
// CudaBuilt() is false, CudaDeviceCount() is 0, and NewCudaBackend fails with
// kFailedPrecondition, marked permanent (common/permanent_error.h: no restart gives this
// build a GPU), with a message that says so.
#ifndef ONEBIT_KERNELS_CUDA_BACKEND_H_
#define ONEBIT_KERNELS_CUDA_BACKEND_H_

#include <memory>

#include "absl/status/statusor.h"
#include "kernels/kernels.h"

namespace onebit::kernels {

// Whether this build has the CUDA backend (above).
bool CudaBuilt();

// Number of CUDA devices usable here; 0 when there is no GPU or no driver, or in a build
// without CUDA.
int CudaDeviceCount();

// A backend on `device` with its own stream. kUnavailable when no such GPU exists;
// kFailedPrecondition (permanent) in a build without CUDA.
// Zero, Copy and the kernels are queued on the stream; CopyFromHost and CopyToHost return
// once the copy is done, so the host buffer may be reused at once.
absl::StatusOr<std::unique_ptr<Backend>> NewCudaBackend(int device = 0);

// The cudaStream_t of a backend made by NewCudaBackend (void* keeps CUDA headers out of
// this header), for work that must be ordered with the backend's kernels: NCCL calls,
// cudaEvents. Null for any other backend.
void* CudaStreamOf(Backend* backend);

// How ServerAggregate's first pass reads the W workers' bits. Every choice gives the same
// bits and error, element by element, and the same sum of squares order for a given length
// (a function of the length alone, as every reduction here). They differ in how the memory
// is asked for; the benchmark (cuda_kernels_benchmark) runs each against the copy, so that
// the faster one becomes the default on the cards that count (the thread-byte
// reading ran at 0.84 of the copy on an H100 and 0.75 on an H200, and Nsight Compute put
// 85% of its stalls on the workers' bit bytes).
enum class ServerBitLoads {
  // A thread takes 8 elements: two 16-byte groups of err and a byte of each worker's bits
  // (one load instruction per worker and span). The default.
  kThreadBytes,
  // A warp takes rows of 128 elements (a lane a group of 4, so the warp's err accesses are
  // 512 contiguous bytes) and reads the bits as 4-byte words, a lane loading the words of
  // several workers for the whole warp and each lane taking its nibble by a shuffle: one
  // load instruction per lane for every 8 workers and 2 rows (kWarpWords2) or 4 rows
  // (kWarpWords4) a step. Only where the words are aligned (chunk a multiple of 32, the
  // blocks 4-byte aligned); elsewhere kThreadBytes runs.
  kWarpWords2,
  kWarpWords4,
};

// Sets how `backend` (one made by NewCudaBackend) reads the bits from its next
// ServerAggregate on; INVALID_ARGUMENT for any other backend.
absl::Status SetServerBitLoads(Backend* backend, ServerBitLoads loads);

}  // namespace onebit::kernels

#endif  // ONEBIT_KERNELS_CUDA_BACKEND_H_
