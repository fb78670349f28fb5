// The CUDA kernels of the int8 format (kernels.h, INT8 WIRE FORMAT: CompressWorkerInt8,
// ServerAggregateInt8, DecompressInt8) and their launches (cuda_kernels.h).
//
// A chunk's min and max are reduced with atomicMin/atomicMax on order-preserving uint32
// keys of the floats, NaN with atomicOr on a flag: min and max do not depend on the order
// they are taken in, so neither do the bits (after lo + 0.0f turns -0 into +0). The ranges
// live in Int8Ranges (per chunk, cuda_kernels.h), reset with cudaMemsetAsync before each use.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "absl/status/status.h"
#include "kernels/cuda_kernels.h"
#include "kernels/cuda_kernels_common.cuh"
#include "kernels/cuda_status.h"
#include "kernels/kernels.h"

namespace onebit::kernels::cuda {
namespace {

// Monotonic: a < b (floats, not NaN) iff FloatKey(a) < FloatKey(b).
__device__ __forceinline__ unsigned FloatKey(float x) {
  const unsigned u = __float_as_uint(x);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ float KeyFloat(unsigned k) {
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

constexpr unsigned kCanonicalNan = 0x7fc00000u;  // what the CPU backend stores

struct Int8Params {
  float scale, lo, inv;
};

// kernels.h's scale, offset and 1/scale from a chunk's reduced range.
__device__ __forceinline__ Int8Params Int8ParamsFor(unsigned min_key, unsigned max_key,
                                                    unsigned nan) {
  Int8Params p;
  p.inv = 0.0f;
  if (nan != 0u) {
    p.scale = p.lo = __uint_as_float(kCanonicalNan);
    return p;
  }
  if (min_key > max_key) {  // no element
    p.scale = p.lo = 0.0f;
    return p;
  }
  p.lo = __fadd_rn(KeyFloat(min_key), 0.0f);
  const float hi = __fadd_rn(KeyFloat(max_key), 0.0f);
  p.scale = __double2float_rn(
      __ddiv_rn(__dsub_rn(static_cast<double>(hi), static_cast<double>(p.lo)), 255.0));
  if (p.scale != p.scale) p.scale = __uint_as_float(kCanonicalNan);
  if (p.scale > 0.0f && isfinite(p.scale)) {
    const float inv = __fdiv_rn(1.0f, p.scale);
    if (isfinite(inv)) p.inv = inv;
  }
  return p;
}

__device__ __forceinline__ float Int8Decode(uint8_t q, float scale, float lo) {
  return fmaf(static_cast<float>(q), scale, lo);
}

// Reduces a thread's min/max keys and NaN flag over the warp, one atomic per warp. Every
// lane of the warp must call it.
__device__ __forceinline__ void Int8WarpCommit(unsigned min_key, unsigned max_key, unsigned nan,
                                               Int8Ranges ranges, size_t k) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    min_key = min(min_key, __shfl_down_sync(kFullMask, min_key, offset));
    max_key = max(max_key, __shfl_down_sync(kFullMask, max_key, offset));
    nan |= __shfl_down_sync(kFullMask, nan, offset);
  }
  if ((threadIdx.x & 31) == 0) {
    if (min_key != 0xffffffffu) atomicMin(&ranges.min_key[k], min_key);
    if (max_key != 0u) atomicMax(&ranges.max_key[k], max_key);
    if (nan) atomicOr(&ranges.nan[k], 1u);
  }
}

__device__ __forceinline__ void Int8Track(float x, unsigned* min_key, unsigned* max_key,
                                          unsigned* nan) {
  if (x != x) {
    *nan = 1u;
    return;
  }
  const unsigned key = FloatKey(x);
  *min_key = min(*min_key, key);
  *max_key = max(*max_key, key);
}

// Worker pass 1: err = x (as for 1 bit) and each chunk's range. grid.y walks the chunks.
// Every lane reaches the commit after its loop.
template <bool kFusedMomentum, bool kVec>
__global__ void WorkerInputInt8Kernel(const float* __restrict__ m, const float* __restrict__ g,
                                      float beta1, float one_minus_beta1, size_t n,
                                      size_t num_chunks, size_t chunk, float* __restrict__ err,
                                      Int8Ranges ranges) {
  for (size_t k = blockIdx.y; k < num_chunks; k += gridDim.y) {
    unsigned min_key = 0xffffffffu, max_key = 0u, nan = 0u;
    float* x_chunk = err + k * chunk;
    for (size_t j = FirstElement(); j < chunk; j += ElementStride()) {
      const size_t i = k * chunk + j;
      Group x = Load4<kVec>(x_chunk, j, chunk);
      if (i < n) {
        AddMomentum<kFusedMomentum, kVec>(m, g, beta1, one_minus_beta1, i, n, &x);
        Store4<kVec>(x_chunk, j, chunk, x);
      }
#pragma unroll
      for (size_t e = 0; e < kGroup; ++e) Int8Track(x.v[e], &min_key, &max_key, &nan);
    }
    Int8WarpCommit(min_key, max_key, nan, ranges, k);
  }
}

// Server pass 1: err = y = fma(sum over workers in rank order of decode(block w), 1/W, err)
// and the chunk's range (in ranges entry 0). As ServerInputKernel: spans of 8 elements (8
// codes of every worker, one aligned 8-byte load where the blocks start on 8 bytes: blocks
// of 8 + chunk bytes, chunk a multiple of 8), err loaded first, the workers' scales and
// offsets staged in shared memory.
template <bool kVec>
__global__ void ServerInputInt8Kernel(const uint8_t* blocks, size_t block_bytes, int num_workers,
                                      size_t chunk, float inv_w, float* err, Int8Ranges ranges) {
  __shared__ float scales[kThreads], offsets[kThreads];
  int staged = -1;  // as in ServerInputKernel
  const bool aligned = (reinterpret_cast<uintptr_t>(blocks) & 7) == 0;
  unsigned min_key = 0xffffffffu, max_key = 0u, nan = 0u;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x * kServerSpan;
  for (size_t base = static_cast<size_t>(blockIdx.x) * blockDim.x * kServerSpan; base < chunk;
       base += stride) {
    const size_t j = base + threadIdx.x * kServerSpan;
    const bool valid = j < chunk;
    Group y[2] = {}, acc[2] = {};
    if (valid) {
      y[0] = Load4<kVec>(err, j, chunk);
      y[1] = Load4<kVec>(err, j + kGroup, chunk);
    }
    for (int w0 = 0; w0 < num_workers; w0 += kThreads) {
      const int tile = min(kThreads, num_workers - w0);
      if (staged != w0) {
        __syncthreads();
        if (static_cast<int>(threadIdx.x) < tile) {
          const uint8_t* block = blocks + static_cast<size_t>(w0 + threadIdx.x) * block_bytes;
          memcpy(&scales[threadIdx.x], block, sizeof(float));
          memcpy(&offsets[threadIdx.x], block + 4, sizeof(float));
        }
        __syncthreads();
        staged = w0;
      }
      if (valid) {
        const uint8_t* codes = blocks + static_cast<size_t>(w0) * block_bytes + 8 + j;
#pragma unroll 8
        for (int w = 0; w < tile; ++w, codes += block_bytes) {
          const float s = scales[w], lo = offsets[w];
          unsigned words[2];  // codes 0-3 and 4-7, code e at byte e % 4
          if (aligned) {
            const uint2 q = *reinterpret_cast<const uint2*>(codes);
            words[0] = q.x;
            words[1] = q.y;
          } else {
            words[0] = words[1] = 0;
#pragma unroll
            for (size_t e = 0; e < kServerSpan; ++e) {
              words[e / kGroup] |= static_cast<unsigned>(codes[e]) << (8 * (e % kGroup));
            }
          }
#pragma unroll
          for (int h = 0; h < 2; ++h) {
#pragma unroll
            for (size_t e = 0; e < kGroup; ++e) {
              const uint8_t q = static_cast<uint8_t>(words[h] >> (8 * e));
              acc[h].v[e] = __fadd_rn(acc[h].v[e], Int8Decode(q, s, lo));
            }
          }
        }
      }
    }
    if (valid) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (size_t e = 0; e < kGroup; ++e) {
          y[h].v[e] = fmaf(acc[h].v[e], inv_w, y[h].v[e]);
          Int8Track(y[h].v[e], &min_key, &max_key, &nan);
        }
        Store4<kVec>(err, j + h * kGroup, chunk, y[h]);
      }
    }
  }
  Int8WarpCommit(min_key, max_key, nan, ranges, 0);
}

