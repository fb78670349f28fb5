// The in-process client (the fake) and the gloo store over it: real gloo ranks as threads
// find each other through the coordinator's key/value store.
#include "coordinator/inprocess_client.h"

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "coordinator/clock.h"
#include "coordinator/coordinator.h"
#include "coordinator/gloo_store.h"
#include "gloo/common/error.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/gloo_transport.h"

namespace onebit {
namespace {

using ::testing::HasSubstr;

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

TEST_F(InProcessClientTest, GlooRanksRendezvousThroughTheCoordinator) {
  constexpr int kWorld = 3;
  for (int generation = 0; generation < 2; ++generation) {
    auto store = std::make_shared<CoordinatorGlooStore>(
        client_, GlooStorePrefix("inproc", generation), std::chrono::seconds(20));
    std::vector<absl::Status> results(kWorld);
    std::vector<std::vector<float>> data(kWorld);
    std::vector<std::thread> ranks;
    for (int rank = 0; rank < kWorld; ++rank) {
      ranks.emplace_back([&, rank] {
        GlooOptions options;
        options.timeout = absl::Seconds(20);
        auto transport = GlooTransport::Create(store, rank, kWorld, options);
        if (!transport.ok()) {
          results[rank] = transport.status();
          return;
        }
        data[rank] = {1.0f * rank, 2.0f};
        results[rank] = (*transport)->AllReduceSum(data[rank].data(), data[rank].size());
      });
    }
    for (std::thread& t : ranks) t.join();
    for (int rank = 0; rank < kWorld; ++rank) {
      ASSERT_TRUE(results[rank].ok()) << "rank " << rank << ": " << results[rank];
      EXPECT_EQ(data[rank], (std::vector<float>{3.0f, 6.0f}));
    }
  }
}

TEST_F(InProcessClientTest, GlooStoreErrorsAreGlooExceptions) {
  CoordinatorGlooStore store(client_, "p/", std::chrono::milliseconds(50));
  store.set("k", {'a'});
  store.set("k", {'a'});  // the same value again: fine
  EXPECT_EQ(store.get("k"), (std::vector<char>{'a'}));
  try {
    store.set("k", {'b'});
    ADD_FAILURE() << "no exception";
  } catch (const gloo::IoException& e) {
    EXPECT_THAT(e.what(), HasSubstr("ALREADY_EXISTS"));
  }
  try {
    store.get("missing");
    ADD_FAILURE() << "no exception";
  } catch (const gloo::IoException& e) {
    EXPECT_THAT(e.what(), HasSubstr("Wait timeout for key(s): p/missing"));
  }
  try {
    store.wait({"k", "missing"}, std::chrono::milliseconds(30));
    ADD_FAILURE() << "no exception";
  } catch (const gloo::IoException& e) {
    EXPECT_THAT(e.what(), HasSubstr("Wait timeout"));
  }
  try {
    store.set(std::string(600, 'x'), {'a'});
    ADD_FAILURE() << "no exception";
  } catch (const gloo::IoException& e) {
    EXPECT_THAT(e.what(), HasSubstr("INVALID_ARGUMENT"));
  }
}

}  // namespace
}  // namespace onebit
