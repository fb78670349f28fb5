#include "worker/divergence_watch.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace onebit {
namespace {

using ::testing::HasSubstr;

TEST(DivergenceWatchTest, AJumpAfterTheFreezeIsReportedOnceWithTheCause) {
  DivergenceWatch watch(/*factor=*/100.0, /*window=*/3);
  for (int t = 1; t <= 5; ++t) EXPECT_FALSE(watch.Observe(t, false, 10.0 - t, 1e-8, 0.0));
  // Baseline: the last three warmup losses, 7, 6 and 5: mean 6.
  EXPECT_FALSE(watch.Observe(6, true, 6.0, 1e-8, 0.0));
  EXPECT_FALSE(watch.Observe(7, true, 600.0, 1e-8, 0.0));  // exactly 100x: not more
  std::optional<std::string> warning = watch.Observe(8, true, 3773.0, 1e-8, 0.0);
  ASSERT_TRUE(warning.has_value());
  EXPECT_THAT(*warning, HasSubstr("the loss is 3773 at step 8, 629x the warmup's last losses"));
  EXPECT_THAT(*warning, HasSubstr("scale/eps = scale/1e-08 (update_clip 0: none)"));
  EXPECT_THAT(*warning, HasSubstr("a smaller optimizer.params.update_clip"));
  DivergenceWatch clipped;
  clipped.Observe(1, false, 1.0, 1e-8, 10.0);
  std::optional<std::string> bounded = clipped.Observe(2, true, 1e4, 1e-8, 10.0);
  ASSERT_TRUE(bounded.has_value());
  EXPECT_THAT(*bounded, HasSubstr("move by up to lr * update_clip = lr * 10 each step"));
  EXPECT_FALSE(watch.Observe(9, true, 43059.0, 1e-8, 0.0));  // once
}

TEST(DivergenceWatchTest, NoBaselineOrNoLossSaysNothing) {
  DivergenceWatch watch;
  EXPECT_FALSE(watch.Observe(1, true, 1e9, 1e-8, 0.0));  // freeze_step 0: no warmup to compare
  DivergenceWatch warmed;
  warmed.Observe(1, false, 0.0, 1e-8, 0.0);  // a zero loss gives no baseline
  EXPECT_FALSE(warmed.Observe(2, true, 1e9, 1e-8, 0.0));
  DivergenceWatch nan;
  nan.Observe(1, false, 1.0, 1e-8, 0.0);
  EXPECT_FALSE(nan.Observe(2, true, std::nan(""), 1e-8, 0.0));  // the trainer stops on NaN itself
  EXPECT_TRUE(nan.Observe(3, true, 1000.0, 1e-8, 0.0).has_value());
}

}  // namespace
}  // namespace onebit