// Pass 2 of both int8 compressions: x is in err; each chunk's scale and offset from its
// range; codes, and err = x - decode(q).
template <bool kVec>
__global__ void QuantizeInt8Kernel(Int8Ranges ranges, size_t num_chunks, size_t chunk,
                                   size_t block_bytes, float* err, uint8_t* out) {
  for (size_t k = blockIdx.y; k < num_chunks; k += gridDim.y) {
    const Int8Params p = Int8ParamsFor(ranges.min_key[k], ranges.max_key[k], ranges.nan[k]);
    uint8_t* block = out + k * block_bytes;
    if (blockIdx.x == 0 && threadIdx.x == 0) {
      memcpy(block, &p.scale, sizeof(p.scale));
      memcpy(block + 4, &p.lo, sizeof(p.lo));
    }
    float* x_chunk = err + k * chunk;
    for (size_t j = FirstElement(); j < chunk; j += ElementStride()) {
      Group x = Load4<kVec>(x_chunk, j, chunk);
      unsigned packed = 0;
#pragma unroll
      for (size_t e = 0; e < kGroup; ++e) {
        float r = __fmul_rn(__fsub_rn(x.v[e], p.lo), p.inv);
        r = r > 0.0f ? r : 0.0f;  // NaN -> 0
        r = r < 255.0f ? r : 255.0f;
        const uint8_t q = static_cast<uint8_t>(__float2uint_rn(r));  // ties to even
        packed |= static_cast<unsigned>(q) << (8 * e);
        x.v[e] = __fsub_rn(x.v[e], Int8Decode(q, p.scale, p.lo));
      }
      Store4<kVec>(x_chunk, j, chunk, x);
      uint8_t* codes = block + 8 + j;
      if ((reinterpret_cast<uintptr_t>(codes) & 3) == 0) {
        *reinterpret_cast<uint32_t*>(codes) = packed;  // little-endian: code e at byte e
      } else {
#pragma unroll
        for (size_t e = 0; e < kGroup; ++e) codes[e] = static_cast<uint8_t>(packed >> (8 * e));
      }
    }
  }
}

