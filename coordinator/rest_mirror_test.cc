#include "coordinator/rest_mirror.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <memory>
#include <string>

#include "coordinator/clock.h"
#include "coordinator/coordinator.h"
#include "proto/proto_json.h"
#include "gmock/gmock.h"
#include "google/protobuf/struct.pb.h"
#include "gtest/gtest.h"
#include "httplib.h"

namespace onebit {
namespace {

using ::testing::HasSubstr;

class RestMirrorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    CoordinatorOptions options;
    options.config.workers = 2;
    options.config.steps = 100;
    options.config.optimizer.freeze_step = 50;
    options.job_id = "rest-job";
    coordinator_ = *Coordinator::Create(options, &clock_, nullptr);
  }

  RestResponse Call(const std::string& method, const std::string& path,
                    const std::string& body = "") {
    return HandleRest(coordinator_.get(), nullptr, method, path, body);
  }

  // The "code" of an error body.
  static std::string Code(const RestResponse& r) {
    google::protobuf::Struct body;
    if (!FromJson(r.body, &body).ok()) return "(not JSON: " + r.body + ")";
    return body.fields().at("code").string_value();
  }

  std::string JobJson() { return ToJson(*coordinator_->GetJob({})); }

  FakeClock clock_;
  std::unique_ptr<Coordinator> coordinator_;
};

TEST(HttpStatusForTest, MapsEveryCode) {
  EXPECT_EQ(HttpStatusFor(absl::StatusCode::kOk), 200);
  EXPECT_EQ(HttpStatusFor(absl::StatusCode::kInvalidArgument), 400);
  EXPECT_EQ(HttpStatusFor(absl::StatusCode::kOutOfRange), 400);
  EXPECT_EQ(HttpStatusFor(absl::StatusCode::kFailedPrecondition), 409);
  EXPECT_EQ(HttpStatusFor(absl::StatusCode::kAlreadyExists), 409);
  EXPECT_EQ(HttpStatusFor(absl::StatusCode::kNotFound), 404);
  EXPECT_EQ(HttpStatusFor(absl::StatusCode::kResourceExhausted), 429);
  EXPECT_EQ(HttpStatusFor(absl::StatusCode::kUnavailable), 503);
  EXPECT_EQ(HttpStatusFor(absl::StatusCode::kDeadlineExceeded), 504);
  EXPECT_EQ(HttpStatusFor(absl::StatusCode::kInternal), 500);
  EXPECT_EQ(HttpStatusFor(absl::StatusCode::kDataLoss), 500);
}

TEST_F(RestMirrorTest, GetJobIsTheHandlersAnswerInJson) {
  RestResponse r = Call("GET", "/v1/job");
  EXPECT_EQ(r.http_status, 200);
  EXPECT_EQ(r.body, JobJson());
  EXPECT_THAT(r.body, HasSubstr("\"workersRegistered\":0"));  // zeros are printed
  EXPECT_THAT(r.body, HasSubstr("\"freezeStep\":\"50\""));
  EXPECT_EQ(Call("HEAD", "/v1/job").http_status, 200);
  RestResponse members = Call("GET", "/v1/members");
  EXPECT_EQ(members.http_status, 200);
  EXPECT_EQ(members.body, "{\"members\":[]}");
}

TEST_F(RestMirrorTest, FreezeAcceptsBothJsonNamesAndNumbersOrStrings) {
  RestResponse r = Call("POST", "/v1/freeze", R"({"atStep": "20"})");
  EXPECT_EQ(r.http_status, 200) << r.body;
  EXPECT_THAT(r.body, HasSubstr("\"freezeStep\":\"20\""));
  r = Call("POST", "/v1/freeze", R"({"at_step": 25})");
  EXPECT_EQ(r.http_status, 200) << r.body;
  EXPECT_EQ(coordinator_->GetJob({})->freeze_step(), 25);
  r = Call("POST", "/v1/freeze/delay", R"({"toStep": 30})");
  EXPECT_EQ(r.http_status, 200) << r.body;
  EXPECT_EQ(coordinator_->GetJob({})->freeze_step(), 30);
  r = Call("POST", "/v1/freeze", R"({"now": true})");
  EXPECT_EQ(r.http_status, 200) << r.body;
  EXPECT_EQ(coordinator_->GetJob({})->freeze_step(), 0);
}

