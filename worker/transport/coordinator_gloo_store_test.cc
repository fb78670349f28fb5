// The gloo store over the coordinator's key/value store (through the in-process client):
// real gloo ranks as threads find each other through it.
#include "worker/transport/coordinator_gloo_store.h"

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "coordinator/clock.h"
#include "coordinator/coordinator.h"
#include "coordinator/inprocess_client.h"
#include "gloo/common/error.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/transport/gloo_transport.h"

namespace onebit {
namespace {

using ::testing::HasSubstr;

// A real coordinator (its key/value store) behind the in-process client.
class CoordinatorGlooStoreTest : public ::testing::Test {
 protected:
  std::unique_ptr<Coordinator> coordinator_ =
      *Coordinator::Create(CoordinatorOptions{}, Clock::Real(), nullptr);
  std::shared_ptr<CoordinatorClient> client_ = NewInProcessCoordinatorClient(coordinator_.get());
};

TEST_F(CoordinatorGlooStoreTest, GlooRanksRendezvousThroughTheCoordinator) {
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

TEST_F(CoordinatorGlooStoreTest, GlooStoreErrorsAreGlooExceptions) {
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
