// FP8 WIRE FORMAT (exchange.compressor "fp8"): the same tensors, padding and chunks as the
// 1-bit and int8 formats (kernels/kernels.h); a chunk of C elements is one block of
// BlockBytes(C) = ceil(C/32) + C bytes:
//
//   offset 0              ceil(C/32) scale bytes, E8M0: byte b means 2^(b - 127), 255 NaN
//   offset ceil(C/32)     C e4m3 codes, element j of the chunk at byte ceil(C/32) + j
//
// Sub-block k covers elements [32k, min(32k + 32, C)) and has scale byte k; the last one
// may be partial. A block needs no alignment: any C works (C = 0 is an empty block).
//
// E4M3 CODES (OCP "e4m3fn"): bit 7 the sign, then 4 exponent bits E and 3 mantissa bits M,
// bias 7, no infinities. mag = code & 0x7F; 0x7F (and 0xFF) is NaN; otherwise the value is
//   E == 0: M * 2^-9 (subnormal)    E >= 1: (8 + M) * 2^(E - 10),    the largest 448.
//
// ENCODING a sub-block of float32 values x (a worker's x = m' + err, a server's y, as for
// int8: Backend::CompressWorkerInt8):
//   amax  = max |x_j|. If some x_j is NaN or infinite: scale byte 255 and every code 0, so
//           the whole sub-block decodes to NaN (the trainer's NaN check stops the run). A
//           shard rejects a block whose first scale byte is 255; it reads no other
//           (Codec::header_bytes() is 1), so a NaN sub-block further on reaches the
//           workers' decode instead.
//   e     = the smallest integer with amax <= 448 * 2^e, clamped to [-127, 127]: nothing
//           saturates (amax = 0 and float32 subnormals give e = -127, byte 0). Computed
//           from amax's bits alone (ScaleByte).
//   v_j   = x_j * 2^-e (exact; where float32 underflows, the code is 0 either way), a = |v_j|
//   kk    = max(floor(log2 a), -6),   n = rint(a * 2^(3 - kk)) (ties to even),
//   code  = sign(x_j) << 7 | min((kk + 6) * 8 + n, 126)
//           (contiguous across the subnormal boundary: n = 16, or n = 8 at kk = -6, is the
//           next binade's M = 0, so the carry is correct). -0 encodes as 0x80.
// DECODING: d = sign * value(mag) * 2^e, exact in float32 (4 significant bits, at least
// 2^-136), NaN for scale byte 255 or mag 0x7F. The error feedback err = x - d is therefore
// exact: err + d == x in float32. Every finite value rounds to at most 448 * 2^e, so
// only |x| within 1/32 of FLT_MAX can decode to an infinity.
//
// WORKER (Codec::Compress): x_i = (g ? fma(b1, m_i, (1 - b1) * g_i) : m_i) + err_i for
// i < n and x_i = err_i for the padding; every chunk is encoded as above; err = x - d.
// SERVER (Codec::Aggregate): acc = sum over workers j in rank order, from 0.0f, of d_j;
// y = fma(acc, 1/W, err); y is encoded; err = y - d. The maximum is exact and taken in no
// particular order, so CPU and CUDA give the same bits (but the payloads of NaNs): both
// evaluate the functions below, integer operations and float32 products by powers of two,
// with no contraction into fused multiply-adds (-ffp-contract=off, nvcc -fmad=false).
//
// This layout is a wire format: keep it stable.
#ifndef ONEBIT_COMPRESSION_FP8_FP8_E4M3_H_
#define ONEBIT_COMPRESSION_FP8_FP8_E4M3_H_

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

// Every function below is host code, and device code too under nvcc.
#if defined(__CUDACC__)
#define ONEBIT_FP8_HD __host__ __device__ __forceinline__
#else
#define ONEBIT_FP8_HD inline
#endif

namespace onebit::fp8 {

constexpr size_t kSubBlock = 32;
constexpr uint8_t kNanScale = 255;  // the scale byte of a sub-block with a NaN or an inf
constexpr uint8_t kMaxMagnitude = 126;  // 0x7E = 448

// Scale bytes of a chunk of `chunk` elements.
constexpr size_t ScaleBytes(size_t chunk) { return (chunk + kSubBlock - 1) / kSubBlock; }
// Bytes of one fp8 block of `chunk` elements.
constexpr size_t BlockBytes(size_t chunk) { return ScaleBytes(chunk) + chunk; }

ONEBIT_FP8_HD uint32_t FloatBits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  uint32_t b;
  std::memcpy(&b, &x, sizeof(b));
  return b;
#endif
}

ONEBIT_FP8_HD float BitsFloat(uint32_t b) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(b);
#else
  float x;
  std::memcpy(&x, &b, sizeof(x));
  return x;
#endif
}

// 2^k exactly, for -126 <= k <= 127 (a normal float32).
ONEBIT_FP8_HD float Pow2Normal(int k) { return BitsFloat(static_cast<uint32_t>(k + 127) << 23); }

// 2^k exactly, for -149 <= k <= 127 (float32 subnormals below -126).
ONEBIT_FP8_HD float Pow2(int k) {
  return k >= -126 ? Pow2Normal(k) : BitsFloat(uint32_t{1} << (k + 149));
}

