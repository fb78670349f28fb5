// The fp8 kernels on a CUDA stream (fp8_cuda.h). A warp takes a sub-block of 32 elements,
// a lane an element: the lanes' x, the sub-block's largest |x| as the maximum of the bit
// patterns (__reduce_max_sync: exact and in no particular order), the scale byte from lane
// 0, and each lane's code and error. The element formulas are fp8_e4m3.h's, shared with the
// host loops; the additions and products here use the round-to-nearest intrinsics and
// fmaf() only where the format says fma, and the build passes -fmad=false (and never
// --use_fast_math, which would flush the subnormals the format needs).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "common/status_macros.h"
#include "compression/fp8/fp8_cuda.h"
#include "compression/fp8/fp8_e4m3.h"
#include "kernels/cuda_status.h"

namespace onebit::fp8::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarpsPerBlock = kThreads / 32;
constexpr unsigned kFullMask = 0xffffffffu;
constexpr size_t kMaxBlocks = size_t{1} << 16;  // the kernels loop past it

size_t BlocksFor(size_t items, size_t per_block) {
  return std::max<size_t>(1, std::min(kMaxBlocks, (items + per_block - 1) / per_block));
}

__device__ __forceinline__ size_t FirstWarp() {
  return static_cast<size_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
}
__device__ __forceinline__ size_t WarpStride() {
  return static_cast<size_t>(gridDim.x) * kWarpsPerBlock;
}

// One sub-block, a lane per element (lanes past the chunk's end have valid false and take
// part in the maximum as 0): the scale byte (lane 0) and each valid lane's code and error.
// Every lane of the warp calls it.
__device__ __forceinline__ void EncodeLane(float x, bool valid, uint8_t* scale, uint8_t* code,
                                           float* err) {
  const uint32_t amax = __reduce_max_sync(kFullMask, valid ? AbsBits(x) : 0u);
  const uint8_t s = ScaleByte(amax);
  if ((threadIdx.x & 31) == 0) *scale = s;
  if (valid) {
    const uint8_t q = s == kNanScale ? 0 : Encode(x, ScaleExponent(s));
    *code = q;
    *err = __fsub_rn(x, fp8::Decode(q, s));
  }
}

// Worker: x = m' + err (err alone in the padding) for each of the num_chunks * scales
// sub-blocks, a warp each.
__global__ void CompressWorkerKernel(const float* __restrict__ m, const float* __restrict__ g,
                                     float beta1, float one_minus_beta1, size_t n,
                                     size_t num_chunks, size_t chunk, size_t scales,
                                     size_t stride, float* __restrict__ err,
                                     uint8_t* __restrict__ out) {
  const unsigned lane = threadIdx.x & 31;
  const size_t sub_blocks = num_chunks * scales;
  for (size_t t = FirstWarp(); t < sub_blocks; t += WarpStride()) {
    const size_t r = t / scales, k = t - r * scales;
    const size_t j = k * kSubBlock + lane;
    const bool valid = j < chunk;
    const size_t i = r * chunk + j;
    float x = 0.0f;
    if (valid) {
      x = err[i];
      if (i < n) {
        const float mi = g != nullptr ? fmaf(beta1, m[i], __fmul_rn(one_minus_beta1, g[i])) : m[i];
        x = __fadd_rn(mi, x);
      }
    }
    uint8_t* block = out + r * stride;
    EncodeLane(x, valid, block + k, block + scales + j, err + i);
  }
}

// Server: y = fma(sum over workers in rank order of their decoded values, 1/W, err), then
// encoded as the worker's x.
__global__ void ServerAggregateKernel(const uint8_t* __restrict__ blocks, int num_workers,
                                      size_t chunk, size_t scales, size_t stride, float inv_w,
                                      float* __restrict__ err, uint8_t* __restrict__ out) {
  const unsigned lane = threadIdx.x & 31;
  for (size_t k = FirstWarp(); k < scales; k += WarpStride()) {
    const size_t j = k * kSubBlock + lane;
    const bool valid = j < chunk;
    float y = 0.0f;
    if (valid) {
      float acc = 0.0f;
      for (int w = 0; w < num_workers; ++w) {
        const uint8_t* block = blocks + static_cast<size_t>(w) * stride;
        acc = __fadd_rn(acc, fp8::Decode(block[scales + j], block[k]));
      }
      y = fmaf(acc, inv_w, err[j]);
    }
    EncodeLane(y, valid, out + k, out + scales + j, err + j);
  }
}

// out[i] for i < n: element i % chunk of block i / chunk.
__global__ void DecodeKernel(const uint8_t* __restrict__ blocks, size_t chunk, size_t scales,
                             size_t stride, size_t n, float* __restrict__ out) {
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const size_t r = i / chunk, j = i - r * chunk;
    const uint8_t* block = blocks + r * stride;
    out[i] = fp8::Decode(block[scales + j], block[j / kSubBlock]);
  }
}

absl::Status MakeCurrent(cudaStream_t stream) {
  int device = 0;
  ONEBIT_CUDA_RETURN_IF_ERROR(cudaStreamGetDevice(stream, &device));
  ONEBIT_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  return absl::OkStatus();
}

}  // namespace

absl::Status CompressWorker(void* stream_ptr, const float* m, const float* g, float beta1,
                            size_t n, size_t num_chunks, size_t chunk, float* err,
                            uint8_t* out) {
  const size_t scales = ScaleBytes(chunk);
  if (num_chunks * scales == 0) return absl::OkStatus();
  const auto stream = static_cast<cudaStream_t>(stream_ptr);
  ONEBIT_RETURN_IF_ERROR(MakeCurrent(stream));
  CompressWorkerKernel<<<BlocksFor(num_chunks * scales, kWarpsPerBlock), kThreads, 0, stream>>>(
      m, g, beta1, 1.0f - beta1, n, num_chunks, chunk, scales, BlockBytes(chunk), err, out);
  ONEBIT_CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

absl::Status ServerAggregate(void* stream_ptr, const uint8_t* blocks, int num_workers,
                             size_t chunk, float* err, uint8_t* out) {
  const size_t scales = ScaleBytes(chunk);
  if (scales == 0) return absl::OkStatus();
  const auto stream = static_cast<cudaStream_t>(stream_ptr);
  ONEBIT_RETURN_IF_ERROR(MakeCurrent(stream));
  ServerAggregateKernel<<<BlocksFor(scales, kWarpsPerBlock), kThreads, 0, stream>>>(
      blocks, num_workers, chunk, scales, BlockBytes(chunk),
      1.0f / static_cast<float>(num_workers), err, out);
  ONEBIT_CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

absl::Status Decode(void* stream_ptr, const uint8_t* blocks, size_t num_chunks, size_t chunk,
                    size_t n, float* out) {
  if (n == 0) return absl::OkStatus();
  const auto stream = static_cast<cudaStream_t>(stream_ptr);
  ONEBIT_RETURN_IF_ERROR(MakeCurrent(stream));
  DecodeKernel<<<BlocksFor(n, kThreads), kThreads, 0, stream>>>(
      blocks, chunk, ScaleBytes(chunk), BlockBytes(chunk), n, out);
  ONEBIT_CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

}  // namespace onebit::fp8::cuda
