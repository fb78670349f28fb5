#include "checkpoint/part.h"

#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <random>
#include <string>

#include "gtest/gtest.h"

namespace onebit::checkpoint {
namespace {

Part Example() {
  Part part;
  part.meta["role"] = "worker";
  part.PutMetaInt("step", 10);
  part.Put("params", {1.0f, -2.5f, 3.25f});
  part.Put("worker_error", {});
  Tensor t;
  t.shape = {2, 3};
  t.data = {1, 2, 3, 4, 5, 6};
  part.tensors["matrix"] = t;
  return part;
}

TEST(PartTest, RoundTripsBitForBit) {
  const Part part = Example();
  const std::string bytes = EncodePart(part);
  absl::StatusOr<Part> back = DecodePart(bytes);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->meta, part.meta);
  ASSERT_EQ(back->tensors.size(), 3u);
  EXPECT_EQ(back->tensors.at("params").data, part.tensors.at("params").data);
  EXPECT_EQ(back->tensors.at("matrix").shape, (std::vector<uint64_t>{2, 3}));
  EXPECT_TRUE(back->tensors.at("worker_error").data.empty());
  EXPECT_EQ(*back->MetaInt("step"), 10);
  EXPECT_EQ(back->MetaInt("nope").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(back->MetaInt("role").status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(back->Get("nope").status().code(), absl::StatusCode::kNotFound);
}

TEST(PartTest, EveryTruncationIsDataLoss) {
  const std::string bytes = EncodePart(Example());
  for (size_t len = 8; len < bytes.size(); ++len) {
    absl::StatusOr<Part> got = DecodePart(bytes.substr(0, len));
    EXPECT_EQ(got.status().code(), absl::StatusCode::kDataLoss) << "length " << len;
  }
}

TEST(PartTest, EveryFlippedBitIsCaught) {
  const std::string bytes = EncodePart(Example());
  for (size_t i = 0; i < bytes.size(); ++i) {
    std::string bad = bytes;
    bad[i] ^= 0x10;
    absl::StatusOr<Part> got = DecodePart(bad);
    EXPECT_FALSE(got.ok()) << "byte " << i;
  }
}

TEST(PartTest, ForeignFilesAreInvalidArgument) {
  EXPECT_EQ(DecodePart("").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DecodePart("\x93NUMPY").status().code(), absl::StatusCode::kInvalidArgument);
  std::string other_version = EncodePart(Example());
  other_version[8] = 7;
  EXPECT_EQ(DecodePart(other_version).status().code(), absl::StatusCode::kInvalidArgument);
}

// A body that claims a huge tensor with a valid checksum: rejected without allocating.
TEST(PartTest, HugeShapesWithAValidChecksumAreRejected) {
  std::string body;
  auto u32 = [&](uint32_t v) { body.append(reinterpret_cast<const char*>(&v), 4); };
  auto u64 = [&](uint64_t v) { body.append(reinterpret_cast<const char*>(&v), 8); };
  u32(0);  // meta
  u32(1);  // tensors
  u32(1);
  body += "x";
  body.push_back(1);
  u32(2);
  u64(uint64_t{1} << 40);
  u64(uint64_t{1} << 40);
  std::string bytes(kPartMagic, 8);
  const uint32_t version = kPartVersion;
  bytes.append(reinterpret_cast<const char*>(&version), 4);
  const uint64_t len = body.size();
  bytes.append(reinterpret_cast<const char*>(&len), 8);
  bytes += body;
  const uint32_t crc = Crc32(bytes);
  bytes.append(reinterpret_cast<const char*>(&crc), 4);
  absl::StatusOr<Part> got = DecodePart(bytes);
  ASSERT_EQ(got.status().code(), absl::StatusCode::kDataLoss) << got.status();
  EXPECT_NE(got.status().message().find("larger than the file"), std::string::npos);
}

TEST(PartTest, RandomBytesNeverCrash) {
  std::mt19937 rng(7);
  const std::string good = EncodePart(Example());
  for (int i = 0; i < 2000; ++i) {
    std::string bytes = good;
    const int edits = 1 + rng() % 4;
    for (int e = 0; e < edits; ++e) bytes[rng() % bytes.size()] = static_cast<char>(rng());
    bytes.resize(rng() % (bytes.size() + 1));
    (void)DecodePart(bytes);
  }
}

TEST(PartTest, FilesRoundTripAndReportTheirChecksum) {
  const std::string path = std::string(std::getenv("TEST_TMPDIR")) + "/p.part";
  absl::StatusOr<WrittenFile> written = WritePart(path, Example());
  ASSERT_TRUE(written.ok()) << written.status();
  absl::StatusOr<WrittenFile> check = ChecksumFile(path);
  ASSERT_TRUE(check.ok());
  EXPECT_EQ(check->bytes, written->bytes);
  EXPECT_EQ(check->crc32, written->crc32);
  ASSERT_TRUE(ReadPart(path).ok());
  ASSERT_EQ(truncate(path.c_str(), written->bytes - 3), 0);
  absl::StatusOr<Part> cut = ReadPart(path);
  EXPECT_EQ(cut.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(cut.status().message().find(path), std::string::npos) << cut.status();
  EXPECT_EQ(ReadPart(path + ".missing").status().code(), absl::StatusCode::kNotFound);
}

// The head: meta and shapes without the elements, so a damaged element is not seen (the
// full read catches it); any truncation, a foreign file and a missing one are.
TEST(PartTest, TheHeadHasMetaAndShapesOnly) {
  const std::string path = std::string(std::getenv("TEST_TMPDIR")) + "/head.part";
  const Part part = Example();
  ASSERT_TRUE(WritePart(path, part).ok());
  absl::StatusOr<Part> head = ReadPartHead(path);
  ASSERT_TRUE(head.ok()) << head.status();
  EXPECT_EQ(head->meta, part.meta);
  ASSERT_EQ(head->tensors.size(), 3u);
  EXPECT_EQ(head->tensors.at("params").shape, (std::vector<uint64_t>{3}));
  EXPECT_EQ(head->tensors.at("matrix").shape, (std::vector<uint64_t>{2, 3}));
  for (const auto& [name, t] : head->tensors) EXPECT_TRUE(t.data.empty()) << name;

  std::string bytes = EncodePart(part);
  const size_t element = bytes.find(std::string("\x00\x00\x20\xc0", 4));  // -2.5f
  ASSERT_NE(element, std::string::npos);
  bytes[element + 3] ^= 0x01;
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
  EXPECT_TRUE(ReadPartHead(path).ok());
  EXPECT_EQ(ReadPart(path).status().code(), absl::StatusCode::kDataLoss);

  for (size_t len : {size_t{4}, size_t{20}, bytes.size() / 2, bytes.size() - 1}) {
    std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes.substr(0, len);
    absl::StatusOr<Part> cut = ReadPartHead(path);
    EXPECT_FALSE(cut.ok()) << "length " << len;
    if (len >= 8) EXPECT_EQ(cut.status().code(), absl::StatusCode::kDataLoss) << cut.status();
    EXPECT_NE(cut.status().message().find(path), std::string::npos) << cut.status();
  }
  std::ofstream(path, std::ios::binary | std::ios::trunc) << "NOTAPART and more bytes here";
  EXPECT_EQ(ReadPartHead(path).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ReadPartHead(path + ".missing").status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace onebit::checkpoint
