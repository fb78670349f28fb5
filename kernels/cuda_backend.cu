// The CUDA backend: kernels.h's contract on one GPU, every kernel queued on the backend's
// own stream.
//
// Bit-exactness with the CPU backend rests on the float32 expressions below being evaluated
// exactly as written. The element formulas therefore use the round-to-nearest intrinsics
// (__fadd_rn, __fmul_rn, __fdiv_rn, __fsqrt_rn) and fmaf() only where the contract says
// fma: nvcc may not contract an __fmul_rn/__fadd_rn pair into an FMA, whatever -fmad says.
// The build also passes -fmad=false so that a later edit written with plain operators stays
// exact, and never --use_fast_math.
//
// Sums of squares are the one place the two backends may differ: they are accumulated in
// float64 in another order than the CPU's, so scales agree with the CPU's to within
// rounding, not bit for bit. The order is still fixed (see "Reductions" below): it depends
// on the length alone, never on the GPU, its SM count or the timing of blocks, so two runs
// on the same input give the same bits, and a resumed run continues bit for bit.

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "kernels/cuda_backend.h"
#include "kernels/cuda_status.h"
#include "kernels/kernels.h"
#include "common/status_macros.h"

namespace onebit::kernels {
namespace {

// ---------------------------------------------------------------------------------------
// Errors

// CudaErrorStatus and ONEBIT_CUDA_RETURN_IF_ERROR come from kernels/cuda_status.h.

absl::Status CheckChunking(size_t num_chunks, size_t chunk, size_t n) {
  if (chunk % 8 != 0) {
    return absl::InvalidArgumentError(absl::StrCat("chunk ", chunk, " is not a multiple of 8"));
  }
  if (chunk != 0 && num_chunks > SIZE_MAX / chunk) {
    return absl::InvalidArgumentError("num_chunks * chunk overflows");
  }
  if (n > num_chunks * chunk) {
    return absl::InvalidArgumentError(absl::StrCat("n = ", n, " exceeds num_chunks * chunk = ",
                                                   num_chunks * chunk));
  }
  return absl::OkStatus();
}

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

// s = float(sqrt(sumsq / n)) in float64, s = 0 when n = 0 (the contract's scale).
__device__ __forceinline__ float ScaleFromSumSquares(double sumsq, size_t n) {
  if (n == 0) return 0.0f;
  return __double2float_rn(__dsqrt_rn(__ddiv_rn(sumsq, static_cast<double>(n))));
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

// u = m / (sqrt(v) + eps), clipped; u = fma(wd, p, u) if wd > 0; returns fma(-lr, u, p).
__device__ __forceinline__ float AdamStep(float m, float v, float p, const AdamArgs& a) {
  float u = ClipDirection(__fdiv_rn(m, __fadd_rn(__fsqrt_rn(v), a.eps)), a.update_clip);
  if (a.weight_decay > 0.0f) u = fmaf(a.weight_decay, p, u);
  return fmaf(a.neg_lr, u, p);
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

// At most this many blocks per reduction: ~4 waves of 256-thread blocks on an H100 (132 SMs
// x 8 resident), ~5 on an A100 (108 x 8), so the last, partial wave costs little on either;
// 32 KB of partials. Past n = 4096 * kThreads * kGroup (4M elements) threads loop.
constexpr size_t kMaxReduceBlocks = 4096;

// The grid of every reduction kernel over n > 0 elements: depends on n alone (see above).
constexpr unsigned ReduceBlocks(size_t n) {
  const size_t blocks = (n + kThreads * kGroup - 1) / (kThreads * kGroup);
  return static_cast<unsigned>(blocks < kMaxReduceBlocks ? blocks : kMaxReduceBlocks);
}

// Device memory of the reductions, one per backend: its kernels run one at a time on the
// backend's stream, so one scratch is enough.
struct ReductionScratch {
  unsigned max_bits;                   // MaxDenomRatio's result: a non-negative float's bits
  double total;                        // the result of the last reduction
  unsigned arrivals;                   // blocks done in the running reduction; 0 between
  double partials[kMaxReduceBlocks];   // per-block sums of the running reduction
};

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

template <bool kVec>
__global__ void MomentumKernel(float beta1, float one_minus_beta1, const float* g, float* m,
                               size_t n) {
  for (size_t i = FirstElement(); i < n; i += ElementStride()) {
    const Group gv = Load4<kVec>(g, i, n);
    Group mv = Load4<kVec>(m, i, n);
#pragma unroll
    for (size_t e = 0; e < kGroup; ++e) {
      mv.v[e] = fmaf(beta1, mv.v[e], __fmul_rn(one_minus_beta1, gv.v[e]));
    }
    Store4<kVec>(m, i, n, mv);
  }
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

// Worker pass 1: err = x (see Backend::CompressWorker), scratch->total = sum of x^2. err
// has n_pad elements, a multiple of 8; m and g have n.
template <bool kFusedMomentum, bool kVec>
__global__ void WorkerInputKernel(const float* __restrict__ m, const float* __restrict__ g,
                                  float beta1, float one_minus_beta1, size_t n, size_t n_pad,
                                  float* __restrict__ err, ReductionScratch* scratch) {
  double local = 0.0;
  for (size_t i = FirstElement(); i < n_pad; i += ElementStride()) {
    Group x = Load4<kVec>(err, i, n_pad);
    if (i < n) {
      AddMomentum<kFusedMomentum, kVec>(m, g, beta1, one_minus_beta1, i, n, &x);
      Store4<kVec>(err, i, n_pad, x);  // past n: the padding's error, unchanged
    }
    AddSquares(x, &local);
  }
  FinishReduction(local, scratch);
}

// Puts the scales of workers first .. first + kThreads - 1 (those below num_workers) into
// `scales`, unless *staged says they are there already. Every thread of the block calls it
// with the same arguments (it synchronises the block).
__device__ __forceinline__ void StageScales(const uint8_t* blocks, size_t block_bytes,
                                            int num_workers, int first, float* scales,
                                            int* staged) {
  if (*staged == first) return;
  __syncthreads();  // Nobody still reads the previous tile's scales.
  if (static_cast<int>(threadIdx.x) < min(kThreads, num_workers - first)) {
    scales[threadIdx.x] =
        LoadScale(blocks + static_cast<size_t>(first + threadIdx.x) * block_bytes);
  }
  __syncthreads();
  *staged = first;
}

// Server pass 1: err = fma(sum over workers in rank order of decode(block w), 1/W, err),
// scratch->total = sum of err^2. A thread takes a span of kServerSpan = 8 elements per step
// (one byte of every worker's bits, two groups of err), so that each byte load serves 8
// elements and 32 bytes of err are in flight per thread; its err is loaded before the
// bits, so that both are in flight together. The loop over spans advances block-uniformly
// so that the whole block can stage worker scales in shared memory, kThreads workers at a
// time (with W <= kThreads, once for the whole kernel).
constexpr size_t kServerSpan = 2 * kGroup;

template <bool kVec>
__global__ void ServerInputKernel(const uint8_t* blocks, size_t block_bytes, int num_workers,
                                  size_t chunk, float inv_w, float* err,
                                  ReductionScratch* scratch) {
  __shared__ float scales[kThreads];
  int staged = -1;  // the first worker of the tile in `scales`; the same in every thread
  double local = 0.0;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x * kServerSpan;
  for (size_t base = static_cast<size_t>(blockIdx.x) * blockDim.x * kServerSpan; base < chunk;
       base += stride) {
    const size_t j = base + threadIdx.x * kServerSpan;
    const bool valid = j < chunk;  // chunk is a multiple of 8: a valid span is whole
    Group y[2] = {}, acc[2] = {};
    if (valid) {
      y[0] = Load4<kVec>(err, j, chunk);
      y[1] = Load4<kVec>(err, j + kGroup, chunk);
    }
    for (int w0 = 0; w0 < num_workers; w0 += kThreads) {
      const int tile = min(kThreads, num_workers - w0);
      StageScales(blocks, block_bytes, num_workers, w0, scales, &staged);
      if (valid) {
        const uint8_t* bits = blocks + static_cast<size_t>(w0) * block_bytes + 4 + (j >> 3);
#pragma unroll 8
        for (int w = 0; w < tile; ++w, bits += block_bytes) {
          const unsigned byte = *bits;
          const float s = scales[w];
#pragma unroll
          for (int h = 0; h < 2; ++h) {
#pragma unroll
            for (size_t e = 0; e < kGroup; ++e) {
              acc[h].v[e] = __fadd_rn(acc[h].v[e], DecodeBit(byte >> (4 * h), e, s));
            }
          }
        }
      }
    }
    if (valid) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (size_t e = 0; e < kGroup; ++e) y[h].v[e] = fmaf(acc[h].v[e], inv_w, y[h].v[e]);
        Store4<kVec>(err, j + h * kGroup, chunk, y[h]);
        AddSquares(y[h], &local);
      }
    }
  }
  FinishReduction(local, scratch);
}

// Server pass 1 by warps (ServerBitLoads::kWarpWords2/4): the same sums as ServerInputKernel,
// element by element (every worker's decoded bit added in rank order, then the fma). A warp
// takes kRows rows of 128 elements a step; lane l takes the group at element 4*l of each
// row, so that each 16-byte access of the warp covers 512 contiguous bytes of err. The
// bits of a row are 4 words per worker; for 8 workers a lane loads kRows words (lane l:
// word l % (4*kRows) of worker l / (4*kRows) of each load's set of workers) and every lane
// takes its nibble of each worker's word from the lane that loaded it. Bit t of a
// little-endian word is element t of its 32 (bit t % 8 of byte t / 8, as LoadNibble reads
// them). Needs 4-byte aligned words: chunk % 32 == 0 and blocks 4-byte aligned.
constexpr int kWordTile = 8;  // workers whose words a warp loads at once

// The launch bounds hold kRows = 2 to the default's 40 registers (6 blocks an SM; ptxas
// gave it 56 unbounded) and let kRows = 4 have 64 (4 blocks, 64 bytes of err in flight a
// thread); neither spills (nvcc -Xptxas -v, sm_80 and sm_90).
template <int kRows, bool kVec>
__global__ void __launch_bounds__(kThreads, kRows == 2 ? 6 : 4)
    ServerInputWordsKernel(const uint8_t* blocks, size_t block_bytes, int num_workers,
                           size_t chunk, float inv_w, float* err, ReductionScratch* scratch) {
  constexpr size_t kRow = 32 * kGroup;                     // elements of a row: 128
  constexpr int kWordsPerWorker = 4 * kRows;               // a step's words of one worker
  constexpr int kWorkersPerLoad = 32 / kWordsPerWorker;    // workers of one load: 4 or 2
  constexpr int kLoads = kWordTile / kWorkersPerLoad;      // loads per lane for 8 workers
  constexpr size_t kWarpSpan = kRows * kRow;
  __shared__ float scales[kThreads];
  const unsigned lane = threadIdx.x & 31;
  const size_t block_span = kWarps * kWarpSpan;
  int staged = -1;  // the first worker of the tile in `scales`; the same in every thread
  double local = 0.0;
  for (size_t base = static_cast<size_t>(blockIdx.x) * block_span; base < chunk;
       base += static_cast<size_t>(gridDim.x) * block_span) {
    const size_t warp_base = base + (threadIdx.x >> 5) * kWarpSpan;
    Group y[kRows], acc[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const size_t j = warp_base + r * kRow + lane * kGroup;
      y[r] = j < chunk ? Load4<kVec>(err, j, chunk) : Group{};
      acc[r] = Group{};
    }
    const size_t my_word = warp_base / 32 + lane % kWordsPerWorker;  // of each worker's bits
    const bool word_in_chunk = my_word * 32 < chunk;
    for (int w0 = 0; w0 < num_workers; w0 += kWordTile) {
      const int scale_tile = w0 - w0 % kThreads;
      StageScales(blocks, block_bytes, num_workers, scale_tile, scales, &staged);
      unsigned words[kLoads];
#pragma unroll
      for (int k = 0; k < kLoads; ++k) {
        const int worker = w0 + k * kWorkersPerLoad + static_cast<int>(lane) / kWordsPerWorker;
        words[k] = 0;
        if (word_in_chunk && worker < num_workers) {
          words[k] = reinterpret_cast<const unsigned*>(
              blocks + static_cast<size_t>(worker) * block_bytes + 4)[my_word];
        }
      }
      const int tile = min(kWordTile, num_workers - w0);  // the same in every lane
#pragma unroll
      for (int w = 0; w < kWordTile; ++w) {
        if (w < tile) {
          const float s = scales[w0 + w - scale_tile];
#pragma unroll
          for (int r = 0; r < kRows; ++r) {
            const int from = (w % kWorkersPerLoad) * kWordsPerWorker + 4 * r + lane / 8;
            const unsigned word = __shfl_sync(kFullMask, words[w / kWorkersPerLoad], from);
            const unsigned nibble = word >> (kGroup * (lane % 8));
#pragma unroll
            for (size_t e = 0; e < kGroup; ++e) {
              acc[r].v[e] = __fadd_rn(acc[r].v[e], DecodeBit(nibble, e, s));
            }
          }
        }
      }
    }
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const size_t j = warp_base + r * kRow + lane * kGroup;
      if (j < chunk) {  // chunk is a multiple of 32: a group is whole or absent
#pragma unroll
        for (size_t e = 0; e < kGroup; ++e) y[r].v[e] = fmaf(acc[r].v[e], inv_w, y[r].v[e]);
        Store4<kVec>(err, j, chunk, y[r]);
        AddSquares(y[r], &local);
      }
    }
  }
  FinishReduction(local, scratch);
}

// The grid of ServerInputWordsKernel over chunk > 0 elements: a block per kWarps * kRows
// rows, at most kMaxReduceBlocks (a function of the length alone, as every reduction's).
template <int kRows>
unsigned ServerWordsBlocks(size_t chunk) {
  const size_t span = static_cast<size_t>(kWarps) * kRows * 32 * kGroup;
  return static_cast<unsigned>(std::min<size_t>((chunk + span - 1) / span, kMaxReduceBlocks));
}

// Pass 2 of both compressions: x is in err; s comes from the sum of squares *sumsq over
// n_scale elements. Writes s and the packed signs of each chunk and sets
// err = x - s*sign(x). grid.y walks the chunks, grid.x the groups of a chunk; the loop
// over groups advances warp-uniformly (every lane reaches the shuffle).
template <bool kVec>
__global__ void SignPackKernel(const double* sumsq, size_t n_scale, size_t num_chunks,
                               size_t chunk, size_t block_bytes, float* err, uint8_t* out) {
  const float s = ScaleFromSumSquares(*sumsq, n_scale);
  const unsigned lane = threadIdx.x & 31;
  const size_t warp_first = FirstElement() - lane * kGroup;  // the warp's first element
  for (size_t k = blockIdx.y; k < num_chunks; k += gridDim.y) {
    float* x_chunk = err + k * chunk;
    uint8_t* block = out + k * block_bytes;
    if (blockIdx.x == 0 && threadIdx.x == 0) StoreScale(block, s);
    for (size_t j0 = warp_first; j0 < chunk; j0 += ElementStride()) {
      const size_t j = j0 + lane * kGroup;
      const bool valid = j < chunk;  // whole groups: chunk is a multiple of 8
      unsigned nibble = 0;
      if (valid) {
        Group x = Load4<kVec>(x_chunk, j, chunk);
#pragma unroll
        for (size_t e = 0; e < kGroup; ++e) {
          // sign(0) = +1; NaN counts as negative, like the CPU.
          const bool positive = x.v[e] >= 0.0f;
          nibble |= static_cast<unsigned>(positive) << e;
          x.v[e] = positive ? __fsub_rn(x.v[e], s) : __fadd_rn(x.v[e], s);
        }
        Store4<kVec>(x_chunk, j, chunk, x);
      }
      const unsigned high = __shfl_down_sync(kFullMask, nibble, 1);
      // An even lane's group starts a byte (j is a multiple of 8), whose second half is the
      // next lane's group, also inside the chunk.
      if ((lane & 1) == 0 && valid) block[4 + (j >> 3)] = static_cast<uint8_t>(nibble | (high << 4));
    }
  }
}

// out[i] = decode(blocks)[i] for i < n.
template <bool kVec>
__global__ void DecompressKernel(const uint8_t* blocks, size_t block_bytes, size_t num_chunks,
                                 size_t chunk, size_t n, float* out) {
  for (size_t k = blockIdx.y; k < num_chunks && k * chunk < n; k += gridDim.y) {
    const uint8_t* block = blocks + k * block_bytes;
    const float s = LoadScale(block);
    const size_t count = min(chunk, n - k * chunk);
    float* out_chunk = out + k * chunk;
    // Two groups per step, both nibbles loaded before either is stored: a thread's only
    // load is its bits (half a byte a group), so one group a step left the loop waiting a
    // full load latency for every 16 bytes it writes.
    const size_t stride = ElementStride();
    for (size_t j = FirstElement(); j < count; j += 2 * stride) {
      const bool second = j + stride < count;
      const unsigned first_bits = LoadNibble(block + 4, j);
      const unsigned second_bits = second ? LoadNibble(block + 4, j + stride) : 0u;
      Group r;
#pragma unroll
      for (size_t e = 0; e < kGroup; ++e) r.v[e] = DecodeBit(first_bits, e, s);
      Store4<kVec>(out_chunk, j, count, r);
      if (!second) break;
#pragma unroll
      for (size_t e = 0; e < kGroup; ++e) r.v[e] = DecodeBit(second_bits, e, s);
      Store4<kVec>(out_chunk, j + stride, count, r);
    }
  }
}

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


template <bool kVec>
__global__ void AdamWarmupKernel(AdamArgs a, const float* g, float grad_scale, float* m,
                                 float* v, float* p, size_t n) {
  for (size_t i = FirstElement(); i < n; i += ElementStride()) {
    const Group gv = Load4<kVec>(g, i, n);
    Group mv = Load4<kVec>(m, i, n), vv = Load4<kVec>(v, i, n), pv = Load4<kVec>(p, i, n);
#pragma unroll
    for (size_t e = 0; e < kGroup; ++e) {
      const float gi = __fmul_rn(gv.v[e], grad_scale);
      mv.v[e] = fmaf(a.beta1, mv.v[e], __fmul_rn(a.one_minus_beta1, gi));
      vv.v[e] = fmaf(a.beta2, vv.v[e], __fmul_rn(__fmul_rn(a.one_minus_beta2, gi), gi));
      pv.v[e] = AdamStep(mv.v[e], vv.v[e], pv.v[e], a);
    }
    Store4<kVec>(m, i, n, mv);
    Store4<kVec>(v, i, n, vv);
    Store4<kVec>(p, i, n, pv);
  }
}

// Without a mask m is only read: skipping its store saves a quarter of the traffic.
template <bool kVec>
__global__ void FrozenAdamKernel(AdamArgs a, const float* v, const float* mask, float* m,
                                 float* p, size_t n) {
  for (size_t i = FirstElement(); i < n; i += ElementStride()) {
    Group mv = Load4<kVec>(m, i, n);
    if (mask != nullptr) {
      const Group k = Load4<kVec>(mask, i, n);
#pragma unroll
      for (size_t e = 0; e < kGroup; ++e) mv.v[e] = __fmul_rn(mv.v[e], k.v[e]);
      Store4<kVec>(m, i, n, mv);
    }
    const Group vv = Load4<kVec>(v, i, n);
    Group pv = Load4<kVec>(p, i, n);
#pragma unroll
    for (size_t e = 0; e < kGroup; ++e) {
      pv.v[e] = AdamStep(mv.v[e], vv.v[e], pv.v[e], a);
    }
    Store4<kVec>(p, i, n, pv);
  }
}

template <bool kVec>
__global__ void DecompressFrozenAdamKernel(const uint8_t* blocks, size_t block_bytes,
                                           size_t num_chunks, size_t chunk, AdamArgs a,
                                           const float* v, const float* mask, float* m,
                                           float* p, size_t n) {
  for (size_t k = blockIdx.y; k < num_chunks && k * chunk < n; k += gridDim.y) {
    const uint8_t* block = blocks + k * block_bytes;
    const float s = LoadScale(block);
    const size_t begin = k * chunk;
    const size_t count = min(chunk, n - begin);
    for (size_t j = FirstElement(); j < count; j += ElementStride()) {
      const size_t i = begin + j;
      const unsigned nibble = LoadNibble(block + 4, j);
      Group mv;
#pragma unroll
      for (size_t e = 0; e < kGroup; ++e) mv.v[e] = DecodeBit(nibble, e, s);
      if (mask != nullptr) {
        const Group mk = Load4<kVec>(mask, i, n);
#pragma unroll
        for (size_t e = 0; e < kGroup; ++e) mv.v[e] = __fmul_rn(mv.v[e], mk.v[e]);
      }
      const Group vv = Load4<kVec>(v, i, n);
      Group pv = Load4<kVec>(p, i, n);
#pragma unroll
      for (size_t e = 0; e < kGroup; ++e) {
        pv.v[e] = AdamStep(mv.v[e], vv.v[e], pv.v[e], a);
      }
      Store4<kVec>(m, i, n, mv);
      Store4<kVec>(p, i, n, pv);
    }
  }
}

// Two groups per step, both loaded before either is added, so that twice the bytes are in
// flight; the additions keep the order of a one-group loop (see "Reductions").
template <bool kVec>
__global__ void SumSquaresKernel(const float* x, size_t n, ReductionScratch* scratch) {
  double local = 0.0;
  const size_t stride = ElementStride();
  size_t i = FirstElement();
  for (; i + stride < n; i += 2 * stride) {
    const Group a = Load4<kVec>(x, i, n);
    const Group b = Load4<kVec>(x, i + stride, n);
    AddSquares(a, &local);
    AddSquares(b, &local);
  }
  if (i < n) AddSquares(Load4<kVec>(x, i, n), &local);
  FinishReduction(local, scratch);
}

// ---------------------------------------------------------------------------------------
// The int8 format (kernels.h, INT8 WIRE FORMAT)
//
// A chunk's min and max are reduced with atomicMin/atomicMax on order-preserving uint32
// keys of the floats, NaN with atomicOr on a flag: min and max do not depend on the order
// they are taken in, so neither do the bits (after lo + 0.0f turns -0 into +0). The ranges
// live in Int8Ranges (per chunk), reset with cudaMemsetAsync before each use.

struct Int8Ranges {
  unsigned* min_key;  // num_chunks, reset to 0xffffffff
  unsigned* max_key;  // num_chunks, reset to 0
  unsigned* nan;      // num_chunks, reset to 0
};

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

// 0/1 Adam (Backend::ZeroOneLocalUpdate and the sync pair).
template <bool kVec>
__global__ void ZeroOneLocalKernel(AdamArgs a, const float* g, const float* v, float* m,
                                   float* p, float* acc, size_t n) {
  for (size_t i = FirstElement(); i < n; i += ElementStride()) {
    const Group gv = Load4<kVec>(g, i, n), vv = Load4<kVec>(v, i, n);
    Group mv = Load4<kVec>(m, i, n), pv = Load4<kVec>(p, i, n), av = Load4<kVec>(acc, i, n);
#pragma unroll
    for (size_t e = 0; e < kGroup; ++e) {
      const float mi = fmaf(a.beta1, mv.v[e], __fmul_rn(a.one_minus_beta1, gv.v[e]));
      const float pi = pv.v[e];
      float u = ClipDirection(__fdiv_rn(mi, __fadd_rn(__fsqrt_rn(vv.v[e]), a.eps)), a.update_clip);
      if (a.weight_decay > 0.0f) u = fmaf(a.weight_decay, pi, u);
      mv.v[e] = mi;
      pv.v[e] = fmaf(a.neg_lr, u, pi);
      av.v[e] = fmaf(a.neg_lr, u, av.v[e]);
    }
    Store4<kVec>(m, i, n, mv);
    Store4<kVec>(p, i, n, pv);
    Store4<kVec>(acc, i, n, av);
  }
}

template <bool kVec>
__global__ void ZeroOneSyncPrepareKernel(float eps, const float* v, float* acc, size_t n) {
  for (size_t i = FirstElement(); i < n; i += ElementStride()) {
    const Group vv = Load4<kVec>(v, i, n);
    Group av = Load4<kVec>(acc, i, n);
#pragma unroll
    for (size_t e = 0; e < kGroup; ++e) {
      av.v[e] = __fmul_rn(av.v[e], __fadd_rn(__fsqrt_rn(vv.v[e]), eps));
    }
    Store4<kVec>(acc, i, n, av);
  }
}

template <bool kVec>
__global__ void ZeroOneSyncApplyKernel(float eps, float lrs, const float* v, const float* mask,
                                       const float* avg, float* m, float* anchor, float* p,
                                       size_t n) {
  for (size_t i = FirstElement(); i < n; i += ElementStride()) {
    const Group av = Load4<kVec>(avg, i, n);
    if (lrs != 0.0f) {
      Group mv;
#pragma unroll
      for (size_t e = 0; e < kGroup; ++e) mv.v[e] = __fdiv_rn(-av.v[e], lrs);
      if (mask != nullptr) {
        const Group mk = Load4<kVec>(mask, i, n);
#pragma unroll
        for (size_t e = 0; e < kGroup; ++e) mv.v[e] = __fmul_rn(mv.v[e], mk.v[e]);
      }
      Store4<kVec>(m, i, n, mv);
    }
    const Group vv = Load4<kVec>(v, i, n);
    Group pv = Load4<kVec>(anchor, i, n);
#pragma unroll
    for (size_t e = 0; e < kGroup; ++e) {
      pv.v[e] = __fadd_rn(pv.v[e], __fdiv_rn(av.v[e], __fadd_rn(__fsqrt_rn(vv.v[e]), eps)));
    }
    Store4<kVec>(p, i, n, pv);
    Store4<kVec>(anchor, i, n, pv);
  }
}

// 1-bit LAMB's element-wise steps (Backend::AdamMomentsUpdate ... MaxDenomRatio).
template <bool kVec>
__global__ void AdamMomentsKernel(AdamArgs a, const float* g, float grad_scale, float* m,
                                  float* v, size_t n) {
  for (size_t i = FirstElement(); i < n; i += ElementStride()) {
    const Group gv = Load4<kVec>(g, i, n);
    Group mv = Load4<kVec>(m, i, n), vv = Load4<kVec>(v, i, n);
#pragma unroll
    for (size_t e = 0; e < kGroup; ++e) {
      const float gi = __fmul_rn(gv.v[e], grad_scale);
      mv.v[e] = fmaf(a.beta1, mv.v[e], __fmul_rn(a.one_minus_beta1, gi));
      vv.v[e] = fmaf(a.beta2, vv.v[e], __fmul_rn(__fmul_rn(a.one_minus_beta2, gi), gi));
    }
    Store4<kVec>(m, i, n, mv);
    Store4<kVec>(v, i, n, vv);
  }
}

template <bool kVec>
__global__ void AdamDirectionKernel(AdamArgs a, const float* m, const float* v, const float* p,
                                    float* u, size_t n) {
  for (size_t i = FirstElement(); i < n; i += ElementStride()) {
    const Group mv = Load4<kVec>(m, i, n), vv = Load4<kVec>(v, i, n);
    Group uv;
#pragma unroll
    for (size_t e = 0; e < kGroup; ++e) {
      uv.v[e] = ClipDirection(__fdiv_rn(mv.v[e], __fadd_rn(__fsqrt_rn(vv.v[e]), a.eps)), a.update_clip);
    }
    if (a.weight_decay > 0.0f) {
      const Group pv = Load4<kVec>(p, i, n);
#pragma unroll
      for (size_t e = 0; e < kGroup; ++e) uv.v[e] = fmaf(a.weight_decay, pv.v[e], uv.v[e]);
    }
    Store4<kVec>(u, i, n, uv);
  }
}

template <bool kVec>
__global__ void AxpyKernel(float alpha, const float* x, float* y, size_t n) {
  for (size_t i = FirstElement(); i < n; i += ElementStride()) {
    const Group xv = Load4<kVec>(x, i, n);
    Group yv = Load4<kVec>(y, i, n);
#pragma unroll
    for (size_t e = 0; e < kGroup; ++e) yv.v[e] = fmaf(alpha, xv.v[e], yv.v[e]);
    Store4<kVec>(y, i, n, yv);
  }
}

template <bool kVec>
__global__ void ScaleKernel(float alpha, float* x, size_t n) {
  for (size_t i = FirstElement(); i < n; i += ElementStride()) {
    Group xv = Load4<kVec>(x, i, n);
#pragma unroll
    for (size_t e = 0; e < kGroup; ++e) xv.v[e] = __fmul_rn(xv.v[e], alpha);
    Store4<kVec>(x, i, n, xv);
  }
}

template <bool kVec>
__global__ void ApplyMaskKernel(const float* mask, float* x, size_t n) {
  for (size_t i = FirstElement(); i < n; i += ElementStride()) {
    const Group mk = Load4<kVec>(mask, i, n);
    Group xv = Load4<kVec>(x, i, n);
#pragma unroll
    for (size_t e = 0; e < kGroup; ++e) xv.v[e] = __fmul_rn(xv.v[e], mk.v[e]);
    Store4<kVec>(x, i, n, xv);
  }
}

// seen is written only where g is nonzero (or NaN): element by element.
template <bool kVec>
__global__ void MarkNonzeroKernel(const float* g, float* seen, size_t n) {
  for (size_t i = FirstElement(); i < n; i += ElementStride()) {
    const Group gv = Load4<kVec>(g, i, n);
#pragma unroll
    for (size_t e = 0; e < kGroup; ++e) {
      if (i + e < n && (gv.v[e] != 0.0f || isnan(gv.v[e]))) seen[i + e] = 1.0f;
    }
  }
}

template <bool kVec>
__global__ void FreshVarianceKernel(float beta1, float one_minus_beta1, float beta2,
                                    float one_minus_beta2, const float* m, const float* m_last,
                                    float* v_fresh, size_t n) {
  for (size_t i = FirstElement(); i < n; i += ElementStride()) {
    const Group mv = Load4<kVec>(m, i, n), lv = Load4<kVec>(m_last, i, n);
    Group fv = Load4<kVec>(v_fresh, i, n);
#pragma unroll
    for (size_t e = 0; e < kGroup; ++e) {
      const float g = __fdiv_rn(fmaf(-beta1, lv.v[e], mv.v[e]), one_minus_beta1);
      fv.v[e] = fmaf(beta2, fv.v[e], __fmul_rn(__fmul_rn(one_minus_beta2, g), g));
    }
    Store4<kVec>(v_fresh, i, n, fv);
  }
}

// The ratios are >= 0 (or a NaN, whose bits as produced here are above +inf's), so the
// largest float is the largest unsigned bit pattern: atomicMax on the bits, in any order.
template <bool kVec>
__global__ void MaxDenomRatioKernel(float eps, const float* v, const float* v_fresh, size_t n,
                                    unsigned* max_bits) {
  unsigned local = 0;
  for (size_t i = FirstElement(); i < n; i += ElementStride()) {
    const Group vv = Load4<kVec>(v, i, n), fv = Load4<kVec>(v_fresh, i, n);
#pragma unroll
    for (size_t e = 0; e < kGroup; ++e) {
      if (i + e >= n) break;
      float r = __fdiv_rn(__fadd_rn(__fsqrt_rn(vv.v[e]), eps),
                          __fadd_rn(__fsqrt_rn(fv.v[e]), eps));
      if (isnan(r)) r = __int_as_float(0x7fffffff);
      local = max(local, __float_as_uint(r));
    }
  }
  for (int offset = 16; offset > 0; offset >>= 1) {
    local = max(local, __shfl_down_sync(0xffffffffu, local, offset));
  }
  if ((threadIdx.x & 31) == 0 && local != 0) atomicMax(max_bits, local);
}

AdamArgs MakeAdamArgs(const AdamHyper& h) {
  // Host float arithmetic is IEEE binary32 too, so 1 - beta matches the CPU backend's.
  return AdamArgs{h.beta1, 1.0f - h.beta1, h.beta2,         1.0f - h.beta2,
                  -h.lr,   h.eps,          h.weight_decay, h.update_clip};
}

size_t CeilDiv(size_t a, size_t b) { return (a + b - 1) / b; }

// Whether a kernel may run with kVec (see "Bandwidth"): every float array it touches starts
// on a 16-byte boundary (a null array counts as aligned).
template <typename... T>
bool Vec(const T*... arrays) {
  return ((reinterpret_cast<uintptr_t>(arrays) % 16 == 0) && ...);
}

// The same for rows of `count` floats laid end to end, and their output.
bool RowsVec(const float* rows, size_t count, const float* out) {
  return count % kGroup == 0 && Vec(rows, out);
}

// ---------------------------------------------------------------------------------------
// The backend

// Adds the nanoseconds of its lifetime to *total: the time of a host copy (started once
// the stream is idle, so that no kernel's time is counted).
class CopyTimer {
 public:
  explicit CopyTimer(std::atomic<uint64_t>* total)
      : total_(total), start_(std::chrono::steady_clock::now()) {}
  ~CopyTimer() {
    total_->fetch_add(static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                                std::chrono::steady_clock::now() - start_)
                                                .count()),
                      std::memory_order_relaxed);
  }

