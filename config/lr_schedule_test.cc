#include "config/lr_schedule.h"

#include <cmath>
#include <string>

#include "gtest/gtest.h"

namespace onebit {
namespace {

SchedulerConfig Schedule(const std::string& scheduler_json) {
  auto c = ParseJobConfig(R"({"scheduler": )" + scheduler_json + "}");
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? c->scheduler : SchedulerConfig{};
}

constexpr double kTol = 1e-15;

TEST(LrScheduleTest, NoSchedulerIsTheOptimizersLr) {
  SchedulerConfig none;
  for (int64_t step : {1, 2, 1000}) EXPECT_EQ(LearningRate(none, 0.003, step), 0.003);
  const Betas b = ScheduledBetas(none, {0.9, 0.999}, 5);
  EXPECT_EQ(b.beta1, 0.9);
  EXPECT_EQ(b.beta2, 0.999);
}

// DeepSpeed sets the first step's lr in the scheduler's constructor (last_batch_iteration
// -1) and steps the scheduler after each optimizer step: step t runs at iteration t - 2.
TEST(LrScheduleTest, WarmupLrLogAndDeepSpeedsStepNumbering) {
  const SchedulerConfig s = Schedule(R"({"type": "WarmupLR", "params": {
      "warmup_min_lr": 0, "warmup_max_lr": 0.001, "warmup_num_steps": 1000}})");
  EXPECT_EQ(s.warmup_type, "log");
  EXPECT_EQ(LearningRate(s, 7.0, 1), 0.0);  // the constructor's value: warmup_min_lr
  EXPECT_EQ(LearningRate(s, 7.0, 2), 0.0);  // iteration 0: ln(1) = 0
  // Iteration 1: 0.001 * ln 2 / ln 1000 = 0.001 / log2(1000).
  EXPECT_NEAR(LearningRate(s, 7.0, 3), 0.001 / 9.965784284662087, kTol);
  EXPECT_NEAR(LearningRate(s, 7.0, 501), 0.001 * std::log(500.0) / std::log(1000.0), kTol);
  EXPECT_NEAR(LearningRate(s, 7.0, 1001), 0.001, kTol);  // iteration 999: ln 1000 / ln 1000
  EXPECT_EQ(LearningRate(s, 7.0, 1002), 0.001);
  EXPECT_EQ(LearningRate(s, 7.0, 1000000), 0.001);
}

TEST(LrScheduleTest, WarmupLrLinear) {
  const SchedulerConfig s = Schedule(R"({"type": "WarmupLR", "params": {
      "warmup_min_lr": 0.1, "warmup_max_lr": 0.2, "warmup_num_steps": 10,
      "warmup_type": "linear"}})");
  EXPECT_EQ(LearningRate(s, 1, 1), 0.1);
  EXPECT_EQ(LearningRate(s, 1, 2), 0.1);
  EXPECT_NEAR(LearningRate(s, 1, 3), 0.11, kTol);
  EXPECT_NEAR(LearningRate(s, 1, 7), 0.15, kTol);
  EXPECT_NEAR(LearningRate(s, 1, 11), 0.19, kTol);  // iteration 9
  EXPECT_EQ(LearningRate(s, 1, 12), 0.2);            // iteration 10: the warmup is over
}

TEST(LrScheduleTest, WarmupStepsBelowTwoCountAsTwo) {
  // DeepSpeed: warmup_num_steps = max(2, warmup_num_steps).
  const SchedulerConfig log = Schedule(R"({"type": "WarmupLR", "params": {
      "warmup_min_lr": 0.5, "warmup_max_lr": 1, "warmup_num_steps": 0}})");
  EXPECT_EQ(LearningRate(log, 0, 2), 0.5);
  EXPECT_NEAR(LearningRate(log, 0, 3), 1.0, kTol);  // ln 2 / ln 2
  const SchedulerConfig linear = Schedule(R"({"type": "WarmupLR", "params": {
      "warmup_min_lr": 0.5, "warmup_max_lr": 1, "warmup_num_steps": 1, "warmup_type": "linear"}})");
  EXPECT_NEAR(LearningRate(linear, 0, 3), 0.75, kTol);
  EXPECT_EQ(LearningRate(linear, 0, 4), 1.0);
}

