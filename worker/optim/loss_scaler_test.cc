#include "worker/optim/loss_scaler.h"

#include <cmath>
#include <limits>

#include "gtest/gtest.h"

namespace onebit {
namespace {

LossScaler Make(const LossScalerOptions& o) {
  absl::StatusOr<LossScaler> s = LossScaler::Create(o);
  EXPECT_TRUE(s.ok()) << s.status();
  return *s;
}

TEST(LossScalerTest, StartsAtTheInitialPowerAndDoublesAfterAWindowOfGoodSteps) {
  LossScalerOptions o;
  o.initial_scale_power = 4;
  o.loss_scale_window = 3;
  LossScaler s = Make(o);
  EXPECT_EQ(s.scale(), 16);
  s.Update(false);
  s.Update(false);
  EXPECT_EQ(s.scale(), 16);
  s.Update(false);  // the third good step since the start
  EXPECT_EQ(s.scale(), 32);
  for (int i = 0; i < 3; ++i) s.Update(false);
  EXPECT_EQ(s.scale(), 64);
  EXPECT_EQ(s.state().overflows, 0);
}

TEST(LossScalerTest, HysteresisDelaysTheHalvingAndAWindowRestoresIt) {
  LossScalerOptions o;
  o.initial_scale_power = 10;
  o.loss_scale_window = 4;
  o.hysteresis = 2;
  LossScaler s = Make(o);
  s.Update(true);  // uses up the hysteresis
  EXPECT_EQ(s.scale(), 1024);
  s.Update(true);  // halves
  EXPECT_EQ(s.scale(), 512);
  s.Update(true);  // hysteresis not restored yet: halves again
  EXPECT_EQ(s.scale(), 256);
  for (int i = 0; i < 3; ++i) s.Update(false);
  EXPECT_EQ(s.scale(), 256);
  s.Update(false);  // four good steps after the last overflow: doubles, hysteresis back
  EXPECT_EQ(s.scale(), 512);
  s.Update(true);
  EXPECT_EQ(s.scale(), 512);
  EXPECT_EQ(s.state().overflows, 4);
}

TEST(LossScalerTest, ConsecutiveHysteresisIsRestoredByEveryGoodStep) {
  LossScalerOptions o;
  o.initial_scale_power = 10;
  o.loss_scale_window = 100;
  o.hysteresis = 2;
  o.consecutive_hysteresis = true;
  LossScaler s = Make(o);
  for (int i = 0; i < 5; ++i) {
    s.Update(true);  // one overflow between good steps never halves
    s.Update(false);
  }
  EXPECT_EQ(s.scale(), 1024);
  s.Update(true);
  s.Update(true);  // two in a row do
  EXPECT_EQ(s.scale(), 512);
}

TEST(LossScalerTest, NeverBelowTheMinimumNorAboveFloatRange) {
  LossScalerOptions o;
  o.initial_scale_power = 3;
  o.hysteresis = 1;
  o.min_loss_scale = 2;
  LossScaler s = Make(o);
  for (int i = 0; i < 10; ++i) s.Update(true);
  EXPECT_EQ(s.scale(), 2);

  o.initial_scale_power = 126;
  o.loss_scale_window = 1;
  o.min_loss_scale = 1;
  LossScaler big = Make(o);
  for (int i = 0; i < 10; ++i) big.Update(false);
  EXPECT_EQ(big.scale(), std::ldexp(1.0, 126));
  EXPECT_TRUE(std::isfinite(static_cast<float>(big.scale())));
}

TEST(LossScalerTest, AStaticScaleStaysButOverflowsAreCounted) {
  LossScalerOptions o;
  o.loss_scale = 128;
  LossScaler s = Make(o);
  EXPECT_FALSE(s.dynamic());
  for (int i = 0; i < 2000; ++i) s.Update(i % 7 == 0);
  EXPECT_EQ(s.scale(), 128);
  EXPECT_EQ(s.state().overflows, 286);
}

TEST(LossScalerTest, BadOptionsNameTheField) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  struct Case {
    LossScalerOptions options;
    const char* field;
  };
  std::vector<Case> cases(6);
  cases[0].options.loss_scale = -1;
  cases[0].field = "loss_scale";
  cases[1].options.loss_scale = nan;
  cases[1].field = "loss_scale";
  cases[2].options.initial_scale_power = 127;
  cases[2].field = "initial_scale_power";
  cases[3].options.loss_scale_window = 0;
  cases[3].field = "loss_scale_window";
  cases[4].options.hysteresis = 0;
  cases[4].field = "hysteresis";
  cases[5].options.min_loss_scale = 1e9;
  cases[5].field = "min_loss_scale";
  for (const Case& c : cases) {
    absl::StatusOr<LossScaler> s = LossScaler::Create(c.options);
    ASSERT_FALSE(s.ok()) << c.field;
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(s.status().message().find(c.field), std::string::npos) << s.status();
  }
}

TEST(LossScalerTest, RestoreContinuesExactlyAndRefusesImpossibleStates) {
  LossScalerOptions o;
  o.initial_scale_power = 8;
  o.loss_scale_window = 5;
  o.hysteresis = 3;
  const bool pattern[] = {false, true, false, false, true, true, true, false, false,
                          false, false, false, false, true, false, false};
  LossScaler whole = Make(o);
  LossScaler first = Make(o);
  for (int i = 0; i < 16; ++i) {
    whole.Update(pattern[i]);
    if (i < 9) first.Update(pattern[i]);
  }
  LossScaler resumed = Make(o);
  ASSERT_TRUE(resumed.Restore(first.state()).ok());
  for (int i = 9; i < 16; ++i) resumed.Update(pattern[i]);
  EXPECT_EQ(resumed.scale(), whole.scale());
  EXPECT_EQ(resumed.state().hysteresis_left, whole.state().hysteresis_left);
  EXPECT_EQ(resumed.state().overflows, whole.state().overflows);

  LossScalerState bad = first.state();
  bad.scale = 0;
  EXPECT_FALSE(resumed.Restore(bad).ok());
  bad = first.state();
  bad.hysteresis_left = 4;
  EXPECT_FALSE(resumed.Restore(bad).ok());
  bad = first.state();
  bad.overflows = bad.updates + 1;
  EXPECT_FALSE(resumed.Restore(bad).ok());
  EXPECT_EQ(resumed.scale(), whole.scale());  // a refused state changes nothing
}

}  // namespace
}  // namespace onebit
