// exchange_wire against protobuf itself: the bytes it writes are protobuf's, what it reads
// from protobuf's bytes (in any slicing) is what protobuf reads, and bytes protobuf
// refuses are refused too, with an error rather than a crash.
#include "proto/exchange_wire.h"

#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "onebit/v1/exchange.pb.h"

namespace onebit::wire {
namespace {

grpc::Slice S(const std::string& s) { return grpc::Slice(s.data(), s.size()); }

// `bytes` cut into pieces at random places, as the network delivers them.
grpc::ByteBuffer Sliced(const std::string& bytes, std::mt19937& rng) {
  std::vector<grpc::Slice> slices;
  size_t at = 0;
  while (at < bytes.size()) {
    const size_t n = std::min<size_t>(bytes.size() - at, 1 + rng() % 7);
    slices.emplace_back(bytes.data() + at, n);
    at += n;
  }
  return grpc::ByteBuffer(slices.data(), slices.size());
}

v1::PushChunk RandomPush(std::mt19937& rng) {
  v1::PushChunk p;
  const int32_t ints[] = {0, 1, -1, 127, 128, 300, INT32_MAX, INT32_MIN};
  const int64_t longs[] = {0, 1, -5, 1LL << 40, INT64_MAX, INT64_MIN};
  p.set_worker(ints[rng() % 8]);
  p.set_step(longs[rng() % 6]);
  p.set_chunk(ints[rng() % 8]);
  p.set_kind(static_cast<v1::ChunkKind>(ints[rng() % 8]));
  std::string payload(rng() % 3 == 0 ? 0 : rng() % 300, '\0');
  for (char& c : payload) c = static_cast<char>(rng());
  p.set_payload(payload);
  p.set_checkpoint(rng() % 2 == 0);
  return p;
}

void ExpectSame(const PushFields& got, const v1::PushChunk& want) {
  EXPECT_EQ(got.worker, want.worker());
  EXPECT_EQ(got.step, want.step());
  EXPECT_EQ(got.chunk, want.chunk());
  EXPECT_EQ(got.kind, static_cast<int32_t>(want.kind()));
  EXPECT_EQ(got.checkpoint, want.checkpoint());
  EXPECT_EQ(std::string(got.payload), want.payload());
}

TEST(ExchangeWireTest, EncodesExactlyProtobufsBytes) {
  std::mt19937 rng(1);
  for (int i = 0; i < 500; ++i) {
    const v1::PushChunk p = RandomPush(rng);
    EXPECT_EQ(Flatten(EncodePush(p.worker(), p.step(), p.chunk(), p.kind(), p.checkpoint(),
                                 S(p.payload()))),
              p.SerializeAsString());
    v1::ChunkResult r;
    r.set_step(p.step());
    r.set_chunk(p.chunk());
    r.set_kind(p.kind());
    r.set_payload(p.payload());
    EXPECT_EQ(Flatten(EncodeResult(r.step(), r.chunk(), r.kind(), S(r.payload()))),
              r.SerializeAsString());
  }
}

TEST(ExchangeWireTest, ReadsWhatProtobufWritesInAnySlicing) {
  std::mt19937 rng(2);
  for (int i = 0; i < 500; ++i) {
    v1::PushChunk p = RandomPush(rng);
    std::string bytes = p.SerializeAsString();
    // Unknown fields of every wire type, and a repeated field (the last one wins).
    bytes += std::string("\x48\x96\x01", 3);                      // 9: varint
    bytes += std::string("\x55\x01\x02\x03\x04", 5);              // 10: fixed32
    bytes += std::string("\x59\x01\x02\x03\x04\x05\x06\x07\x08", 9);  // 11: fixed64
    bytes += std::string("\x62\x02zz", 4);                        // 12: bytes
    bytes += std::string("\x0a\x01x", 3);  // 1 (worker) with the wrong wire type: unknown
    bytes += std::string("\x08\x07", 2);   // worker = 7
    v1::PushChunk want;
    ASSERT_TRUE(want.ParseFromString(bytes));
    ASSERT_EQ(want.worker(), 7);
    absl::StatusOr<PushFields> got = ParsePush(ToCord(Sliced(bytes, rng)));
    ASSERT_TRUE(got.ok()) << got.status();
    ExpectSame(*got, want);

    v1::ChunkResult r;
    r.set_step(p.step());
    r.set_chunk(p.chunk());
    r.set_kind(p.kind());
    r.set_payload(p.payload());
    absl::StatusOr<ResultFields> result = ParseResult(ToCord(Sliced(r.SerializeAsString(), rng)));
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(result->step, r.step());
    EXPECT_EQ(result->chunk, r.chunk());
    EXPECT_EQ(result->kind, static_cast<int32_t>(r.kind()));
    EXPECT_EQ(std::string(result->payload), r.payload());
  }
}

TEST(ExchangeWireTest, TruncatedMessagesFailExactlyWhereProtobufFails) {
  std::mt19937 rng(3);
  int refused = 0;
  for (int i = 0; i < 50; ++i) {
    const std::string bytes = RandomPush(rng).SerializeAsString();
    for (size_t len = 0; len <= bytes.size(); ++len) {
      const std::string prefix = bytes.substr(0, len);
      v1::PushChunk want;
      const bool protobuf_ok = want.ParseFromString(prefix);
      absl::StatusOr<PushFields> got = ParsePush(ToCord(Sliced(prefix, rng)));
      ASSERT_EQ(got.ok(), protobuf_ok) << "prefix " << len << ": " << got.status();
      if (got.ok()) {
        ExpectSame(*got, want);
      } else {
        ++refused;
        EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
        EXPECT_NE(got.status().message().find("malformed PushChunk at byte"), std::string::npos)
            << got.status();
      }
    }
  }
  EXPECT_GT(refused, 100);
}

TEST(ExchangeWireTest, RandomBytesNeverCrashAndAreReadAsProtobufReadsThem) {
  std::mt19937 rng(4);
  for (int i = 0; i < 20000; ++i) {
    std::string bytes(rng() % 40, '\0');
    for (char& c : bytes) c = static_cast<char>(rng() % 4 == 0 ? rng() % 0x40 : rng());
    absl::StatusOr<PushFields> got = ParsePush(ToCord(Sliced(bytes, rng)));
    absl::StatusOr<ResultFields> result = ParseResult(ToCord(Sliced(bytes, rng)));
    v1::PushChunk want;
    // protobuf also takes groups, which this refuses (proto3 has none); what this takes,
    // protobuf takes and reads the same.
    if (got.ok()) {
      ASSERT_TRUE(want.ParseFromString(bytes));
      ExpectSame(*got, want);
    }
    if (result.ok()) {
      v1::ChunkResult r;
      ASSERT_TRUE(r.ParseFromString(bytes));
      EXPECT_EQ(std::string(result->payload), r.payload());
      EXPECT_EQ(result->step, r.step());
    }
  }
}

TEST(ExchangeWireTest, NamedErrors) {
  auto error = [](const std::string& bytes) {
    return std::string(ParsePush(absl::Cord(bytes)).status().message());
  };
  EXPECT_EQ(error(std::string("\x08\x80", 2)),
            "malformed PushChunk at byte 1 of 2: a varint runs past the end");
  EXPECT_EQ(error(std::string("\x08" "\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01", 12)),
            "malformed PushChunk at byte 1 of 12: a varint is longer than 10 bytes");
  EXPECT_EQ(error(std::string("\x2a\x05" "abc", 5)),
            "malformed PushChunk at byte 1 of 5: a field of 5 bytes, but only 3 are left");
  EXPECT_EQ(error(std::string("\x00\x01", 2)),
            "malformed PushChunk at byte 0 of 2: field number 0 is outside [1, 2^29)");
  EXPECT_EQ(error(std::string("\x0b\x0c", 2)),
            "malformed PushChunk at byte 0 of 2: a group (wire type 3/4); proto3 messages have none");
  EXPECT_EQ(error(std::string("\x0f", 1)), "malformed PushChunk at byte 0 of 1: wire type 7 is invalid");
  EXPECT_EQ(error(std::string("\x0d\x01\x02", 3)),
            "malformed PushChunk at byte 1 of 3: a fixed-size field runs past the end");
}

TEST(ExchangeWireTest, PayloadIsSharedNotCopied) {
  auto bytes = std::make_shared<const std::string>(1 << 20, 'q');
  const char* data = bytes->data();
  grpc::ByteBuffer buffer = EncodeResult(3, 1, 1, SharedSlice(bytes));
  grpc::ByteBuffer second = buffer;  // what every puller gets: a reference
  EXPECT_EQ(bytes.use_count(), 2);   // the slice holds the result alive
  std::weak_ptr<const std::string> weak = bytes;
  bytes.reset();
  EXPECT_FALSE(weak.expired());
  absl::StatusOr<ResultFields> parsed = ParseResult(ToCord(second));
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  ASSERT_EQ(parsed->payload.size(), 1u << 20);
  // The payload read back is the result string's own memory.
  EXPECT_EQ(parsed->payload.Chunks().begin()->data(), data);
  std::string copy(parsed->payload.size(), '\0');
  CopyTo(parsed->payload, copy.data());
  EXPECT_EQ(copy, std::string(1 << 20, 'q'));
  buffer.Clear();
  second.Clear();
  parsed->payload.Clear();
  EXPECT_TRUE(weak.expired());
}

}  // namespace
}  // namespace onebit::wire