 private:
  std::atomic<uint64_t>* total_;
  std::chrono::steady_clock::time_point start_;
};

// A reduction's result on its way to the host, in pinned memory: the copy is one DMA queued
// behind the kernel and the host waits once (a copy into pageable memory is staged by the
// driver and needs a wait of its own first).
struct HostResults {
  double total;
  unsigned max_bits;
};

class CudaBackend final : public Backend {
 public:
  // Takes ownership of `stream`, `scratch` (device memory, arrivals == 0) and `results`
  // (pinned host memory).
  CudaBackend(int device, int num_sms, cudaStream_t stream, ReductionScratch* scratch,
              HostResults* results)
      : device_(device),
        // Enough 256-thread blocks to fill every SM (2048 resident threads on sm_80/sm_90);
        // the kernels loop over the rest.
        max_blocks_(static_cast<size_t>(std::max(num_sms, 1)) * 8),
        stream_(stream),
        scratch_(scratch),
        results_(results) {}

  ~CudaBackend() override {
    // Errors here mean the context is already broken; there is nobody left to report to.
    cudaSetDevice(device_);
    cudaStreamSynchronize(stream_);
    cudaFree(scratch_);
    cudaFreeHost(results_);
    if (ranges_ != nullptr) cudaFree(ranges_);
    cudaStreamDestroy(stream_);
  }