TEST_F(RestMirrorTest, ErrorsAreJsonWithMappedStatusAndChangeNothing) {
  const std::string before = JobJson();
  struct Case {
    std::string method, path, body;
    int http_status;
    std::string code;
  };
  const Case cases[] = {
      {"POST", "/v1/freeze", "{not json", 400, "INVALID_ARGUMENT"},
      {"POST", "/v1/freeze", R"({"atStep": "x"})", 400, "INVALID_ARGUMENT"},
      {"POST", "/v1/freeze", R"({"bogus": 1})", 400, "INVALID_ARGUMENT"},
      {"POST", "/v1/freeze", R"([1, 2])", 400, "INVALID_ARGUMENT"},
      {"POST", "/v1/freeze", "", 400, "INVALID_ARGUMENT"},  // neither now nor at_step
      {"POST", "/v1/freeze", R"({"atStep": "-3"})", 400, "INVALID_ARGUMENT"},
      {"POST", "/v1/freeze", R"({"atStep": "1", "now": true})", 400, "INVALID_ARGUMENT"},
      {"POST", "/v1/freeze", R"({"atStep": "100"})", 409, "FAILED_PRECONDITION"},
      {"POST", "/v1/freeze/delay", R"({"toStep": 10})", 400, "INVALID_ARGUMENT"},
      {"POST", "/v1/stop", R"({"afterStep": "500"})", 409, "FAILED_PRECONDITION"},
      {"POST", "/v1/stop", R"({"afterStep": "9999999999999999999999"})", 400, "INVALID_ARGUMENT"},
      {"POST", "/v1/job", "", 405, "UNIMPLEMENTED"},
      {"DELETE", "/v1/members", "", 405, "UNIMPLEMENTED"},
      {"GET", "/v1/freeze", "", 405, "UNIMPLEMENTED"},
      {"GET", "/v1/nothing", "", 404, "NOT_FOUND"},
      {"GET", "/", "", 404, "NOT_FOUND"},
      {"GET", "/v1/job/", "", 404, "NOT_FOUND"},
  };
  for (const Case& c : cases) {
    RestResponse r = Call(c.method, c.path, c.body);
    EXPECT_EQ(r.http_status, c.http_status) << c.method << " " << c.path << " " << c.body;
    EXPECT_EQ(Code(r), c.code) << c.method << " " << c.path << " " << c.body << ": " << r.body;
  }
  EXPECT_EQ(Call("POST", "/v1/job").allow, "GET");
  EXPECT_EQ(Call("GET", "/v1/stop").allow, "POST");
  EXPECT_EQ(JobJson(), before);
}

TEST_F(RestMirrorTest, ServesOverHttp) {
  RestMirror mirror(coordinator_.get(), nullptr);
  ASSERT_TRUE(mirror.Start("127.0.0.1", 0).ok());
  ASSERT_GT(mirror.port(), 0);
  httplib::Client client("127.0.0.1", mirror.port());
  client.set_read_timeout(5, 0);
  auto job = client.Get("/v1/job");
  ASSERT_TRUE(job);
  EXPECT_EQ(job->status, 200);
  EXPECT_EQ(job->get_header_value("Content-Type"), "application/json");
  EXPECT_EQ(job->body, JobJson() + "\n");
  auto wrong = client.Put("/v1/job", "{}", "application/json");
  ASSERT_TRUE(wrong);
  EXPECT_EQ(wrong->status, 405);
  EXPECT_EQ(wrong->get_header_value("Allow"), "GET");
  auto bad = client.Post("/v1/freeze", "{\"now\": tru", "application/json");
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->status, 400);
  EXPECT_THAT(bad->body, HasSubstr("INVALID_ARGUMENT"));
  auto huge = client.Post("/v1/freeze", std::string(2 << 20, ' '), "application/json");
  ASSERT_TRUE(huge);
  EXPECT_EQ(huge->status, 413);
  // A second mirror cannot take the same port.
  RestMirror other(coordinator_.get(), nullptr);
  EXPECT_EQ(other.Start("127.0.0.1", mirror.port()).code(), absl::StatusCode::kUnavailable);
  mirror.Stop();
  mirror.Stop();
}

// One request written as bytes on a socket (httplib's client always sends a length); the
// whole answer, up to the server closing the connection.
std::string RawHttp(int port, const std::string& request) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(port);
  timeval timeout{10, 0};  // past the server's 5 s read timeout
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return "(no connection)";
  }
  EXPECT_EQ(send(fd, request.data(), request.size(), 0), static_cast<ssize_t>(request.size()));
  std::string answer;
  char buffer[4096];
  for (ssize_t n; (n = recv(fd, buffer, sizeof(buffer), 0)) > 0;) answer.append(buffer, n);
  close(fd);
  return answer;
}