ONEBIT_FP8_HD float QuietNan() { return BitsFloat(0x7FC00000u); }

// |x|'s bits: as unsigned integers they order like the values, NaN and inf at or above
// 0x7F800000. The maximum of a sub-block is the maximum of these.
ONEBIT_FP8_HD uint32_t AbsBits(float x) { return FloatBits(x) & 0x7FFFFFFFu; }
ONEBIT_FP8_HD bool NonFinite(uint32_t abs_bits) { return abs_bits >= 0x7F800000u; }

// The scale byte of a sub-block whose largest |x| has the bits `amax_bits` (above).
ONEBIT_FP8_HD uint8_t ScaleByte(uint32_t amax_bits) {
  if (NonFinite(amax_bits)) return kNanScale;
  const int biased = static_cast<int>(amax_bits >> 23);
  // A normal amax is f * 2^x with f = (1 + mantissa / 2^23) / 2 in [0.5, 1), x = biased -
  // 126, and 448 = 0.875 * 2^9: e = x - 9, plus 1 where f > 0.875 (mantissa > 0x600000).
  // Zero and float32 subnormals (amax < 2^-126 < 448 * 2^-127) clamp to -127.
  int e = biased == 0 ? -127 : biased - 135 + ((amax_bits & 0x7FFFFFu) > 0x600000u ? 1 : 0);
  e = e < -127 ? -127 : e;  // at most 254 - 135 + 1 = 120 above: no upper clamp needed
  return static_cast<uint8_t>(e + 127);
}

// The scale exponent of a finite scale byte.
ONEBIT_FP8_HD int ScaleExponent(uint8_t scale) { return static_cast<int>(scale) - 127; }

// x rounded to an integer, ties to even, for 0 <= x < 2^22: adding 2^23 leaves no fraction
// bits, so the addition rounds (the default rounding mode: to nearest, ties to even), and
// the subtraction is exact. No library call, and the same on host and device.
ONEBIT_FP8_HD float RoundToEven(float x) {
  constexpr float kShift = 8388608.0f;  // 2^23
#if defined(__CUDA_ARCH__)
  return __fsub_rn(__fadd_rn(x, kShift), kShift);
#else
  return (x + kShift) - kShift;  // never reassociated: no -ffast-math here
#endif
}

// The code of a finite x (never NaN or inf) in a sub-block of scale exponent e (|x| <= 448 *
// 2^e), given inv = 2^-e (Pow2(-e)). Branch free, integer operations but for two float32
// products by powers of two and the subnormal rounding:
//   a >= 2^-6   rounding a's bits to 3 mantissa bits, to nearest even, gives the code:
//               ((biased exponent - 120) << 3) + mantissa, a carry into the exponent
//               being the next binade's M = 0 (the formula of ENCODING, in bits);
//   a < 2^-6    n = rint(a * 2^9), the subnormal code.
ONEBIT_FP8_HD uint8_t EncodeWith(float x, float inv) {
  const uint32_t bits = FloatBits(x);
  // Exact but where the product is below 2^-126; then the code is 0 either way (a * 2^9
  // < 2^-117 rounds to 0).
  const float a = BitsFloat(bits & 0x7FFFFFFFu) * inv;
  const uint32_t ab = FloatBits(a);
  const uint32_t rounded = (ab + 0x7FFFFu + ((ab >> 20) & 1u)) >> 20;
  const uint32_t normal = rounded - (120u << 3);
  const uint32_t subnormal = static_cast<uint32_t>(RoundToEven(a * 512.0f));  // 0..8
  const uint32_t mag = ab >= (121u << 23) ? normal : subnormal;
  return static_cast<uint8_t>(((bits >> 24) & 0x80u) | (mag < kMaxMagnitude ? mag : kMaxMagnitude));
}

// The code of a finite x in a sub-block of scale exponent e (|x| <= 448 * 2^e).
ONEBIT_FP8_HD uint8_t Encode(float x, int e) { return EncodeWith(x, Pow2(-e)); }

// The signed value of `code` at scale 2^0 (exact), NaN for 0x7F and 0xFF. Branch free:
// E == 0 gives M * 2^-9 as (M + 0) * 2^(1 - 10).
ONEBIT_FP8_HD float DecodeUnit(uint8_t code) {
  const uint32_t mag = code & 0x7Fu, exp = mag >> 3;
  const uint32_t significand = (mag & 7u) | (exp != 0 ? 8u : 0u);
  const int k = static_cast<int>(exp != 0 ? exp : 1u) - 10;
  const float unit = static_cast<float>(significand) * Pow2Normal(k);
  const float signed_unit =
      BitsFloat(FloatBits(unit) | (static_cast<uint32_t>(code & 0x80u) << 24));
  return mag == 0x7Fu ? QuietNan() : signed_unit;
}

// The value of `code` in a sub-block with scale byte `scale`: DecodeUnit(code) * 2^e, exact
// (see DECODING; the sign commutes with the product), NaN for scale 255.
ONEBIT_FP8_HD float Decode(uint8_t code, uint8_t scale) {
  return scale == kNanScale ? QuietNan() : DecodeUnit(code) * Pow2(ScaleExponent(scale));
}

}  // namespace onebit::fp8

#endif  // ONEBIT_COMPRESSION_FP8_FP8_E4M3_H_
