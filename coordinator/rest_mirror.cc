#include "coordinator/rest_mirror.h"

#include <chrono>
#include <functional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "proto/proto_json.h"
#include "security/tls.h"
#include "google/protobuf/struct.pb.h"
#include "httplib.h"

namespace onebit {

int HttpStatusFor(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kOk:
      return 200;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
      return 400;
    case absl::StatusCode::kUnauthenticated:
      return 401;
    case absl::StatusCode::kPermissionDenied:
      return 403;
    case absl::StatusCode::kNotFound:
      return 404;
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kAlreadyExists:
    case absl::StatusCode::kAborted:
      return 409;
    case absl::StatusCode::kResourceExhausted:
      return 429;
    case absl::StatusCode::kCancelled:
      return 499;
    case absl::StatusCode::kUnimplemented:
      return 501;
    case absl::StatusCode::kUnavailable:
      return 503;
    case absl::StatusCode::kDeadlineExceeded:
      return 504;
    default:
      return 500;
  }
}

namespace {

// The largest request body (admin requests are a few bytes).
constexpr size_t kMaxBody = 1 << 20;

// `s` with every byte that is not part of a well-formed UTF-8 sequence replaced by U+FFFD.
// Messages echo the request (its path), and protobuf prints a string's bytes as they are:
// invalid UTF-8 would make the answer invalid JSON.
std::string ValidUtf8(absl::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    const size_t len = c < 0x80                 ? 1
                       : (c >= 0xc2 && c <= 0xdf) ? 2
                       : (c >= 0xe0 && c <= 0xef) ? 3
                       : (c >= 0xf0 && c <= 0xf4) ? 4
                                                  : 0;
    bool ok = len > 0 && i + len <= s.size();
    for (size_t k = 1; ok && k < len; ++k) {
      ok = (static_cast<unsigned char>(s[i + k]) & 0xc0) == 0x80;
    }
    if (ok && len > 2) {
      const unsigned char c1 = static_cast<unsigned char>(s[i + 1]);
      ok = !(c == 0xe0 && c1 < 0xa0) &&  // overlong
           !(c == 0xed && c1 > 0x9f) &&  // a surrogate
           !(c == 0xf0 && c1 < 0x90) &&  // overlong
           !(c == 0xf4 && c1 > 0x8f);    // beyond U+10FFFF
    }
    if (ok) {
      out.append(s.data() + i, len);
      i += len;
    } else {
      out += "\xef\xbf\xbd";
      ++i;
    }
  }
  return out;
}

RestResponse ErrorResponse(int http_status, const absl::Status& status) {
  google::protobuf::Struct body;
  (*body.mutable_fields())["code"].set_string_value(absl::StatusCodeToString(status.code()));
  (*body.mutable_fields())["message"].set_string_value(ValidUtf8(status.message()));
  RestResponse response;
  response.http_status = http_status;
  response.body = ToJson(body);
  return response;
}

RestResponse ErrorResponse(const absl::Status& status) {
  return ErrorResponse(HttpStatusFor(status.code()), status);
}

template <typename Response>
RestResponse Answer(const absl::StatusOr<Response>& result) {
  if (!result.ok()) return ErrorResponse(result.status());
  RestResponse response;
  response.body = ToJson(*result);
  return response;
}

// Parses the body into a fresh Request (empty means {}) and calls `call` with it.
template <typename Request, typename Call>
RestResponse WithBody(absl::string_view body, Call call) {
  Request request;
  const absl::string_view json = absl::StripAsciiWhitespace(body);
  absl::Status parsed = FromJson(json.empty() ? absl::string_view("{}") : json, &request);
  if (!parsed.ok()) return ErrorResponse(parsed);
  return Answer(call(request));
}

struct Route {
  const char* path;
  const char* method;  // GET or POST
  const char* rpc;     // the handler method, for metrics
  std::function<RestResponse(CoordinatorHandler*, absl::string_view body)> serve;
};

