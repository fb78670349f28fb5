// AVX2+FMA kernels. The file is compiled for AVX2 through a target pragma (not a global
// -mavx2) so one binary runs everywhere; cpu_backend.cc only calls these after checking
// the CPU. Every loop handles 8 floats (one sign byte) at a time and finishes with the
// scalar formulas from cpu_kernels.h.
#if defined(__x86_64__) && defined(__GNUC__)
#pragma GCC target("avx2,fma")
#include <immintrin.h>

#include "kernels/cpu_kernels.h"

namespace onebit::kernels::cpu {
namespace {

// Adds x*x of 8 floats to two float64 accumulators.
inline void AccumulateSquares(__m256 x, __m256d& lo, __m256d& hi) {
  const __m256d xl = _mm256_cvtps_pd(_mm256_castps256_ps128(x));
  const __m256d xh = _mm256_cvtps_pd(_mm256_extractf128_ps(x, 1));
  lo = _mm256_fmadd_pd(xl, xl, lo);
  hi = _mm256_fmadd_pd(xh, xh, hi);
}

inline double HorizontalSum(__m256d lo, __m256d hi) {
  alignas(32) double lanes[4];
  _mm256_store_pd(lanes, _mm256_add_pd(lo, hi));
  return (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
}

// kNegate[b] holds, for the 8 elements of sign byte b, the float sign bit in every lane
// whose bit is clear (a -1). Decoding is then one 32-byte load and one XOR with the scale.
struct NegateTable {
  alignas(32) uint32_t lanes[256][8];
  constexpr NegateTable() : lanes() {
    for (int b = 0; b < 256; ++b) {
      for (int i = 0; i < 8; ++i) lanes[b][i] = ((b >> i) & 1) ? 0u : 0x80000000u;
    }
  }
};
constexpr NegateTable kNegate;

// The 8 decoded values of one sign byte: bit set -> s, clear -> -s (flipping the sign
// bit is exact negation, as in the scalar code, for any s).
inline __m256 DecodeByte(uint8_t byte, __m256 s) {
  return _mm256_xor_ps(s, _mm256_load_ps(reinterpret_cast<const float*>(kNegate.lanes[byte])));
}

inline __m256 Direction(const AdamHyper& h, __m256 m, __m256 v, __m256 p) {
  __m256 u = _mm256_div_ps(m, _mm256_add_ps(_mm256_sqrt_ps(v), _mm256_set1_ps(h.eps)));
  if (h.update_clip > 0.0f) {
    // max/min return their second operand when either is NaN: a NaN direction stays NaN,
    // as in the scalar kernel.
    const __m256 c = _mm256_set1_ps(h.update_clip);
    u = _mm256_min_ps(c, _mm256_max_ps(_mm256_sub_ps(_mm256_setzero_ps(), c), u));
  }
  if (h.weight_decay > 0.0f) u = _mm256_fmadd_ps(_mm256_set1_ps(h.weight_decay), p, u);
  return u;
}

void Momentum(float beta1, const float* g, float* m, size_t n) {
  const __m256 b1 = _mm256_set1_ps(beta1), omb1 = _mm256_set1_ps(1.0f - beta1);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 gi = _mm256_mul_ps(omb1, _mm256_loadu_ps(g + i));
    _mm256_storeu_ps(m + i, _mm256_fmadd_ps(b1, _mm256_loadu_ps(m + i), gi));
  }
  ScalarKernels().momentum(beta1, g + i, m + i, n - i);
}

double WorkerInput(const float* m, const float* g, float beta1, size_t n, size_t n_pad,
                   float* err) {
  const __m256 b1 = _mm256_set1_ps(beta1), omb1 = _mm256_set1_ps(1.0f - beta1);
  __m256d lo = _mm256_setzero_pd(), hi = _mm256_setzero_pd();
  size_t i = 0;
  if (g) {
    for (; i + 8 <= n; i += 8) {
      const __m256 gi = _mm256_mul_ps(omb1, _mm256_loadu_ps(g + i));
      const __m256 mi = _mm256_fmadd_ps(b1, _mm256_loadu_ps(m + i), gi);
      const __m256 x = _mm256_add_ps(mi, _mm256_loadu_ps(err + i));
      _mm256_storeu_ps(err + i, x);
      AccumulateSquares(x, lo, hi);
    }
  } else {
    for (; i + 8 <= n; i += 8) {
      const __m256 x = _mm256_add_ps(_mm256_loadu_ps(m + i), _mm256_loadu_ps(err + i));
      _mm256_storeu_ps(err + i, x);
      AccumulateSquares(x, lo, hi);
    }
  }
  return HorizontalSum(lo, hi) +
         ScalarKernels().worker_input(m + i, g ? g + i : nullptr, beta1, n - i, n_pad - i,
                                      err + i);
}

double ServerInput(const uint8_t* blocks, size_t stride, int num_workers, size_t first,
                   size_t count, float* err) {
  const __m256 inv_w = _mm256_set1_ps(1.0f / static_cast<float>(num_workers));
  __m256d lo = _mm256_setzero_pd(), hi = _mm256_setzero_pd();
  // count is a multiple of 8: no tail.
  const size_t byte0 = 4 + first / 8;
  for (size_t k = 0; k < count / 8; ++k) {
    __m256 acc = _mm256_setzero_ps();
    for (int j = 0; j < num_workers; ++j) {
      const uint8_t* block = blocks + j * stride;
      acc = _mm256_add_ps(acc, DecodeByte(block[byte0 + k], _mm256_set1_ps(BlockScale(block))));
    }
    const __m256 y = _mm256_fmadd_ps(acc, inv_w, _mm256_loadu_ps(err + 8 * k));
    _mm256_storeu_ps(err + 8 * k, y);
    AccumulateSquares(y, lo, hi);
  }
  return HorizontalSum(lo, hi);
}

void SignPack(float* err, size_t chunk, float scale, uint8_t* bits) {
  const __m256 s = _mm256_set1_ps(scale), zero = _mm256_setzero_ps();
  for (size_t k = 0; k < chunk / 8; ++k) {
    const __m256 x = _mm256_loadu_ps(err + 8 * k);
    const __m256 positive = _mm256_cmp_ps(x, zero, _CMP_GE_OQ);  // sign(0) = +1
    bits[k] = static_cast<uint8_t>(_mm256_movemask_ps(positive));
    const __m256 step = _mm256_blendv_ps(_mm256_sub_ps(zero, s), s, positive);
    _mm256_storeu_ps(err + 8 * k, _mm256_sub_ps(x, step));
  }
}

void DecodeBlock(float scale, const uint8_t* bits, size_t count, float* out) {
  const __m256 s = _mm256_set1_ps(scale);
  size_t i = 0;
  for (; i + 8 <= count; i += 8) _mm256_storeu_ps(out + i, DecodeByte(bits[i / 8], s));
  for (; i < count; ++i) out[i] = SignBit(bits, i) ? scale : -scale;
}

void SumRows(const float* rows, size_t stride, int num_rows, size_t count, float* out) {
  size_t i = 0;
  for (; i + 8 <= count; i += 8) {
    __m256 acc = _mm256_setzero_ps();
    for (int j = 0; j < num_rows; ++j) acc = _mm256_add_ps(acc, _mm256_loadu_ps(rows + j * stride + i));
    _mm256_storeu_ps(out + i, acc);
  }
  for (; i < count; ++i) {
    float acc = 0.0f;
    for (int j = 0; j < num_rows; ++j) acc += rows[j * stride + i];
    out[i] = acc;
  }
}

void AdamWarmup(const AdamHyper& h, const float* g, float grad_scale, float* m, float* v,
                float* p, size_t n) {
  const __m256 b1 = _mm256_set1_ps(h.beta1), omb1 = _mm256_set1_ps(1.0f - h.beta1);
  const __m256 b2 = _mm256_set1_ps(h.beta2), omb2 = _mm256_set1_ps(1.0f - h.beta2);
  const __m256 gs = _mm256_set1_ps(grad_scale), neg_lr = _mm256_set1_ps(-h.lr);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 gi = _mm256_mul_ps(_mm256_loadu_ps(g + i), gs);
    const __m256 mi = _mm256_fmadd_ps(b1, _mm256_loadu_ps(m + i), _mm256_mul_ps(omb1, gi));
    const __m256 vi =
        _mm256_fmadd_ps(b2, _mm256_loadu_ps(v + i), _mm256_mul_ps(_mm256_mul_ps(omb2, gi), gi));
    const __m256 pi = _mm256_loadu_ps(p + i);
    _mm256_storeu_ps(m + i, mi);
    _mm256_storeu_ps(v + i, vi);
    _mm256_storeu_ps(p + i, _mm256_fmadd_ps(neg_lr, Direction(h, mi, vi, pi), pi));
  }
  ScalarKernels().adam_warmup(h, g + i, grad_scale, m + i, v + i, p + i, n - i);
}

void FrozenUpdate(const AdamHyper& h, const float* v, const float* mask, float* m, float* p,
                  size_t n) {
  const __m256 neg_lr = _mm256_set1_ps(-h.lr);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 mi = _mm256_loadu_ps(m + i);
    if (mask) {
      mi = _mm256_mul_ps(mi, _mm256_loadu_ps(mask + i));
      _mm256_storeu_ps(m + i, mi);
    }
    const __m256 pi = _mm256_loadu_ps(p + i);
    _mm256_storeu_ps(p + i,
                     _mm256_fmadd_ps(neg_lr, Direction(h, mi, _mm256_loadu_ps(v + i), pi), pi));
  }
  ScalarKernels().frozen_update(h, v + i, mask ? mask + i : nullptr, m + i, p + i, n - i);
}

