// FaultExchange (--fault=kill_in_exchange:STEP) with sharded state: the three calls that
// open a step's exchange (SumGradientsOfShard, AverageMomentumOfShard, ShardRows) kill the
// process at the fault's step and forward at every other; the calls inside a step
// (CompressedAverageOfRows, AllGatherShards, AllGatherShardBytes, GatherPartials) always
// forward.
#include "worker/fault_exchange.h"

#include <csignal>
#include <vector>

#include "gtest/gtest.h"
#include "worker/exchange/recording_exchange.h"

namespace onebit {
namespace {

constexpr int64_t kFaultStep = 7;
constexpr char kKilled[] = "killing worker 3 at the exchange of step 7";

TEST(FaultExchangeDeathTest, TheShardCallsThatOpenAStepKillAtTheFaultStep) {
  float grad[4] = {}, m[4] = {};
  RecordingExchange inner;
  FaultExchange f(&inner, kFaultStep, "worker 3");
  EXPECT_EXIT(f.SumGradientsOfShard(kFaultStep, grad).IgnoreError(),
              ::testing::KilledBySignal(SIGKILL), kKilled);
  EXPECT_EXIT(f.AverageMomentumOfShard(kFaultStep, m, grad, 0.9f, 1.0f).IgnoreError(),
              ::testing::KilledBySignal(SIGKILL), kKilled);
  EXPECT_EXIT(f.ShardRows(kFaultStep, grad, 1.0f).IgnoreError(), ::testing::KilledBySignal(SIGKILL),
              kKilled);
}

TEST(FaultExchangeTest, ShardCallsForwardAtOtherSteps) {
  float grad[4] = {}, m[4] = {}, whole[8] = {};
  RecordingExchange inner;
  FaultExchange f(&inner, kFaultStep, "worker 3");
  ASSERT_TRUE(f.state_shard().has_value());
  EXPECT_EQ(f.state_shard()->replicas, 3);
  EXPECT_EQ(f.buffer_bytes(), inner.bytes);
  EXPECT_TRUE(f.SumGradientsOfShard(kFaultStep - 1, grad).ok());
  EXPECT_TRUE(f.AverageMomentumOfShard(kFaultStep + 1, m, grad, 0.9f, 1.0f).ok());
  EXPECT_TRUE(f.ShardRows(kFaultStep - 1, grad, 1.0f).ok());
  // The rows' average belongs to the step ShardRows opened: it never kills.
  EXPECT_TRUE(f.CompressedAverageOfRows(kFaultStep).ok());
  EXPECT_TRUE(f.AllGatherShards(whole).ok());
  EXPECT_TRUE(f.GatherPartials({1.0}).ok());
  EXPECT_TRUE(f.AllGatherShardBytes(whole, 2).ok());
  ASSERT_EQ(inner.calls.size(), 7u);
  EXPECT_EQ(inner.calls[0].step, kFaultStep - 1);
  EXPECT_EQ(inner.calls[1].step, kFaultStep + 1);
  EXPECT_EQ(inner.calls[3].name, "CompressedAverageOfRows");
  EXPECT_EQ(inner.calls[3].step, kFaultStep);
}

}  // namespace
}  // namespace onebit
