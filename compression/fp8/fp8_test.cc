// The fp8 format against a float64 model written here from the format's definition (not
// from its code), and the codec on the CPU backend and on the simulated device.
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "compression/codec.h"
#include "compression/codec_registry.h"
#include "compression/fp8/fp8_cpu.h"
#include "compression/fp8/fp8_device.h"
#include "compression/fp8/fp8_e4m3.h"
#include "gtest/gtest.h"
#include "kernels/buffer.h"
#include "kernels/kernels.h"
#include "kernels/simulated_device.h"

namespace onebit::fp8 {
namespace {

const float kNan = std::numeric_limits<float>::quiet_NaN();
const float kInf = std::numeric_limits<float>::infinity();

// ---- The float64 model --------------------------------------------------------------

// The value of magnitude code `mag` (0..126) at scale exponent 0: enumerated from the
// e4m3 definition, E = mag >> 3, M = mag & 7.
double ModelMagnitude(int mag) {
  const int e = mag >> 3, m = mag & 7;
  return e == 0 ? std::ldexp(m, -9) : std::ldexp(8 + m, e - 7 - 3);
}

double ModelDecode(uint8_t code, uint8_t scale) {
  if (scale == 255 || (code & 0x7F) == 0x7F) return std::nan("");
  const double v = std::ldexp(ModelMagnitude(code & 0x7F), scale - 127);
  return (code & 0x80) ? -v : v;
}

// The smallest e in [-127, 127] with amax <= 448 * 2^e (amax finite).
int ModelScaleExponent(double amax) {
  for (int e = -127; e < 127; ++e) {
    if (amax <= std::ldexp(448.0, e)) return e;
  }
  return 127;
}

// x / 2^e to the nearest of the 127 magnitudes, ties to the even code (the even mantissa).
uint8_t ModelEncode(float x, int e) {
  const double a = std::fabs(static_cast<double>(x)) / std::ldexp(1.0, e);  // exact
  int best = 0;
  for (int mag = 1; mag <= 126; ++mag) {
    const double d = std::fabs(ModelMagnitude(mag) - a);
    const double d_best = std::fabs(ModelMagnitude(best) - a);
    if (d < d_best || (d == d_best && mag % 2 == 0)) best = mag;
  }
  return static_cast<uint8_t>((std::signbit(x) ? 0x80 : 0) | best);
}

struct ModelBlock {
  std::vector<uint8_t> bytes;
  std::vector<float> err;  // x - decoded
};

// One chunk of values x as a block.
ModelBlock ModelEncodeChunk(const std::vector<float>& x) {
  const size_t c = x.size(), scales = (c + 31) / 32;
  ModelBlock b{std::vector<uint8_t>(scales + c), std::vector<float>(c)};
  for (size_t k = 0; k < scales; ++k) {
    double amax = 0.0;
    bool finite = true;
    for (size_t j = 32 * k; j < std::min(c, 32 * k + 32); ++j) {
      finite = finite && std::isfinite(x[j]);
      amax = std::max(amax, std::fabs(static_cast<double>(x[j])));
    }
    const int e = ModelScaleExponent(amax);
    b.bytes[k] = finite ? static_cast<uint8_t>(e + 127) : 255;
    for (size_t j = 32 * k; j < std::min(c, 32 * k + 32); ++j) {
      const uint8_t code = finite ? ModelEncode(x[j], e) : 0;
      b.bytes[scales + j] = code;
      b.err[j] = static_cast<float>(static_cast<double>(x[j]) - ModelDecode(code, b.bytes[k]));
    }
  }
  return b;
}

std::vector<float> Random(size_t n, uint32_t seed, float stddev = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, stddev);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

float BitsFloatForTest(uint32_t b) {
  float x;
  std::memcpy(&x, &b, sizeof(x));
  return x;
}

bool SameBits(float a, float b) { return std::memcmp(&a, &b, sizeof(a)) == 0; }

// ---- The format ---------------------------------------------------------------------

TEST(Fp8FormatTest, Sizes) {
  EXPECT_EQ(BlockBytes(0), 0u);
  EXPECT_EQ(BlockBytes(1), 2u);
  EXPECT_EQ(BlockBytes(32), 33u);
  EXPECT_EQ(BlockBytes(33), 35u);
  EXPECT_EQ(BlockBytes(250008), 7813u + 250008u);
  EXPECT_EQ(Fp8Codec().BlockBytes(1000), BlockBytes(1000));
}

// Every code but the NaNs decodes to the model's value and encodes back to itself, at
// every scale that keeps it finite; the NaN codes and scale 255 decode to NaN.
TEST(Fp8FormatTest, EveryCodeRoundTrips) {
  for (int scale = 0; scale <= 254; ++scale) {
    const int e = scale - 127;
    for (int code = 0; code < 256; ++code) {
      SCOPED_TRACE(testing::Message() << "scale " << scale << " code " << code);
      const float d = Decode(static_cast<uint8_t>(code), static_cast<uint8_t>(scale));
      if ((code & 0x7F) == 0x7F) {
        ASSERT_TRUE(std::isnan(d));
        continue;
      }
      const double want = ModelDecode(static_cast<uint8_t>(code), static_cast<uint8_t>(scale));
      if (std::fabs(want) > std::numeric_limits<float>::max()) {
        ASSERT_TRUE(std::isinf(d));  // only scale bytes no encoder makes (e > 120)
        continue;
      }
      ASSERT_EQ(static_cast<double>(d), want);  // exact in float32
      ASSERT_EQ(std::signbit(d), (code & 0x80) != 0);
      ASSERT_EQ(Encode(d, e), code);
    }
  }
  for (int code = 0; code < 256; ++code) {
    EXPECT_TRUE(std::isnan(Decode(static_cast<uint8_t>(code), kNanScale))) << code;
  }
}

// Midpoints between neighbouring codes go to the even one; a hair off them, to the nearer.
TEST(Fp8FormatTest, RoundsToNearestEven) {
  for (int e : {-127, -20, -1, 0, 3, 100}) {
    for (int mag = 0; mag < 126; ++mag) {
      SCOPED_TRACE(testing::Message() << "e " << e << " mag " << mag);
      const double lo = std::ldexp(ModelMagnitude(mag), e);
      const double hi = std::ldexp(ModelMagnitude(mag + 1), e);
      const float mid = static_cast<float>((lo + hi) / 2);
      ASSERT_EQ(static_cast<double>(mid), (lo + hi) / 2);  // representable
      const int even = mag % 2 == 0 ? mag : mag + 1;
      ASSERT_EQ(Encode(mid, e), even);
      ASSERT_EQ(Encode(-mid, e), 0x80 | even);
      ASSERT_EQ(Encode(std::nextafter(mid, 0.0f), e), mag);
      ASSERT_EQ(Encode(std::nextafter(mid, kInf), e), mag + 1);
      ASSERT_EQ(Encode(mid, e), ModelEncode(mid, e));
    }
  }
}

// Encode against the float64 model over a sweep of every binade from float32's smallest
// subnormal to 448 (a stride through the bit patterns, both signs).
TEST(Fp8FormatTest, EncodeMatchesTheModelAcrossTheRange) {
  const uint32_t top = 0x43E00000u;  // 448.0f
  for (uint32_t b = 0; b <= top; b += 997) {
    const float x = BitsFloatForTest(b);
    ASSERT_EQ(Encode(x, 0), ModelEncode(x, 0)) << x;
    ASSERT_EQ(Encode(-x, 0), ModelEncode(-x, 0)) << -x;
  }
  ASSERT_EQ(Encode(448.0f, 0), 0x7E);
}

// Subnormal codes M * 2^-9, and the carries across the subnormal boundary.
TEST(Fp8FormatTest, Subnormals) {
  for (int m = 0; m < 8; ++m) {
    EXPECT_EQ(Encode(std::ldexp(static_cast<float>(m), -9), 0), m);
    EXPECT_EQ(Decode(static_cast<uint8_t>(m), 127), std::ldexp(static_cast<float>(m), -9));
  }
  EXPECT_EQ(Encode(std::ldexp(1.0f, -10), 0), 0);    // tie 0 | 1: to 0
  EXPECT_EQ(Encode(std::ldexp(3.0f, -10), 0), 2);    // tie 1 | 2: to 2
  EXPECT_EQ(Encode(std::ldexp(15.0f, -10), 0), 8);   // tie 7 | 2^-6 (E=1, M=0): to 8
  EXPECT_EQ(Decode(8, 127), std::ldexp(1.0f, -6));
  EXPECT_EQ(Encode(std::ldexp(1.0f, -5), 0), 16);    // E = 2, M = 0
  EXPECT_EQ(Decode(16, 127), std::ldexp(1.0f, -5));
  EXPECT_EQ(Encode(0.96875f, 0), 56);                 // tie 0.9375 (E=6, M=7) | 1: to 1.0
  EXPECT_EQ(Decode(56, 127), 1.0f);
  EXPECT_EQ(Encode(std::ldexp(1.0f, -40), 0), 0);    // far below: 0
  EXPECT_EQ(Encode(-std::ldexp(1.0f, -40), 0), 0x80);
  EXPECT_EQ(Encode(0.0f, 0), 0);
  EXPECT_EQ(Encode(-0.0f, 0), 0x80);
}

// The scale never lets the largest value saturate, and is the smallest that does not.
TEST(Fp8FormatTest, ScaleIsTheSmallestThatDoesNotSaturate) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<uint32_t> bits(0, 0x7F7FFFFFu);  // every finite |x|
  std::vector<float> amaxes = {0.0f, std::numeric_limits<float>::denorm_min(),
                               std::numeric_limits<float>::min(), 1.0f, 448.0f,
                               std::nextafter(448.0f, kInf), 1.75f, 1.7500001f,
                               std::ldexp(448.0f, -127), std::ldexp(448.0f, -128),
                               std::nextafter(std::ldexp(448.0f, -127), kInf),
                               std::numeric_limits<float>::max()};
  for (int i = 0; i < 20000; ++i) {
    float a;
    const uint32_t b = bits(rng);
    std::memcpy(&a, &b, 4);
    amaxes.push_back(a);
  }
  for (float amax : amaxes) {
    SCOPED_TRACE(testing::Message() << "amax " << amax);
    const uint8_t s = ScaleByte(AbsBits(amax));
    ASSERT_EQ(ScaleExponent(s), ModelScaleExponent(amax));
    ASSERT_EQ(ScaleByte(AbsBits(-amax)), s);
    const uint8_t code = Encode(amax, ScaleExponent(s));
    ASSERT_LE(code, kMaxMagnitude);
    // Rounded, not clamped: within half a step of amax.
    const double d = ModelDecode(code, s), step = ModelDecode(code, s) / 8;
    ASSERT_LE(std::fabs(d - amax), step / 2 + std::ldexp(1.0, -137)) << int(code);
  }
  EXPECT_EQ(ScaleByte(AbsBits(448.0f)), 127);
  EXPECT_EQ(ScaleByte(AbsBits(std::nextafter(448.0f, kInf))), 128);
  EXPECT_EQ(ScaleByte(AbsBits(0.0f)), 0);
  EXPECT_EQ(ScaleByte(AbsBits(std::numeric_limits<float>::max())), 247);
  EXPECT_EQ(ScaleByte(AbsBits(kInf)), kNanScale);
  EXPECT_EQ(ScaleByte(AbsBits(kNan)), kNanScale);
  EXPECT_EQ(ScaleByte(AbsBits(-kNan)), kNanScale);
}

// ---- The kernels against the model ---------------------------------------------------

// Worker compression: the block bytes and errors of the model, and err + decode == x.
TEST(Fp8KernelsTest, CompressWorkerMatchesTheModel) {
  for (size_t chunk : {1, 8, 31, 32, 37, 64, 1000}) {
    for (size_t num_chunks : {1, 3}) {
      const size_t n_pad = chunk * num_chunks;
      for (size_t n : {n_pad, n_pad - std::min<size_t>(n_pad, 5), size_t{0}}) {
        for (bool fused : {false, true}) {
          SCOPED_TRACE(testing::Message() << "chunk " << chunk << " x" << num_chunks << " n "
                                          << n << " fused " << fused);
          std::vector<float> m = Random(n, 1), g = Random(n, 2), err = Random(n_pad, 3, 0.01f);
          // A heavy tail, zeros, and a sub-block far below its neighbours.
          for (size_t i = 0; i < n; i += 17) m[i] *= 1000.0f;
          for (size_t i = 1; i < n; i += 13) m[i] = 0.0f;
          std::vector<float> x(n_pad);
          for (size_t i = 0; i < n_pad; ++i) {
            const float mi =
                i >= n ? 0.0f : fused ? std::fma(0.9f, m[i], (1.0f - 0.9f) * g[i]) : m[i];
            x[i] = i < n ? mi + err[i] : err[i];
          }
          std::vector<uint8_t> out(num_chunks * BlockBytes(chunk));
          cpu::CompressWorker(m.data(), fused ? g.data() : nullptr, 0.9f, n, num_chunks, chunk,
                              err.data(), out.data());
          for (size_t r = 0; r < num_chunks; ++r) {
            const std::vector<float> xr(x.begin() + r * chunk, x.begin() + (r + 1) * chunk);
            const ModelBlock want = ModelEncodeChunk(xr);
            const std::vector<uint8_t> got(out.begin() + r * BlockBytes(chunk),
                                           out.begin() + (r + 1) * BlockBytes(chunk));
            ASSERT_EQ(got, want.bytes) << "chunk " << r;
            std::vector<float> dec(chunk);
            cpu::Decode(got.data(), 1, chunk, chunk, dec.data());
            for (size_t j = 0; j < chunk; ++j) {
              ASSERT_TRUE(SameBits(err[r * chunk + j], want.err[j])) << j;
              ASSERT_EQ(err[r * chunk + j] + dec[j], xr[j]) << j;  // exact error feedback
            }
          }
        }
      }
    }
  }
}

// Server aggregation: the decoded rows summed in rank order from 0.0f, fma(acc, 1/W, err),
// encoded as by the model.
TEST(Fp8KernelsTest, ServerAggregateMatchesTheModel) {
  for (size_t chunk : {1, 37, 64, 1000}) {
    for (int workers : {1, 2, 3, 4, 7}) {
      SCOPED_TRACE(testing::Message() << "chunk " << chunk << " W " << workers);
      const size_t stride = BlockBytes(chunk);
      std::vector<uint8_t> blocks(workers * stride);
      for (int w = 0; w < workers; ++w) {
        std::vector<float> e = Random(chunk, 10 + w, 1.0f + w);
        std::vector<float> zero(chunk, 0.0f);
        cpu::CompressWorker(e.data(), nullptr, 0.0f, chunk, 1, chunk, zero.data(),
                            blocks.data() + w * stride);
      }
      std::vector<float> err = Random(chunk, 20, 0.1f), y(chunk);
      for (size_t j = 0; j < chunk; ++j) {
        float acc = 0.0f;
        for (int w = 0; w < workers; ++w) {
          const uint8_t* b = blocks.data() + w * stride;
          acc += static_cast<float>(ModelDecode(b[(chunk + 31) / 32 + j], b[j / 32]));
        }
        y[j] = std::fma(acc, 1.0f / static_cast<float>(workers), err[j]);
      }
      const ModelBlock want = ModelEncodeChunk(y);
      std::vector<uint8_t> out(stride);
      cpu::ServerAggregate(blocks.data(), workers, chunk, err.data(), out.data());
      ASSERT_EQ(out, want.bytes);
      for (size_t j = 0; j < chunk; ++j) ASSERT_TRUE(SameBits(err[j], want.err[j])) << j;
    }
  }
}

// A zero sub-block: byte 0, +0 codes, zeros decoded, the error unchanged.
TEST(Fp8KernelsTest, ZeroSubBlocks) {
  const size_t chunk = 70;
  std::vector<float> m(chunk, 0.0f), err(chunk, 0.0f);
  for (size_t j = 32; j < 64; ++j) m[j] = 1.0f;  // sub-block 1 is not zero
  std::vector<uint8_t> out(BlockBytes(chunk));
  cpu::CompressWorker(m.data(), nullptr, 0.0f, chunk, 1, chunk, err.data(), out.data());
  EXPECT_EQ(out[0], 0);
  EXPECT_EQ(out[1], ScaleByte(AbsBits(1.0f)));
  EXPECT_EQ(out[2], 0);
  for (size_t j = 0; j < chunk; ++j) {
    if (j >= 32 && j < 64) continue;
    EXPECT_EQ(out[3 + j], 0) << j;
    EXPECT_TRUE(SameBits(err[j], 0.0f)) << j;
  }
  std::vector<float> dec(chunk, 5.0f);
  cpu::Decode(out.data(), 1, chunk, chunk, dec.data());
  for (size_t j = 0; j < chunk; ++j) EXPECT_EQ(dec[j], m[j]) << j;
}

// A NaN or an infinity makes its own sub-block NaN (byte 255, codes 0, error NaN), and
// only that one; a shard rejects such a block when the first scale byte is 255.
TEST(Fp8KernelsTest, NonFiniteSubBlocksDecodeToNan) {
  for (float bad : {kNan, kInf, -kInf}) {
    SCOPED_TRACE(testing::Message() << bad);
    const size_t chunk = 96;
    std::vector<float> m = Random(chunk, 4), err(chunk, 0.0f);
    m[40] = bad;  // sub-block 1
    std::vector<uint8_t> out(BlockBytes(chunk));
    cpu::CompressWorker(m.data(), nullptr, 0.0f, chunk, 1, chunk, err.data(), out.data());
    EXPECT_NE(out[0], kNanScale);
    EXPECT_EQ(out[1], kNanScale);
    EXPECT_NE(out[2], kNanScale);
    std::vector<float> dec(chunk);
    cpu::Decode(out.data(), 1, chunk, chunk, dec.data());
    for (size_t j = 0; j < chunk; ++j) {
      const bool in_bad = j >= 32 && j < 64;
      if (in_bad) {
        EXPECT_EQ(out[3 + j], 0) << j;
      }
      EXPECT_EQ(std::isnan(dec[j]), in_bad) << j;
      EXPECT_EQ(std::isnan(err[j]), in_bad) << j;
    }
    // The server: a NaN block from one worker makes that sub-block NaN in the result.
    std::vector<float> serr(chunk, 0.0f);
    std::vector<uint8_t> two(2 * BlockBytes(chunk)), res(BlockBytes(chunk));
    std::memcpy(two.data(), out.data(), out.size());
    std::memcpy(two.data() + out.size(), out.data(), out.size());
    two[out.size() + 1] = 120;  // the second worker's sub-block 1 is finite
    cpu::ServerAggregate(two.data(), 2, chunk, serr.data(), res.data());
    EXPECT_EQ(res[1], kNanScale);
    EXPECT_NE(res[0], kNanScale);
    EXPECT_NE(res[2], kNanScale);
  }
  const Codec& codec = Fp8Codec();
  uint8_t header = kNanScale;
  std::optional<HeaderFault> fault = codec.CheckHeader(&header);
  ASSERT_TRUE(fault.has_value());
  EXPECT_EQ(fault->field, "scale byte");
  EXPECT_EQ(fault->rule, "below 255 (255 is NaN)");
  EXPECT_EQ(fault->value, 255.0f);
  for (int b = 0; b < 255; ++b) {
    header = static_cast<uint8_t>(b);
    EXPECT_FALSE(codec.CheckHeader(&header).has_value()) << b;
  }
}

// Decode drops the padding: nothing at or past n is written.
TEST(Fp8KernelsTest, DecodeDropsThePadding) {
  const size_t chunk = 40, num_chunks = 3, n = 85;
  std::vector<float> m = Random(n, 5), err(chunk * num_chunks, 0.0f);
  std::vector<uint8_t> out(num_chunks * BlockBytes(chunk));
  cpu::CompressWorker(m.data(), nullptr, 0.0f, n, num_chunks, chunk, err.data(), out.data());
  std::vector<float> dec(chunk * num_chunks, -7.0f);
  cpu::Decode(out.data(), num_chunks, chunk, n, dec.data());
  for (size_t i = 0; i < n; ++i) EXPECT_EQ(dec[i] + err[i], m[i]) << i;
  for (size_t i = n; i < dec.size(); ++i) EXPECT_EQ(dec[i], -7.0f) << i;
}

// ---- The codec on backends -----------------------------------------------------------

struct Outputs {
  std::vector<uint8_t> blocks, aggregated;
  std::vector<float> err, server_err, decoded;
};

// Two steps of worker compression (fused momentum the second time), an aggregation of the
// blocks as that many workers' blocks of one chunk, and a decode, on `backend`.
Outputs RunCodec(kernels::Backend* backend, size_t n, size_t num_chunks, size_t chunk) {
  const Codec& codec = Fp8Codec();
  const std::vector<float> m = Random(n, 1), g = Random(n, 2);
  auto dm = *kernels::Buffer<float>::FromHost(backend, m.data(), n);
  auto dg = *kernels::Buffer<float>::FromHost(backend, g.data(), n);
  auto err = *kernels::Buffer<float>::Create(backend, num_chunks * chunk);
  auto out = *kernels::Buffer<uint8_t>::Create(backend, num_chunks * codec.BlockBytes(chunk));
  EXPECT_TRUE(codec.Compress(*backend, dm.data(), nullptr, 0.9f, n, num_chunks, chunk,
                             err.data(), out.data()).ok());
  EXPECT_TRUE(codec.Compress(*backend, dm.data(), dg.data(), 0.9f, n, num_chunks, chunk,
                             err.data(), out.data()).ok());
  auto serr = *kernels::Buffer<float>::Create(backend, chunk);
  auto agg = *kernels::Buffer<uint8_t>::Create(backend, codec.BlockBytes(chunk));
  EXPECT_TRUE(codec.Aggregate(*backend, out.data(), static_cast<int>(num_chunks), chunk,
                              serr.data(), agg.data()).ok());
  auto dec = *kernels::Buffer<float>::Create(backend, n);
  EXPECT_TRUE(codec.Decode(*backend, out.data(), num_chunks, chunk, n, dec.data()).ok());
  return {*out.ToHost(), *agg.ToHost(), *err.ToHost(), *serr.ToHost(), *dec.ToHost()};
}

TEST(Fp8CodecTest, CpuBackendAndSimulatedDeviceGiveTheSameBytes) {
  for (int threads : {1, 2}) {
    std::unique_ptr<kernels::Backend> cpu = kernels::NewCpuBackend(true, threads);
    absl::StatusOr<std::unique_ptr<kernels::Backend>> device =
        kernels::NewSimulatedDeviceBackend(threads);
    ASSERT_TRUE(device.ok()) << device.status();
    for (size_t chunk : {8, 37, 1000, 70000}) {
      for (size_t num_chunks : {1, 4}) {
        const size_t n = chunk * num_chunks - (chunk > 8 ? 7 : 0);
        SCOPED_TRACE(testing::Message() << "threads " << threads << " chunk " << chunk << " x"
                                        << num_chunks << " n " << n);
        const Outputs a = RunCodec(cpu.get(), n, num_chunks, chunk);
        const Outputs b = RunCodec(device->get(), n, num_chunks, chunk);
        EXPECT_EQ(a.blocks, b.blocks);
        EXPECT_EQ(a.aggregated, b.aggregated);
        EXPECT_EQ(0, std::memcmp(a.err.data(), b.err.data(), a.err.size() * 4));
        EXPECT_EQ(0, std::memcmp(a.server_err.data(), b.server_err.data(), chunk * 4));
        EXPECT_EQ(0, std::memcmp(a.decoded.data(), b.decoded.data(), n * 4));
        // And the host loops' bytes: the codec forwards to them on both.
        EXPECT_FALSE(Fp8Codec().CheckHeader(a.aggregated.data()).has_value());
      }
    }
  }
}

TEST(Fp8CodecTest, RejectsBadArguments) {
  const Codec& codec = Fp8Codec();
  std::unique_ptr<kernels::Backend> cpu = kernels::NewCpuBackend();
  std::vector<float> x(64), err(64);
  std::vector<uint8_t> out(2 * codec.BlockBytes(32));
  EXPECT_EQ(codec.Compress(*cpu, x.data(), nullptr, 0.9f, 65, 2, 32, err.data(), out.data())
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(codec.Aggregate(*cpu, out.data(), 0, 32, err.data(), out.data()).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(codec.Decode(*cpu, out.data(), 2, 32, 65, x.data()).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(codec.Compress(*cpu, x.data(), nullptr, 0.9f, 0, SIZE_MAX, 2, err.data(),
                           out.data()).code(),
            absl::StatusCode::kInvalidArgument);
  // Nothing to do: no pointer is touched.
  EXPECT_TRUE(codec.Compress(*cpu, nullptr, nullptr, 0.9f, 0, 0, 32, nullptr, nullptr).ok());
  EXPECT_TRUE(codec.Decode(*cpu, nullptr, 0, 32, 0, nullptr).ok());
  EXPECT_TRUE(codec.Aggregate(*cpu, nullptr, 1, 0, nullptr, nullptr).ok());
}

// This test links no CUDA kernels: the codec has host kernels only.
TEST(Fp8CodecTest, NoDeviceKernelsWithoutTheCudaLibrary) {
  EXPECT_EQ(RegisteredDeviceKernels(), nullptr);
  EXPECT_EQ(Fp8Codec().name(), "fp8");
  EXPECT_EQ(Fp8Codec().alignment(), 1u);
  EXPECT_EQ(Fp8Codec().header_bytes(), 1u);
  EXPECT_FALSE(Fp8Codec().fuses_frozen_update());
}

}  // namespace
}  // namespace onebit::fp8
