// The CUDA kernels of 1-bit LAMB's element-wise steps (kernels.h: AdamMomentsUpdate ...
// MaxDenomRatio) and of SumSquares, the per-tensor norms it needs, with their launches
// (cuda_kernels.h).
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda_kernels.h"
#include "kernels/cuda_kernels_common.cuh"
#include "kernels/cuda_status.h"
#include "kernels/kernels.h"
#include "kernels/wire_dtype.h"

namespace onebit::kernels::cuda {
namespace {

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

// Elements i .. i+3 of x[0, n) as float32 (i a multiple of kGroup; those at or past n read
// as 0): float32 as they are (Load4), bf16 and fp16 widened by wire_dtype.h's conversions,
// which are exact. A 16-bit group is one 8-byte load with kVec (x 8-byte aligned), else
// four 2-byte ones; either way element e is the same float as in a float32 copy.
template <WireDtype kDtype, bool kVec>
__device__ __forceinline__ Group LoadWire4(const void* x, size_t i, size_t n) {
  if constexpr (kDtype == WireDtype::kFp32) {
    return Load4<kVec>(static_cast<const float*>(x), i, n);
  } else {
    const uint16_t* h = static_cast<const uint16_t*>(x);
    uint16_t bits[kGroup];
    if (kVec && i + kGroup <= n) {
      const uint2 q = *reinterpret_cast<const uint2*>(h + i);  // little-endian: low half first
      bits[0] = static_cast<uint16_t>(q.x & 0xffffu);
      bits[1] = static_cast<uint16_t>(q.x >> 16);
      bits[2] = static_cast<uint16_t>(q.y & 0xffffu);
      bits[3] = static_cast<uint16_t>(q.y >> 16);
    } else {
#pragma unroll
      for (size_t e = 0; e < kGroup; ++e) bits[e] = i + e < n ? h[i + e] : uint16_t{0};
    }
    Group r;
#pragma unroll
    for (size_t e = 0; e < kGroup; ++e) {
      r.v[e] = kDtype == WireDtype::kBf16 ? Bf16ToFloat(bits[e]) : Fp16ToFloat(bits[e]);
    }
    return r;
  }
}

// Two groups per step, both loaded before either is added, so that twice the bytes are in
// flight; the additions keep the order of a one-group loop (see "Reductions"). x holds n
// elements of kDtype; the grid, the groups and the order of the additions do not depend on
// it, so a 16-bit tensor sums to the bits of its float32 widening (SumSquaresWire).
template <WireDtype kDtype, bool kVec>
__global__ void SumSquaresKernel(const void* x, size_t n, ReductionScratch* scratch) {
  double local = 0.0;
  const size_t stride = ElementStride();
  size_t i = FirstElement();
  for (; i + stride < n; i += 2 * stride) {
    const Group a = LoadWire4<kDtype, kVec>(x, i, n);
    const Group b = LoadWire4<kDtype, kVec>(x, i + stride, n);
    AddSquares(a, &local);
    AddSquares(b, &local);
  }
  if (i < n) AddSquares(LoadWire4<kDtype, kVec>(x, i, n), &local);
  FinishReduction(local, scratch);
}

// SumSquaresKernel over n > 0 elements of kDtype at x; kVec where x is aligned for its
// group loads (16 bytes for float32, 8 for 16-bit).
template <WireDtype kDtype>
absl::Status LaunchSumSquares(Launch launch, ReductionScratch* scratch, const void* x,
                              size_t n) {
  constexpr uintptr_t kAlign = kGroup * WireDtypeBytes(kDtype);
  const auto kernel = reinterpret_cast<uintptr_t>(x) % kAlign == 0
                          ? SumSquaresKernel<kDtype, true>
                          : SumSquaresKernel<kDtype, false>;
  kernel<<<ReduceBlocks(n), kThreads, 0, launch.stream>>>(x, n, scratch);
  ONEBIT_CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

}  // namespace

absl::Status AdamMomentsUpdate(Launch launch, const AdamHyper& h, const float* g,
                               float grad_scale, float* m, float* v, size_t n) {
  const auto kernel = Vec(g, m, v) ? AdamMomentsKernel<true> : AdamMomentsKernel<false>;
  kernel<<<GroupBlocks(launch, n), kThreads, 0, launch.stream>>>(MakeAdamArgs(h), g,
                                                                 grad_scale, m, v, n);
  ONEBIT_CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

absl::Status AdamDirectionInto(Launch launch, const AdamHyper& h, const float* m,
                               const float* v, const float* p, float* u, size_t n) {
  const auto kernel = Vec(m, v, p, u) ? AdamDirectionKernel<true> : AdamDirectionKernel<false>;
  kernel<<<GroupBlocks(launch, n), kThreads, 0, launch.stream>>>(MakeAdamArgs(h), m, v, p, u,
                                                                 n);
  ONEBIT_CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

absl::Status Axpy(Launch launch, float a, const float* x, float* y, size_t n) {
  const auto kernel = Vec(x, y) ? AxpyKernel<true> : AxpyKernel<false>;
  kernel<<<GroupBlocks(launch, n), kThreads, 0, launch.stream>>>(a, x, y, n);
  ONEBIT_CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

absl::Status Scale(Launch launch, float a, float* x, size_t n) {
  const auto kernel = Vec(x) ? ScaleKernel<true> : ScaleKernel<false>;
  kernel<<<GroupBlocks(launch, n), kThreads, 0, launch.stream>>>(a, x, n);
  ONEBIT_CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

absl::Status ApplyMask(Launch launch, const float* mask, float* x, size_t n) {
  const auto kernel = Vec(mask, x) ? ApplyMaskKernel<true> : ApplyMaskKernel<false>;
  kernel<<<GroupBlocks(launch, n), kThreads, 0, launch.stream>>>(mask, x, n);
  ONEBIT_CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

absl::Status MarkNonzero(Launch launch, const float* g, float* seen, size_t n) {
  const auto kernel = Vec(g, seen) ? MarkNonzeroKernel<true> : MarkNonzeroKernel<false>;
  kernel<<<GroupBlocks(launch, n), kThreads, 0, launch.stream>>>(g, seen, n);
  ONEBIT_CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

absl::Status FreshVarianceUpdate(Launch launch, float beta1, float beta2, const float* m,
                                 const float* m_last, float* v_fresh, size_t n) {
  const auto kernel =
      Vec(m, m_last, v_fresh) ? FreshVarianceKernel<true> : FreshVarianceKernel<false>;
  kernel<<<GroupBlocks(launch, n), kThreads, 0, launch.stream>>>(
      beta1, 1.0f - beta1, beta2, 1.0f - beta2, m, m_last, v_fresh, n);
  ONEBIT_CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

absl::Status MaxDenomRatio(Launch launch, float eps, const float* v, const float* v_fresh,
                           size_t n, unsigned* max_bits) {
  const auto kernel = Vec(v, v_fresh) ? MaxDenomRatioKernel<true> : MaxDenomRatioKernel<false>;
  kernel<<<GroupBlocks(launch, n), kThreads, 0, launch.stream>>>(eps, v, v_fresh, n, max_bits);
  ONEBIT_CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

absl::Status SumSquaresWire(Launch launch, ReductionScratch* scratch, WireDtype dtype,
                            const void* x, size_t n) {
  switch (dtype) {
    case WireDtype::kFp32:
      return LaunchSumSquares<WireDtype::kFp32>(launch, scratch, x, n);
    case WireDtype::kBf16:
      return LaunchSumSquares<WireDtype::kBf16>(launch, scratch, x, n);
    case WireDtype::kFp16:
      return LaunchSumSquares<WireDtype::kFp16>(launch, scratch, x, n);
  }
  return absl::InvalidArgumentError("unknown wire dtype");
}

}  // namespace onebit::kernels::cuda
