// The CUDA kernels of 1-bit compression (kernels.h: CompressWorker, ServerAggregate,
// Decompress) and their launches (cuda_kernels.h).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda_backend.h"
#include "kernels/cuda_kernels.h"
#include "kernels/cuda_kernels_common.cuh"
#include "kernels/cuda_status.h"
#include "kernels/kernels.h"

namespace onebit::kernels::cuda {
namespace {

// s = float(sqrt(sumsq / n)) in float64, s = 0 when n = 0 (the contract's scale).
__device__ __forceinline__ float ScaleFromSumSquares(double sumsq, size_t n) {
  if (n == 0) return 0.0f;
  return __double2float_rn(__dsqrt_rn(__ddiv_rn(sumsq, static_cast<double>(n))));
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

}  // namespace

absl::Status CompressWorker(Launch launch, ReductionScratch* scratch, const float* m,
                            const float* g, float beta1, size_t n, size_t num_chunks,
                            size_t chunk, float* err, uint8_t* out) {
  const size_t n_pad = num_chunks * chunk;
  const bool vec = Vec(m, g, err);
  const auto input = g != nullptr ? (vec ? WorkerInputKernel<true, true>
                                         : WorkerInputKernel<true, false>)
                                  : (vec ? WorkerInputKernel<false, true>
                                         : WorkerInputKernel<false, false>);
  input<<<ReduceBlocks(n_pad), kThreads, 0, launch.stream>>>(m, g, beta1, 1.0f - beta1, n,
                                                             n_pad, err, scratch);
  ONEBIT_CUDA_RETURN_IF_LAUNCH_ERROR();
  const auto pack = vec ? SignPackKernel<true> : SignPackKernel<false>;
  pack<<<ChunkGrid(launch, num_chunks, chunk), kThreads, 0, launch.stream>>>(
      &scratch->total, n_pad, num_chunks, chunk, CompressedBlockBytes(chunk), err, out);
  ONEBIT_CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

absl::Status ServerAggregate(Launch launch, ReductionScratch* scratch, ServerBitLoads loads,
                             const uint8_t* blocks, int num_workers, size_t chunk, float* err,
                             uint8_t* out) {
  const float inv_w = 1.0f / static_cast<float>(num_workers);
  const bool vec = Vec(err);
  const size_t block_bytes = CompressedBlockBytes(chunk);
  const bool words_aligned =
      chunk % 32 == 0 && reinterpret_cast<uintptr_t>(blocks) % alignof(unsigned) == 0;
  if (loads == ServerBitLoads::kWarpWords2 && words_aligned) {
    const auto input = vec ? ServerInputWordsKernel<2, true> : ServerInputWordsKernel<2, false>;
    input<<<ServerWordsBlocks<2>(chunk), kThreads, 0, launch.stream>>>(
        blocks, block_bytes, num_workers, chunk, inv_w, err, scratch);
  } else if (loads == ServerBitLoads::kWarpWords4 && words_aligned) {
    const auto input = vec ? ServerInputWordsKernel<4, true> : ServerInputWordsKernel<4, false>;
    input<<<ServerWordsBlocks<4>(chunk), kThreads, 0, launch.stream>>>(
        blocks, block_bytes, num_workers, chunk, inv_w, err, scratch);
  } else {
    const auto input = vec ? ServerInputKernel<true> : ServerInputKernel<false>;
    input<<<ReduceBlocks(chunk), kThreads, 0, launch.stream>>>(blocks, block_bytes, num_workers,
                                                               chunk, inv_w, err, scratch);
  }
  ONEBIT_CUDA_RETURN_IF_LAUNCH_ERROR();
  const auto pack = vec ? SignPackKernel<true> : SignPackKernel<false>;
  pack<<<ChunkGrid(launch, 1, chunk), kThreads, 0, launch.stream>>>(
      &scratch->total, chunk, 1, chunk, CompressedBlockBytes(chunk), err, out);
  ONEBIT_CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

absl::Status Decompress(Launch launch, const uint8_t* blocks, size_t num_chunks, size_t chunk,
                        size_t n, float* out) {
  const auto kernel = Vec(out) ? DecompressKernel<true> : DecompressKernel<false>;
  kernel<<<ChunkGrid(launch, CeilDiv(n, chunk), chunk), kThreads, 0, launch.stream>>>(
      blocks, CompressedBlockBytes(chunk), num_chunks, chunk, n, out);
  ONEBIT_CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

}  // namespace onebit::kernels::cuda