// `curl -X POST .../v1/stop`, as the README writes it, sends no Content-Length: an empty
// body, which means {}; and with tokens the missing token is what the caller hears first.
TEST_F(RestMirrorTest, APostWithoutABodyIsAnEmptyOneAndTokensComeFirst) {
  const std::string bare =
      "POST /v1/stop HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
  {
    RestMirror open(coordinator_.get(), nullptr);
    ASSERT_TRUE(open.Start("127.0.0.1", 0).ok());
    const std::string answer = RawHttp(open.port(), bare);
    EXPECT_THAT(answer, ::testing::StartsWith("HTTP/1.1 200")) << answer;
    EXPECT_THAT(answer, HasSubstr("\"stopAfterStep\""));
    // A body shorter than its Content-Length: refused, as JSON, once the server's read
    // timeout (5 s) says the rest is not coming.
    const std::string cut = RawHttp(
        open.port(),
        "POST /v1/freeze HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n"
        "Connection: close\r\n\r\n{\"now\"");
    EXPECT_THAT(cut, ::testing::StartsWith("HTTP/1.1 400")) << cut;
  }
  RestMirrorOptions options;
  options.tokens = {"admin-token-0123456789", "member-token-0123456789"};
  RestMirror guarded(coordinator_.get(), nullptr, options);
  ASSERT_TRUE(guarded.Start("127.0.0.1", 0).ok());
  std::string answer = RawHttp(guarded.port(), bare);
  EXPECT_THAT(answer, ::testing::StartsWith("HTTP/1.1 401")) << answer;
  EXPECT_THAT(answer, HasSubstr("UNAUTHENTICATED"));
  answer = RawHttp(guarded.port(),
                   "POST /v1/stop HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                   "admin-token-0123456789\r\nConnection: close\r\n\r\n");
  EXPECT_THAT(answer, ::testing::StartsWith("HTTP/1.1 200")) << answer;
}

TEST_F(RestMirrorTest, StopRightAfterStart) {
  for (int i = 0; i < 5; ++i) {
    RestMirror mirror(coordinator_.get(), nullptr);
    ASSERT_TRUE(mirror.Start("127.0.0.1", 0).ok());
  }
}

// Tokens, without a socket: POSTs need the admin token, GETs a member or admin token; a
// refused request changes nothing.
TEST_F(RestMirrorTest, TokensGuardEveryRoute) {
  const security::Tokens tokens{"admin-token-0123456789", "member-token-0123456789"};
  auto call = [&](const std::string& method, const std::string& path, const std::string& body,
                  const std::string& authorization) {
    return HandleRest(coordinator_.get(), nullptr, method, path, body, &tokens, authorization);
  };
  const std::string before = JobJson();
  RestResponse r = call("POST", "/v1/stop", "{}", "");
  EXPECT_EQ(r.http_status, 401);
  EXPECT_EQ(Code(r), "UNAUTHENTICATED");
  EXPECT_EQ(r.www_authenticate, "Bearer realm=\"onebit\"");
  r = call("POST", "/v1/stop", "{}", "Bearer wrong-token-0123456789");
  EXPECT_EQ(r.http_status, 401);
  r = call("POST", "/v1/freeze", R"({"now": true})", "Bearer member-token-0123456789");
  EXPECT_EQ(r.http_status, 403);
  EXPECT_EQ(Code(r), "PERMISSION_DENIED");
  EXPECT_TRUE(r.www_authenticate.empty());
  r = call("GET", "/v1/members", "", "");
  EXPECT_EQ(r.http_status, 401);
  EXPECT_EQ(JobJson(), before);
  EXPECT_EQ(call("GET", "/v1/job", "", "Bearer member-token-0123456789").http_status, 200);
  EXPECT_EQ(call("GET", "/v1/checkpoints", "", "Bearer admin-token-0123456789").http_status, 200);
  r = call("POST", "/v1/freeze/delay", R"({"toStep": 70})", "Bearer admin-token-0123456789");
  EXPECT_EQ(r.http_status, 200) << r.body;
  EXPECT_THAT(r.body, HasSubstr("\"freezeStep\":\"70\""));
  // Unknown paths and wrong methods answer as before, token or not.
  EXPECT_EQ(call("GET", "/v2/job", "", "").http_status, 404);
  EXPECT_EQ(call("DELETE", "/v1/job", "", "").http_status, 405);
}

}  // namespace
}  // namespace onebit
