// The CUDA kernels of the momentum, 1-bit Adam's updates and 0/1 Adam's (kernels.h:
// MomentumUpdate, AdamWarmupUpdate, FrozenAdamUpdate, DecompressFrozenAdamUpdate,
// ZeroOneLocalUpdate, ZeroOneSyncPrepare, ZeroOneSyncApply) and their launches
// (cuda_kernels.h).
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda_kernels.h"
#include "kernels/cuda_kernels_common.cuh"
#include "kernels/cuda_status.h"
#include "kernels/kernels.h"

namespace onebit::kernels::cuda {
namespace {

// u = m / (sqrt(v) + eps), clipped; u = fma(wd, p, u) if wd > 0; returns fma(-lr, u, p).
__device__ __forceinline__ float AdamStep(float m, float v, float p, const AdamArgs& a) {
  float u = ClipDirection(__fdiv_rn(m, __fadd_rn(__fsqrt_rn(v), a.eps)), a.update_clip);
  if (a.weight_decay > 0.0f) u = fmaf(a.weight_decay, p, u);
  return fmaf(a.neg_lr, u, p);
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

// 1-bit Adam (Backend::AdamWarmupUpdate, FrozenAdamUpdate and DecompressFrozenAdamUpdate).
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

}  // namespace

absl::Status MomentumUpdate(Launch launch, float beta1, const float* g, float* m, size_t n) {
  const auto kernel = Vec(g, m) ? MomentumKernel<true> : MomentumKernel<false>;
  kernel<<<GroupBlocks(launch, n), kThreads, 0, launch.stream>>>(beta1, 1.0f - beta1, g, m, n);
  ONEBIT_CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

absl::Status AdamWarmupUpdate(Launch launch, const AdamHyper& h, const float* g,
                              float grad_scale, float* m, float* v, float* p, size_t n) {
  const auto kernel = Vec(g, m, v, p) ? AdamWarmupKernel<true> : AdamWarmupKernel<false>;
  kernel<<<GroupBlocks(launch, n), kThreads, 0, launch.stream>>>(MakeAdamArgs(h), g,
                                                                 grad_scale, m, v, p, n);
  ONEBIT_CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

absl::Status FrozenAdamUpdate(Launch launch, const AdamHyper& h, const float* v,
                              const float* mask, float* m, float* p, size_t n) {
  const auto kernel = Vec(v, mask, m, p) ? FrozenAdamKernel<true> : FrozenAdamKernel<false>;
  kernel<<<GroupBlocks(launch, n), kThreads, 0, launch.stream>>>(MakeAdamArgs(h), v, mask, m,
                                                                 p, n);
  ONEBIT_CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

absl::Status DecompressFrozenAdamUpdate(Launch launch, const uint8_t* blocks, size_t num_chunks,
                                        size_t chunk, const AdamHyper& h, const float* v,
                                        const float* mask, float* m, float* p, size_t n) {
  const auto kernel = Vec(v, mask, m, p) ? DecompressFrozenAdamKernel<true>
                                         : DecompressFrozenAdamKernel<false>;
  kernel<<<ChunkGrid(launch, CeilDiv(n, chunk), chunk), kThreads, 0, launch.stream>>>(
      blocks, CompressedBlockBytes(chunk), num_chunks, chunk, MakeAdamArgs(h), v, mask, m, p,
      n);
  ONEBIT_CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

absl::Status ZeroOneLocalUpdate(Launch launch, const AdamHyper& h, const float* g,
                                const float* v, float* m, float* p, float* acc, size_t n) {
  const auto kernel = Vec(g, v, m, p, acc) ? ZeroOneLocalKernel<true> : ZeroOneLocalKernel<false>;
  kernel<<<GroupBlocks(launch, n), kThreads, 0, launch.stream>>>(MakeAdamArgs(h), g, v, m, p,
                                                                 acc, n);
  ONEBIT_CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

absl::Status ZeroOneSyncPrepare(Launch launch, float eps, const float* v, float* acc,
                                size_t n) {
  const auto kernel =
      Vec(v, acc) ? ZeroOneSyncPrepareKernel<true> : ZeroOneSyncPrepareKernel<false>;
  kernel<<<GroupBlocks(launch, n), kThreads, 0, launch.stream>>>(eps, v, acc, n);
  ONEBIT_CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

absl::Status ZeroOneSyncApply(Launch launch, float eps, float lrs, const float* v,
                              const float* mask, const float* avg, float* m, float* anchor,
                              float* p, size_t n) {
  const auto kernel = Vec(v, mask, avg, m, anchor, p) ? ZeroOneSyncApplyKernel<true>
                                                      : ZeroOneSyncApplyKernel<false>;
  kernel<<<GroupBlocks(launch, n), kThreads, 0, launch.stream>>>(eps, lrs, v, mask, avg, m,
                                                                 anchor, p, n);
  ONEBIT_CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

}  // namespace onebit::kernels::cuda
