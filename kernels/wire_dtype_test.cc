// The wire formats' conversions (wire_dtype.h) and the CPU backend's ToWire, SumWireRows
// and WireToFloat,
// against the float64 model of rounding (kernels_reference.h), which is written from the
// formats' definitions, not from the bit tricks.
#include "kernels/wire_dtype.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/kernels.h"
#include "kernels/kernels_reference.h"

namespace onebit::kernels {
namespace {

uint32_t Bits(float x) { return FloatBits(x); }

float ToWireAndBack(WireDtype dtype, float x) { return RoundToWire(dtype, x); }

// Values with every kind of edge: zeros, infinities, float subnormals, fp16 subnormals and
// their ties, the largest finite values and the overflow boundaries, ties at 1.
std::vector<float> EdgeValues() {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> v = {0.0f,
                          -0.0f,
                          inf,
                          -inf,
                          std::numeric_limits<float>::denorm_min(),
                          -std::numeric_limits<float>::denorm_min(),
                          std::numeric_limits<float>::min(),
                          std::numeric_limits<float>::max(),
                          -std::numeric_limits<float>::max(),
                          65504.0f,
                          65519.996f,
                          65520.0f,
                          -65520.0f,
                          70000.0f,
                          std::ldexp(1.0f, -24),         // fp16's smallest subnormal
                          std::ldexp(1.0f, -25),         // half of it: a tie, to 0
                          std::ldexp(1.5f, -25),         // above the tie: to 2^-24
                          std::ldexp(3.0f, -25),         // 1.5 units: a tie, to 2 units
                          std::ldexp(5.0f, -25),         // 2.5 units: a tie, to 2 units
                          std::ldexp(1.0f, -14),         // fp16's smallest normal
                          std::ldexp(1023.5f, -24),      // rounds up into the normals
                          1.0f + std::ldexp(1.0f, -8),   // bf16 tie at 1: to even (1)
                          1.0f + std::ldexp(3.0f, -8),   // bf16 tie: to even (up)
                          1.0f + std::ldexp(1.0f, -11),  // fp16 tie at 1: to even (1)
                          1.0f + std::ldexp(3.0f, -11),  // fp16 tie: to even (up)
                          std::ldexp(1.0f, -133),        // bf16's smallest subnormal
                          std::ldexp(1.0f, -134),        // half of it: a tie, to 0
                          3.3895314e38f};                // bf16's largest finite value
  return v;
}

std::vector<float> RandomValues(size_t n) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<uint32_t> bits;
  std::vector<float> v;
  while (v.size() < n) {  // every exponent, every mantissa
    float x;
    const uint32_t u = bits(rng);
    std::memcpy(&x, &u, sizeof(x));
    if (!std::isnan(x)) v.push_back(x);
  }
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (size_t i = 0; i < n; ++i) v.push_back(normal(rng));
  return v;
}

TEST(WireDtypeTest, Sizes) {
  EXPECT_EQ(WireDtypeBytes(WireDtype::kFp32), 4u);
  EXPECT_EQ(WireDtypeBytes(WireDtype::kBf16), 2u);
  EXPECT_EQ(WireDtypeBytes(WireDtype::kFp16), 2u);
}

TEST(WireDtypeTest, EveryBf16AndFp16RoundTrips) {
  for (uint32_t h = 0; h <= 0xffff; ++h) {
    const uint16_t b = static_cast<uint16_t>(h);
    const float fb = Bf16ToFloat(b);
    const float fh = Fp16ToFloat(b);
    if (std::isnan(fb)) {
      // A NaN stays a NaN with its sign; the quiet bit is set.
      EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(fb)))) << h;
      EXPECT_EQ(FloatToBf16(fb), b | 0x0040) << h;
    } else {
      EXPECT_EQ(FloatToBf16(fb), b) << h;
    }
    if (std::isnan(fh)) {
      EXPECT_EQ(FloatToFp16(fh), b | 0x0200) << h;
    } else {
      EXPECT_EQ(FloatToFp16(fh), b) << h;
      // Every fp16, subnormals included, is exactly what the model says it is.
      const double want = std::ldexp(static_cast<double>(b & 0x3ff) +
                                         ((b >> 10 & 0x1f) == 0 ? 0.0 : 1024.0),
                                     std::max(static_cast<int>(b >> 10 & 0x1f), 1) - 25);
      if ((b >> 10 & 0x1f) != 0x1f) {
        EXPECT_EQ(static_cast<double>(fh), (b & 0x8000) ? -want : want) << h;
      }
    }
  }
}

