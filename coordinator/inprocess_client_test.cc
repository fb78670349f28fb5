// The in-process client (the fake): sessions, events and errors without a network.
#include "coordinator/inprocess_client.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/notification.h"
#include "coordinator/clock.h"
#include "coordinator/coordinator.h"
#include "gtest/gtest.h"

namespace onebit {
namespace {

class InProcessClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    CoordinatorOptions options;
    options.config.workers = 3;
    options.config.steps = 100;
    options.config.optimizer.freeze_step = 50;
    options.job_id = "inproc";
    coordinator_ = *Coordinator::Create(options, Clock::Real(), nullptr);
    client_ = NewInProcessCoordinatorClient(coordinator_.get());
  }

  std::unique_ptr<Coordinator> coordinator_;
  std::shared_ptr<CoordinatorClient> client_;
};

TEST_F(InProcessClientTest, CancelFailsEveryLaterCallWithoutCallingIn) {
  ASSERT_TRUE(client_->GetJob({}).ok());
  client_->Cancel();
  EXPECT_EQ(client_->GetJob({}).status().code(), absl::StatusCode::kCancelled);
  v1::RegisterRequest r;
  r.set_role(v1::ROLE_WORKER);
  r.set_instance_id("w");
  EXPECT_EQ(client_->Register(r).status().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(coordinator_->GetJob({})->workers_registered(), 0);  // never reached it
}

TEST_F(InProcessClientTest, SessionReportsTheJobAndItsChanges) {
  v1::RegisterRequest r;
  r.set_role(v1::ROLE_WORKER);
  r.set_instance_id("w");
  ASSERT_TRUE(client_->Register(r).ok());
  absl::Mutex mu;
  std::vector<int64_t> freeze_steps;
  SessionOptions options;
  options.instance_id = "w";
  options.heartbeat_interval = absl::Milliseconds(20);
  auto session = client_->StartSession(options, [&](const v1::JobEvent& e) {
    absl::MutexLock lock(&mu);
    freeze_steps.push_back(e.job().freeze_step());
  });
  ASSERT_TRUE(session.ok());
  auto saw = [&](int64_t step) {
    absl::MutexLock lock(&mu);
    return std::find(freeze_steps.begin(), freeze_steps.end(), step) != freeze_steps.end();
  };
  for (int i = 0; i < 200 && !saw(50); ++i) absl::SleepFor(absl::Milliseconds(10));
  EXPECT_TRUE(saw(50));
  v1::FreezeRequest freeze;
  freeze.set_at_step(20);
  ASSERT_TRUE(client_->Freeze(freeze).ok());
  for (int i = 0; i < 200 && !saw(20); ++i) absl::SleepFor(absl::Milliseconds(10));
  EXPECT_TRUE(saw(20));
  EXPECT_TRUE((*session)->Stop().ok());
}

TEST_F(InProcessClientTest, SessionOfAStrangerEndsWithTheError) {
  SessionOptions options;
  options.instance_id = "nobody";
  auto session = client_->StartSession(options, nullptr);
  ASSERT_TRUE(session.ok());
  for (int i = 0; i < 200 && (*session)->status().ok(); ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ((*session)->status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ((*session)->Stop().code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace onebit
