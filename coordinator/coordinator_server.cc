#include "coordinator/coordinator_server.h"

#include <chrono>
#include <exception>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/metrics_server.h"
#include "common/net.h"
#include "config/job_config.h"
#include "security/tls.h"
#include "coordinator/log.h"
#include "grpcpp/grpcpp.h"

namespace onebit {

absl::StatusOr<std::unique_ptr<CoordinatorServer>> CoordinatorServer::Start(
    const CoordinatorOptions& options, const CoordinatorServerOptions& server_options,
    Clock* clock) {
  std::unique_ptr<CoordinatorServer> s(new CoordinatorServer());
  s->metrics_ = std::make_unique<CoordinatorMetrics>();
  absl::StatusOr<std::unique_ptr<Coordinator>> coordinator =
      Coordinator::Create(options, clock, s->metrics_.get());
  if (!coordinator.ok()) return coordinator.status();
  s->coordinator_ = *std::move(coordinator);
  const std::string& host = server_options.host;

  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials =
      security::GrpcServerCredentials(server_options.tls);
  if (!credentials.ok()) return credentials.status();
  const int members = options.config.workers + ServerCount(options.config);
  CoordinatorGrpcServiceOptions service_options;
  service_options.tokens = server_options.tokens;
  service_options.max_sessions =
      server_options.max_sessions > 0 ? server_options.max_sessions : 2 * members + 16;
  const int max_threads = server_options.max_threads > 0
                              ? server_options.max_threads
                              : service_options.max_sessions + members + 32;
  s->service_ = std::make_unique<CoordinatorGrpcService>(s->coordinator_.get(), s->metrics_.get(),
                                                         service_options);
  grpc::ServerBuilder builder;
  int grpc_port = 0;
  builder.AddListeningPort(JoinHostPort(host, server_options.grpc_port), *credentials, &grpc_port);
  // gRPC sets SO_REUSEPORT by default, which would let a second coordinator "bind" a port
  // that is already in use.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, server_options.max_concurrent_streams);
  // Members ping every quarter of the heartbeat timeout to notice a silent link
  // (GrpcClientOptions::keepalive): answer them, however often, instead of counting
  // "too many pings" and closing the connection.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 100);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
  builder.SetMaxReceiveMessageSize(server_options.max_message_bytes);
  builder.SetMaxSendMessageSize(server_options.max_message_bytes);
  // Every call runs on a thread of the synchronous server, and a session holds one for
  // its whole life: without a bound, a flood of calls starts threads without end.
  grpc::ResourceQuota quota("onebit-coordinator");
  quota.SetMaxThreads(max_threads);
  builder.SetResourceQuota(quota);
  builder.RegisterService(s->service_.get());
  s->grpc_server_ = builder.BuildAndStart();
  if (s->grpc_server_ == nullptr || grpc_port == 0) {
    return absl::UnavailableError(
        absl::StrCat("gRPC: cannot bind ", JoinHostPort(host, server_options.grpc_port)));
  }
  s->addresses_.grpc = JoinHostPort(host, grpc_port);

  RestMirrorOptions rest_options;
  rest_options.tokens = server_options.tokens;
  rest_options.tls = server_options.tls;
  s->rest_ = std::make_unique<RestMirror>(s->coordinator_.get(), s->metrics_.get(), rest_options);
  absl::Status rest = s->rest_->Start(host, server_options.rest_port);
  if (!rest.ok()) return rest;
  s->addresses_.rest = JoinHostPort(host, s->rest_->port());

  if (server_options.metrics_port >= 0) {
    absl::StatusOr<std::unique_ptr<MetricsServer>> metrics =
        MetricsServer::Start(host, server_options.metrics_port);
    if (!metrics.ok()) return metrics.status();
    s->metrics_server_ = *std::move(metrics);
    s->metrics_server_->RegisterCollectable(s->metrics_->registry());
    s->addresses_.metrics = s->metrics_server_->address();
  }

  s->ticker_ = std::thread([server = s.get(), tick = server_options.tick] {
    while (!server->stop_ticker_.WaitForNotificationWithTimeout(tick)) {
      server->coordinator_->Tick();
    }
  });
  const bool tls = server_options.tls.enabled();
  const security::Tokens& tokens = server_options.tokens;
  LogLine(absl::StrCat(
      "serving gRPC on ", s->addresses_.grpc,
      tls ? (server_options.tls.mutual ? " (mutual TLS)" : " (TLS)") : "", ", REST on ",
      s->addresses_.rest, tls ? " (HTTPS)" : "",
      s->addresses_.metrics.empty() ? std::string()
                                    : absl::StrCat(", metrics on ", s->addresses_.metrics),
      "; admin calls ", tokens.admin.empty() ? "open" : "need the admin token",
      ", member calls and reads ", tokens.member.empty() ? "open" : "need the member token",
      "; at most ", service_options.max_sessions, " sessions, ", max_threads, " threads"));
  if (!tls && (!tokens.admin.empty() || !tokens.member.empty())) {
    LogLine("warning: bearer tokens without TLS travel in clear text");
  }
  // Every port serves: /readyz says so (probes, compose healthchecks).
  if (s->metrics_server_ != nullptr) s->metrics_server_->SetReady();
  return s;
}

CoordinatorServer::~CoordinatorServer() { Shutdown(); }

void CoordinatorServer::Shutdown() {
  if (shut_down_) return;
  shut_down_ = true;
  if (metrics_server_ != nullptr) metrics_server_->SetNotReady("shutting down");
  // Sessions first (their loops would otherwise spin on a shut-down coordinator), then
  // the waits, then the servers, which now have nothing long-running to wait for.
  if (service_ != nullptr) service_->Shutdown();
  if (coordinator_ != nullptr) coordinator_->Shutdown();
  if (rest_ != nullptr) rest_->Stop();
  if (grpc_server_ != nullptr) {
    grpc_server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
    grpc_server_->Wait();
  }
  if (ticker_.joinable()) {
    stop_ticker_.Notify();
    ticker_.join();
  }
  metrics_server_.reset();
}

}  // namespace onebit
