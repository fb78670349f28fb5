// A running coordinator: the Coordinator behind a gRPC server, the REST mirror and the
// Prometheus /metrics endpoint, each on its own port, plus a ticker that re-evaluates
// liveness. What onebit-coordinator runs, and what tests start in-process.
//
// Start and Shutdown from one thread; the accessors are thread-safe.
#ifndef ONEBIT_COORDINATOR_COORDINATOR_SERVER_H_
#define ONEBIT_COORDINATOR_COORDINATOR_SERVER_H_

#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/metrics_server.h"
#include "coordinator/address_file.h"
#include "coordinator/clock.h"
#include "coordinator/coordinator.h"
#include "coordinator/coordinator_client.h"
#include "coordinator/grpc_service.h"
#include "coordinator/metrics.h"
#include "coordinator/rest_mirror.h"
#include "security/auth.h"
#include "security/tls_options.h"

namespace grpc {
class Server;
}  // namespace grpc

namespace onebit {

struct CoordinatorServerOptions {
  std::string host = "127.0.0.1";
  int grpc_port = 0;     // 0: any free port
  int rest_port = 0;     // 0: any free port
  int metrics_port = 0;  // 0: any free port; < 0: no /metrics endpoint
  // How often liveness is re-evaluated.
  absl::Duration tick = absl::Milliseconds(200);

  // TLS on the gRPC port and HTTPS on the REST mirror (security/tls.h); off: plaintext.
  // /metrics stays plain HTTP (Prometheus scrapes it; it holds no secrets and takes no
  // commands).
  security::TlsOptions tls;
  // Who may make which call, on gRPC and REST alike (security/auth.h); none: open.
  security::Tokens tokens;
  // The largest message either way.
  int max_message_bytes = kCoordinatorMaxMessageBytes;
  // Bounds against floods: server threads (grpc::ResourceQuota; a call that finds none
  // free gets RESOURCE_EXHAUSTED), open Session streams (grpc_service.h), and concurrent
  // streams on one connection. 0: from the job's size (members = workers + servers):
  // 2 * members + 16 sessions (a reconnect each while the old one is noticed), threads for
  // those plus one waiting KvGet per member plus 32 for everything else.
  int max_threads = 0;
  int max_sessions = 0;
  int max_concurrent_streams = 100;
};

class CoordinatorServer {
 public:
  // Creates the coordinator and serves it. INVALID_ARGUMENT for a config that does not make
  // a job; UNAVAILABLE naming the port that could not be bound. `clock` must outlive the
  // server.
  static absl::StatusOr<std::unique_ptr<CoordinatorServer>> Start(
      const CoordinatorOptions& options, const CoordinatorServerOptions& server_options,
      Clock* clock = Clock::Real());

  ~CoordinatorServer();  // Shutdown()

  // Ends sessions, wakes waiting calls, stops every server. Idempotent.
  void Shutdown();

  const CoordinatorAddresses& addresses() const { return addresses_; }
  const std::string& grpc_address() const { return addresses_.grpc; }
  const std::string& rest_address() const { return addresses_.rest; }
  Coordinator* coordinator() const { return coordinator_.get(); }
  CoordinatorMetrics* metrics() const { return metrics_.get(); }
  // Session streams open now: one per member that is connected.
  int open_sessions() const { return service_->open_sessions(); }

 private:
  CoordinatorServer() = default;

  std::unique_ptr<CoordinatorMetrics> metrics_;
  std::unique_ptr<Coordinator> coordinator_;
  std::unique_ptr<CoordinatorGrpcService> service_;
  std::unique_ptr<grpc::Server> grpc_server_;
  std::unique_ptr<RestMirror> rest_;
  std::unique_ptr<MetricsServer> metrics_server_;  // /metrics, /healthz, /readyz
  absl::Notification stop_ticker_;
  std::thread ticker_;
  CoordinatorAddresses addresses_;
  bool shut_down_ = false;
};

}  // namespace onebit

#endif  // ONEBIT_COORDINATOR_COORDINATOR_SERVER_H_
