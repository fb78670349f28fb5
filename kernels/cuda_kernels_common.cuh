// The device code that the CUDA kernel families (cuda_kernels.h) share: the group loads and
// stores, the 1-bit decode, Adam's arguments, the fixed-tree reductions, and the launch
// helpers. Included by each family's .cu only (nvcc).
//
// Bit-exactness with the CPU backend rests on the kernels' float32 expressions being
// evaluated exactly as written. The element formulas therefore use the round-to-nearest
// intrinsics (__fadd_rn, __fmul_rn, __fdiv_rn, __fsqrt_rn) and fmaf() only where the
// contract says fma: nvcc may not contract an __fmul_rn/__fadd_rn pair into an FMA,
// whatever -fmad says. The build also passes -fmad=false (kernels/BUILD, every CUDA object)
// so that a later edit written with plain operators stays exact, and never --use_fast_math.
//
// Sums of squares are the one place the two backends may differ: they are accumulated in
// float64 in another order than the CPU's, so scales agree with the CPU's to within
// rounding, not bit for bit. The order is still fixed (see "Reductions" below): it depends
// on the length alone, never on the GPU, its SM count or the timing of blocks, so two runs
// on the same input give the same bits, and a resumed run continues bit for bit.
//
// Everything here is in an unnamed namespace, as it was when the backend was one file: each
// family's object has its own copy with internal linkage, so nvcc inlines and compiles the
// kernels as it did then (tools/gpu/sass_diff.py compares their SASS).
#ifndef ONEBIT_KERNELS_CUDA_KERNELS_COMMON_CUH_
#define ONEBIT_KERNELS_CUDA_KERNELS_COMMON_CUH_

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kernels/cuda_kernels.h"
#include "kernels/kernels.h"

