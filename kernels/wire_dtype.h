// The number formats the full-precision (warmup) exchange can carry on the wire, and their
// conversions from and to float32, shared by the CPU backend and the CUDA kernels (the
// functions are __host__ __device__ under nvcc) so that both give the same bits.
//
//   fp32  IEEE binary32, as is.
//   bf16  the top 16 bits of a float32, rounded to nearest, ties to even. Same exponent
//         range as float32: only values within half an ulp of FLT_MAX overflow (to inf).
//   fp16  IEEE binary16, rounded to nearest, ties to even, with subnormals. Overflow
//         follows IEEE 754 (and CUDA's __float2half_rn): |x| >= 65520 becomes +-inf, not
//         65504. A gradient that large in an fp16 exchange is a sign the model needs bf16
//         or fp32; the trainer stops on the non-finite values instead of training on
//         silently clipped ones.
// Both 16-bit formats keep the sign of zero and of infinities; a NaN stays a NaN (quiet,
// sign kept, the top bits of its payload kept).
#ifndef ONEBIT_KERNELS_WIRE_DTYPE_H_
#define ONEBIT_KERNELS_WIRE_DTYPE_H_

#include <cstddef>
#include <cstdint>
#include <cstring>

#ifdef __CUDACC__
#define ONEBIT_HOST_DEVICE __host__ __device__
#else
#define ONEBIT_HOST_DEVICE
#endif

namespace onebit::kernels {

enum class WireDtype { kFp32 = 0, kBf16 = 1, kFp16 = 2 };

// Bytes of one element on the wire.
constexpr size_t WireDtypeBytes(WireDtype dtype) { return dtype == WireDtype::kFp32 ? 4 : 2; }

inline const char* WireDtypeName(WireDtype dtype) {
  switch (dtype) {
    case WireDtype::kFp32:
      return "fp32";
    case WireDtype::kBf16:
      return "bf16";
    case WireDtype::kFp16:
      return "fp16";
  }
  return "unknown";
}

ONEBIT_HOST_DEVICE inline uint32_t FloatBits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof(u));
  return u;
}

ONEBIT_HOST_DEVICE inline float BitsToFloat(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof(f));
  return f;
}

ONEBIT_HOST_DEVICE inline uint16_t FloatToBf16(float f) {
  const uint32_t u = FloatBits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) {
    return static_cast<uint16_t>((u >> 16) | 0x0040u);  // NaN: quiet
  }
  // Adding 0x7fff plus the lowest kept bit rounds to nearest, ties to even; a carry out of
  // the mantissa bumps the exponent, up to inf.
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

ONEBIT_HOST_DEVICE inline float Bf16ToFloat(uint16_t h) {
  return BitsToFloat(static_cast<uint32_t>(h) << 16);
}

ONEBIT_HOST_DEVICE inline uint16_t FloatToFp16(float f) {
  const uint32_t u = FloatBits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) {  // NaN: quiet, top payload bits
    return static_cast<uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
  }
  if (a >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520, inf: inf
  if (a >= 0x38800000u) {  // a normal fp16 (>= 2^-14): rebias the exponent by 112, round
    uint32_t r = a - 0x38000000u;
    r += 0xfffu + ((r >> 13) & 1u);
    return static_cast<uint16_t>(sign | (r >> 13));
  }
  if (a <= 0x33000000u) return sign;  // <= 2^-25: half the smallest subnormal or less: zero
  // A subnormal: the value in units of 2^-24 is m * 2^(e - 126), shift = 126 - e in [14, 24].
  const uint32_t e = a >> 23;
  const uint32_t m = (a & 0x7fffffu) | 0x800000u;
  const uint32_t shift = 126u - e;
  uint32_t q = m >> shift;
  const uint32_t rem = m & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1u);
  if (rem > half || (rem == half && (q & 1u))) ++q;  // may become 0x400, the smallest normal
  return static_cast<uint16_t>(sign | q);
}

ONEBIT_HOST_DEVICE inline float Fp16ToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1fu;
  uint32_t m = h & 0x3ffu;
  if (e == 0x1f) return BitsToFloat(sign | 0x7f800000u | (m << 13));  // inf, NaN
  if (e == 0) {
    if (m == 0) return BitsToFloat(sign);
    uint32_t exp = 113;  // normalize the subnormal
    while ((m & 0x400u) == 0) {
      m <<= 1;
      --exp;
    }
    return BitsToFloat(sign | (exp << 23) | ((m & 0x3ffu) << 13));
  }
  return BitsToFloat(sign | ((e + 112u) << 23) | (m << 13));
}

// A 16-bit format's bits for x (bf16 or fp16; fp32 is not 16-bit: 0), and back. The
// optimizer's low-precision parameters use them on the host, where the backends use ToWire.
ONEBIT_HOST_DEVICE inline uint16_t NarrowParam(WireDtype dtype, float x) {
  switch (dtype) {
    case WireDtype::kBf16:
      return FloatToBf16(x);
    case WireDtype::kFp16:
      return FloatToFp16(x);
    case WireDtype::kFp32:
      break;
  }
  return 0;
}
ONEBIT_HOST_DEVICE inline float WidenParam(WireDtype dtype, uint16_t h) {
  return dtype == WireDtype::kFp16 ? Fp16ToFloat(h) : Bf16ToFloat(h);
}

// The value `x` takes on the wire, back as a float32 (what the receiver computes with).
ONEBIT_HOST_DEVICE inline float RoundToWire(WireDtype dtype, float x) {
  switch (dtype) {
    case WireDtype::kBf16:
      return Bf16ToFloat(FloatToBf16(x));
    case WireDtype::kFp16:
      return Fp16ToFloat(FloatToFp16(x));
    case WireDtype::kFp32:
      break;
  }
  return x;
}

}  // namespace onebit::kernels

#endif  // ONEBIT_KERNELS_WIRE_DTYPE_H_
