// The HTTP port every long-running onebit process serves (coordinator, shard, worker):
// Prometheus metrics at /metrics, and the two probes an orchestrator asks (Kubernetes
// liveness/readiness probes, compose healthchecks):
//
//   GET /healthz  200 "ok": the process is up and its HTTP threads answer (liveness).
//   GET /readyz   200 "ready" once the owner called SetReady(); 503 "not ready: <reason>"
//                 before that and after SetNotReady() (readiness: e.g. the shard has
//                 registered with the coordinator, the worker trains).
//
// One listener (prometheus-cpp's Exposer, i.e. civetweb) serves all three: the probes are
// answered in civetweb's begin_request callback, before its URI handlers, so they never
// wait on a scrape and need no second port.
//
//   auto server = MetricsServer::Start("0.0.0.0", 9100);
//   server->RegisterCollectable(registry);
//   server->SetReady();  ...  server->SetNotReady("shutting down");
//
// Thread safety: every method may be called from any thread. The destructor stops the
// listener (waits for requests in flight).
#ifndef ONEBIT_COMMON_METRICS_SERVER_H_
#define ONEBIT_COMMON_METRICS_SERVER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace prometheus {
class Collectable;
class Exposer;
}  // namespace prometheus

namespace onebit {

class MetricsServer {
 public:
  // Binds host:port (port 0: a free one; host may be an IPv6 literal, with or without
  // brackets). UNAVAILABLE naming the address when it cannot bind. Starts not ready
  // ("starting").
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(const std::string& host, int port,
                                                              int threads = 2);
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  // Served at /metrics (every registered collectable, as the Exposer does).
  void RegisterCollectable(const std::weak_ptr<prometheus::Collectable>& collectable);

  void SetReady();
  void SetNotReady(const std::string& reason);
  // What /readyz answers now: OK, or UNAVAILABLE with the reason.
  absl::Status Readiness() const;

  int port() const { return port_; }
  // host:port as bound (JoinHostPort of the host given and the bound port).
  const std::string& address() const { return address_; }

  // The health state one listener answers from, shared with the civetweb callback (which
  // may still hold it while the server is being destroyed).
  struct Health;

 private:
  MetricsServer() = default;

  std::shared_ptr<Health> health_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  int port_ = 0;
  std::string address_;
};

}  // namespace onebit

#endif  // ONEBIT_COMMON_METRICS_SERVER_H_