TEST(LrScheduleTest, WarmupDecayLr) {
  // The seed tutorial's production config.
  const SchedulerConfig s = Schedule(R"({"type": "WarmupDecayLR", "params": {
      "warmup_min_lr": 0, "warmup_max_lr": 1e-4, "warmup_num_steps": 2000,
      "total_num_steps": 100000}})");
  EXPECT_EQ(LearningRate(s, 1, 1), 0.0);
  EXPECT_NEAR(LearningRate(s, 1, 3), 1e-4 * std::log(2.0) / std::log(2000.0), kTol);
  EXPECT_NEAR(LearningRate(s, 1, 2001), 1e-4, 1e-19);       // iteration 1999: ln 2000 / ln 2000
  EXPECT_EQ(LearningRate(s, 1, 2002), 1e-4);               // iteration 2000: 98000 / 98000
  EXPECT_NEAR(LearningRate(s, 1, 51002), 5e-5, 1e-19);     // iteration 51000: 49000 / 98000
  EXPECT_NEAR(LearningRate(s, 1, 100001), 1e-4 / 98000, 1e-19);
  EXPECT_EQ(LearningRate(s, 1, 100002), 0.0);              // iteration 100000
  EXPECT_EQ(LearningRate(s, 1, 200000), 0.0);              // never negative
}

TEST(LrScheduleTest, WarmupCosineLr) {
  const SchedulerConfig s = Schedule(R"({"type": "WarmupCosineLR", "params": {
      "total_num_steps": 20, "warmup_num_steps": 10, "warmup_min_ratio": 0.1,
      "warmup_type": "linear"}})");
  EXPECT_EQ(s.cos_min_ratio, 0.0001);
  EXPECT_EQ(LearningRate(s, 2.0, 1), 0.0);  // DeepSpeed's get_lr() before the first step()
  EXPECT_NEAR(LearningRate(s, 2.0, 2), 0.2, kTol);
  EXPECT_NEAR(LearningRate(s, 2.0, 7), 2.0 * 0.55, kTol);
  // Iteration 10: (1 + cos(pi / 10)) / 2 = 0.97552825814757677.
  EXPECT_NEAR(LearningRate(s, 2.0, 12), 2.0 * (0.0001 + 0.9999 * 0.97552825814757677), 1e-14);
  EXPECT_NEAR(LearningRate(s, 2.0, 21), 2.0 * 0.0001, 1e-15);  // cos(pi) = -1
}

TEST(LrScheduleTest, OneCycle) {
  const SchedulerConfig s = Schedule(R"({"type": "OneCycle", "params": {
      "cycle_min_lr": 0.1, "cycle_max_lr": 1.1, "cycle_first_step_size": 10,
      "decay_lr_rate": 1, "decay_step_size": 5, "cycle_momentum": false}})");
  EXPECT_EQ(LearningRate(s, 9, 1), 0.1);               // scale 0 (batch iteration 0)
  EXPECT_NEAR(LearningRate(s, 9, 2), 0.2, kTol);       // x = 1/20, scale 0.1
  EXPECT_NEAR(LearningRate(s, 9, 11), 1.1, kTol);      // x = 0.5: the peak
  EXPECT_NEAR(LearningRate(s, 9, 16), 0.6, kTol);      // x = 0.75: half way down
  EXPECT_NEAR(LearningRate(s, 9, 21), 0.1, kTol);      // x = 0: the cycle's end
  EXPECT_NEAR(LearningRate(s, 9, 22), 0.1 / 1.2, kTol);  // decay iteration 1: 1 + 1 * 1/5
  EXPECT_NEAR(LearningRate(s, 9, 31), 0.1 / 3, kTol);    // decay iteration 10
  // Without decay: cycle_min_lr after the cycle.
  const SchedulerConfig flat = Schedule(R"({"type": "OneCycle", "params": {
      "cycle_min_lr": 0.1, "cycle_max_lr": 1.1, "cycle_first_step_size": 10,
      "decay_lr_rate": 1, "cycle_momentum": false}})");
  EXPECT_EQ(LearningRate(flat, 9, 500), 0.1);
  // An asymmetric cycle: 10 up, 30 down (r = 1/4).
  const SchedulerConfig asym = Schedule(R"({"type": "OneCycle", "params": {
      "cycle_min_lr": 0, "cycle_max_lr": 1, "cycle_first_step_size": 10,
      "cycle_second_step_size": 30, "cycle_momentum": false}})");
  EXPECT_NEAR(LearningRate(asym, 9, 2), 0.1, kTol);
  EXPECT_NEAR(LearningRate(asym, 9, 11), 1.0, kTol);
  EXPECT_NEAR(LearningRate(asym, 9, 21), 2.0 / 3, kTol);  // x = 0.5: (0.5 - 1) / (0.25 - 1)
  EXPECT_NEAR(LearningRate(asym, 9, 41), 0.0, kTol);
}

