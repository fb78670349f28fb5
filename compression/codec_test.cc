// Every registered codec: its names, sizes and header checks, its compression with error
// feedback, aggregation and decode on the CPU backend, and, for a codec whose kernels are
// Backend methods, that it forwards to them (same bytes, same error buffers).
#include "compression/codec.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "compression/codec_registry.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/kernels.h"

namespace onebit {
namespace {

using ::testing::HasSubstr;

std::vector<float> Random(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// The Backend methods a codec forwards to, by name: the formats of kernels.h.
struct Direct {
  size_t (*block_bytes)(size_t);
  absl::Status (kernels::Backend::*compress)(const float*, const float*, float, size_t, size_t,
                                             size_t, float*, uint8_t*);
  absl::Status (kernels::Backend::*aggregate)(const uint8_t*, int, size_t, float*, uint8_t*);
  absl::Status (kernels::Backend::*decode)(const uint8_t*, size_t, size_t, size_t, float*);
};

size_t OnebitBytes(size_t c) { return kernels::CompressedBlockBytes(c); }
size_t Int8Bytes(size_t c) { return kernels::Int8BlockBytes(c); }

// nullopt for a codec whose kernels live with it rather than in kernels::Backend (fp8:
// compression/fp8/fp8_test checks those against its float64 model and across backends);
// this test then checks only what holds for every codec.
std::optional<Direct> DirectFor(absl::string_view name) {
  if (name == "int8") {
    return Direct{Int8Bytes, &kernels::Backend::CompressWorkerInt8,
                  &kernels::Backend::ServerAggregateInt8, &kernels::Backend::DecompressInt8};
  }
  if (name == "onebit") {
    return Direct{OnebitBytes, &kernels::Backend::CompressWorker,
                  &kernels::Backend::ServerAggregate, &kernels::Backend::Decompress};
  }
  return std::nullopt;
}

TEST(CodecRegistryTest, NamesAreUniqueAndFound) {
  const std::vector<const Codec*> all = AllCodecs();
  ASSERT_GE(all.size(), 2u);
  EXPECT_EQ(all[0], &OnebitCodec());
  std::set<std::string> names;
  for (const Codec* codec : all) {
    EXPECT_TRUE(names.insert(std::string(codec->name())).second) << codec->name();
    absl::StatusOr<const Codec*> found = FindCodec(codec->name());
    ASSERT_TRUE(found.ok()) << found.status();
    EXPECT_EQ(*found, codec);
  }
  EXPECT_EQ(*FindCodec("int8"), &Int8Codec());
  EXPECT_EQ(*FindCodec("fp8"), &Fp8Codec());
}

TEST(CodecRegistryTest, UnknownNameListsTheCodecs) {
  absl::StatusOr<const Codec*> found = FindCodec("int4");
  ASSERT_FALSE(found.ok());
  EXPECT_EQ(found.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(found.status().message(),
            "unknown compressor \"int4\": must be \"onebit\", \"int8\" or \"fp8\"");
  EXPECT_FALSE(FindCodec("").ok());
  EXPECT_FALSE(FindCodec("ONEBIT").ok());
}

TEST(CodecTest, SizesMatchTheFormats) {
  for (const Codec* codec : AllCodecs()) {
    SCOPED_TRACE(std::string(codec->name()));
    EXPECT_GE(codec->alignment(), 1u);
    EXPECT_EQ(8 % codec->alignment(), 0u);  // the layouts' chunks are multiples of 8
    // Chunks are never empty (codec.h): the header fits the smallest block.
    EXPECT_LE(codec->header_bytes(), codec->BlockBytes(codec->alignment()));
    size_t last = 0;
    for (size_t chunk : {0, 8, 16, 64, 1000, 1 << 20}) {
      EXPECT_GE(codec->BlockBytes(chunk), last) << chunk;
      last = codec->BlockBytes(chunk);
    }
    const std::optional<Direct> direct = DirectFor(codec->name());
    if (!direct.has_value()) continue;
    for (size_t chunk : {0, 8, 16, 64, 1000, 1 << 20}) {
      EXPECT_EQ(codec->BlockBytes(chunk), direct->block_bytes(chunk)) << chunk;
    }
  }
}

// A header that a codec must reject, with the fault it names.
struct BadHeader {
  std::vector<uint8_t> bytes;
  absl::string_view field, rule;
};

std::vector<uint8_t> FloatHeader(float scale, float offset = 0.0f, size_t bytes = 4) {
  std::vector<uint8_t> header(bytes, 0);
  std::memcpy(header.data(), &scale, 4);
  if (bytes >= 8) std::memcpy(header.data() + 4, &offset, 4);
  return header;
}

// The known bad headers of each codec, by name (none listed: only the checks below that
// hold for every codec).
std::vector<BadHeader> BadHeadersFor(absl::string_view name) {
  const float kNan = std::numeric_limits<float>::quiet_NaN();
  const float kInf = std::numeric_limits<float>::infinity();
  std::vector<BadHeader> bad;
  if (name == "onebit" || name == "int8") {
    const size_t bytes = name == "int8" ? 8 : 4;
    for (float scale : {kNan, kInf, -kInf, -1.0f}) {
      bad.push_back({FloatHeader(scale, 0.0f, bytes), "scale", "finite and >= 0"});
    }
  }
  if (name == "int8") bad.push_back({FloatHeader(1.0f, kNan, 8), "offset", "finite"});
  if (name == "fp8") bad.push_back({{255}, "scale byte", "below 255 (255 is NaN)"});
  return bad;
}

TEST(CodecTest, HeaderChecks) {
  auto backend = kernels::NewCpuBackend();
  for (const Codec* codec : AllCodecs()) {
    SCOPED_TRACE(std::string(codec->name()));
    // Every codec: the header of zeros compressed is valid, that of a NaN is not.
    const size_t chunk = 64;
    std::vector<float> x(chunk, 0.0f), err(chunk, 0.0f);
    std::vector<uint8_t> block(codec->BlockBytes(chunk));
    ASSERT_TRUE(codec->Compress(*backend, x.data(), nullptr, 0.9f, chunk, 1, chunk, err.data(),
                                block.data()).ok());
    EXPECT_FALSE(codec->CheckHeader(block.data()).has_value());
    x[0] = std::numeric_limits<float>::quiet_NaN();
    ASSERT_TRUE(codec->Compress(*backend, x.data(), nullptr, 0.9f, chunk, 1, chunk, err.data(),
                                block.data()).ok());
    EXPECT_TRUE(codec->CheckHeader(block.data()).has_value());
    // Its known bad headers, with the field and rule the shard's message names.
    for (const BadHeader& bad : BadHeadersFor(codec->name())) {
      ASSERT_EQ(bad.bytes.size(), codec->header_bytes());
      std::optional<HeaderFault> fault = codec->CheckHeader(bad.bytes.data());
      ASSERT_TRUE(fault.has_value());
      EXPECT_EQ(fault->field, bad.field);
      EXPECT_EQ(fault->rule, bad.rule);
    }
  }
  // int8's offset may be negative but must be finite.
  const Codec& int8 = Int8Codec();
  EXPECT_FALSE(int8.CheckHeader(FloatHeader(0.0f, -3.5f, 8).data()).has_value());
  std::optional<HeaderFault> fault =
      int8.CheckHeader(FloatHeader(0.0f, std::numeric_limits<float>::quiet_NaN(), 8).data());
  ASSERT_TRUE(fault.has_value());
  EXPECT_TRUE(std::isnan(fault->value));
}

// Compress, Aggregate and Decode over lengths that are and are not whole chunks, with and
// without the fused momentum: every compressed header passes CheckHeader, and what was sent
// plus the new error is what was compressed. A codec whose kernels are Backend methods
// gives their bytes and error buffers exactly.
TEST(CodecTest, CompressAggregateDecode) {
  auto backend = kernels::NewCpuBackend();
  for (const Codec* codec : AllCodecs()) {
    SCOPED_TRACE(std::string(codec->name()));
    const std::optional<Direct> direct = DirectFor(codec->name());
    for (size_t chunk : {8, 64, 1000}) {
      for (size_t num_chunks : {1, 3}) {
        const size_t n_pad = chunk * num_chunks;
        for (size_t n : {n_pad, n_pad - 5}) {
          for (bool fused : {false, true}) {
            SCOPED_TRACE(testing::Message() << "chunk " << chunk << " x" << num_chunks << " n "
                                            << n << " fused " << fused);
            const std::vector<float> m = Random(n, 1), g = Random(n, 2);
            const std::vector<float> err0 = Random(n_pad, 3);
            const size_t bytes = num_chunks * codec->BlockBytes(chunk);
            std::vector<float> err_codec = err0, err_direct = err0;
            std::vector<uint8_t> out_codec(bytes), out_direct(bytes);
            const float* gp = fused ? g.data() : nullptr;
            ASSERT_TRUE(codec->Compress(*backend, m.data(), gp, 0.9f, n, num_chunks, chunk,
                                        err_codec.data(), out_codec.data()).ok());
            if (direct.has_value()) {
              ASSERT_TRUE(((*backend).*direct->compress)(m.data(), gp, 0.9f, n, num_chunks,
                                                         chunk, err_direct.data(),
                                                         out_direct.data()).ok());
              EXPECT_EQ(out_codec, out_direct);
              EXPECT_EQ(0, std::memcmp(err_codec.data(), err_direct.data(), n_pad * 4));
            }
            for (size_t c = 0; c < num_chunks; ++c) {
              EXPECT_FALSE(
                  codec->CheckHeader(out_codec.data() + c * codec->BlockBytes(chunk)).has_value());
            }

            // The num_chunks blocks as that many workers' blocks of one chunk.
            std::vector<float> serr_codec = Random(chunk, 4), serr_direct = serr_codec;
            std::vector<uint8_t> agg_codec(codec->BlockBytes(chunk)), agg_direct(agg_codec.size());
            const int workers = static_cast<int>(num_chunks);
            ASSERT_TRUE(codec->Aggregate(*backend, out_codec.data(), workers, chunk,
                                         serr_codec.data(), agg_codec.data()).ok());
            EXPECT_FALSE(codec->CheckHeader(agg_codec.data()).has_value());
            if (direct.has_value()) {
              ASSERT_TRUE(((*backend).*direct->aggregate)(out_direct.data(), workers, chunk,
                                                          serr_direct.data(),
                                                          agg_direct.data()).ok());
              EXPECT_EQ(agg_codec, agg_direct);
              EXPECT_EQ(0, std::memcmp(serr_codec.data(), serr_direct.data(), chunk * 4));
            }

            std::vector<float> dec_codec(n), dec_direct(n);
            ASSERT_TRUE(codec->Decode(*backend, out_codec.data(), num_chunks, chunk, n,
                                      dec_codec.data()).ok());
            if (direct.has_value()) {
              ASSERT_TRUE(((*backend).*direct->decode)(out_direct.data(), num_chunks, chunk, n,
                                                       dec_direct.data()).ok());
              EXPECT_EQ(0, std::memcmp(dec_codec.data(), dec_direct.data(), n * 4));
            }
            // Error feedback: what was sent plus the new error is what was compressed.
            if (!fused) {
              for (size_t i = 0; i < n; ++i) {
                const float x = m[i] + err0[i];
                ASSERT_NEAR(dec_codec[i] + err_codec[i], x, 1e-5f * (1 + std::fabs(x))) << i;
              }
            }
          }
        }
      }
    }
  }
}

// A codec that fuses the frozen-Adam decode gives the bits of Decode + FrozenAdamUpdate; one
// that does not says so.
TEST(CodecTest, FusedFrozenUpdateMatchesDecodeThenUpdate) {
  auto backend = kernels::NewCpuBackend();
  kernels::AdamHyper h;
  h.lr = 0.01f;
  h.weight_decay = 0.1f;
  h.update_clip = 2.0f;
  const size_t chunk = 64, num_chunks = 3, n = chunk * num_chunks - 7;
  for (const Codec* codec : AllCodecs()) {
    SCOPED_TRACE(std::string(codec->name()));
    const std::vector<float> x = Random(n, 5), p0 = Random(n, 6);
    std::vector<float> v = Random(n, 7), mask(n, 1.0f);
    for (float& e : v) e = e * e;
    for (size_t i = 0; i < n; i += 3) mask[i] = 0.0f;
    std::vector<float> err(chunk * num_chunks, 0.0f);
    std::vector<uint8_t> blocks(num_chunks * codec->BlockBytes(chunk));
    ASSERT_TRUE(codec->Compress(*backend, x.data(), nullptr, 0.0f, n, num_chunks, chunk,
                                err.data(), blocks.data()).ok());
    std::vector<float> m_fused(n, 0.0f), p_fused = p0;
    const absl::Status fused =
        codec->DecodeFrozenAdamUpdate(*backend, blocks.data(), num_chunks, chunk, h, v.data(),
                                      mask.data(), m_fused.data(), p_fused.data(), n);
    if (!codec->fuses_frozen_update()) {
      EXPECT_EQ(fused.code(), absl::StatusCode::kUnimplemented);
      EXPECT_THAT(std::string(fused.message()), HasSubstr(std::string(codec->name())));
      continue;
    }
    ASSERT_TRUE(fused.ok()) << fused;
    std::vector<float> m(n), p = p0;
    ASSERT_TRUE(codec->Decode(*backend, blocks.data(), num_chunks, chunk, n, m.data()).ok());
    ASSERT_TRUE(backend->FrozenAdamUpdate(h, v.data(), mask.data(), m.data(), p.data(), n).ok());
    EXPECT_EQ(0, std::memcmp(m.data(), m_fused.data(), n * 4));
    EXPECT_EQ(0, std::memcmp(p.data(), p_fused.data(), n * 4));
  }
}

}  // namespace
}  // namespace onebit