  std::string name() const override { return absl::StrCat("cuda:", device_); }
  MemorySpace memory_space() const override { return MemorySpace::kCuda; }

  cudaStream_t stream() const { return stream_; }
  void set_server_bit_loads(ServerBitLoads loads) { server_bit_loads_ = loads; }

  absl::StatusOr<void*> Allocate(size_t bytes) override {
    ONEBIT_RETURN_IF_ERROR(Activate());
    void* ptr = nullptr;
    // cudaMalloc(0) may return null; one byte keeps pointers unique and non-null.
    ONEBIT_CUDA_RETURN_IF_ERROR(cudaMalloc(&ptr, std::max<size_t>(bytes, 1)));
    return ptr;
  }

  void Free(void* ptr) override {
    if (ptr == nullptr) return;
    // cudaFree waits for the device, so queued kernels that use ptr finish first. A failure
    // means a broken context, which the next call that returns a Status reports.
    if (cudaSetDevice(device_) == cudaSuccess) cudaFree(ptr);
  }

  absl::Status Zero(void* ptr, size_t bytes) override {
    if (bytes == 0) return absl::OkStatus();
    ONEBIT_RETURN_IF_ERROR(Activate());
    ONEBIT_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(ptr, 0, bytes, stream_));
    return absl::OkStatus();
  }

  absl::StatusOr<void*> AllocateHost(size_t bytes) override {
    ONEBIT_RETURN_IF_ERROR(Activate());
    void* ptr = nullptr;
    ONEBIT_CUDA_RETURN_IF_ERROR(cudaMallocHost(&ptr, std::max<size_t>(bytes, 1)));
    return ptr;
  }

  void FreeHost(void* ptr) override {
    if (ptr == nullptr) return;
    if (cudaSetDevice(device_) == cudaSuccess) cudaFreeHost(ptr);
  }

  HostTransfers host_transfers() const override {
    return {to_host_.load(std::memory_order_relaxed), from_host_.load(std::memory_order_relaxed),
            1e-9 * static_cast<double>(copy_ns_.load(std::memory_order_relaxed))};
  }

  absl::Status CopyFromHost(void* dst, const void* host_src, size_t bytes) override {
    return HostCopy(dst, host_src, bytes, cudaMemcpyHostToDevice, from_host_);
  }

  absl::Status CopyToHost(void* host_dst, const void* src, size_t bytes) override {
    return HostCopy(host_dst, src, bytes, cudaMemcpyDeviceToHost, to_host_);
  }

  absl::Status Copy(void* dst, const void* src, size_t bytes) override {
    if (bytes == 0) return absl::OkStatus();
    ONEBIT_RETURN_IF_ERROR(Activate());
    ONEBIT_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_));
    return absl::OkStatus();
  }

  absl::Status Synchronize() override {
    ONEBIT_RETURN_IF_ERROR(Activate());
    ONEBIT_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    return absl::OkStatus();
  }

  absl::Status MomentumUpdate(float beta1, const float* g, float* m, size_t n) override {
    if (n == 0) return absl::OkStatus();
    ONEBIT_RETURN_IF_ERROR(Activate());
    const auto kernel = Vec(g, m) ? MomentumKernel<true> : MomentumKernel<false>;
    kernel<<<GroupBlocks(n), kThreads, 0, stream_>>>(beta1, 1.0f - beta1, g, m, n);
    ONEBIT_CUDA_RETURN_IF_LAUNCH_ERROR();
    return absl::OkStatus();
  }

  absl::Status CompressWorker(const float* m, const float* g, float beta1, size_t n,
                              size_t num_chunks, size_t chunk, float* err,
                              uint8_t* out) override {
    ONEBIT_RETURN_IF_ERROR(CheckChunking(num_chunks, chunk, n));
    ONEBIT_RETURN_IF_ERROR(Activate());
    const size_t n_pad = num_chunks * chunk;
    if (n_pad == 0) return ZeroScales(out, num_chunks);
    const bool vec = Vec(m, g, err);
    const auto input = g != nullptr ? (vec ? WorkerInputKernel<true, true>
                                           : WorkerInputKernel<true, false>)
                                    : (vec ? WorkerInputKernel<false, true>
                                           : WorkerInputKernel<false, false>);
    input<<<ReduceBlocks(n_pad), kThreads, 0, stream_>>>(m, g, beta1, 1.0f - beta1, n, n_pad,
                                                         err, scratch_);
    ONEBIT_CUDA_RETURN_IF_LAUNCH_ERROR();
    const auto pack = vec ? SignPackKernel<true> : SignPackKernel<false>;
    pack<<<ChunkGrid(num_chunks, chunk), kThreads, 0, stream_>>>(
        &scratch_->total, n_pad, num_chunks, chunk, CompressedBlockBytes(chunk), err, out);
    ONEBIT_CUDA_RETURN_IF_LAUNCH_ERROR();
    return absl::OkStatus();
  }

  absl::Status ServerAggregate(const uint8_t* blocks, int num_workers, size_t chunk,
                               float* err, uint8_t* out) override {
    if (num_workers < 1) {
      return absl::InvalidArgumentError(absl::StrCat("num_workers = ", num_workers));
    }
    ONEBIT_RETURN_IF_ERROR(CheckChunking(1, chunk, chunk));
    ONEBIT_RETURN_IF_ERROR(Activate());
    if (chunk == 0) return ZeroScales(out, 1);
    const float inv_w = 1.0f / static_cast<float>(num_workers);
    const bool vec = Vec(err);
    const size_t block_bytes = CompressedBlockBytes(chunk);
    const bool words_aligned =
        chunk % 32 == 0 && reinterpret_cast<uintptr_t>(blocks) % alignof(unsigned) == 0;
    if (server_bit_loads_ == ServerBitLoads::kWarpWords2 && words_aligned) {
      const auto input = vec ? ServerInputWordsKernel<2, true> : ServerInputWordsKernel<2, false>;
      input<<<ServerWordsBlocks<2>(chunk), kThreads, 0, stream_>>>(
          blocks, block_bytes, num_workers, chunk, inv_w, err, scratch_);
    } else if (server_bit_loads_ == ServerBitLoads::kWarpWords4 && words_aligned) {
      const auto input = vec ? ServerInputWordsKernel<4, true> : ServerInputWordsKernel<4, false>;
      input<<<ServerWordsBlocks<4>(chunk), kThreads, 0, stream_>>>(
          blocks, block_bytes, num_workers, chunk, inv_w, err, scratch_);
    } else {
      const auto input = vec ? ServerInputKernel<true> : ServerInputKernel<false>;
      input<<<ReduceBlocks(chunk), kThreads, 0, stream_>>>(blocks, block_bytes, num_workers,
                                                           chunk, inv_w, err, scratch_);
    }
    ONEBIT_CUDA_RETURN_IF_LAUNCH_ERROR();
    const auto pack = vec ? SignPackKernel<true> : SignPackKernel<false>;
    pack<<<ChunkGrid(1, chunk), kThreads, 0, stream_>>>(
        &scratch_->total, chunk, 1, chunk, CompressedBlockBytes(chunk), err, out);
    ONEBIT_CUDA_RETURN_IF_LAUNCH_ERROR();
    return absl::OkStatus();
  }

  absl::Status Decompress(const uint8_t* blocks, size_t num_chunks, size_t chunk, size_t n,
                          float* out) override {
    ONEBIT_RETURN_IF_ERROR(CheckChunking(num_chunks, chunk, n));
    if (n == 0) return absl::OkStatus();
    ONEBIT_RETURN_IF_ERROR(Activate());
    const auto kernel = Vec(out) ? DecompressKernel<true> : DecompressKernel<false>;
    kernel<<<ChunkGrid(CeilDiv(n, chunk), chunk), kThreads, 0, stream_>>>(
        blocks, CompressedBlockBytes(chunk), num_chunks, chunk, n, out);
    ONEBIT_CUDA_RETURN_IF_LAUNCH_ERROR();
    return absl::OkStatus();
  }

  absl::Status CompressWorkerInt8(const float* m, const float* g, float beta1, size_t n,
                                  size_t num_chunks, size_t chunk, float* err,
                                  uint8_t* out) override {
    ONEBIT_RETURN_IF_ERROR(CheckChunking(num_chunks, chunk, n));
    ONEBIT_RETURN_IF_ERROR(Activate());
    if (num_chunks == 0) return absl::OkStatus();
    if (chunk == 0) return ZeroInt8Headers(out, num_chunks);
    ONEBIT_ASSIGN_OR_RETURN(Int8Ranges ranges, ResetRanges(num_chunks));
    const dim3 grid = ChunkGrid(num_chunks, chunk);
    const bool vec = Vec(m, g, err);
    const auto input = g != nullptr ? (vec ? WorkerInputInt8Kernel<true, true>
                                           : WorkerInputInt8Kernel<true, false>)
                                    : (vec ? WorkerInputInt8Kernel<false, true>
                                           : WorkerInputInt8Kernel<false, false>);
    input<<<grid, kThreads, 0, stream_>>>(m, g, beta1, 1.0f - beta1, n, num_chunks, chunk, err,
                                          ranges);
    ONEBIT_CUDA_RETURN_IF_LAUNCH_ERROR();
    const auto quantize = vec ? QuantizeInt8Kernel<true> : QuantizeInt8Kernel<false>;
    quantize<<<grid, kThreads, 0, stream_>>>(ranges, num_chunks, chunk, Int8BlockBytes(chunk),
                                             err, out);
    ONEBIT_CUDA_RETURN_IF_LAUNCH_ERROR();
    return absl::OkStatus();
  }

  absl::Status ServerAggregateInt8(const uint8_t* blocks, int num_workers, size_t chunk,
                                   float* err, uint8_t* out) override {
    if (num_workers < 1) {
      return absl::InvalidArgumentError(absl::StrCat("num_workers = ", num_workers));
    }
    ONEBIT_RETURN_IF_ERROR(CheckChunking(1, chunk, chunk));
    ONEBIT_RETURN_IF_ERROR(Activate());
    if (chunk == 0) return ZeroInt8Headers(out, 1);
    ONEBIT_ASSIGN_OR_RETURN(Int8Ranges ranges, ResetRanges(1));
    const float inv_w = 1.0f / static_cast<float>(num_workers);
    const bool vec = Vec(err);
    const auto input = vec ? ServerInputInt8Kernel<true> : ServerInputInt8Kernel<false>;
    input<<<GroupBlocks(chunk), kThreads, 0, stream_>>>(
        blocks, Int8BlockBytes(chunk), num_workers, chunk, inv_w, err, ranges);
    ONEBIT_CUDA_RETURN_IF_LAUNCH_ERROR();
    const auto quantize = vec ? QuantizeInt8Kernel<true> : QuantizeInt8Kernel<false>;
    quantize<<<ChunkGrid(1, chunk), kThreads, 0, stream_>>>(
        ranges, 1, chunk, Int8BlockBytes(chunk), err, out);
    ONEBIT_CUDA_RETURN_IF_LAUNCH_ERROR();
    return absl::OkStatus();
  }

  absl::Status DecompressInt8(const uint8_t* blocks, size_t num_chunks, size_t chunk, size_t n,
                              float* out) override {
    ONEBIT_RETURN_IF_ERROR(CheckChunking(num_chunks, chunk, n));
    if (n == 0) return absl::OkStatus();
    ONEBIT_RETURN_IF_ERROR(Activate());
    const auto kernel = Vec(out) ? DecompressInt8Kernel<true> : DecompressInt8Kernel<false>;
    kernel<<<ChunkGrid(CeilDiv(n, chunk), chunk), kThreads, 0, stream_>>>(
        blocks, Int8BlockBytes(chunk), num_chunks, chunk, n, out);
    ONEBIT_CUDA_RETURN_IF_LAUNCH_ERROR();
    return absl::OkStatus();
  }

  absl::Status SumRows(const float* rows, int num_rows, size_t count, float* out) override {
    if (num_rows < 0) {
      return absl::InvalidArgumentError(absl::StrCat("num_rows = ", num_rows));
    }
    if (count == 0) return absl::OkStatus();
    ONEBIT_RETURN_IF_ERROR(Activate());
    const auto kernel = RowsVec(rows, count, out) ? SumRowsKernel<false, true>
                                                  : SumRowsKernel<false, false>;
    kernel<<<GroupBlocks(count), kThreads, 0, stream_>>>(rows, num_rows, count, 1.0f, out);
    ONEBIT_CUDA_RETURN_IF_LAUNCH_ERROR();
    return absl::OkStatus();
  }

  absl::Status AverageRows(const float* rows, int num_rows, size_t count, float* out) override {
    if (num_rows < 1) {
      return absl::InvalidArgumentError(absl::StrCat("num_rows = ", num_rows));
    }
    if (count == 0) return absl::OkStatus();
    ONEBIT_RETURN_IF_ERROR(Activate());
    const auto kernel = RowsVec(rows, count, out) ? SumRowsKernel<true, true>
                                                  : SumRowsKernel<true, false>;
    kernel<<<GroupBlocks(count), kThreads, 0, stream_>>>(
        rows, num_rows, count, 1.0f / static_cast<float>(num_rows), out);
    ONEBIT_CUDA_RETURN_IF_LAUNCH_ERROR();
    return absl::OkStatus();
  }

  absl::Status AdamWarmupUpdate(const AdamHyper& h, const float* g, float grad_scale, float* m,
                                float* v, float* p, size_t n) override {
    if (n == 0) return absl::OkStatus();
    ONEBIT_RETURN_IF_ERROR(Activate());
    const auto kernel = Vec(g, m, v, p) ? AdamWarmupKernel<true> : AdamWarmupKernel<false>;
    kernel<<<GroupBlocks(n), kThreads, 0, stream_>>>(MakeAdamArgs(h), g, grad_scale, m, v, p, n);
    ONEBIT_CUDA_RETURN_IF_LAUNCH_ERROR();
    return absl::OkStatus();
  }

  absl::Status FrozenAdamUpdate(const AdamHyper& h, const float* v, const float* mask,
                                float* m, float* p, size_t n) override {
    if (n == 0) return absl::OkStatus();
    ONEBIT_RETURN_IF_ERROR(Activate());
    const auto kernel = Vec(v, mask, m, p) ? FrozenAdamKernel<true> : FrozenAdamKernel<false>;
    kernel<<<GroupBlocks(n), kThreads, 0, stream_>>>(MakeAdamArgs(h), v, mask, m, p, n);
    ONEBIT_CUDA_RETURN_IF_LAUNCH_ERROR();
    return absl::OkStatus();
  }

  absl::Status DecompressFrozenAdamUpdate(const uint8_t* blocks, size_t num_chunks,
                                          size_t chunk, const AdamHyper& h, const float* v,
                                          const float* mask, float* m, float* p,
                                          size_t n) override {
    ONEBIT_RETURN_IF_ERROR(CheckChunking(num_chunks, chunk, n));
    if (n == 0) return absl::OkStatus();
    ONEBIT_RETURN_IF_ERROR(Activate());
    const auto kernel = Vec(v, mask, m, p) ? DecompressFrozenAdamKernel<true>
                                           : DecompressFrozenAdamKernel<false>;
    kernel<<<ChunkGrid(CeilDiv(n, chunk), chunk), kThreads, 0, stream_>>>(blocks, CompressedBlockBytes(chunk), num_chunks,
                                            chunk, MakeAdamArgs(h), v, mask, m, p, n);
    ONEBIT_CUDA_RETURN_IF_LAUNCH_ERROR();
    return absl::OkStatus();
  }

  absl::Status SumSquares(const float* x, size_t n, double* host_result) override {
    ONEBIT_RETURN_IF_ERROR(Activate());
    if (n == 0) {
      ONEBIT_CUDA_RETURN_IF_ERROR(
          cudaMemsetAsync(&scratch_->total, 0, sizeof(double), stream_));
    } else {
      const auto kernel = Vec(x) ? SumSquaresKernel<true> : SumSquaresKernel<false>;
      kernel<<<ReduceBlocks(n), kThreads, 0, stream_>>>(x, n, scratch_);
      ONEBIT_CUDA_RETURN_IF_LAUNCH_ERROR();
    }
    ONEBIT_RETURN_IF_ERROR(ResultToHost(&results_->total, &scratch_->total));
    *host_result = results_->total;
    return absl::OkStatus();
  }

  absl::Status ZeroOneLocalUpdate(const AdamHyper& h, const float* g, const float* v, float* m,
                                  float* p, float* acc, size_t n) override {
    if (n == 0) return absl::OkStatus();
    ONEBIT_RETURN_IF_ERROR(Activate());
    const auto kernel = Vec(g, v, m, p, acc) ? ZeroOneLocalKernel<true> : ZeroOneLocalKernel<false>;
    kernel<<<GroupBlocks(n), kThreads, 0, stream_>>>(MakeAdamArgs(h), g, v, m, p, acc, n);
    ONEBIT_CUDA_RETURN_IF_LAUNCH_ERROR();
    return absl::OkStatus();
  }

  absl::Status ZeroOneSyncPrepare(float eps, const float* v, float* acc, size_t n) override {
    if (n == 0) return absl::OkStatus();
    ONEBIT_RETURN_IF_ERROR(Activate());
    const auto kernel = Vec(v, acc) ? ZeroOneSyncPrepareKernel<true> : ZeroOneSyncPrepareKernel<false>;
    kernel<<<GroupBlocks(n), kThreads, 0, stream_>>>(eps, v, acc, n);
    ONEBIT_CUDA_RETURN_IF_LAUNCH_ERROR();
    return absl::OkStatus();
  }

  absl::Status ZeroOneSyncApply(float eps, float lrs, const float* v, const float* mask,
                                const float* avg, float* m, float* anchor, float* p,
                                size_t n) override {
    if (n == 0) return absl::OkStatus();
    ONEBIT_RETURN_IF_ERROR(Activate());
    const auto kernel = Vec(v, mask, avg, m, anchor, p) ? ZeroOneSyncApplyKernel<true>
                                                        : ZeroOneSyncApplyKernel<false>;
    kernel<<<GroupBlocks(n), kThreads, 0, stream_>>>(eps, lrs, v, mask, avg, m,
                                                                 anchor, p, n);
    ONEBIT_CUDA_RETURN_IF_LAUNCH_ERROR();
    return absl::OkStatus();
  }

  absl::Status AdamMomentsUpdate(const AdamHyper& h, const float* g, float grad_scale, float* m,
                                 float* v, size_t n) override {
    if (n == 0) return absl::OkStatus();
    ONEBIT_RETURN_IF_ERROR(Activate());
    const auto kernel = Vec(g, m, v) ? AdamMomentsKernel<true> : AdamMomentsKernel<false>;
    kernel<<<GroupBlocks(n), kThreads, 0, stream_>>>(MakeAdamArgs(h), g, grad_scale, m, v,
                                                            n);
    ONEBIT_CUDA_RETURN_IF_LAUNCH_ERROR();
    return absl::OkStatus();
  }

  absl::Status AdamDirectionInto(const AdamHyper& h, const float* m, const float* v,
                                 const float* p, float* u, size_t n) override {
    if (n == 0) return absl::OkStatus();
    ONEBIT_RETURN_IF_ERROR(Activate());
    const auto kernel = Vec(m, v, p, u) ? AdamDirectionKernel<true> : AdamDirectionKernel<false>;
    kernel<<<GroupBlocks(n), kThreads, 0, stream_>>>(MakeAdamArgs(h), m, v, p, u, n);
    ONEBIT_CUDA_RETURN_IF_LAUNCH_ERROR();
    return absl::OkStatus();
  }

  absl::Status Axpy(float a, const float* x, float* y, size_t n) override {
    if (n == 0) return absl::OkStatus();
    ONEBIT_RETURN_IF_ERROR(Activate());
    const auto kernel = Vec(x, y) ? AxpyKernel<true> : AxpyKernel<false>;
    kernel<<<GroupBlocks(n), kThreads, 0, stream_>>>(a, x, y, n);
    ONEBIT_CUDA_RETURN_IF_LAUNCH_ERROR();
    return absl::OkStatus();
  }

  absl::Status Scale(float a, float* x, size_t n) override {
    if (n == 0) return absl::OkStatus();
    ONEBIT_RETURN_IF_ERROR(Activate());
    const auto kernel = Vec(x) ? ScaleKernel<true> : ScaleKernel<false>;
    kernel<<<GroupBlocks(n), kThreads, 0, stream_>>>(a, x, n);
    ONEBIT_CUDA_RETURN_IF_LAUNCH_ERROR();
    return absl::OkStatus();
  }

  absl::Status ApplyMask(const float* mask, float* x, size_t n) override {
    if (n == 0) return absl::OkStatus();
    ONEBIT_RETURN_IF_ERROR(Activate());
    const auto kernel = Vec(mask, x) ? ApplyMaskKernel<true> : ApplyMaskKernel<false>;
    kernel<<<GroupBlocks(n), kThreads, 0, stream_>>>(mask, x, n);
    ONEBIT_CUDA_RETURN_IF_LAUNCH_ERROR();
    return absl::OkStatus();
  }

  absl::Status MarkNonzero(const float* g, float* seen, size_t n) override {
    if (n == 0) return absl::OkStatus();
    ONEBIT_RETURN_IF_ERROR(Activate());
    const auto kernel = Vec(g, seen) ? MarkNonzeroKernel<true> : MarkNonzeroKernel<false>;
    kernel<<<GroupBlocks(n), kThreads, 0, stream_>>>(g, seen, n);
    ONEBIT_CUDA_RETURN_IF_LAUNCH_ERROR();
    return absl::OkStatus();
  }

  absl::Status FreshVarianceUpdate(float beta1, float beta2, const float* m, const float* m_last,
                                   float* v_fresh, size_t n) override {
    if (n == 0) return absl::OkStatus();
    ONEBIT_RETURN_IF_ERROR(Activate());
    const auto kernel =
        Vec(m, m_last, v_fresh) ? FreshVarianceKernel<true> : FreshVarianceKernel<false>;
    kernel<<<GroupBlocks(n), kThreads, 0, stream_>>>(beta1, 1.0f - beta1, beta2,
                                                              1.0f - beta2, m, m_last, v_fresh, n);
    ONEBIT_CUDA_RETURN_IF_LAUNCH_ERROR();
    return absl::OkStatus();
  }

  absl::Status MaxDenomRatio(float eps, const float* v, const float* v_fresh, size_t n,
                             float* host_result) override {
    ONEBIT_RETURN_IF_ERROR(Activate());
    ONEBIT_CUDA_RETURN_IF_ERROR(
        cudaMemsetAsync(&scratch_->max_bits, 0, sizeof(unsigned), stream_));
    if (n > 0) {
      const auto kernel = Vec(v, v_fresh) ? MaxDenomRatioKernel<true> : MaxDenomRatioKernel<false>;
      kernel<<<GroupBlocks(n), kThreads, 0, stream_>>>(eps, v, v_fresh, n,
                                                                &scratch_->max_bits);
      ONEBIT_CUDA_RETURN_IF_LAUNCH_ERROR();
    }
    ONEBIT_RETURN_IF_ERROR(ResultToHost(&results_->max_bits, &scratch_->max_bits));
    static_assert(sizeof(float) == sizeof(unsigned), "max_bits holds a float's bits");
    std::memcpy(host_result, &results_->max_bits, sizeof(float));
    return absl::OkStatus();
  }

  absl::Status ToWire(WireDtype dtype, const float* x, size_t n, void* out) override {
    if (n == 0) return absl::OkStatus();
    ONEBIT_RETURN_IF_ERROR(Activate());
    if (dtype == WireDtype::kFp32) return CopyFloats(x, n, out);
    return LaunchWire16(dtype, [&](auto d) {
      ToWireKernel<decltype(d)::value><<<Blocks(n), kThreads, 0, stream_>>>(x, n, out);
    });
  }

  absl::Status SumWireRows(WireDtype dtype, const void* rows, int num_rows, size_t count,
                           float* out) override {
    if (num_rows < 0) {
      return absl::InvalidArgumentError(absl::StrCat("num_rows = ", num_rows));
    }
    if (count == 0) return absl::OkStatus();
    ONEBIT_RETURN_IF_ERROR(Activate());
    if (dtype == WireDtype::kFp32) {
      return SumRows(static_cast<const float*>(rows), num_rows, count, out);
    }
    return LaunchWire16(dtype, [&](auto d) {
      SumWireRowsKernel<decltype(d)::value>
          <<<Blocks(count), kThreads, 0, stream_>>>(rows, num_rows, count, out);
    });
  }

  absl::Status WireToFloat(WireDtype dtype, const void* in, size_t n, float* out) override {
    if (n == 0) return absl::OkStatus();
    ONEBIT_RETURN_IF_ERROR(Activate());
    if (dtype == WireDtype::kFp32) return CopyFloats(in, n, out);
    return LaunchWire16(dtype, [&](auto d) {
      WireToFloatKernel<decltype(d)::value><<<Blocks(n), kThreads, 0, stream_>>>(in, n, out);
    });
  }

 private:
  // A copy between the host and the device, counted in `bytes_counter`, timed alone (the
  // kernels queued before it finish first), and finished when it returns: CUDA may still
  // read host memory after cudaMemcpyAsync returns (always pinned, sometimes pageable), and
  // callers written against Backend reuse the buffer at once, as with the CPU backend.
  absl::Status HostCopy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                        std::atomic<uint64_t>& bytes_counter) {
    if (bytes == 0) return absl::OkStatus();
    ONEBIT_RETURN_IF_ERROR(Activate());
    bytes_counter.fetch_add(bytes, std::memory_order_relaxed);
    ONEBIT_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    const CopyTimer timer(&copy_ns_);
    ONEBIT_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, bytes, kind, stream_));
    ONEBIT_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    return absl::OkStatus();
  }

  // The fp32 wire is the floats themselves: a copy on the stream unless in place.
  absl::Status CopyFloats(const void* from, size_t n, void* to) {
    if (from != to) {
      ONEBIT_CUDA_RETURN_IF_ERROR(
          cudaMemcpyAsync(to, from, n * sizeof(float), cudaMemcpyDeviceToDevice, stream_));
    }
    return absl::OkStatus();
  }

  // Calls launch(std::integral_constant<WireDtype, D>) for a 16-bit wire dtype D, then
  // checks the launch; any other dtype is INVALID_ARGUMENT.
  template <typename Launch>
  static absl::Status LaunchWire16(WireDtype dtype, Launch launch) {
    switch (dtype) {
      case WireDtype::kBf16:
        launch(std::integral_constant<WireDtype, WireDtype::kBf16>());
        break;
      case WireDtype::kFp16:
        launch(std::integral_constant<WireDtype, WireDtype::kFp16>());
        break;
      default:
        return absl::InvalidArgumentError("unknown wire dtype");
    }
    ONEBIT_CUDA_RETURN_IF_LAUNCH_ERROR();
    return absl::OkStatus();
  }

  // The calling thread's current device may be another backend's.
  absl::Status Activate() const {
    ONEBIT_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    return absl::OkStatus();
  }

  // A reduction's result, queued behind its kernel, into `pinned` (a member of results_);
  // the host waits once. Counted in host_transfers()' bytes; its time is the kernel's as
  // much as the copy's, so it is left out of their copy time.
  template <typename T>
  absl::Status ResultToHost(T* pinned, const T* device_src) {
    to_host_.fetch_add(sizeof(T), std::memory_order_relaxed);
    ONEBIT_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(pinned, device_src, sizeof(T), cudaMemcpyDeviceToHost, stream_));
    ONEBIT_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    return absl::OkStatus();
  }

  // The grid of the elementwise kernels, n > 0. Not for reductions: it depends on the SM
  // count (they use ReduceBlocks).
  unsigned Blocks(size_t n) const {
    return static_cast<unsigned>(std::min(CeilDiv(n, kThreads), max_blocks_));
  }

  // The grid of the kernels that walk n elements in groups of kGroup.
  unsigned GroupBlocks(size_t n) const { return Blocks(CeilDiv(n, kGroup)); }

  // grid.y over chunks, grid.x over the groups of a chunk, about max_blocks_ blocks in all.
  // num_chunks > 0, chunk > 0.
  dim3 ChunkGrid(size_t num_chunks, size_t chunk) const {
    const size_t y = std::min(num_chunks, kMaxGridY);
    const size_t x = std::min(std::max<size_t>(max_blocks_ / y, 1),
                              CeilDiv(chunk, kThreads * kGroup));
    return dim3(static_cast<unsigned>(x), static_cast<unsigned>(y));
  }

  // Blocks of chunk 0 are bare scales, and their scale is 0 (a float 0 is all zero bytes).
  absl::Status ZeroScales(uint8_t* out, size_t num_chunks) {
    if (num_chunks == 0) return absl::OkStatus();
    ONEBIT_CUDA_RETURN_IF_ERROR(
        cudaMemsetAsync(out, 0, num_chunks * CompressedBlockBytes(0), stream_));
    return absl::OkStatus();
  }

  // int8 headers of empty chunks: scale 0, offset 0.
  absl::Status ZeroInt8Headers(uint8_t* out, size_t num_chunks) {
    ONEBIT_CUDA_RETURN_IF_ERROR(
        cudaMemsetAsync(out, 0, num_chunks * Int8BlockBytes(0), stream_));
    return absl::OkStatus();
  }

  // The int8 ranges of num_chunks chunks, reset on the stream (grown as needed; growing
  // waits for the kernels that may still use the old memory).
  absl::StatusOr<Int8Ranges> ResetRanges(size_t num_chunks) {
    if (num_chunks > ranges_capacity_) {
      ONEBIT_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
      if (ranges_ != nullptr) cudaFree(ranges_);
      ranges_ = nullptr;
      ranges_capacity_ = 0;
      ONEBIT_CUDA_RETURN_IF_ERROR(
          cudaMalloc(reinterpret_cast<void**>(&ranges_), 3 * num_chunks * sizeof(unsigned)));
      ranges_capacity_ = num_chunks;
    }
    Int8Ranges r{ranges_, ranges_ + num_chunks, ranges_ + 2 * num_chunks};
    ONEBIT_CUDA_RETURN_IF_ERROR(
        cudaMemsetAsync(r.min_key, 0xff, num_chunks * sizeof(unsigned), stream_));
    ONEBIT_CUDA_RETURN_IF_ERROR(
        cudaMemsetAsync(r.max_key, 0, 2 * num_chunks * sizeof(unsigned), stream_));
    return r;
  }

  const int device_;
  const size_t max_blocks_;
  const cudaStream_t stream_;
  // The reductions' partials and result. Stream order makes one enough: the next
  // reduction is queued after the previous one's last reader.
  ReductionScratch* const scratch_;
  HostResults* const results_;  // pinned: the reductions' results for the host
  unsigned* ranges_ = nullptr;  // int8: 3 * ranges_capacity_ (ResetRanges)
  size_t ranges_capacity_ = 0;
  // host_transfers(); atomic so that a metrics thread may read them.
  std::atomic<uint64_t> to_host_{0}, from_host_{0}, copy_ns_{0};
  ServerBitLoads server_bit_loads_ = ServerBitLoads::kThreadBytes;
};

}  // namespace