TEST(LrScheduleTest, OneCycleMomentum) {
  const SchedulerConfig s = Schedule(R"({"type": "OneCycle", "params": {
      "cycle_min_lr": 0.1, "cycle_max_lr": 1.1, "cycle_first_step_size": 10,
      "decay_step_size": 5, "decay_mom_rate": 0.1}})");
  EXPECT_TRUE(s.cycle_momentum);
  EXPECT_EQ(s.cycle_min_mom, 0.8);
  EXPECT_EQ(s.cycle_max_mom, 0.9);
  const Betas configured{0.95, 0.999};
  Betas b = ScheduledBetas(s, configured, 1);  // DeepSpeed's constructor: min_mom
  EXPECT_EQ(b.beta1, 0.8);
  EXPECT_EQ(b.beta2, 0.99);
  b = ScheduledBetas(s, configured, 2);  // scale 0.1: inverse to the lr
  EXPECT_NEAR(b.beta1, 0.89, kTol);
  EXPECT_EQ(b.beta2, 0.99);
  EXPECT_NEAR(ScheduledBetas(s, configured, 11).beta1, 0.8, kTol);
  EXPECT_NEAR(ScheduledBetas(s, configured, 21).beta1, 0.9, kTol);
  EXPECT_NEAR(ScheduledBetas(s, configured, 22).beta1, 0.9 * (1 + 0.1 / 5), kTol);
  SchedulerConfig off = s;
  off.cycle_momentum = false;
  EXPECT_EQ(ScheduledBetas(off, configured, 2).beta1, 0.95);
  EXPECT_EQ(ScheduledBetas(off, configured, 2).beta2, 0.999);
}

