// One onebit-server process: a ShardState on the CPU backend, its gRPC ParameterServer
// service, a Prometheus /metrics endpoint, and the address file. server_main.cc wraps it
// in flags and signals; tests start it in-process.
//
//   auto process = ServerProcess::Start(options);   // binds, serves, writes the file
//   ... (register with the coordinator, heartbeat: to come)
//   process->Shutdown();                            // from a signal handler thread
//
// Thread safety: Shutdown() and the accessors may be called from any thread. Shutdown is
// idempotent; the destructor calls it.
#ifndef ONEBIT_SERVER_SERVER_PROCESS_H_
#define ONEBIT_SERVER_SERVER_PROCESS_H_

#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "common/metrics_server.h"
#include "kernels/kernels.h"
#include "prometheus/registry.h"
#include "server/exchange_service.h"
#include "server/server_metrics.h"
#include "server/shard_state.h"
#include "security/tls_options.h"

namespace onebit::server {

struct ServerProcessOptions {
  ShardConfig shard;
  std::string host = "127.0.0.1";  // both listeners; "0.0.0.0" for every interface
  int port = 0;                    // gRPC; 0 picks a free port
  bool serve_metrics = true;
  int metrics_port = 0;  // 0 picks a free port
  // If set, {"grpc": "host:port", "metrics": "host:port"} is written here (atomically:
  // temp file, fsync, rename) once both listeners are bound.
  std::string address_file;
  ExchangeServiceOptions service;
  // TLS on the gRPC port (security/tls.h); with mutual TLS only holders of a certificate
  // of the job's CA can push. Off: plaintext. /metrics stays plain HTTP.
  security::TlsOptions tls;
  // Threads of the CPU kernels (>= 1).
  int cpu_threads = 1;
  // How long Shutdown lets in-flight calls finish before cancelling them.
  absl::Duration shutdown_grace = absl::Seconds(2);
};

class ServerProcess {
 public:
  static absl::StatusOr<std::unique_ptr<ServerProcess>> Start(const ServerProcessOptions& options);
  ~ServerProcess();

  // What was bound: host:port. metrics_address() is empty without metrics.
  const std::string& grpc_address() const { return grpc_address_; }
  const std::string& metrics_address() const { return metrics_address_; }

  ShardState& state() { return *state_; }
  ServerMetrics& metrics() { return *metrics_; }
  // /metrics, /healthz and /readyz (not ready until the owner calls SetReady(): once the
  // shard is open for pushes); null without metrics.
  MetricsServer* metrics_server() { return metrics_server_.get(); }

  // Wakes every waiting stream (UNAVAILABLE), stops accepting calls, waits up to
  // shutdown_grace for calls in flight, then cancels the rest.
  void Shutdown();
  // Returns once Shutdown() has run.
  void Wait();

 private:
  explicit ServerProcess(const ServerProcessOptions& options) : options_(options) {}
  absl::Status Init();

  const ServerProcessOptions options_;
  std::unique_ptr<kernels::Backend> backend_;
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<ServerMetrics> metrics_;
  std::unique_ptr<ShardState> state_;
  std::unique_ptr<ExchangeService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<MetricsServer> metrics_server_;
  std::string grpc_address_, metrics_address_;

  absl::Mutex mu_;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace onebit::server

#endif  // ONEBIT_SERVER_SERVER_PROCESS_H_