bool CudaBuilt() { return true; }

int CudaDeviceCount() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    // No driver or no device: clear the error so that it does not leak into later calls.
    cudaGetLastError();
    return 0;
  }
  return count;
}

absl::StatusOr<std::unique_ptr<Backend>> NewCudaBackend(int device) {
  const int count = CudaDeviceCount();
  if (device < 0 || device >= count) {
    return absl::UnavailableError(
        absl::StrCat("no CUDA device ", device, ": ", count,
                     " device(s) visible (no GPU, no driver, or CUDA_VISIBLE_DEVICES)"));
  }
  ONEBIT_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  int num_sms = 0;
  ONEBIT_CUDA_RETURN_IF_ERROR(
      cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, device));
  cudaStream_t stream = nullptr;
  // Non-blocking: the legacy default stream, which other libraries may use, does not
  // serialize against this backend's work.
  ONEBIT_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  ReductionScratch* scratch = nullptr;
  cudaError_t error = cudaMalloc(&scratch, sizeof(ReductionScratch));
  if (error != cudaSuccess) {
    cudaStreamDestroy(stream);
    return CudaErrorStatus(error, "cudaMalloc(&scratch, sizeof(ReductionScratch))", __FILE__,
                           __LINE__);
  }
  // On the backend's stream: a non-blocking stream is not ordered after the legacy one.
  error = cudaMemsetAsync(scratch, 0, sizeof(ReductionScratch), stream);
  if (error == cudaSuccess) error = cudaStreamSynchronize(stream);
  if (error != cudaSuccess) {
    cudaFree(scratch);
    cudaStreamDestroy(stream);
    return CudaErrorStatus(error, "cudaMemsetAsync(scratch, 0, ...)", __FILE__, __LINE__);
  }
  HostResults* results = nullptr;
  error = cudaMallocHost(&results, sizeof(HostResults));
  if (error != cudaSuccess) {
    cudaFree(scratch);
    cudaStreamDestroy(stream);
    return CudaErrorStatus(error, "cudaMallocHost(&results, sizeof(HostResults))", __FILE__,
                           __LINE__);
  }
  return std::unique_ptr<Backend>(new CudaBackend(device, num_sms, stream, scratch, results));
}

void* CudaStreamOf(Backend* backend) {
  auto* cuda = dynamic_cast<CudaBackend*>(backend);
  return cuda == nullptr ? nullptr : static_cast<void*>(cuda->stream());
}

absl::Status SetServerBitLoads(Backend* backend, ServerBitLoads loads) {
  auto* cuda = dynamic_cast<CudaBackend*>(backend);
  if (cuda == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "SetServerBitLoads: ", backend == nullptr ? "no backend" : backend->name(),
        " is not a CUDA backend"));
  }
  cuda->set_server_bit_loads(loads);
  return absl::OkStatus();
}

}  // namespace onebit::kernels
