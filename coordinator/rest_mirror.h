// The REST/JSON mirror of the coordinator's admin calls, on its own port, calling the same
// CoordinatorHandler as the gRPC service:
//
//   GET  /v1/job           -> GetJob       JobStatus
//   GET  /v1/members       -> ListMembers  ListMembersResponse
//   POST /v1/freeze        -> Freeze       body FreezeRequest, e.g. {"now": true} or
//                                          {"atStep": "120"} (or "at_step", or a number)
//   POST /v1/freeze/delay  -> DelayFreeze  body DelayFreezeRequest, e.g. {"toStep": 200}
//   POST /v1/stop          -> Stop         body StopRequest; empty or {} stops as soon as safe
//   GET  /v1/checkpoints   -> ListCheckpoints  ListCheckpointsResponse
//   POST /v1/checkpoints   -> Checkpoint   body CheckpointRequest
//
// Bodies and answers use protobuf's JSON mapping (proto_json.h). An empty POST body is {}.
// Errors answer {"code": "FAILED_PRECONDITION", "message": "..."} with the HTTP status
// HttpStatusFor(code): 400 INVALID_ARGUMENT / OUT_OF_RANGE (malformed JSON too),
// 409 FAILED_PRECONDITION / ALREADY_EXISTS / ABORTED, 404 NOT_FOUND (and unknown paths),
// 405 for a known path with the wrong method (with an Allow header), 429 RESOURCE_EXHAUSTED,
// 504 DEADLINE_EXCEEDED, 503 UNAVAILABLE, 501 UNIMPLEMENTED, 401/403, 499 CANCELLED,
// 500 otherwise. Bodies over 1 MiB get 413.
//
// SECURITY (security/auth.h): with tokens configured, the request's "Authorization:
// Bearer <token>" header is checked as on gRPC: the POSTs are admin calls (admin token),
// the GETs reads (member or admin token). None, or a wrong one: 401 with
// "WWW-Authenticate: Bearer"; the member token on a POST: 403. With TLS options the mirror
// serves HTTPS with the same certificate as the gRPC port, and with mutual TLS it requires
// a client certificate from the same CA (curl --cacert CA --cert C --key K).
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

int HttpStatusFor(absl::StatusCode code);

struct RestResponse {
  int http_status = 200;
  std::string body;   // JSON
  std::string allow;  // the Allow header of a 405, else empty
  std::string www_authenticate;  // the WWW-Authenticate header of a 401, else empty
};

// The whole mirror as a function of (method, path, body): what the HTTP server runs for
// every request, and what tests can call without a socket. `metrics` may be null.
// `tokens` (may be null: no checks) and `authorization` (the header's value, "" when
// absent) decide who may call what.
RestResponse HandleRest(CoordinatorHandler* handler, CoordinatorMetrics* metrics,
                        absl::string_view method, absl::string_view path, absl::string_view body,
                        const security::Tokens* tokens = nullptr,
                        absl::string_view authorization = "");

struct RestMirrorOptions {
  security::Tokens tokens;  // none: every route is open
  security::TlsOptions tls;  // enabled: HTTPS (cert and key required; ca_cert with mutual)
};

// The HTTP server around HandleRest: a cpp-httplib server with a small thread pool.
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