TEST(WireDtypeTest, RoundingMatchesTheFloat64Model) {
  std::vector<float> values = EdgeValues();
  const std::vector<float> random = RandomValues(200000);
  values.insert(values.end(), random.begin(), random.end());
  for (WireDtype dtype : {WireDtype::kFp32, WireDtype::kBf16, WireDtype::kFp16}) {
    for (float x : values) {
      const float got = ToWireAndBack(dtype, x);
      const float want = static_cast<float>(reference::RoundToWire(dtype, x));
      ASSERT_EQ(Bits(got), Bits(want))
          << WireDtypeName(dtype) << " of " << x << " (0x" << std::hex << Bits(x)
          << "): got " << got << ", model " << want;
    }
  }
}

TEST(WireDtypeTest, DocumentedEdges) {
  const float inf = std::numeric_limits<float>::infinity();
  // fp16 overflows to inf (IEEE, as CUDA's __float2half_rn), not to 65504.
  EXPECT_EQ(ToWireAndBack(WireDtype::kFp16, 65519.996f), 65504.0f);
  EXPECT_EQ(ToWireAndBack(WireDtype::kFp16, 65520.0f), inf);
  EXPECT_EQ(ToWireAndBack(WireDtype::kFp16, -1e6f), -inf);
  // bf16 keeps float32's range.
  EXPECT_TRUE(std::isfinite(ToWireAndBack(WireDtype::kBf16, 1e38f)));
  EXPECT_EQ(ToWireAndBack(WireDtype::kBf16, std::numeric_limits<float>::max()), inf);
  // Signed zeros survive; fp16 flushes what is below half its smallest subnormal to zero.
  EXPECT_TRUE(std::signbit(ToWireAndBack(WireDtype::kBf16, -0.0f)));
  EXPECT_TRUE(std::signbit(ToWireAndBack(WireDtype::kFp16, -0.0f)));
  EXPECT_EQ(ToWireAndBack(WireDtype::kFp16, 1e-8f), 0.0f);
  EXPECT_EQ(ToWireAndBack(WireDtype::kFp16, std::ldexp(1.0f, -24)), std::ldexp(1.0f, -24));
  EXPECT_TRUE(std::isnan(ToWireAndBack(WireDtype::kBf16, std::nanf(""))));
  EXPECT_TRUE(std::isnan(ToWireAndBack(WireDtype::kFp16, std::nanf(""))));
}

// The CPU backend's ToWire, SumWireRows (float32 adds in row order from 0.0f of the
// converted rows) and WireToFloat against the model.
TEST(WireDtypeTest, CpuToWireSumWireRowsAndWireToFloatMatchTheModel) {
  auto backend = NewCpuBackend();
  constexpr int kRows = 5;
  std::vector<float> x = EdgeValues();
  const std::vector<float> more = RandomValues(5000);
  x.insert(x.end(), more.begin(), more.end());
  x.resize(x.size() / kRows * kRows);
  const size_t count = x.size() / kRows;
  for (WireDtype dtype : {WireDtype::kFp32, WireDtype::kBf16, WireDtype::kFp16}) {
    SCOPED_TRACE(WireDtypeName(dtype));
    std::vector<uint8_t> wire(x.size() * WireDtypeBytes(dtype));
    ASSERT_TRUE(backend->ToWire(dtype, x.data(), x.size(), wire.data()).ok());
    std::vector<float> back(x.size());
    ASSERT_TRUE(backend->WireToFloat(dtype, wire.data(), x.size(), back.data()).ok());
    for (size_t i = 0; i < x.size(); ++i) {
      const float want = static_cast<float>(reference::RoundToWire(dtype, x[i]));
      ASSERT_EQ(Bits(back[i]), Bits(want)) << x[i] << " at " << i;
    }
    std::vector<float> sum(count);
    ASSERT_TRUE(backend->SumWireRows(dtype, wire.data(), kRows, count, sum.data()).ok());
    for (size_t i = 0; i < count; ++i) {
      // float32 adds, done in float64 and rounded to float32: the same result, as float64
      // has more than twice float32's precision.
      double acc = 0.0;
      for (int j = 0; j < kRows; ++j) {
        acc = static_cast<float>(acc + reference::RoundToWire(dtype, x[j * count + i]));
      }
      const float want = static_cast<float>(acc);
      if (std::isnan(want)) {
        ASSERT_TRUE(std::isnan(sum[i])) << i;
      } else {
        ASSERT_EQ(Bits(sum[i]), Bits(want)) << "element " << i;
      }
    }
  }
  // Sums start from +0.0f: a row of -0 sums to +0.
  const float minus_zero = -0.0f;
  float out = 1.0f;
  ASSERT_TRUE(backend->SumWireRows(WireDtype::kFp32, &minus_zero, 1, 1, &out).ok());
  EXPECT_FALSE(std::signbit(out));
}

