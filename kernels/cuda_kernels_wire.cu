// The CUDA kernels of the full-precision exchange (kernels.h: SumRows, AverageRows, ToWire,
// SumWireRows, WireToFloat) and their launches (cuda_kernels.h).
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "absl/status/status.h"
#include "kernels/cuda_kernels.h"
#include "kernels/cuda_kernels_common.cuh"
#include "kernels/cuda_status.h"
#include "kernels/kernels.h"
#include "kernels/wire_dtype.h"

namespace onebit::kernels::cuda {
namespace {

// out[i] = sum over rows in row order, from 0.0f like the CPU backend, times inv when
// kAverage (the CPU backend's two roundings: the sum, the product). Each thread reads its
// elements of every row before writing, so out may be one of the rows.
template <bool kAverage, bool kVec>
__global__ void SumRowsKernel(const float* rows, int num_rows, size_t count, float inv,
                              float* out) {
  for (size_t i = FirstElement(); i < count; i += ElementStride()) {
    Group acc = {};
    for (int r = 0; r < num_rows; ++r) {
      const Group x = Load4<kVec>(rows + static_cast<size_t>(r) * count, i, count);
#pragma unroll
      for (size_t e = 0; e < kGroup; ++e) acc.v[e] = __fadd_rn(acc.v[e], x.v[e]);
    }
    if (kAverage) {
#pragma unroll
      for (size_t e = 0; e < kGroup; ++e) acc.v[e] = __fmul_rn(acc.v[e], inv);
    }
    Store4<kVec>(out, i, count, acc);
  }
}

// The full-precision exchange's wire formats. The conversions are wire_dtype.h's, the very
// code the CPU backend runs.
template <WireDtype kDtype>
__device__ inline float LoadWire(const void* p, size_t i) {
  if constexpr (kDtype == WireDtype::kFp32) {
    return static_cast<const float*>(p)[i];
  } else if constexpr (kDtype == WireDtype::kBf16) {
    return Bf16ToFloat(static_cast<const uint16_t*>(p)[i]);
  } else {
    return Fp16ToFloat(static_cast<const uint16_t*>(p)[i]);
  }
}

template <WireDtype kDtype>
__device__ inline void StoreWire(void* p, size_t i, float v) {
  if constexpr (kDtype == WireDtype::kFp32) {
    static_cast<float*>(p)[i] = v;
  } else if constexpr (kDtype == WireDtype::kBf16) {
    static_cast<uint16_t*>(p)[i] = FloatToBf16(v);
  } else {
    static_cast<uint16_t*>(p)[i] = FloatToFp16(v);
  }
}

template <WireDtype kDtype>
__global__ void ToWireKernel(const float* x, size_t n, void* out) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    StoreWire<kDtype>(out, i, x[i]);
  }
}

// SumRowsKernel over rows in a wire format: the same float32 adds in the same order.
template <WireDtype kDtype>
__global__ void SumWireRowsKernel(const void* rows, int num_rows, size_t count, float* out) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += stride) {
    float acc = 0.0f;
    for (int j = 0; j < num_rows; ++j) {
      acc = __fadd_rn(acc, LoadWire<kDtype>(rows, static_cast<size_t>(j) * count + i));
    }
    out[i] = acc;
  }
}

template <WireDtype kDtype>
__global__ void WireToFloatKernel(const void* in, size_t n, float* out) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    out[i] = LoadWire<kDtype>(in, i);
  }
}

// The same for rows of `count` floats laid end to end, and their output.
bool RowsVec(const float* rows, size_t count, const float* out) {
  return count % kGroup == 0 && Vec(rows, out);
}

// The fp32 wire is the floats themselves: a copy on the stream unless in place.
absl::Status CopyFloats(Launch launch, const void* from, size_t n, void* to) {
  if (from != to) {
    ONEBIT_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(to, from, n * sizeof(float),
                                                cudaMemcpyDeviceToDevice, launch.stream));
  }
  return absl::OkStatus();
}

// The one switch over the wire dtypes, with a functor for each kind: fp32, the floats
// themselves, returns fp32() (a Status); a 16-bit dtype D calls
// launch16(std::integral_constant<WireDtype, D>()), which queues D's kernel, and checks the
// launch. INVALID_ARGUMENT for a value that is no WireDtype.
template <typename Fp32, typename Launch16>
absl::Status ForWireDtype(WireDtype dtype, Fp32 fp32, Launch16 launch16) {
  switch (dtype) {
    case WireDtype::kFp32:
      return fp32();
    case WireDtype::kBf16:
      launch16(std::integral_constant<WireDtype, WireDtype::kBf16>());
      break;
    case WireDtype::kFp16:
      launch16(std::integral_constant<WireDtype, WireDtype::kFp16>());
      break;
    default:
      return absl::InvalidArgumentError("unknown wire dtype");
  }
  ONEBIT_CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

}  // namespace

absl::Status SumRows(Launch launch, const float* rows, int num_rows, size_t count, float* out) {
  const auto kernel = RowsVec(rows, count, out) ? SumRowsKernel<false, true>
                                                : SumRowsKernel<false, false>;
  kernel<<<GroupBlocks(launch, count), kThreads, 0, launch.stream>>>(rows, num_rows, count, 1.0f,
                                                                     out);
  ONEBIT_CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

absl::Status AverageRows(Launch launch, const float* rows, int num_rows, size_t count,
                         float* out) {
  const auto kernel = RowsVec(rows, count, out) ? SumRowsKernel<true, true>
                                                : SumRowsKernel<true, false>;
  kernel<<<GroupBlocks(launch, count), kThreads, 0, launch.stream>>>(
      rows, num_rows, count, 1.0f / static_cast<float>(num_rows), out);
  ONEBIT_CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

absl::Status ToWire(Launch launch, WireDtype dtype, const float* x, size_t n, void* out) {
  return ForWireDtype(
      dtype, [&] { return CopyFloats(launch, x, n, out); },
      [&](auto d) {
        ToWireKernel<decltype(d)::value><<<Blocks(launch, n), kThreads, 0, launch.stream>>>(
            x, n, out);
      });
}

absl::Status SumWireRows(Launch launch, WireDtype dtype, const void* rows, int num_rows,
                         size_t count, float* out) {
  return ForWireDtype(
      dtype,
      [&] { return SumRows(launch, static_cast<const float*>(rows), num_rows, count, out); },
      [&](auto d) {
        SumWireRowsKernel<decltype(d)::value>
            <<<Blocks(launch, count), kThreads, 0, launch.stream>>>(rows, num_rows, count, out);
      });
}

absl::Status WireToFloat(Launch launch, WireDtype dtype, const void* in, size_t n, float* out) {
  return ForWireDtype(
      dtype, [&] { return CopyFloats(launch, in, n, out); },
      [&](auto d) {
        WireToFloatKernel<decltype(d)::value><<<Blocks(launch, n), kThreads, 0, launch.stream>>>(
            in, n, out);
      });
}

}  // namespace onebit::kernels::cuda