// Each bad scheduler must fail with a message containing `path`.
TEST(LrScheduleTest, BadSchedulersNameTheKey) {
  const std::pair<const char*, const char*> cases[] = {
      {R"({"type": "CosineAnnealingLR"})", "scheduler.type: must be one of"},
      {R"({"params": {"warmup_max_lr": 1}})", "scheduler.type: is required"},
      {R"({"type": "WarmupLR", "params": {"warmup_type": "cosine"}})",
       "scheduler.params.warmup_type"},
      {R"({"type": "WarmupLR", "params": {"warmup_num_steps": -1}})",
       "scheduler.params.warmup_num_steps"},
      {R"({"type": "WarmupLR", "params": {"warmup_max_lr": -0.1}})",
       "scheduler.params.warmup_max_lr"},
      {R"({"type": "WarmupLR", "params": {"total_num_steps": 10}})",
       "scheduler.params.total_num_steps: not a parameter of WarmupLR (WarmupCosineLR, "
       "WarmupDecayLR take it)"},
      {R"({"type": "WarmupLR", "params": {"cycle_min_lr": 0.1}})",
       "scheduler.params.cycle_min_lr: not a parameter of WarmupLR (OneCycle takes it)"},
      {R"({"type": "WarmupLR", "params": {"warmup_max": 0.1}})",
       "scheduler.params.warmup_max: unknown key"},
      {R"({"type": "WarmupLR", "params": {"last_batch_iteration": 10}})",
       "scheduler.params.last_batch_iteration: must be -1"},
      {R"({"type": "WarmupDecayLR", "params": {"warmup_num_steps": 10}})",
       "scheduler.params.total_num_steps: is required for WarmupDecayLR"},
      {R"({"type": "WarmupCosineLR", "params": {"total_num_steps": 10, "warmup_num_steps": 10}})",
       "scheduler.params.total_num_steps: must be > warmup_num_steps"},
      {R"({"type": "OneCycle", "params": {"cycle_max_lr": 0.1}})",
       "scheduler.params.cycle_min_lr: is required"},
      {R"({"type": "OneCycle", "params": {"cycle_min_lr": 0.1}})",
       "scheduler.params.cycle_max_lr: is required"},
      {R"({"type": "OneCycle", "params": {"cycle_min_lr": 0, "cycle_max_lr": 1,
                                         "cycle_first_step_size": 0}})",
       "scheduler.params.cycle_first_step_size"},
      {R"({"type": "OneCycle", "params": {"cycle_min_lr": 0, "cycle_max_lr": 1,
                                         "cycle_max_mom": 1}})",
       "scheduler.params.cycle_max_mom: must be < 1"},
      {R"({"type": "OneCycle", "params": {"cycle_min_lr": 0, "cycle_max_lr": 1,
                                         "decay_lr_rate": -1}})",
       "scheduler.params.decay_lr_rate"},
      {R"({"type": "OneCycle", "params": {"cycle_min_lr": 0, "cycle_max_lr": 1,
                                         "warmup_type": "log"}})",
       "scheduler.params.warmup_type: not a parameter of OneCycle"},
      {R"("WarmupLR")", "scheduler: must be an object"},
  };
  for (const auto& [json, path] : cases) {
    auto c = ParseJobConfig(std::string(R"({"scheduler": )") + json + "}");
    ASSERT_FALSE(c.ok()) << json;
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << json;
    EXPECT_NE(std::string(c.status().message()).find(path), std::string::npos)
        << json << " -> " << c.status().message();
  }
}

TEST(LrScheduleTest, NoticesForWhatIsNotApplied) {
  auto c = ParseJobConfig(R"({"scheduler": {"type": "OneCycle", "params": {
      "cycle_min_lr": 0, "cycle_max_lr": 1, "cycle_first_stair_count": 3}}})");
  ASSERT_TRUE(c.ok()) << c.status();
  // Momentum cycling (cycle_momentum, true by default) is applied: no notice for it.
  ASSERT_EQ(c->notices.size(), 1u) << ::testing::PrintToString(c->notices);
  EXPECT_NE(c->notices[0].find("scheduler.params.cycle_first_stair_count"), std::string::npos);
  auto quiet = ParseJobConfig(R"({"scheduler": {"type": "OneCycle", "params": {
      "cycle_min_lr": 0, "cycle_max_lr": 1, "cycle_momentum": false}}})");
  ASSERT_TRUE(quiet.ok());
  EXPECT_TRUE(quiet->notices.empty()) << ::testing::PrintToString(quiet->notices);
  auto short_decay = ParseJobConfig(R"({"scheduler": {"type": "WarmupDecayLR", "params": {
      "warmup_num_steps": 100, "total_num_steps": 50}}})");
  ASSERT_TRUE(short_decay.ok());
  ASSERT_EQ(short_decay->notices.size(), 1u);
  EXPECT_NE(short_decay->notices[0].find("scheduler.params.total_num_steps: 50 is less"),
            std::string::npos);
}

}  // namespace
}  // namespace onebit
