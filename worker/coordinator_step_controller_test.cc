// CoordinatorStepController against a real Coordinator (in process): stats reports leave
// the step's critical path, and a lease is only asked for once they are all delivered.
#include "worker/coordinator_step_controller.h"

#include <algorithm>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "coordinator/clock.h"
#include "coordinator/coordinator.h"
#include "coordinator/inprocess_client.h"
#include "gtest/gtest.h"

namespace onebit {
namespace {

// The real client, with its stats reports held until Open() (a slow or distant
// coordinator), or answered with `report_error` instead, and a log of what was called.
class GatedClient : public CoordinatorClient {
 public:
  explicit GatedClient(std::unique_ptr<CoordinatorClient> inner) : inner_(std::move(inner)) {}

  void Open() {
    absl::MutexLock lock(&mu_);
    open_ = true;
  }
  void Close() {
    absl::MutexLock lock(&mu_);
    open_ = false;
  }
  void FailReportsWith(absl::Status status) {
    absl::MutexLock lock(&mu_);
    report_error_ = std::move(status);
  }
  std::vector<std::string> log() {
    absl::MutexLock lock(&mu_);
    return log_;
  }

  // Returns once a report has reached the coordinator (held there while closed).
  void AwaitReportArrived() {
    absl::MutexLock lock(&mu_);
    auto arrived = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return arrived_ > 0; };
    mu_.Await(absl::Condition(&arrived));
  }

  absl::StatusOr<v1::StatsReportResponse> ReportStats(const v1::StatsReport& report) override {
    absl::MutexLock lock(&mu_);
    ++arrived_;
    mu_.Await(absl::Condition(&open_));
    if (!report_error_.ok()) return report_error_;
    log_.push_back(absl::StrCat("report ", report.step()));
    return inner_->ReportStats(report);
  }
  absl::StatusOr<v1::LeaseResponse> Lease(const v1::LeaseRequest& request) override {
    {
      absl::MutexLock lock(&mu_);
      log_.push_back(absl::StrCat("lease ", request.next_step()));
    }
    return inner_->Lease(request);
  }
  absl::StatusOr<v1::RegisterResponse> Register(const v1::RegisterRequest& r) override {
    return inner_->Register(r);
  }
  absl::StatusOr<v1::KvSetResponse> KvSet(const v1::KvSetRequest& r) override {
    return inner_->KvSet(r);
  }
  absl::StatusOr<v1::KvGetResponse> KvGet(const v1::KvGetRequest& r) override {
    return inner_->KvGet(r);
  }
  absl::StatusOr<v1::JobStatus> ReportFailure(const v1::FailureReport& r) override {
    return inner_->ReportFailure(r);
  }
  absl::StatusOr<std::unique_ptr<CoordinatorSession>> StartSession(
      const SessionOptions& options, JobEventCallback on_event) override {
    return inner_->StartSession(options, std::move(on_event));
  }
  absl::StatusOr<v1::JobStatus> GetJob(const v1::GetJobRequest& r) override {
    return inner_->GetJob(r);
  }
  absl::StatusOr<v1::ListMembersResponse> ListMembers(const v1::ListMembersRequest& r) override {
    return inner_->ListMembers(r);
  }
  absl::StatusOr<v1::JobStatus> Freeze(const v1::FreezeRequest& r) override {
    return inner_->Freeze(r);
  }
  absl::StatusOr<v1::JobStatus> DelayFreeze(const v1::DelayFreezeRequest& r) override {
    return inner_->DelayFreeze(r);
  }
  absl::StatusOr<v1::JobStatus> Stop(const v1::StopRequest& r) override { return inner_->Stop(r); }
  absl::StatusOr<v1::CommitPartResponse> CommitPart(const v1::CommitPartRequest& r) override {
    return inner_->CommitPart(r);
  }
  absl::StatusOr<v1::CheckpointInfo> Checkpoint(const v1::CheckpointRequest& r) override {
    return inner_->Checkpoint(r);
  }
  absl::StatusOr<v1::ListCheckpointsResponse> ListCheckpoints(
      const v1::ListCheckpointsRequest& r) override {
    return inner_->ListCheckpoints(r);
  }
  void Cancel() override { inner_->Cancel(); }