const std::vector<Route>& Routes() {
  static const auto* routes = new std::vector<Route>{
      {"/v1/job", "GET", "GetJob",
       [](CoordinatorHandler* h, absl::string_view) {
         return Answer(h->GetJob(v1::GetJobRequest()));
       }},
      {"/v1/members", "GET", "ListMembers",
       [](CoordinatorHandler* h, absl::string_view) {
         return Answer(h->ListMembers(v1::ListMembersRequest()));
       }},
      {"/v1/freeze", "POST", "Freeze",
       [](CoordinatorHandler* h, absl::string_view body) {
         return WithBody<v1::FreezeRequest>(
             body, [h](const v1::FreezeRequest& r) { return h->Freeze(r); });
       }},
      {"/v1/freeze/delay", "POST", "DelayFreeze",
       [](CoordinatorHandler* h, absl::string_view body) {
         return WithBody<v1::DelayFreezeRequest>(
             body, [h](const v1::DelayFreezeRequest& r) { return h->DelayFreeze(r); });
       }},
      {"/v1/stop", "POST", "Stop",
       [](CoordinatorHandler* h, absl::string_view body) {
         return WithBody<v1::StopRequest>(body,
                                          [h](const v1::StopRequest& r) { return h->Stop(r); });
       }},
      {"/v1/checkpoints", "GET", "ListCheckpoints",
       [](CoordinatorHandler* h, absl::string_view) {
         return Answer(h->ListCheckpoints(v1::ListCheckpointsRequest()));
       }},
      {"/v1/checkpoints", "POST", "Checkpoint",
       [](CoordinatorHandler* h, absl::string_view body) {
         return WithBody<v1::CheckpointRequest>(
             body, [h](const v1::CheckpointRequest& r) { return h->Checkpoint(r); });
       }},
  };
  return *routes;
}

}  // namespace

RestResponse HandleRest(CoordinatorHandler* handler, CoordinatorMetrics* metrics,
                        absl::string_view method, absl::string_view path, absl::string_view body,
                        const security::Tokens* tokens, absl::string_view authorization) {
  // HEAD is GET without the body (the HTTP server drops it).
  const absl::string_view effective = method == "HEAD" ? absl::string_view("GET") : method;
  std::vector<std::string> allowed;  // methods of `path`
  for (const Route& route : Routes()) {
    if (path != route.path) continue;
    if (effective != route.method) {
      allowed.push_back(route.method);
      continue;
    }
    if (tokens != nullptr) {
      // GETs read; POSTs change the job.
      const security::Access access = absl::string_view(route.method) == "GET"
                                          ? security::Access::kMember
                                          : security::Access::kAdmin;
      const absl::Status auth = security::Authorize(*tokens, access, authorization, route.rpc);
      if (!auth.ok()) {
        if (metrics != nullptr) metrics->RpcError(route.rpc);
        RestResponse refused = ErrorResponse(auth);
        if (auth.code() == absl::StatusCode::kUnauthenticated) {
          refused.www_authenticate = "Bearer realm=\"onebit\"";
        }
        return refused;
      }
    }
    RestResponse response = route.serve(handler, body);
    if (response.http_status >= 400 && metrics != nullptr) metrics->RpcError(route.rpc);
    return response;
  }
  if (!allowed.empty()) {
    RestResponse response = ErrorResponse(
        405, absl::UnimplementedError(absl::StrCat(method, " ", path, ": method not allowed; ",
                                                   "use ", absl::StrJoin(allowed, " or "))));
    response.allow = absl::StrJoin(allowed, ", ");
    return response;
  }
  std::vector<std::string> paths;
  for (const Route& route : Routes()) paths.push_back(absl::StrCat(route.method, " ", route.path));
  return ErrorResponse(404, absl::NotFoundError(absl::StrCat("no such path: ", path, " (known: ",
                                                             absl::StrJoin(paths, ", "), ")")));
}

RestMirror::RestMirror(CoordinatorHandler* handler, CoordinatorMetrics* metrics,
                       const RestMirrorOptions& options)
    : handler_(handler), metrics_(metrics), options_(options) {}

RestMirror::~RestMirror() { Stop(); }