// out[i] = decode(blocks)[i] for i < n.
template <bool kVec>
__global__ void DecompressInt8Kernel(const uint8_t* blocks, size_t block_bytes, size_t num_chunks,
                                     size_t chunk, size_t n, float* out) {
  for (size_t k = blockIdx.y; k < num_chunks && k * chunk < n; k += gridDim.y) {
    const uint8_t* block = blocks + k * block_bytes;
    float s, lo;
    memcpy(&s, block, sizeof(s));
    memcpy(&lo, block + 4, sizeof(lo));
    const size_t count = min(chunk, n - k * chunk);
    float* out_chunk = out + k * chunk;
    for (size_t j = FirstElement(); j < count; j += ElementStride()) {
      const uint8_t* codes = block + 8 + j;  // a whole group: the chunk holds it
      unsigned packed;
      if ((reinterpret_cast<uintptr_t>(codes) & 3) == 0) {
        packed = *reinterpret_cast<const uint32_t*>(codes);
      } else {
        packed = 0;
#pragma unroll
        for (size_t e = 0; e < kGroup; ++e) packed |= static_cast<unsigned>(codes[e]) << (8 * e);
      }
      Group r;
#pragma unroll
      for (size_t e = 0; e < kGroup; ++e) {
        r.v[e] = Int8Decode(static_cast<uint8_t>(packed >> (8 * e)), s, lo);
      }
      Store4<kVec>(out_chunk, j, count, r);
    }
  }
}

}  // namespace

absl::Status CompressWorkerInt8(Launch launch, Int8Ranges ranges, const float* m,
                                const float* g, float beta1, size_t n, size_t num_chunks,
                                size_t chunk, float* err, uint8_t* out) {
  const dim3 grid = ChunkGrid(launch, num_chunks, chunk);
  const bool vec = Vec(m, g, err);
  const auto input = g != nullptr ? (vec ? WorkerInputInt8Kernel<true, true>
                                         : WorkerInputInt8Kernel<true, false>)
                                  : (vec ? WorkerInputInt8Kernel<false, true>
                                         : WorkerInputInt8Kernel<false, false>);
  input<<<grid, kThreads, 0, launch.stream>>>(m, g, beta1, 1.0f - beta1, n, num_chunks, chunk,
                                              err, ranges);
  ONEBIT_CUDA_RETURN_IF_LAUNCH_ERROR();
  const auto quantize = vec ? QuantizeInt8Kernel<true> : QuantizeInt8Kernel<false>;
  quantize<<<grid, kThreads, 0, launch.stream>>>(ranges, num_chunks, chunk,
                                                 Int8BlockBytes(chunk), err, out);
  ONEBIT_CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

absl::Status ServerAggregateInt8(Launch launch, Int8Ranges ranges, const uint8_t* blocks,
                                 int num_workers, size_t chunk, float* err, uint8_t* out) {
  const float inv_w = 1.0f / static_cast<float>(num_workers);
  const bool vec = Vec(err);
  const auto input = vec ? ServerInputInt8Kernel<true> : ServerInputInt8Kernel<false>;
  input<<<GroupBlocks(launch, chunk), kThreads, 0, launch.stream>>>(
      blocks, Int8BlockBytes(chunk), num_workers, chunk, inv_w, err, ranges);
  ONEBIT_CUDA_RETURN_IF_LAUNCH_ERROR();
  const auto quantize = vec ? QuantizeInt8Kernel<true> : QuantizeInt8Kernel<false>;
  quantize<<<ChunkGrid(launch, 1, chunk), kThreads, 0, launch.stream>>>(
      ranges, 1, chunk, Int8BlockBytes(chunk), err, out);
  ONEBIT_CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

absl::Status DecompressInt8(Launch launch, const uint8_t* blocks, size_t num_chunks,
                            size_t chunk, size_t n, float* out) {
  const auto kernel = Vec(out) ? DecompressInt8Kernel<true> : DecompressInt8Kernel<false>;
  kernel<<<ChunkGrid(launch, CeilDiv(n, chunk), chunk), kThreads, 0, launch.stream>>>(
      blocks, Int8BlockBytes(chunk), num_chunks, chunk, n, out);
  ONEBIT_CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

}  // namespace onebit::kernels::cuda