void DecodeBlockFrozenUpdate(float scale, const uint8_t* bits, const AdamHyper& h,
                             const float* v, const float* mask, float* m, float* p,
                             size_t count) {
  const __m256 s = _mm256_set1_ps(scale);
  const __m256 neg_lr = _mm256_set1_ps(-h.lr);
  size_t i = 0;
  for (; i + 8 <= count; i += 8) {
    __m256 mi = DecodeByte(bits[i / 8], s);
    if (mask) mi = _mm256_mul_ps(mi, _mm256_loadu_ps(mask + i));
    _mm256_storeu_ps(m + i, mi);
    const __m256 pi = _mm256_loadu_ps(p + i);
    _mm256_storeu_ps(p + i,
                     _mm256_fmadd_ps(neg_lr, Direction(h, mi, _mm256_loadu_ps(v + i), pi), pi));
  }
  // The tail starts on a byte boundary (i % 8 == 0).
  ScalarKernels().decode_block_frozen_update(scale, bits + i / 8, h, v + i,
                                             mask ? mask + i : nullptr, m + i, p + i, count - i);
}

double SumSquares(const float* x, size_t n) {
  __m256d lo = _mm256_setzero_pd(), hi = _mm256_setzero_pd();
  size_t i = 0;
  for (; i + 8 <= n; i += 8) AccumulateSquares(_mm256_loadu_ps(x + i), lo, hi);
  return HorizontalSum(lo, hi) + ScalarKernels().sum_squares(x + i, n - i);
}