// The bits torch's copy_ from float32 gives (torch 1.13 and 2.15, CPU, scalar and
// vectorised: x.to(torch.bfloat16) and x.to(torch.float16)), which the optimizer's
// low-precision parameters must equal (optimizer_base.h): ties, fp16's subnormals,
// overflow boundaries, signed zeros and infinities. A NaN stays a NaN, its payload not
// compared (torch's own scalar and vectorised paths differ there).
TEST(WireDtypeTest, NarrowingMatchesTorchCopy) {
  struct Want {
    uint32_t x;
    uint16_t bf16, fp16;
  };
  const Want table[] = {
      {0x3f800000u, 0x3f80, 0x3c00},
      {0x3f808000u, 0x3f80, 0x3c04},
      {0x3f818000u, 0x3f82, 0x3c0c},
      {0x477fe000u, 0x4780, 0x7bff},
      {0x477feffdu, 0x4780, 0x7bff},
      {0x477ff000u, 0x4780, 0x7c00},
      {0x49742400u, 0x4974, 0x7c00},
      {0xb22bcc77u, 0xb22c, 0x8000},
      {0x3649539cu, 0x3649, 0x0032},
      {0x3380d959u, 0x3381, 0x0001},
      {0x32f91badu, 0x32f9, 0x0000},
      {0x33000000u, 0x3300, 0x0000},
      {0x33800000u, 0x3380, 0x0001},
      {0x012355e6u, 0x0123, 0x0000},
      {0x000116c2u, 0x0001, 0x0000},
      {0x80000000u, 0x8000, 0x8000},
      {0x7f800000u, 0x7f80, 0x7c00},
      {0xff800000u, 0xff80, 0xfc00},
      {0x7f7fffffu, 0x7f80, 0x7c00},
      {0xff7f8000u, 0xff80, 0xfc00},
      {0x3dcccccdu, 0x3dcd, 0x2e66},
      {0xb7d1b717u, 0xb7d2, 0x81a3},
      {0x38800000u, 0x3880, 0x0400},
      {0x387fda40u, 0x3880, 0x03ff},
  };
  for (const Want& w : table) {
    const float x = BitsToFloat(w.x);
    EXPECT_EQ(NarrowParam(WireDtype::kBf16, x), w.bf16) << std::hex << w.x;
    EXPECT_EQ(NarrowParam(WireDtype::kFp16, x), w.fp16) << std::hex << w.x;
    EXPECT_EQ(FloatToBf16(x), w.bf16);
    EXPECT_EQ(FloatToFp16(x), w.fp16);
  }
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(std::isnan(WidenParam(WireDtype::kBf16, NarrowParam(WireDtype::kBf16, nan))));
  EXPECT_TRUE(std::isnan(WidenParam(WireDtype::kFp16, NarrowParam(WireDtype::kFp16, nan))));
}

}  // namespace
}  // namespace onebit::kernels
