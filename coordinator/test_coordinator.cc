#include "coordinator/test_coordinator.h"

#include <utility>

namespace onebit {

JobConfig TestJobConfig(int workers, int64_t steps, int64_t lease_steps, int64_t freeze_step) {
  JobConfig config;
  config.workers = workers;
  config.steps = steps;
  config.lease_steps = lease_steps;
  config.optimizer.freeze_step = freeze_step;
  return config;
}

absl::StatusOr<TestCoordinator> StartTestCoordinator(const JobConfig& config,
                                                     const TestCoordinatorOptions& test_options) {
  CoordinatorOptions options;
  options.config = config;
  options.job_id = "test-job";
  options.heartbeat_timeout = test_options.heartbeat_timeout;
  CoordinatorServerOptions server_options;
  server_options.tick = absl::Milliseconds(20);
  server_options.metrics_port = test_options.metrics ? 0 : -1;
  TestCoordinator t;
  absl::StatusOr<std::unique_ptr<CoordinatorServer>> server =
      CoordinatorServer::Start(options, server_options);
  if (!server.ok()) return server.status();
  t.server = *std::move(server);
  GrpcClientOptions client_options;
  client_options.address = t.server->grpc_address();
  client_options.rpc_timeout = absl::Seconds(20);
  absl::StatusOr<std::unique_ptr<CoordinatorClient>> client =
      NewGrpcCoordinatorClient(client_options);
  if (!client.ok()) return client.status();
  t.client = *std::move(client);
  return t;
}

}  // namespace onebit