// ---- int8 (kernels.h, INT8 WIRE FORMAT): the scalar formulas of cpu_kernels_int8.cc, 8
// elements at a time. min_ps(x, lo) is x < lo ? x : lo and max_ps(x, hi) x > hi ? x : hi,
// so a NaN x leaves them alone, as the scalar Track does (NaN is flagged apart);
// max_ps(r, 0) is r > 0 ? r : 0 and min_ps(r, 255) r < 255 ? r : 255, the scalar clamp;
// round_ps to nearest is nearbyint's ties to even.

struct Int8Lanes {
  // Written out: an implicit constructor would not be compiled for AVX2.
  Int8Lanes()
      : lo(_mm256_set1_ps(INFINITY)), hi(_mm256_set1_ps(-INFINITY)), nan(_mm256_setzero_ps()) {}
  __m256 lo, hi;
  __m256 nan;  // all ones in a lane that saw a NaN
  void Track(__m256 x) {
    nan = _mm256_or_ps(nan, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
    lo = _mm256_min_ps(x, lo);
    hi = _mm256_max_ps(x, hi);
  }
  void MergeInto(int8::Range* range) const {
    alignas(32) float l[8], h[8];
    _mm256_store_ps(l, lo);
    _mm256_store_ps(h, hi);
    int8::Range lanes;
    for (int i = 0; i < 8; ++i) {
      if (l[i] < lanes.lo) lanes.lo = l[i];
      if (h[i] > lanes.hi) lanes.hi = h[i];
    }
    lanes.nan = _mm256_movemask_ps(nan) != 0;
    int8::Merge(lanes, range);
  }
};

void Int8WorkerInput(const float* m, const float* g, float beta1, size_t n, size_t count,
                     float* err, int8::Range* range) {
  const __m256 b1 = _mm256_set1_ps(beta1), omb1 = _mm256_set1_ps(1.0f - beta1);
  Int8Lanes lanes;
  size_t i = 0;
  if (g) {
    for (; i + 8 <= n; i += 8) {
      const __m256 gi = _mm256_mul_ps(omb1, _mm256_loadu_ps(g + i));
      const __m256 mi = _mm256_fmadd_ps(b1, _mm256_loadu_ps(m + i), gi);
      const __m256 x = _mm256_add_ps(mi, _mm256_loadu_ps(err + i));
      _mm256_storeu_ps(err + i, x);
      lanes.Track(x);
    }
  } else {
    for (; i + 8 <= n; i += 8) {
      const __m256 x = _mm256_add_ps(_mm256_loadu_ps(m + i), _mm256_loadu_ps(err + i));
      _mm256_storeu_ps(err + i, x);
      lanes.Track(x);
    }
  }
  // The rest of the real elements, then the padding (whole groups of 8 where possible).
  const size_t tail = n - i;
  int8::WorkerInput(m + i, g ? g + i : nullptr, beta1, tail, tail, err + i, range);
  i = n;
  for (; i + 8 <= count; i += 8) lanes.Track(_mm256_loadu_ps(err + i));
  int8::WorkerInput(m, nullptr, beta1, 0, count - i, err + i, range);
  lanes.MergeInto(range);
}

void Int8ServerInput(const uint8_t* blocks, size_t stride, int num_workers, size_t first,
                     size_t count, float* err, int8::Range* range) {
  const __m256 inv_w = _mm256_set1_ps(1.0f / static_cast<float>(num_workers));
  Int8Lanes lanes;
  size_t i = 0;
  for (; i + 8 <= count; i += 8) {
    __m256 acc = _mm256_setzero_ps();
    for (int j = 0; j < num_workers; ++j) {
      const uint8_t* block = blocks + j * stride;
      const __m128i q8 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(block + 8 + first + i));
      const __m256 q = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(q8));
      const __m256 d =
          _mm256_fmadd_ps(q, _mm256_set1_ps(BlockScale(block)), _mm256_set1_ps(BlockOffset(block)));
      acc = _mm256_add_ps(acc, d);
    }
    const __m256 y = _mm256_fmadd_ps(acc, inv_w, _mm256_loadu_ps(err + i));
    _mm256_storeu_ps(err + i, y);
    lanes.Track(y);
  }
  int8::ServerInput(blocks, stride, num_workers, first + i, count - i, err + i, range);
  lanes.MergeInto(range);
}

