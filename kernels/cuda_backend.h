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
absl::StatusOr<std::unique_ptr<Backend>> NewCudaBackend(int device = 0);

}  // namespace onebit::kernels

#endif  // ONEBIT_KERNELS_CUDA_BACKEND_H_