 private:
  std::unique_ptr<CoordinatorClient> inner_;
  absl::Mutex mu_;
  bool open_ ABSL_GUARDED_BY(mu_) = false;
  int arrived_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status report_error_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> log_ ABSL_GUARDED_BY(mu_);
};

class CoordinatorStepControllerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    CoordinatorOptions options;
    options.config.workers = 1;
    options.config.steps = 30;
    options.config.lease_steps = 10;
    options.config.optimizer.freeze_step = 5;
    options.job_id = "controller";
    coordinator_ = *Coordinator::Create(options, Clock::Real(), nullptr);
    client_ = std::make_unique<GatedClient>(NewInProcessCoordinatorClient(coordinator_.get()));
    v1::RegisterRequest r;
    r.set_role(v1::ROLE_WORKER);
    r.set_instance_id("w");
    ASSERT_TRUE(client_->Register(r).ok());
  }

  static StepReport At(int64_t step) {
    StepReport report;
    report.step = step;
    report.stage = step <= 5 ? Stage::kWarmup : Stage::kCompression;  // freeze_step 5
    return report;
  }

  std::unique_ptr<Coordinator> coordinator_;
  std::unique_ptr<GatedClient> client_;
};

TEST_F(CoordinatorStepControllerTest, ReportsDoNotWaitButLeasesWaitForThem) {
  CoordinatorStepController controller(client_.get(), nullptr, 0, /*report_every=*/5, nullptr);
  auto lease = controller.Acquire(1);
  ASSERT_TRUE(lease.ok()) << lease.status();
  EXPECT_EQ(lease->through_step, 10);
  // The coordinator does not answer reports yet: the steps do not wait for it.
  const absl::Time start = absl::Now();
  for (int64_t step = 1; step <= 10; ++step) ASSERT_TRUE(controller.Report(At(step)).ok());
  EXPECT_LT(absl::Now() - start, absl::Seconds(1));
  // The next lease waits until the coordinator has every report.
  absl::Notification acquired;
  absl::StatusOr<Lease> next;
  std::thread acquire([&] {
    next = controller.Acquire(11);
    acquired.Notify();
  });
  EXPECT_FALSE(acquired.WaitForNotificationWithTimeout(absl::Milliseconds(300)));
  client_->Open();
  acquire.join();
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(next->through_step, 20);
  // Step 1, every 5th, in order, all before the lease.
  EXPECT_EQ(client_->log(),
            (std::vector<std::string>{"lease 1", "report 1", "report 5", "report 10", "lease 11"}));
}

TEST_F(CoordinatorStepControllerTest, AnAnswerAboutThisMemberEndsTheRunAtTheNextCall) {
  CoordinatorStepController controller(client_.get(), nullptr, 0, /*report_every=*/5, nullptr);
  client_->Open();
  ASSERT_TRUE(controller.Acquire(1).ok());
  // A coordinator that cannot take a report costs the report only.
  client_->FailReportsWith(absl::UnavailableError("restarting"));
  EXPECT_TRUE(controller.Report(At(1)).ok());
  EXPECT_TRUE(controller.Acquire(2).ok());
  // One that no longer knows this member ends the run, at the next call.
  client_->FailReportsWith(absl::FailedPreconditionError("not a member"));
  EXPECT_TRUE(controller.Report(At(5)).ok());  // queued
  EXPECT_EQ(controller.Acquire(6).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(controller.Acquire(6).ok());  // the error was handed back once
}

TEST_F(CoordinatorStepControllerTest, TheLastStepsReportIsDeliveredBeforeReportReturns) {
  CoordinatorStepController controller(client_.get(), nullptr, 0, /*report_every=*/0, nullptr);
  client_->Open();
  for (int64_t next = 1; next <= 21; next += 10) {
    auto lease = controller.Acquire(next);
    ASSERT_TRUE(lease.ok()) << lease.status();
  }
  ASSERT_TRUE(controller.Report(At(29)).ok());
  ASSERT_TRUE(controller.Report(At(30)).ok());
  const std::vector<std::string> log = client_->log();
  ASSERT_FALSE(log.empty());
  EXPECT_EQ(log.back(), "report 30");
  EXPECT_EQ(std::count(log.begin(), log.end(), "report 29"), 0);  // not due
}

TEST_F(CoordinatorStepControllerTest, GoingAwayWaitsForTheReportInFlightAndDropsTheRest) {
  auto controller = std::make_unique<CoordinatorStepController>(client_.get(), nullptr, 0,
                                                                /*report_every=*/5, nullptr);
  client_->Open();
  ASSERT_TRUE(controller->Acquire(1).ok());
  client_->Close();
  ASSERT_TRUE(controller->Report(At(1)).ok());
  client_->AwaitReportArrived();                // in flight, held by the coordinator
  ASSERT_TRUE(controller->Report(At(5)).ok());  // queued
  std::thread open([&] {
    absl::SleepFor(absl::Milliseconds(200));
    client_->Open();
  });
  controller.reset();  // joins once the report in flight is answered
  open.join();
  EXPECT_EQ(client_->log(), (std::vector<std::string>{"lease 1", "report 1"}));
}

}  // namespace
}  // namespace onebit