void Int8Quantize(const int8::Params& p, size_t count, float* err, uint8_t* codes) {
  const __m256 lo = _mm256_set1_ps(p.lo), inv = _mm256_set1_ps(p.inv),
               scale = _mm256_set1_ps(p.scale);
  const __m256 zero = _mm256_setzero_ps(), top = _mm256_set1_ps(255.0f);
  size_t i = 0;
  for (; i + 8 <= count; i += 8) {
    const __m256 x = _mm256_loadu_ps(err + i);
    __m256 r = _mm256_mul_ps(_mm256_sub_ps(x, lo), inv);
    r = _mm256_min_ps(_mm256_max_ps(r, zero), top);
    r = _mm256_round_ps(r, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m256i q = _mm256_cvtps_epi32(r);  // exact: an integer in [0, 255]
    const __m128i q16 =
        _mm_packus_epi32(_mm256_castsi256_si128(q), _mm256_extracti128_si256(q, 1));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(codes + i), _mm_packus_epi16(q16, q16));
    _mm256_storeu_ps(err + i, _mm256_sub_ps(x, _mm256_fmadd_ps(r, scale, lo)));
  }
  int8::Quantize(p, count - i, err + i, codes + i);
}

void Int8Decode(const uint8_t* block, size_t first, size_t count, float* out) {
  const __m256 scale = _mm256_set1_ps(BlockScale(block)), lo = _mm256_set1_ps(BlockOffset(block));
  const uint8_t* codes = block + 8 + first;
  size_t i = 0;
  for (; i + 8 <= count; i += 8) {
    const __m128i q8 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes + i));
    const __m256 q = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(q8));
    _mm256_storeu_ps(out + i, _mm256_fmadd_ps(q, scale, lo));
  }
  int8::Decode(block, first + i, count - i, out + i);
}

