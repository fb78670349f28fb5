#include "common/metrics_server.h"

#include <cstring>
#include <exception>
#include <map>
#include <vector>

#include "CivetServer.h"
#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "civetweb.h"
#include "common/net.h"
#include "prometheus/exposer.h"

namespace onebit {

struct MetricsServer::Health {
  mutable absl::Mutex mu;
  bool ready ABSL_GUARDED_BY(mu) = false;
  std::string reason ABSL_GUARDED_BY(mu) = "starting";
};

namespace {

// civetweb's begin_request callback is a plain function with no user data of ours (the
// Exposer owns the CivetServer), so the listeners of this process are found by the port
// a request came in on.
absl::Mutex g_table_mu(absl::kConstInit);
std::map<int, std::shared_ptr<MetricsServer::Health>>* g_table ABSL_GUARDED_BY(g_table_mu) =
    nullptr;

std::shared_ptr<MetricsServer::Health> Lookup(int port) {
  absl::MutexLock lock(&g_table_mu);
  if (g_table == nullptr) return nullptr;
  auto it = g_table->find(port);
  return it == g_table->end() ? nullptr : it->second;
}

void Reply(mg_connection* conn, bool head, int code, const std::string& body) {
  mg_printf(conn,
            "HTTP/1.1 %d %s\r\nContent-Type: text/plain; charset=utf-8\r\n"
            "Content-Length: %zu\r\nCache-Control: no-store\r\nConnection: close\r\n\r\n",
            code, code == 200 ? "OK" : code == 405 ? "Method Not Allowed" : "Service Unavailable",
            body.size());
  if (!head) mg_write(conn, body.data(), body.size());
}

// Answers /healthz and /readyz; returns 0 (civetweb goes on: /metrics, 404) for the rest.
int BeginRequest(mg_connection* conn) {
  const mg_request_info* info = mg_get_request_info(conn);
  if (info == nullptr || info->local_uri == nullptr) return 0;
  const bool healthz = std::strcmp(info->local_uri, "/healthz") == 0;
  const bool readyz = std::strcmp(info->local_uri, "/readyz") == 0;
  if (!healthz && !readyz) return 0;
  std::shared_ptr<MetricsServer::Health> health = Lookup(info->server_port);
  if (health == nullptr) return 0;  // not registered yet (port 0 just bound), or stopping
  const char* method = info->request_method != nullptr ? info->request_method : "";
  const bool head = std::strcmp(method, "HEAD") == 0;
  if (!head && std::strcmp(method, "GET") != 0) {
    Reply(conn, false, 405, "GET or HEAD\n");
    return 405;
  }
  if (healthz) {
    Reply(conn, head, 200, "ok\n");
    return 200;
  }
  absl::MutexLock lock(&health->mu);
  if (health->ready) {
    Reply(conn, head, 200, "ready\n");
    return 200;
  }
  Reply(conn, head, 503, absl::StrCat("not ready: ", health->reason, "\n"));
  return 503;
}

}  // namespace

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(const std::string& host,
                                                                    int port, int threads) {
  if (port < 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("metrics port ", port, " is out of range"));
  }
  std::unique_ptr<MetricsServer> server(new MetricsServer());
  server->health_ = std::make_shared<Health>();
  const std::string bind = JoinHostPort(host, port);
  CivetCallbacks callbacks;  // zeroed by its constructor
  callbacks.begin_request = &BeginRequest;
  try {
    // civetweb's options spelled out (the (address, threads) constructor failed to start
    // inside larger binaries here; this form does not). A failed bind throws: keep
    // exceptions inside this call. civetweb copies the callbacks.
    server->exposer_ = std::make_unique<prometheus::Exposer>(
        std::vector<std::string>{"listening_ports", bind, "num_threads",
                                 std::to_string(threads < 1 ? 1 : threads)},
        &callbacks);
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("cannot serve /metrics on ", bind, ": ", e.what()));
  }
  const std::vector<int> ports = server->exposer_->GetListeningPorts();
  if (ports.empty()) return absl::UnavailableError(absl::StrCat("no /metrics port on ", bind));
  server->port_ = ports.front();
  server->address_ = JoinHostPort(host, server->port_);
  {
    absl::MutexLock lock(&g_table_mu);
    if (g_table == nullptr) g_table = new std::map<int, std::shared_ptr<Health>>();
    (*g_table)[server->port_] = server->health_;
  }
  return server;
}

MetricsServer::~MetricsServer() {
  {
    absl::MutexLock lock(&g_table_mu);
    if (g_table != nullptr) {
      auto it = g_table->find(port_);
      if (it != g_table->end() && it->second == health_) g_table->erase(it);
    }
  }
  exposer_.reset();
}

void MetricsServer::RegisterCollectable(const std::weak_ptr<prometheus::Collectable>& c) {
  exposer_->RegisterCollectable(c);
}

void MetricsServer::SetReady() {
  absl::MutexLock lock(&health_->mu);
  health_->ready = true;
  health_->reason.clear();
}

void MetricsServer::SetNotReady(const std::string& reason) {
  absl::MutexLock lock(&health_->mu);
  health_->ready = false;
  health_->reason = reason;
}

absl::Status MetricsServer::Readiness() const {
  absl::MutexLock lock(&health_->mu);
  if (health_->ready) return absl::OkStatus();
  return absl::UnavailableError(health_->reason);
}

}  // namespace onebit
