// The chunk layouts: padding, chunk sizes and the parameter-server runs.
#include "compression/layout.h"

#include <string>

#include "gtest/gtest.h"

namespace onebit {
namespace {

TEST(PeerPaddedSizeTest, IsAMultipleOfWTimesLcm) {
  EXPECT_EQ(PeerPaddedSize(0, 3), 0u);
  EXPECT_EQ(PeerPaddedSize(1, 1), 8u);
  EXPECT_EQ(PeerPaddedSize(1, 2), 16u);
  EXPECT_EQ(PeerPaddedSize(1, 3), 72u);    // 3 * lcm(3, 8) = 72
  EXPECT_EQ(PeerPaddedSize(1000, 8), 1024u);
  EXPECT_EQ(PeerPaddedSize(10007, 5), 10200u);  // 5 * 40 = 200
}

TEST(PsLayoutTest, SplitsAndPads) {
  for (size_t n : {1, 7, 8, 100, 1001, 10007}) {
    for (int s : {1, 2, 3, 4, 5, 8}) {
      auto layout = PsLayout::Create(n, s);
      ASSERT_TRUE(layout.ok());
      EXPECT_EQ(layout->padded_size() % (8 * static_cast<size_t>(s)), 0u);
      EXPECT_GE(layout->padded_size(), n);
      EXPECT_EQ(layout->block_bytes(), 4 + layout->chunk() / 8);
      size_t next = 0;
      for (int shard = 0; shard < s; ++shard) {  // contiguous runs covering [0, n)
        EXPECT_EQ(layout->fp32_offset(shard), next);
        EXPECT_LE(layout->fp32_count(shard), layout->max_fp32_count());
        EXPECT_GE(layout->fp32_count(shard) + 1, layout->max_fp32_count());
        for (ChunkKind kind : {ChunkKind::kFp32, ChunkKind::kOnebit}) {
          EXPECT_LE(layout->payload_bytes(kind, shard), layout->max_payload_bytes());
        }
        next += layout->fp32_count(shard);
      }
      EXPECT_EQ(next, n);
      EXPECT_EQ(layout->max_message_bytes(),
                layout->max_payload_bytes() + PsLayout::kMessageOverheadBytes);
    }
  }
  EXPECT_EQ(PsLayout::Create(1, 3)->padded_size(), 72u);  // 3 * lcm(3, 8)
  EXPECT_FALSE(PsLayout::Create(0, 2).ok());
  EXPECT_FALSE(PsLayout::Create(10, 0).ok());
}

TEST(PsLayoutTest, PaddingIsPeerPaddingWithShardsForWorkers) {
  for (size_t n : {1, 7, 8, 9, 100, 1000, 1003, 10007}) {
    for (int s = 1; s <= 16; ++s) {
      EXPECT_EQ(PsLayout::Create(n, s)->padded_size(), PeerPaddedSize(n, s))
          << "n " << n << " S " << s;
    }
  }
}

// A warmup push carries a shard's fp32 run in one gRPC message, which may not exceed 2 GiB:
// 1.2B parameters need 3 shards (2 give pushes of 2.4 GB), and the error says so; 1.07B
// (tools/gpu's 1b model) still fits in pushes to 2.
TEST(PsLayoutTest, RefusesPushesOverTwoGibibytes) {
  const absl::StatusOr<PsLayout> two = PsLayout::Create(1'200'000'000, 2);
  ASSERT_FALSE(two.ok());
  EXPECT_EQ(two.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(two.status().message().find("use at least 3 shards"), std::string::npos)
      << two.status();
  const absl::StatusOr<PsLayout> three = PsLayout::Create(1'200'000'000, 3);
  ASSERT_TRUE(three.ok()) << three.status();
  EXPECT_LE(three->max_message_bytes(), size_t{2147483647});
  const absl::StatusOr<PsLayout> gpt_1b = PsLayout::Create(1'071'329'280, 2);
  ASSERT_TRUE(gpt_1b.ok()) << gpt_1b.status();
}

TEST(HierarchicalLayoutTest, SlicesCoverThePaddedTensor) {
  for (size_t n : {1, 7, 8, 100, 1001, 10007}) {
    for (int local : {1, 2, 3, 4}) {
      for (int inter : {1, 2, 3, 5}) {
        auto layout = HierarchicalLayout::Create(n, local, inter);
        ASSERT_TRUE(layout.ok());
        EXPECT_EQ(layout->slice() % (8 * static_cast<size_t>(inter)), 0u);
        EXPECT_EQ(PeerPaddedSize(layout->slice(), inter), layout->slice());  // no extra padding
        EXPECT_GE(layout->padded_size(), n);
        const size_t per_worker = (n + local - 1) / local;  // the smallest such multiple
        EXPECT_GE(layout->slice(), per_worker);
        EXPECT_LT(layout->slice() - PeerPaddedSize(1, inter), per_worker);
        EXPECT_EQ(layout->chunk() * layout->num_chunks(), layout->padded_size());
        size_t covered = 0;
        for (int l = 0; l < local; ++l) covered += layout->slice_count(l);
        EXPECT_EQ(covered, n);
      }
    }
  }
  // 4 nodes of one worker: the flat peer layout.
  EXPECT_EQ(HierarchicalLayout::Create(10007, 1, 4)->padded_size(), PeerPaddedSize(10007, 4));
  EXPECT_EQ(HierarchicalLayout::Create(10, 4, 2)->slice(), 16u);  // ceil(10/4) = 3 -> 16
  EXPECT_EQ(HierarchicalLayout::Create(10, 4, 2)->slice_count(3), 0u);
  EXPECT_FALSE(HierarchicalLayout::Create(0, 2, 2).ok());
  EXPECT_FALSE(HierarchicalLayout::Create(10, 0, 2).ok());
  EXPECT_FALSE(HierarchicalLayout::Create(10, 2, 0).ok());
}

}  // namespace
}  // namespace onebit
