#include "coordinator/stage_machine.h"

#include <cmath>
#include <limits>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace onebit {
namespace {

using ::testing::HasSubstr;

StageMachineOptions Static(int world_size, int64_t freeze_step, int64_t lease_steps = 10,
                           int64_t total_steps = 600) {
  StageMachineOptions o;
  o.world_size = world_size;
  o.policy = FreezePolicy::kStatic;
  o.static_freeze_step = freeze_step;
  o.lease_steps = lease_steps;
  o.total_steps = total_steps;
  return o;
}

StageMachineOptions Automatic(int world_size, int64_t min_warmup, int64_t max_warmup,
                              int64_t lease_steps = 10) {
  StageMachineOptions o;
  o.world_size = world_size;
  o.policy = FreezePolicy::kAutomatic;
  o.threshold = 0.05;
  o.reports_in_a_row = 3;
  o.min_warmup = min_warmup;
  o.max_warmup = max_warmup;
  o.lease_steps = lease_steps;
  o.total_steps = 600;
  return o;
}

StageMachineOptions Never(int world_size) {
  StageMachineOptions o = Static(world_size, 0);
  o.policy = FreezePolicy::kNever;
  return o;
}

StageMachine Make(const StageMachineOptions& o) {
  absl::StatusOr<StageMachine> m = StageMachine::Create(o);
  EXPECT_TRUE(m.ok()) << m.status();
  return *std::move(m);
}

TEST(StageMachineOptionsTest, ErrorsNameTheConfigKey) {
  StageMachineOptions o = Static(0, 10);
  EXPECT_THAT(ValidateStageMachineOptions(o).message(), HasSubstr("onebit.workers"));
  o = Static(1, 10, 0);
  EXPECT_THAT(ValidateStageMachineOptions(o).message(), HasSubstr("onebit.lease_steps"));
  o = Static(1, -1);
  EXPECT_THAT(ValidateStageMachineOptions(o).message(), HasSubstr("optimizer.params.freeze_step"));
  o = Static(1, 1, 10, -5);
  EXPECT_THAT(ValidateStageMachineOptions(o).message(), HasSubstr("steps"));
  o = Automatic(1, 50, 40);
  EXPECT_THAT(ValidateStageMachineOptions(o).message(), HasSubstr("onebit.freeze.max_warmup"));
  o = Automatic(1, -1, 40);
  EXPECT_THAT(ValidateStageMachineOptions(o).message(), HasSubstr("onebit.freeze.min_warmup"));
  o = Automatic(1, 0, 40);
  o.threshold = 0;
  EXPECT_THAT(ValidateStageMachineOptions(o).message(), HasSubstr("onebit.freeze.threshold"));
  o.threshold = std::numeric_limits<double>::quiet_NaN();
  EXPECT_THAT(ValidateStageMachineOptions(o).message(), HasSubstr("onebit.freeze.threshold"));
  o = Automatic(1, 0, 40);
  o.reports_in_a_row = 0;
  EXPECT_THAT(ValidateStageMachineOptions(o).message(),
              HasSubstr("onebit.freeze.reports_in_a_row"));
  EXPECT_EQ(StageMachine::Create(Static(0, 1)).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(StageMachineTest, StaticSchedulesAtStartAndLeasesCarryIt) {
  StageMachine m = Make(Static(2, 25, 10, 100));
  EXPECT_EQ(m.freeze_step(), 25);
  EXPECT_EQ(m.stop_after_step(), 100);
  absl::StatusOr<LeaseGrant> g = m.Lease(0, 1);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->through_step, 10);
  EXPECT_EQ(g->freeze_step, 25);
  EXPECT_EQ(g->stop_after_step, 100);
  EXPECT_EQ(m.max_lease_step(), 10);
  EXPECT_FALSE(m.Compresses(25));
  EXPECT_TRUE(m.Compresses(26));
}

TEST(StageMachineTest, LeaseNeverPassesTheStopAndIsEmptyAfterIt) {
  StageMachine m = Make(Static(1, 5, 10, 15));
  EXPECT_EQ(m.Lease(0, 1)->through_step, 10);
  EXPECT_EQ(m.Lease(0, 11)->through_step, 15);
  absl::StatusOr<LeaseGrant> done = m.Lease(0, 16);
  ASSERT_TRUE(done.ok());
  EXPECT_LT(done->through_step, 16);  // nothing granted: the job is over
  EXPECT_EQ(done->stop_after_step, 15);
  EXPECT_EQ(m.max_lease_step(), 15);
}

TEST(StageMachineTest, LeaseValidatesRankAndStep) {
  StageMachine m = Make(Static(2, 5));
  EXPECT_EQ(m.Lease(-1, 1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(m.Lease(2, 1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(m.Lease(0, 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(m.Lease(0, -7).status().code(), absl::StatusCode::kInvalidArgument);
  // Skipping ahead of its own lease is refused and changes nothing.
  absl::Status skip = m.Lease(0, 12).status();
  EXPECT_EQ(skip.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(skip.message(), HasSubstr("from step 1 at the latest"));
  EXPECT_EQ(m.max_lease_step(), 0);
  EXPECT_EQ(m.Lease(0, std::numeric_limits<int64_t>::max()).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(StageMachineTest, LeaseRetryAndRollbackGetConsistentAnswers) {
  StageMachine m = Make(Static(1, 100, 10));
  EXPECT_EQ(m.Lease(0, 1)->through_step, 10);
  EXPECT_EQ(m.Lease(0, 1)->through_step, 10);  // retry after a lost reply
  EXPECT_EQ(m.Lease(0, 11)->through_step, 20);
  EXPECT_EQ(m.Lease(0, 5)->through_step, 14);  // a rollback: no lease shrinks
  EXPECT_EQ(m.max_lease_step(), 20);
  EXPECT_EQ(m.Lease(0, 21)->through_step, 30);
}

TEST(StageMachineTest, HugeLeaseStepsDoNotOverflow) {
  StageMachineOptions o = Static(1, 5, std::numeric_limits<int64_t>::max(), 1000);
  StageMachine m = Make(o);
  EXPECT_EQ(m.Lease(0, 1)->through_step, 1000);
}

TEST(StageMachineTest, ProgressMustLieWithinTheLease) {
  StageMachine m = Make(Static(2, 5));
  EXPECT_TRUE(m.ReportProgress(0, 0).ok());
  EXPECT_EQ(m.ReportProgress(0, 1).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(m.Lease(0, 1).ok());
  EXPECT_TRUE(m.ReportProgress(0, 10).ok());
  EXPECT_EQ(m.ReportProgress(0, 11).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(m.ReportProgress(0, -1).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(m.ReportProgress(5, 1).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(m.max_reported_step(), 10);
}

TEST(StageMachineTest, FreezeAtMustNotPrecedeAnyLease) {
  StageMachine m = Make(Static(2, 500));
  ASSERT_TRUE(m.Lease(0, 1).ok());  // through 10
  absl::Status early = m.FreezeAt(7);
  EXPECT_EQ(early.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(early.message(), HasSubstr("earliest freeze step is 10"));
  EXPECT_EQ(m.freeze_step(), 500);
  EXPECT_TRUE(m.FreezeAt(10).ok());
  EXPECT_EQ(m.freeze_step(), 10);
  EXPECT_TRUE(m.FreezeAt(30).ok());  // still movable: no lease past 10 yet
  EXPECT_EQ(m.freeze_step(), 30);
  EXPECT_EQ(m.FreezeAt(-1).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(m.FreezeAt(600).code(), absl::StatusCode::kFailedPrecondition);  // stop is 600
  EXPECT_EQ(m.freeze_step(), 30);
}

TEST(StageMachineTest, FreezeIsFixedOnceALeaseExtendsPastIt) {
  StageMachine m = Make(Static(1, 15, 10));
  ASSERT_TRUE(m.Lease(0, 1).ok());   // through 10
  ASSERT_TRUE(m.Lease(0, 11).ok());  // through 20 > 15
  EXPECT_TRUE(m.FreezeFixed());
  EXPECT_EQ(m.FreezeAt(25).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(m.FreezeAt(15).ok());  // the same step: idempotent
  EXPECT_EQ(m.FreezeNow().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(m.DelayFreeze(40).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(m.DelayFreeze(-1).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(m.freeze_step(), 15);
}

TEST(StageMachineTest, FreezeAtTheLeaseBoundaryCanStillMoveLater) {
  StageMachine m = Make(Static(1, 10, 10));
  ASSERT_TRUE(m.Lease(0, 1).ok());  // through 10 == F
  EXPECT_FALSE(m.FreezeFixed());
  EXPECT_TRUE(m.DelayFreeze(12).ok());
  EXPECT_EQ(m.freeze_step(), 12);
  EXPECT_EQ(m.Lease(0, 11)->freeze_step, 12);
}

TEST(StageMachineTest, FreezeNowUsesTheFurthestLease) {
  StageMachine m = Make(Static(2, 500, 10));
  ASSERT_TRUE(m.Lease(0, 1).ok());
  ASSERT_TRUE(m.Lease(1, 1).ok());
  ASSERT_TRUE(m.Lease(1, 11).ok());  // rank 1 through 20
  EXPECT_TRUE(m.FreezeNow().ok());
  EXPECT_EQ(m.freeze_step(), 20);
  // Rank 0, still at 11, learns of it with its next lease and switches after step 20 too.
  absl::StatusOr<LeaseGrant> g = m.Lease(0, 11);
  EXPECT_EQ(g->through_step, 20);
  EXPECT_EQ(g->freeze_step, 20);
}

TEST(StageMachineTest, FreezeNowBeforeAnyLeaseCompressesFromStepOne) {
  StageMachine m = Make(Static(1, 500));
  EXPECT_TRUE(m.FreezeNow().ok());
  EXPECT_EQ(m.freeze_step(), 0);
  EXPECT_TRUE(m.Compresses(1));
}

TEST(StageMachineTest, FreezeNowTooLateToMatter) {
  StageMachine m = Make(Static(1, 500, 10, 10));
  ASSERT_TRUE(m.Lease(0, 1).ok());  // through 10 == stop
  EXPECT_EQ(m.FreezeNow().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(m.freeze_step(), 500);
}

TEST(StageMachineTest, DelayAndCancel) {
  StageMachine m = Make(Static(1, 20, 10));
  ASSERT_TRUE(m.Lease(0, 1).ok());
  EXPECT_EQ(m.DelayFreeze(19).code(), absl::StatusCode::kInvalidArgument);      // not later
  EXPECT_EQ(m.DelayFreeze(600).code(), absl::StatusCode::kFailedPrecondition);  // past stop
  EXPECT_TRUE(m.DelayFreeze(20).ok());                                          // the same: no-op
  EXPECT_TRUE(m.DelayFreeze(35).ok());
  EXPECT_EQ(m.freeze_step(), 35);
  EXPECT_TRUE(m.DelayFreeze(-1).ok());
  EXPECT_EQ(m.freeze_step(), -1);
  EXPECT_TRUE(m.DelayFreeze(-1).ok());  // nothing to cancel: no-op
  EXPECT_EQ(m.DelayFreeze(50).code(), absl::StatusCode::kFailedPrecondition);  // nothing to delay
  // Static mode does not reschedule by itself.
  EXPECT_EQ(m.Lease(0, 11)->freeze_step, -1);
  EXPECT_EQ(m.Lease(0, 21)->freeze_step, -1);
}

TEST(StageMachineTest, AdamNeverFreezes) {
  StageMachine m = Make(Never(2));
  EXPECT_EQ(m.freeze_step(), -1);
  EXPECT_EQ(m.Lease(0, 1)->freeze_step, -1);
  EXPECT_EQ(m.FreezeNow().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(m.FreezeAt(100).message(), HasSubstr("Adam"));
  EXPECT_EQ(m.DelayFreeze(100).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(m.ReportVarianceChange(0, 10, 0.0).ok());  // accepted, ignored
  EXPECT_EQ(m.freeze_step(), -1);
}

TEST(StageMachineTest, StopAsSoonAsSafeAndNeverExtended) {
  StageMachine m = Make(Static(2, 500, 10, 100));
  ASSERT_TRUE(m.Lease(0, 1).ok());
  ASSERT_TRUE(m.Lease(0, 11).ok());  // through 20
  EXPECT_EQ(m.Stop(15).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(m.Stop(101).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(m.stop_after_step(), 100);
  EXPECT_TRUE(m.Stop(-1).ok());
  EXPECT_EQ(m.stop_after_step(), 20);
  EXPECT_EQ(m.Lease(1, 1)->through_step, 10);
  EXPECT_EQ(m.Lease(1, 11)->through_step, 20);
  EXPECT_LT(m.Lease(1, 21)->through_step, 21);
  EXPECT_EQ(m.Stop(30).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(m.Stop(20).ok());  // the same: no-op
}

TEST(StageMachineTest, FinishedWhenEveryWorkerReportedTheLastStep) {
  StageMachine m = Make(Static(2, 3, 10, 5));
  ASSERT_TRUE(m.Lease(0, 1).ok());
  ASSERT_TRUE(m.Lease(1, 1).ok());
  EXPECT_TRUE(m.ReportProgress(0, 5).ok());
  EXPECT_FALSE(m.Finished());
  EXPECT_TRUE(m.ReportProgress(1, 5).ok());
  EXPECT_TRUE(m.Finished());
}

// Runs `reports` variance reports from every worker at steps interval, 2*interval, ...,
// taking leases as needed, until a freeze is scheduled. Returns the freeze step.
int64_t DriveAutomatic(StageMachine& m, int64_t interval, double (*value)(int64_t step)) {
  const int w = m.options().world_size;
  std::vector<int64_t> through(w, 0);
  for (int64_t step = 1; step <= 600; ++step) {
    for (int r = 0; r < w; ++r) {
      if (step > through[r]) {
        absl::StatusOr<LeaseGrant> g = m.Lease(r, step);
        EXPECT_TRUE(g.ok()) << g.status();
        through[r] = g->through_step;
        if (through[r] < step) return m.freeze_step();
      }
      if (m.freeze_step() >= 0 && step > m.freeze_step()) return m.freeze_step();
      if (step % interval == 0) {
        EXPECT_TRUE(m.ReportVarianceChange(r, step, value(step)).ok());
      }
    }
  }
  return m.freeze_step();
}

TEST(StageMachineTest, AutomaticFreezesAfterReportsInARowUnderThreshold) {
  StageMachine m = Make(Automatic(2, 0, 1000, 10));
  EXPECT_EQ(m.freeze_step(), -1);
  // Under 0.05 from step 40 on: reports at 40, 50, 60 -> counted at 60; leases reach 60.
  int64_t f = DriveAutomatic(m, 10, [](int64_t s) { return s >= 40 ? 0.01 : 0.5; });
  EXPECT_EQ(f, 60);
  EXPECT_THAT(m.freeze_reason(), HasSubstr("automatic"));
}

TEST(StageMachineTest, AutomaticWaitsForMinWarmup) {
  StageMachine m = Make(Automatic(1, 95, 1000, 10));
  int64_t f = DriveAutomatic(m, 10, [](int64_t) { return 0.0; });
  EXPECT_EQ(f, 100);  // first report step >= 95 with 3 under in a row
}

TEST(StageMachineTest, AutomaticStreakResetsOnAReportOverThreshold) {
  StageMachine m = Make(Automatic(1, 0, 1000, 5));
  int64_t f = DriveAutomatic(m, 5, [](int64_t s) { return s == 15 ? 0.2 : 0.01; });
  // Under at 5, 10; over at 15; under at 20, 25, 30 -> counted at 30.
  EXPECT_EQ(f, 30);
}

TEST(StageMachineTest, AutomaticNanIsNotUnderThreshold) {
  StageMachine m = Make(Automatic(1, 0, 1000, 5));
  int64_t f = DriveAutomatic(
      m, 5, [](int64_t s) { return s == 10 ? std::numeric_limits<double>::quiet_NaN() : 0.01; });
  EXPECT_EQ(f, 25);
  EXPECT_FALSE(std::isnan(m.last_counted_variance_change()));
}

TEST(StageMachineTest, AutomaticForcesAtMaxWarmupExactly) {
  StageMachine m = Make(Automatic(3, 0, 37, 10));
  int64_t f = DriveAutomatic(m, 10, [](int64_t) { return 1.0; });
  EXPECT_EQ(f, 37);
  EXPECT_THAT(m.freeze_reason(), HasSubstr("max_warmup"));
}

TEST(StageMachineTest, AutomaticLeasesStopAtMaxWarmupWhileUnscheduled) {
  StageMachine m = Make(Automatic(2, 0, 25, 10));
  EXPECT_EQ(m.Lease(0, 1)->through_step, 10);
  EXPECT_EQ(m.Lease(0, 11)->through_step, 20);
  absl::StatusOr<LeaseGrant> g = m.Lease(0, 21);
  EXPECT_EQ(g->through_step, 25);
  EXPECT_EQ(g->freeze_step, 25);  // scheduled by the lease that reached max_warmup
  EXPECT_EQ(m.Lease(0, 26)->through_step, 35);
}

TEST(StageMachineTest, AutomaticMaxWarmupZeroCompressesFromTheStart) {
  StageMachine m = Make(Automatic(1, 0, 0));
  EXPECT_EQ(m.freeze_step(), 0);
}

TEST(StageMachineTest, AutomaticNeedsEveryWorkerAndUsesTheLargestValue) {
  StageMachine m = Make(Automatic(2, 0, 1000, 100));
  ASSERT_TRUE(m.Lease(0, 1).ok());
  ASSERT_TRUE(m.Lease(1, 1).ok());
  for (int64_t s : {10, 20, 30}) {
    ASSERT_TRUE(m.ReportVarianceChange(0, s, 0.01).ok());
  }
  EXPECT_EQ(m.freeze_step(), -1);  // rank 1 has not reported
  ASSERT_TRUE(m.ReportVarianceChange(1, 10, 0.01).ok());
  ASSERT_TRUE(m.ReportVarianceChange(1, 20, 0.3).ok());  // the largest value counts
  ASSERT_TRUE(m.ReportVarianceChange(1, 30, 0.01).ok());
  EXPECT_EQ(m.freeze_step(), -1);
  for (int64_t s : {40, 50}) {
    ASSERT_TRUE(m.ReportVarianceChange(0, s, 0.01).ok());
    ASSERT_TRUE(m.ReportVarianceChange(1, s, 0.01).ok());
  }
  // Under at 30, 40, 50; but leases reach 100, so the switch goes after step 100.
  EXPECT_EQ(m.freeze_step(), 100);
}

TEST(StageMachineTest, AutomaticCountsARepeatedReportOnce) {
  StageMachine m = Make(Automatic(2, 0, 1000, 100));
  ASSERT_TRUE(m.Lease(0, 1).ok());
  ASSERT_TRUE(m.Lease(1, 1).ok());
  for (int64_t s : {10, 20, 30}) {
    ASSERT_TRUE(m.ReportVarianceChange(0, s, 0.01).ok());
    ASSERT_TRUE(m.ReportVarianceChange(0, s, 0.01).ok());  // a retried report
  }
  EXPECT_EQ(m.freeze_step(), -1);
}

TEST(StageMachineTest, AutomaticIgnoresUnmeasuredAndLateReports) {
  StageMachine m = Make(Automatic(1, 0, 1000, 100));
  ASSERT_TRUE(m.Lease(0, 1).ok());
  ASSERT_TRUE(m.ReportVarianceChange(0, 10, -1).ok());  // not measured
  ASSERT_TRUE(m.ReportVarianceChange(0, 20, 0.01).ok());
  ASSERT_TRUE(m.ReportVarianceChange(0, 30, 0.01).ok());
  ASSERT_TRUE(m.ReportVarianceChange(0, 25, 0.01).ok());  // older than the last counted
  EXPECT_EQ(m.freeze_step(), -1);
  ASSERT_TRUE(m.ReportVarianceChange(0, 40, 0.01).ok());
  EXPECT_EQ(m.freeze_step(), 100);
}

TEST(StageMachineTest, AutomaticCancelResetsTheStreakAndMayScheduleAgain) {
  StageMachine m = Make(Automatic(1, 0, 1000, 10));
  ASSERT_TRUE(m.Lease(0, 1).ok());
  for (int64_t s : {2, 4, 6}) ASSERT_TRUE(m.ReportVarianceChange(0, s, 0.01).ok());
  EXPECT_EQ(m.freeze_step(), 10);
  EXPECT_TRUE(m.DelayFreeze(-1).ok());
  ASSERT_TRUE(m.ReportVarianceChange(0, 8, 0.01).ok());
  EXPECT_EQ(m.freeze_step(), -1);  // a new streak is needed
  ASSERT_TRUE(m.Lease(0, 11).ok());
  for (int64_t s : {12, 14}) ASSERT_TRUE(m.ReportVarianceChange(0, s, 0.01).ok());
  EXPECT_EQ(m.freeze_step(), 20);
}

TEST(StageMachineTest, AutomaticCancelPastMaxWarmupIsRefused) {
  StageMachine m = Make(Automatic(1, 0, 20, 10));
  ASSERT_TRUE(m.Lease(0, 1).ok());
  ASSERT_TRUE(m.Lease(0, 11).ok());  // through 20 = max_warmup: scheduled at 20
  EXPECT_EQ(m.freeze_step(), 20);
  EXPECT_TRUE(m.DelayFreeze(30).ok());  // an operator may still postpone it
  ASSERT_TRUE(m.Lease(0, 21).ok());     // through 30
  EXPECT_EQ(m.DelayFreeze(-1).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(m.freeze_step(), 30);
}

TEST(StageMachineTest, OperatorFreezeOverridesAutomatic) {
  StageMachine m = Make(Automatic(1, 0, 1000, 10));
  ASSERT_TRUE(m.Lease(0, 1).ok());
  EXPECT_TRUE(m.FreezeAt(15).ok());
  EXPECT_EQ(m.Lease(0, 11)->freeze_step, 15);
  EXPECT_EQ(m.Lease(0, 11)->through_step, 20);  // no max_warmup cap once scheduled
}

TEST(StageMachineCheckpointTest, PeriodicStepsComeWithTheLeases) {
  StageMachineOptions o = Static(2, 100, /*lease_steps=*/10, /*total_steps=*/40);
  o.checkpoint_every = 15;
  auto sm = StageMachine::Create(o);
  ASSERT_TRUE(sm.ok());
  EXPECT_THAT(sm->Lease(0, 1)->checkpoint_steps, testing::ElementsAre());
  EXPECT_THAT(sm->Lease(0, 11)->checkpoint_steps, testing::ElementsAre(15));
  EXPECT_THAT(sm->Lease(1, 1)->checkpoint_steps, testing::ElementsAre());
  EXPECT_THAT(sm->CheckpointSteps(1, 40), testing::ElementsAre(15, 30));
}

TEST(StageMachineCheckpointTest, RequestedCheckpointsLieBeyondEveryLease) {
  auto sm = StageMachine::Create(Static(2, 100, 10, 40));
  ASSERT_TRUE(sm.ok());
  ASSERT_TRUE(sm->Lease(0, 1).ok());  // through 10
  absl::StatusOr<int64_t> next = sm->RequestCheckpoint(0);
  ASSERT_TRUE(next.ok());
  EXPECT_EQ(*next, 11);
  EXPECT_THAT(sm->RequestCheckpoint(7).status().message(), HasSubstr("earliest possible is 11"));
  EXPECT_THAT(sm->RequestCheckpoint(41).status().message(), HasSubstr("past the job's end"));
  ASSERT_TRUE(sm->RequestCheckpoint(25).ok());
  // Every worker hears of both in the leases that cover them, rank 1 as well as rank 0.
  EXPECT_THAT(sm->Lease(1, 1)->checkpoint_steps, testing::ElementsAre());
  EXPECT_THAT(sm->Lease(1, 11)->checkpoint_steps, testing::ElementsAre(11));
  EXPECT_THAT(sm->Lease(0, 11)->checkpoint_steps, testing::ElementsAre(11));
  EXPECT_THAT(sm->Lease(0, 21)->checkpoint_steps, testing::ElementsAre(25));
}

TEST(StageMachineCheckpointTest, ResumeStartsAfterTheCheckpoint) {
  StageMachineOptions o = Static(2, 5, 10, 40);
  o.resume_step = 20;
  o.resume_freeze_step = 5;
  auto sm = StageMachine::Create(o);
  ASSERT_TRUE(sm.ok());
  EXPECT_EQ(sm->freeze_step(), 5);
  EXPECT_EQ(sm->max_lease_step(), 20);
  EXPECT_EQ(sm->Lease(0, 1).status().code(), absl::StatusCode::kOk);  // a rollback may ask again
  absl::StatusOr<LeaseGrant> g = sm->Lease(1, 21);
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(g->through_step, 30);
  EXPECT_THAT(sm->Lease(0, 22).status().message(), HasSubstr("from step 21 at the latest"));
  // A static switch the resumed run has not reached yet stays the config's.
  o.static_freeze_step = 30;
  o.resume_freeze_step = 30;
  EXPECT_EQ(StageMachine::Create(o)->freeze_step(), 30);
  // One the config moved before the checkpoint switches right away, never in the past.
  o.static_freeze_step = 10;
  o.resume_freeze_step = 30;
  EXPECT_EQ(StageMachine::Create(o)->freeze_step(), 20);
}

}  // namespace
}  // namespace onebit
