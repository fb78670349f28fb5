// The REST/JSON mirror of the coordinator's admin calls, on its own port, calling the same
// CoordinatorHandler as the gRPC service: GET /v1/job, /v1/members and /v1/checkpoints; POST
// /v1/freeze, /v1/freeze/delay, /v1/stop and /v1/checkpoints (docs/operate.md has the
// routes and their bodies, docs/security.md who may call which). Bodies and answers use
// protobuf's JSON mapping (proto_json.h); an empty POST body is {}.
#ifndef ONEBIT_COORDINATOR_REST_MIRROR_H_
#define ONEBIT_COORDINATOR_REST_MIRROR_H_

#include <memory>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "coordinator/coordinator_handler.h"
#include "coordinator/metrics.h"
#include "security/auth.h"
#include "security/tls_options.h"

namespace httplib {
class Server;
}  // namespace httplib

namespace onebit {

// The HTTP status of an error with `code`: 400 INVALID_ARGUMENT and OUT_OF_RANGE, 409
// FAILED_PRECONDITION, ALREADY_EXISTS and ABORTED, 499 CANCELLED, 500 a code with no
// better one; the others their usual (401, 403, 404, 429, 501, 503, 504).
int HttpStatusFor(absl::StatusCode code);

struct RestResponse {
  int http_status = 200;
  std::string body;   // JSON
  std::string allow;  // the Allow header of a 405, else empty
  std::string www_authenticate;  // the WWW-Authenticate header of a 401, else empty
};

// The whole mirror as a function of (method, path, body): what the HTTP server runs for
// every request, and what tests can call without a socket. `metrics` may be null. Errors
// answer {"code": "FAILED_PRECONDITION", "message": "..."} with HttpStatusFor(code);
// malformed JSON is 400, an unknown path 404, a known path with the wrong method 405 (with
// `allow`). `tokens` (may be null: no checks) and `authorization` (the header's value, ""
// when absent: "Bearer <token>") decide who may call what, as on gRPC: a POST needs the
// admin token, a GET the member or admin token; none or a wrong one is 401 (with
// `www_authenticate`), the member token on a POST 403.
RestResponse HandleRest(CoordinatorHandler* handler, CoordinatorMetrics* metrics,
                        absl::string_view method, absl::string_view path, absl::string_view body,
                        const security::Tokens* tokens = nullptr,
                        absl::string_view authorization = "");

struct RestMirrorOptions {
  security::Tokens tokens;  // none: every route is open
  // Enabled: HTTPS, with the gRPC port's certificate (cert and key required); mutual: a
  // client certificate from ca_cert's CA is required.
  security::TlsOptions tls;
};

// The HTTP server around HandleRest: a cpp-httplib server with a small thread pool. A body
// over 1 MiB gets 413.
// Start and Stop from one thread; the handler and metrics must outlive it.
class RestMirror {
 public:
  RestMirror(CoordinatorHandler* handler, CoordinatorMetrics* metrics,
             const RestMirrorOptions& options = {});
  ~RestMirror();  // Stop()s

  // Binds host:port (port 0: any free port) and serves on a background thread.
  // UNAVAILABLE if the address cannot be bound; INVALID_ARGUMENT (naming the file) for TLS
  // files that do not load.
  absl::Status Start(const std::string& host, int port);
  int port() const { return port_; }
  // Stops accepting, finishes requests in flight, joins. Idempotent.
  void Stop();

 private:
  CoordinatorHandler* const handler_;
  CoordinatorMetrics* const metrics_;
  const RestMirrorOptions options_;
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  int port_ = 0;
};

}  // namespace onebit

#endif  // ONEBIT_COORDINATOR_REST_MIRROR_H_