void ZeroOneLocal(const AdamHyper& h, const float* g, const float* v, float* m, float* p,
                  float* acc, size_t n) {
  const __m256 b1 = _mm256_set1_ps(h.beta1), omb1 = _mm256_set1_ps(1.0f - h.beta1);
  const __m256 neg_lr = _mm256_set1_ps(-h.lr);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 mi = _mm256_fmadd_ps(b1, _mm256_loadu_ps(m + i),
                                      _mm256_mul_ps(omb1, _mm256_loadu_ps(g + i)));
    const __m256 pi = _mm256_loadu_ps(p + i);
    const __m256 u = Direction(h, mi, _mm256_loadu_ps(v + i), pi);
    _mm256_storeu_ps(m + i, mi);
    _mm256_storeu_ps(p + i, _mm256_fmadd_ps(neg_lr, u, pi));
    _mm256_storeu_ps(acc + i, _mm256_fmadd_ps(neg_lr, u, _mm256_loadu_ps(acc + i)));
  }
  ScalarKernels().zero_one_local(h, g + i, v + i, m + i, p + i, acc + i, n - i);
}

void ZeroOneSyncPrepare(float eps, const float* v, float* acc, size_t n) {
  const __m256 e = _mm256_set1_ps(eps);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 d = _mm256_add_ps(_mm256_sqrt_ps(_mm256_loadu_ps(v + i)), e);
    _mm256_storeu_ps(acc + i, _mm256_mul_ps(_mm256_loadu_ps(acc + i), d));
  }
  ScalarKernels().zero_one_sync_prepare(eps, v + i, acc + i, n - i);
}

void ZeroOneSyncApply(float eps, float lrs, const float* v, const float* mask, const float* avg,
                      float* m, float* anchor, float* p, size_t n) {
  const __m256 e = _mm256_set1_ps(eps), l = _mm256_set1_ps(lrs);
  const __m256 sign = _mm256_set1_ps(-0.0f);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 ai = _mm256_loadu_ps(avg + i);
    if (lrs != 0.0f) {
      // -avg / lrs: flipping the sign bit is the scalar code's exact negation.
      __m256 mi = _mm256_div_ps(_mm256_xor_ps(ai, sign), l);
      if (mask != nullptr) mi = _mm256_mul_ps(mi, _mm256_loadu_ps(mask + i));
      _mm256_storeu_ps(m + i, mi);
    }
    const __m256 d = _mm256_add_ps(_mm256_sqrt_ps(_mm256_loadu_ps(v + i)), e);
    const __m256 pi = _mm256_add_ps(_mm256_loadu_ps(anchor + i), _mm256_div_ps(ai, d));
    _mm256_storeu_ps(p + i, pi);
    _mm256_storeu_ps(anchor + i, pi);
  }
  ScalarKernels().zero_one_sync_apply(eps, lrs, v + i, mask ? mask + i : nullptr, avg + i,
                                      m + i, anchor + i, p + i, n - i);
}

}  // namespace

const KernelTable* Avx2Kernels() {
  static const KernelTable table = {
      "avx2",       Momentum,     WorkerInput,  ServerInput,           SignPack,
      DecodeBlock,  SumRows,      AdamWarmup,   FrozenUpdate, DecodeBlockFrozenUpdate, SumSquares,
      Int8WorkerInput, Int8ServerInput, Int8Quantize, Int8Decode,
      ZeroOneLocal, ZeroOneSyncPrepare, ZeroOneSyncApply,
  };
  return &table;
}

}  // namespace onebit::kernels::cpu

#else  // not x86-64 GCC/Clang: scalar only.

#include "kernels/cpu_kernels.h"

namespace onebit::kernels::cpu {
const KernelTable* Avx2Kernels() { return nullptr; }
}  // namespace onebit::kernels::cpu

#endif
