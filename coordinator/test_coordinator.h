// For tests: a real coordinator (gRPC, REST, /metrics on free ports of 127.0.0.1) in this
// process, and a gRPC client to it.
#ifndef ONEBIT_COORDINATOR_TEST_COORDINATOR_H_
#define ONEBIT_COORDINATOR_TEST_COORDINATOR_H_

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "coordinator/coordinator_client.h"
#include "coordinator/coordinator_server.h"
#include "config/job_config.h"

namespace onebit {

// A small static-freeze job in peer mode.
JobConfig TestJobConfig(int workers, int64_t steps, int64_t lease_steps, int64_t freeze_step);

struct TestCoordinator {
  std::unique_ptr<CoordinatorServer> server;
  std::shared_ptr<CoordinatorClient> client;
};

struct TestCoordinatorOptions {
  absl::Duration heartbeat_timeout = absl::Seconds(60);
  // Off unless a test scrapes it: stopping prometheus-cpp's exposer (civetweb) takes ~2 s.
  bool metrics = false;
};

absl::StatusOr<TestCoordinator> StartTestCoordinator(
    const JobConfig& config, const TestCoordinatorOptions& options = TestCoordinatorOptions());

}  // namespace onebit

#endif  // ONEBIT_COORDINATOR_TEST_COORDINATOR_H_
