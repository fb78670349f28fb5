// The CUDA implementation of kernels::Backend (kernels.h is the contract).
#ifndef ONEBIT_KERNELS_CUDA_BACKEND_H_
#define ONEBIT_KERNELS_CUDA_BACKEND_H_

#include <memory>

#include "absl/status/statusor.h"
#include "kernels/kernels.h"

namespace onebit::kernels {

// Number of CUDA devices usable here; 0 when there is no GPU or no driver.
int CudaDeviceCount();

// A backend on `device` with its own stream. kUnavailable when no such GPU exists.
// Zero, Copy and the kernels are queued on the stream; CopyFromHost and CopyToHost return
// once the copy is done, so the host buffer may be reused at once.
absl::StatusOr<std::unique_ptr<Backend>> NewCudaBackend(int device = 0);

// The cudaStream_t of a backend made by NewCudaBackend (void* keeps CUDA headers out of
// this header), for work that must be ordered with the backend's kernels: NCCL calls,
// cudaEvents. Null for any other backend.
void* CudaStreamOf(Backend* backend);

}  // namespace onebit::kernels

#endif  // ONEBIT_KERNELS_CUDA_BACKEND_H_
