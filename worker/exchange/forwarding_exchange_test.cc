// The base Exchange's sharded-state defaults (nullopt, UNIMPLEMENTED, 0 bytes), and
// ForwardingExchange passing every sharded-state call through with its arguments and its
// answer.
#include "worker/exchange/forwarding_exchange.h"

#include <vector>

#include "gtest/gtest.h"
#include "worker/exchange/recording_exchange.h"

namespace onebit {
namespace {

TEST(ExchangeTest, AnExchangeWithoutShardsSaysSo) {
  BareExchange e;
  float x[4] = {};
  std::vector<float> whole(8);
  EXPECT_FALSE(e.state_shard().has_value());
  EXPECT_EQ(e.buffer_bytes(), 0u);
  const auto unimplemented = [](const absl::Status& s) {
    return s.code() == absl::StatusCode::kUnimplemented &&
           s.message().find("shard_state") != absl::string_view::npos;
  };
  EXPECT_TRUE(unimplemented(e.SumGradientsOfShard(1, x).status()));
  EXPECT_TRUE(unimplemented(e.AverageMomentumOfShard(1, x, x, 0.9f, 1.0f).status()));
  EXPECT_TRUE(unimplemented(e.ShardRows(1, x).status()));
  EXPECT_TRUE(unimplemented(e.CompressedAverageOfRows(1).status()));
  EXPECT_TRUE(unimplemented(e.AllGatherShards(whole.data())));
  EXPECT_TRUE(unimplemented(e.AllGatherShardBytes(whole.data(), 2)));
  EXPECT_TRUE(unimplemented(e.GatherPartials({1.0}).status()));
  EXPECT_EQ(e.reduction_stride(), 0u);
}

TEST(ForwardingExchangeTest, ForwardsEveryShardCall) {
  RecordingExchange inner;
  ForwardingExchange f(&inner);
  float grad[3] = {}, m[3] = {}, whole[6] = {};
  const uint16_t grad16[3] = {};  // a bf16 gradient keeps its dtype through the forwarder

  const std::optional<StateShard> s = f.state_shard();
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->begin, 10u);
  EXPECT_EQ(s->end, 20u);
  EXPECT_EQ(s->stride, 16u);
  EXPECT_EQ(s->piece, 1);
  EXPECT_EQ(s->pieces, 2);
  EXPECT_EQ(s->replica, 0);
  EXPECT_EQ(s->replicas, 3);
  EXPECT_EQ(f.buffer_bytes(), 12345u);

  absl::StatusOr<const float*> sum = f.SumGradientsOfShard(4, grad);
  ASSERT_TRUE(sum.ok());
  EXPECT_EQ(*sum, grad + 1);
  absl::StatusOr<CompressedResult> avg = f.AverageMomentumOfShard(
      5, m, Gradient(grad16, kernels::WireDtype::kBf16), 0.75f, 0.5f);
  ASSERT_TRUE(avg.ok());
  EXPECT_EQ(avg->chunk, 5u);
  absl::StatusOr<float*> rows = f.ShardRows(6, grad, 0.25f);
  ASSERT_TRUE(rows.ok());
  EXPECT_EQ(*rows, inner.rows);
  absl::StatusOr<CompressedResult> rows_avg = f.CompressedAverageOfRows(6);
  ASSERT_TRUE(rows_avg.ok());
  EXPECT_EQ(rows_avg->chunk, 6u);
  EXPECT_TRUE(f.AllGatherShards(whole).ok());
  absl::StatusOr<std::vector<double>> partials = f.GatherPartials({1.5, -2.0});
  ASSERT_TRUE(partials.ok());
  EXPECT_EQ(*partials, (std::vector<double>{1.5, -2.0, 1.5, -2.0}));
  EXPECT_TRUE(f.AllGatherShardBytes(whole, 2).ok());

  ASSERT_EQ(inner.calls.size(), 7u);
  EXPECT_EQ(inner.calls[0].name, "SumGradientsOfShard");
  EXPECT_EQ(inner.calls[0].step, 4);
  EXPECT_EQ(inner.calls[0].first, grad);
  EXPECT_EQ(inner.calls[1].name, "AverageMomentumOfShard");
  EXPECT_EQ(inner.calls[1].step, 5);
  EXPECT_EQ(inner.calls[1].first, m);
  EXPECT_EQ(inner.calls[1].second, grad16);
  EXPECT_EQ(inner.calls[1].dtype, kernels::WireDtype::kBf16);
  EXPECT_EQ(inner.calls[1].beta1, 0.75f);
  EXPECT_EQ(inner.calls[1].g_scale, 0.5f);
  EXPECT_EQ(inner.calls[2].name, "ShardRows");
  EXPECT_EQ(inner.calls[2].step, 6);
  EXPECT_EQ(inner.calls[2].first, grad);
  EXPECT_EQ(inner.calls[2].g_scale, 0.25f);
  EXPECT_EQ(inner.calls[2].dtype, kernels::WireDtype::kFp32);
  EXPECT_EQ(inner.calls[3].name, "CompressedAverageOfRows");
  EXPECT_EQ(inner.calls[3].step, 6);
  EXPECT_EQ(inner.calls[4].name, "AllGatherShards");
  EXPECT_EQ(inner.calls[4].first, whole);
  EXPECT_EQ(inner.calls[5].name, "GatherPartials");
  EXPECT_EQ(inner.calls[5].partials, (std::vector<double>{1.5, -2.0}));
  EXPECT_EQ(inner.calls[6].name, "AllGatherShardBytes");
  EXPECT_EQ(inner.calls[6].first, whole);
  EXPECT_EQ(inner.calls[6].element_bytes, 2u);
}

}  // namespace
}  // namespace onebit
