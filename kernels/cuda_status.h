// CUDA runtime errors as absl::Status, with the call, file and line (the project's style: every CUDA
// call goes through a check that returns an error). Shared by the .cu files (nvcc) and the
// C++ files that call the runtime.
#ifndef ONEBIT_KERNELS_CUDA_STATUS_H_
#define ONEBIT_KERNELS_CUDA_STATUS_H_

#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace onebit::kernels {

// kUnavailable: no usable GPU or driver; kResourceExhausted: out of memory;
// kInvalidArgument: a bad pointer or value; kInternal otherwise.
inline absl::StatusCode CudaErrorCode(cudaError_t error) {
  switch (error) {
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorDevicesUnavailable:
    case cudaErrorInitializationError:
      return absl::StatusCode::kUnavailable;
    case cudaErrorMemoryAllocation:
      return absl::StatusCode::kResourceExhausted;
    case cudaErrorInvalidValue:
    case cudaErrorInvalidDevicePointer:
    case cudaErrorInvalidMemcpyDirection:
      return absl::StatusCode::kInvalidArgument;
    default:
      return absl::StatusCode::kInternal;
  }
}

inline absl::Status CudaErrorStatus(cudaError_t error, const char* expr, const char* file,
                                    int line) {
  return absl::Status(CudaErrorCode(error),
                      absl::StrCat(file, ":", line, ": ", expr, ": ", cudaGetErrorName(error),
                                   ": ", cudaGetErrorString(error)));
}

}  // namespace onebit::kernels

#define ONEBIT_CUDA_RETURN_IF_ERROR(expr)                                                   \
  do {                                                                                      \
    const cudaError_t onebit_cuda_error_ = (expr);                                          \
    if (onebit_cuda_error_ != cudaSuccess) {                                                \
      return ::onebit::kernels::CudaErrorStatus(onebit_cuda_error_, #expr, __FILE__, __LINE__); \
    }                                                                                       \
  } while (0)

// Launch errors (bad configurations) show up only here.
#define ONEBIT_CUDA_RETURN_IF_LAUNCH_ERROR() ONEBIT_CUDA_RETURN_IF_ERROR(cudaGetLastError())

#endif  // ONEBIT_KERNELS_CUDA_STATUS_H_
