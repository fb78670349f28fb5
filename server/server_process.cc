#include "server/server_process.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/atomic_file.h"
#include "common/net.h"
#include "common/status_macros.h"
#include "compression/layout.h"
#include "security/tls.h"

namespace onebit::server {

absl::StatusOr<std::unique_ptr<ServerProcess>> ServerProcess::Start(
    const ServerProcessOptions& options) {
  std::unique_ptr<ServerProcess> process(new ServerProcess(options));
  ONEBIT_RETURN_IF_ERROR(process->Init());
  return process;
}

absl::Status ServerProcess::Init() {
  const ShardConfig& config = options_.shard;
  if (options_.port < 0 || options_.port > 65535 || options_.metrics_port < 0 ||
      options_.metrics_port > 65535) {
    return absl::InvalidArgumentError("ports must be in [0, 65535]");
  }
  backend_ = kernels::NewCpuBackend(/*allow_simd=*/true, options_.cpu_threads);
  registry_ = std::make_shared<prometheus::Registry>();
  metrics_ = std::make_unique<ServerMetrics>(*registry_, config);
  ONEBIT_ASSIGN_OR_RETURN(state_, ShardState::Create(backend_.get(), config, metrics_.get()));
  service_ = std::make_unique<ExchangeService>(state_.get(), metrics_.get(), options_.service);

  ONEBIT_ASSIGN_OR_RETURN(std::shared_ptr<grpc::ServerCredentials> credentials,
                          security::GrpcServerCredentials(options_.tls));
  grpc::ServerBuilder builder;
  int bound_port = 0;
  builder.AddListeningPort(JoinHostPort(options_.host, options_.port), credentials, &bound_port);
  builder.RegisterService(service_.get());
  // The largest legal push or result is one fp32 run (or one compressed block): anything
  // bigger is refused by gRPC before it is buffered, both ways. PsExchange's channels
  // carry the same bound.
  const int max_message = static_cast<int>(
      std::min<size_t>(state_->layout().max_message_bytes(), INT32_MAX));
  builder.SetMaxReceiveMessageSize(max_message);
  builder.SetMaxSendMessageSize(max_message);
  // One thread per open stream (see exchange_service.h): room for every worker, a
  // reconnect each, pulls and gRPC's own pollers, but a bound against a flood of streams.
  grpc::ResourceQuota quota("onebit-server");
  quota.SetMaxThreads(4 * config.num_workers + 16);
  builder.SetResourceQuota(quota);
  server_ = builder.BuildAndStart();
  if (server_ == nullptr || bound_port == 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve gRPC on ", JoinHostPort(options_.host, options_.port)));
  }
  grpc_address_ = JoinHostPort(options_.host, bound_port);

  if (options_.serve_metrics) {
    ONEBIT_ASSIGN_OR_RETURN(metrics_server_, MetricsServer::Start(options_.host, options_.metrics_port));
    metrics_server_->RegisterCollectable(registry_);
    metrics_address_ = metrics_server_->address();
  }

  if (!options_.address_file.empty()) {
    ONEBIT_RETURN_IF_ERROR(WriteFileAtomically(
        options_.address_file, absl::StrFormat("{\"grpc\": \"%s\", \"metrics\": \"%s\"}\n",
                                               grpc_address_, metrics_address_)));
  }
  return absl::OkStatus();
}

void ServerProcess::Shutdown() {
  {
    absl::MutexLock lock(&mu_);
    if (shut_down_) return;
    shut_down_ = true;
  }
  // Waiting streams first, so they end at once with UNAVAILABLE instead of at the grace
  // deadline; then gRPC stops and cancels whatever is still reading.
  if (metrics_server_ != nullptr) metrics_server_->SetNotReady("shutting down");
  if (state_ != nullptr) state_->Shutdown();
  if (server_ != nullptr) {
    server_->Shutdown(std::chrono::system_clock::now() +
                      absl::ToChronoMilliseconds(options_.shutdown_grace));
  }
  metrics_server_.reset();
}

void ServerProcess::Wait() {
  if (server_ != nullptr) server_->Wait();
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(&shut_down_));
}

ServerProcess::~ServerProcess() {
  Shutdown();
  if (server_ != nullptr) server_->Wait();
}

}  // namespace onebit::server