namespace onebit::kernels::cuda {
namespace {

// ---------------------------------------------------------------------------------------
// Device code
//
// Bandwidth. Every kernel walks its arrays in groups of kGroup = 4 consecutive elements: a
// thread moves 16 bytes of each float array per step, as one 16-byte load or store when
// the kernel runs with kVec (every float array it touches 16-byte aligned, and row strides
// multiples of 4), else as four 4-byte ones: one element per thread keeps too few bytes in
// flight to reach the memory's bandwidth. The float32 arithmetic is the same either way,
// element by element, so kVec changes the speed and never the bits. Elements at or past
// an array's end read as 0 and are never stored.
//
// Packed signs: a group's 4 sign bits are a nibble of one byte (chunks are multiples of 8
// elements, so a byte never spans two chunks and a group never spans two bytes). A warp's
// 32 groups are 16 bytes of bits: each even lane takes its odd neighbour's nibble with a
// shuffle and stores the byte.

// Every kernel runs blocks of this many threads; the block reductions rely on it.
constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr unsigned kFullMask = 0xffffffffu;
// grid.y is limited to 65535; chunked kernels loop over chunks with this stride.
constexpr size_t kMaxGridY = 65535;
// Elements per thread per step.
constexpr size_t kGroup = 4;

struct Group {
  float v[kGroup];
};

// Elements i .. i+3 of x[0, n) (i a multiple of kGroup); those at or past n read as 0.
template <bool kVec>
__device__ __forceinline__ Group Load4(const float* x, size_t i, size_t n) {
  Group r;
  if (kVec && i + kGroup <= n) {
    const float4 q = *reinterpret_cast<const float4*>(x + i);
    r.v[0] = q.x;
    r.v[1] = q.y;
    r.v[2] = q.z;
    r.v[3] = q.w;
  } else {
#pragma unroll
    for (size_t e = 0; e < kGroup; ++e) r.v[e] = i + e < n ? x[i + e] : 0.0f;
  }
  return r;
}

// Stores the elements of r that lie below n at x[i ...].
template <bool kVec>
__device__ __forceinline__ void Store4(float* x, size_t i, size_t n, const Group& r) {
  if (kVec && i + kGroup <= n) {
    *reinterpret_cast<float4*>(x + i) = make_float4(r.v[0], r.v[1], r.v[2], r.v[3]);
  } else {
#pragma unroll
    for (size_t e = 0; e < kGroup; ++e) {
      if (i + e < n) x[i + e] = r.v[e];
    }
  }
}

// The first element of this thread's first group along grid.x, and the grid's step.
__device__ __forceinline__ size_t FirstElement() {
  return (static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x) * kGroup;
}
__device__ __forceinline__ size_t ElementStride() {
  return static_cast<size_t>(gridDim.x) * blockDim.x * kGroup;
}

// Block scales sit at offset 0 of blocks of 4 + chunk/8 bytes, so they are only byte aligned.
__device__ __forceinline__ float LoadScale(const uint8_t* block) {
  float s;
  memcpy(&s, block, sizeof(s));
  return s;
}

__device__ __forceinline__ void StoreScale(uint8_t* block, float s) {
  memcpy(block, &s, sizeof(s));
}

// The sign nibble of the group at element j (a multiple of kGroup) of a block's bits.
__device__ __forceinline__ unsigned LoadNibble(const uint8_t* bits, size_t j) {
  return static_cast<unsigned>(bits[j >> 3]) >> (j & 4);
}

// Element e of a group: +s where its bit is set, else -s (the contract's decode).
__device__ __forceinline__ float DecodeBit(unsigned nibble, size_t e, float s) {
  return ((nibble >> e) & 1u) ? s : -s;
}

struct AdamArgs {
  float beta1, one_minus_beta1;
  float beta2, one_minus_beta2;
  float neg_lr, eps, weight_decay;
  float update_clip;  // > 0: the direction's clamp (AdamHyper::update_clip)
};

// u clamped to [-c, c] when c > 0, by comparisons (fminf/fmaxf would turn a NaN into c).
__device__ __forceinline__ float ClipDirection(float u, float c) {
  return c > 0.0f ? (u > c ? c : u < -c ? -c : u) : u;
}

__device__ __forceinline__ double SquareF64(float x) {
  // Exact: a float's square fits in a double's mantissa.
  return static_cast<double>(x) * static_cast<double>(x);
}

// Adds the squares of a group's elements to *sum, in element order.
__device__ __forceinline__ void AddSquares(const Group& x, double* sum) {
#pragma unroll
  for (size_t e = 0; e < kGroup; ++e) *sum += SquareF64(x.v[e]);
}

// ---------------------------------------------------------------------------------------
// Reductions: a fixed tree
//
// A float64 sum over n elements runs on ReduceBlocks(n) blocks, a function of n alone:
//   1. thread t of block b adds the squares of the groups (kGroup elements, in order)
//      starting at elements kGroup * (b*kThreads + t + k*stride), k = 0, 1, ... (stride =
//      ReduceBlocks(n) * kThreads), in that order;
//   2. each block adds its threads' sums by a fixed shuffle tree (BlockSum) and stores the
//      result in partials[b];
//   3. the last block to finish adds partials[0..ReduceBlocks(n)) in index order, by the
//      same per-thread loop and tree, and stores the total.
// An atomic counter only elects the block that does step 3; what it adds, and in which
// order, does not depend on which block that is (an atomicAdd of the block sums would make
// the last bit depend on the order in which blocks finished).
// The grid must not depend on the SM count either, or the same tensor would be summed in
// another order on another GPU. Nor does the order depend on kVec: a group's elements are
// added in the same order however they were loaded. (ServerInputKernel's threads take spans
// of two groups, kServerSpan elements, in place of one: the same rule with 8 for 4.)
//
// kMaxReduceBlocks and ReductionScratch, the reductions' device memory, are cuda_kernels.h's:
// the backend allocates it.

// The grid of every reduction kernel over n > 0 elements: depends on n alone (see above).
constexpr unsigned ReduceBlocks(size_t n) {
  const size_t blocks = (n + kThreads * kGroup - 1) / (kThreads * kGroup);
  return static_cast<unsigned>(blocks < kMaxReduceBlocks ? blocks : kMaxReduceBlocks);
}

// The sum of `value` over the threads of the block by a fixed tree, in thread 0 (other
// threads get a partial sum). All threads must call it; blockDim.x == kThreads.
__device__ double BlockSum(double value) {
  __shared__ double warp_sums[kWarps];
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  for (int offset = 16; offset > 0; offset >>= 1) {
    value += __shfl_down_sync(kFullMask, value, offset);
  }
  if (lane == 0) warp_sums[warp] = value;
  __syncthreads();
  if (warp == 0) {
    value = lane < kWarps ? warp_sums[lane] : 0.0;
    for (int offset = 16; offset > 0; offset >>= 1) {
      value += __shfl_down_sync(kFullMask, value, offset);
    }
  }
  __syncthreads();  // warp_sums may be written again by the next call.
  return value;
}

// Steps 2 and 3 above: every thread of every block of a reduction kernel calls it last,
// with its own sum. Launch with ReduceBlocks(n) blocks (gridDim.y == 1) of kThreads.
__device__ void FinishReduction(double value, ReductionScratch* scratch) {
  __shared__ bool is_last;
  value = BlockSum(value);
  if (threadIdx.x == 0) {
    scratch->partials[blockIdx.x] = value;
    // The partial is visible to every block before this block is counted (the CUDA
    // Programming Guide's last-block pattern).
    __threadfence();
    // atomicInc wraps to 0 after gridDim.x - 1: the counter is ready for the next launch.
    is_last = atomicInc(&scratch->arrivals, gridDim.x - 1) == gridDim.x - 1;
  }
  __syncthreads();
  if (!is_last) return;
  __threadfence();
  double sum = 0.0;
  for (unsigned b = threadIdx.x; b < gridDim.x; b += kThreads) {
    sum += __ldcg(&scratch->partials[b]);  // from L2: other SMs wrote them
  }
  sum = BlockSum(sum);
  if (threadIdx.x == 0) scratch->total = sum;
}

// x += the momentum of elements i .. i+3 of n (those below n): m, or with kFusedMomentum
// fma(beta1, m, (1 - beta1) * g), which is not written back.
template <bool kFusedMomentum, bool kVec>
__device__ __forceinline__ void AddMomentum(const float* __restrict__ m,
                                            const float* __restrict__ g, float beta1,
                                            float one_minus_beta1, size_t i, size_t n,
                                            Group* x) {
  const Group mv = Load4<kVec>(m, i, n);
  const Group gv = kFusedMomentum ? Load4<kVec>(g, i, n) : Group{};
#pragma unroll
  for (size_t e = 0; e < kGroup; ++e) {
    if (i + e < n) {
      const float mi =
          kFusedMomentum ? fmaf(beta1, mv.v[e], __fmul_rn(one_minus_beta1, gv.v[e])) : mv.v[e];
      x->v[e] = __fadd_rn(mi, x->v[e]);
    }
  }
}

// A server pass-1 thread's span of elements a step (ServerInputKernel, ServerInputInt8Kernel):
// two groups, one byte of every worker's 1-bit signs or 8 of its int8 codes.
constexpr size_t kServerSpan = 2 * kGroup;

// ---------------------------------------------------------------------------------------
// Launches

// Host float arithmetic is IEEE binary32 too, so 1 - beta matches the CPU backend's.
inline AdamArgs MakeAdamArgs(const AdamHyper& h) {
  return AdamArgs{h.beta1, 1.0f - h.beta1, h.beta2,         1.0f - h.beta2,
                  -h.lr,   h.eps,          h.weight_decay, h.update_clip};
}

inline size_t CeilDiv(size_t a, size_t b) { return (a + b - 1) / b; }

// Whether a kernel may run with kVec (see "Bandwidth"): every float array it touches starts
// on a 16-byte boundary (a null array counts as aligned).
template <typename... T>
bool Vec(const T*... arrays) {
  return ((reinterpret_cast<uintptr_t>(arrays) % 16 == 0) && ...);
}

// The grid of the elementwise kernels, n > 0. Not for reductions: it depends on the SM
// count (they use ReduceBlocks).
inline unsigned Blocks(Launch launch, size_t n) {
  return static_cast<unsigned>(std::min(CeilDiv(n, kThreads), launch.max_blocks));
}

// The grid of the kernels that walk n elements in groups of kGroup.
inline unsigned GroupBlocks(Launch launch, size_t n) { return Blocks(launch, CeilDiv(n, kGroup)); }

// grid.y over chunks, grid.x over the groups of a chunk, about launch.max_blocks blocks in
// all. num_chunks > 0, chunk > 0.
inline dim3 ChunkGrid(Launch launch, size_t num_chunks, size_t chunk) {
  const size_t y = std::min(num_chunks, kMaxGridY);
  const size_t x = std::min(std::max<size_t>(launch.max_blocks / y, 1),
                            CeilDiv(chunk, kThreads * kGroup));
  return dim3(static_cast<unsigned>(x), static_cast<unsigned>(y));
}

}  // namespace
}  // namespace onebit::kernels::cuda

#endif  // ONEBIT_KERNELS_CUDA_KERNELS_COMMON_CUH_