absl::Status RestMirror::Start(const std::string& host, int port) {
  if (server_ != nullptr) return absl::FailedPreconditionError("REST mirror already started");
  std::unique_ptr<httplib::Server> server;
  if (options_.tls.enabled()) {
    // The same files as the gRPC port, checked the same way (errors name the file).
    const bool mutual = options_.tls.mutual;
    if (options_.tls.cert.empty() || (mutual && options_.tls.ca_cert.empty())) {
      return absl::InvalidArgumentError(
          "REST mirror: HTTPS needs a certificate and key (and the CA with mutual TLS)");
    }
    absl::StatusOr<security::TlsMaterial> checked = security::LoadTlsMaterial(options_.tls);
    if (!checked.ok()) return checked.status();
    auto https = std::make_unique<httplib::SSLServer>(
        options_.tls.cert.c_str(), options_.tls.key.c_str(),
        mutual ? options_.tls.ca_cert.c_str() : nullptr);
    if (!https->is_valid()) {
      return absl::InvalidArgumentError(
          absl::StrCat("REST mirror: cannot serve HTTPS with ", options_.tls.cert, " and ",
                       options_.tls.key));
    }
    server = std::move(https);
  } else {
    server = std::make_unique<httplib::Server>();
  }
  // Admin traffic is light; two threads keep one slow client from blocking the rest.
  server->new_task_queue = [] { return new httplib::ThreadPool(2); };
  server->set_payload_max_length(kMaxBody);
  // Not httplib's default SO_REUSEPORT, which would let two servers share a port.
  server->set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  auto answer_with = [this](const httplib::Request& request, absl::string_view body,
                            httplib::Response& response) {
    const security::Tokens* tokens =
        options_.tokens.admin.empty() && options_.tokens.member.empty() ? nullptr
                                                                        : &options_.tokens;
    RestResponse answer = HandleRest(handler_, metrics_, request.method, request.path, body,
                                     tokens, request.get_header_value("Authorization"));
    response.status = answer.http_status;
    if (!answer.allow.empty()) response.set_header("Allow", answer.allow);
    if (!answer.www_authenticate.empty()) {
      response.set_header("WWW-Authenticate", answer.www_authenticate);
    }
    response.set_content(answer.body + "\n", "application/json");
  };
  auto serve = [answer_with](const httplib::Request& request, httplib::Response& response) {
    answer_with(request, request.body, response);
  };
  // Methods with a body read it here, not in the HTTP server: httplib refuses a POST
  // without Content-Length (`curl -X POST .../v1/stop`) with a bare 400 before any route
  // or token is looked at. No length and no chunks means an empty body, which the routes
  // take as {}.
  auto serve_reading = [answer_with](const httplib::Request& request,
                                     httplib::Response& response,
                                     const httplib::ContentReader& read) {
    std::string body;
    auto refuse = [&response](int code, absl::string_view why) {
      response.status = code;
      response.set_content(ErrorResponse(code, absl::InvalidArgumentError(why)).body + "\n",
                           "application/json");
    };
    if (request.get_header_value<uint64_t>("Content-Length") > kMaxBody) {
      // Read past it unkept (httplib skips a body over its payload limit), so that the
      // client, still sending, gets the answer rather than a reset connection.
      read([](const char*, size_t) { return true; });
      return refuse(413, "request body over 1 MiB");
    }
    if (request.has_header("Content-Length") ||
        request.get_header_value("Transfer-Encoding") == "chunked") {
      bool too_large = false;
      const bool whole = read([&](const char* data, size_t length) {
        if (body.size() + length > kMaxBody) {
          too_large = true;
          return false;
        }
        body.append(data, length);
        return true;
      });
      if (!whole) {
        return too_large ? refuse(413, "request body over 1 MiB")
                         : refuse(400, "the request body ended early");
      }
    }
    answer_with(request, body, response);
  };
  const char* kAll = "(.*)";
  server->Get(kAll, serve);
  server->Post(kAll, serve_reading);
  server->Put(kAll, serve_reading);
  server->Delete(kAll, serve_reading);
  server->Patch(kAll, serve_reading);
  server->Options(kAll, serve);
  // Errors the server produces itself (a too large body, a request it cannot parse) get a
  // JSON body too.
  server->set_error_handler([](const httplib::Request&, httplib::Response& response) {
    if (!response.body.empty()) return;
    absl::Status status = response.status == 413
                              ? absl::InvalidArgumentError("request body over 1 MiB")
                              : absl::InvalidArgumentError("bad HTTP request");
    response.set_content(ErrorResponse(response.status, status).body + "\n", "application/json");
  });
  if (port == 0) {
    port_ = server->bind_to_any_port(host);
    if (port_ < 0) port_ = 0;
  } else if (server->bind_to_port(host, port)) {
    port_ = port;
  }
  if (port_ == 0) {
    return absl::UnavailableError(absl::StrCat("REST mirror: cannot bind ", host, ":", port));
  }
  server_ = std::move(server);
  thread_ = std::thread([server = server_.get()] { server->listen_after_bind(); });
  // httplib's stop() does nothing to a server that is not running yet, so a Stop() right
  // after Start() would leave the thread listening forever: wait until it runs.
  for (int i = 0; i < 5000 && !server_->is_running(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (!server_->is_running()) {
    Stop();
    return absl::UnavailableError("REST mirror: the HTTP server did not start");
  }
  return absl::OkStatus();
}

void RestMirror::Stop() {
  if (server_ == nullptr) return;
  server_->stop();
  if (thread_.joinable()) thread_.join();
  server_.reset();
}

}  // namespace onebit
