// The REST mirror and gRPC give the same answers, over real HTTP and real gRPC: the same
// JSON for GetJob and ListMembers, admin calls through one seen through the other, the
// same errors, and bad requests (malformed JSON, wrong methods, unknown paths, huge bodies)
// refused without any change to the job.
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "proto/proto_json.h"
#include "coordinator/test_coordinator.h"
#include "gmock/gmock.h"
#include "google/protobuf/struct.pb.h"
#include "gtest/gtest.h"
#include "httplib.h"

namespace onebit {
namespace {

using ::testing::HasSubstr;

class CoordinatorRestTest : public ::testing::Test {
 protected:
  void SetUp() override {
    JobConfig config = TestJobConfig(2, 100, 10, 40);
    config.exchange.mode = "ps";
    config.exchange.servers = 1;
    TestCoordinatorOptions options;
    options.metrics = metrics_;
    absl::StatusOr<TestCoordinator> t = StartTestCoordinator(config, options);
    ASSERT_TRUE(t.ok()) << t.status();
    t_ = *std::move(t);
    const std::string rest = t_.server->rest_address();
    const size_t colon = rest.rfind(':');
    http_ =
        std::make_unique<httplib::Client>(rest.substr(0, colon), std::stoi(rest.substr(colon + 1)));
    http_->set_read_timeout(10, 0);
    // Members with addresses, and a lease, so that the answers are not all defaults.
    for (const char* id : {"w0", "w1"}) {
      v1::RegisterRequest r;
      r.set_role(v1::ROLE_WORKER);
      r.set_instance_id(id);
      r.set_requested_rank(-1);
      r.set_address(absl::StrCat(id, ":7000"));
      r.set_metrics_address(absl::StrCat(id, ":9000"));
      ASSERT_TRUE(t_.client->Register(r).ok());
    }
    v1::RegisterRequest s;
    s.set_role(v1::ROLE_SERVER);
    s.set_instance_id("s0");
    ASSERT_TRUE(t_.client->Register(s).ok());
    v1::LeaseRequest lease;
    lease.set_rank(1);
    lease.set_next_step(1);
    ASSERT_TRUE(t_.client->Lease(lease).ok());
  }

  // GET or POST; the body of the answer, and its status in *status.
  std::string Http(const std::string& method, const std::string& path, const std::string& body,
                   int* status) {
    httplib::Result result =
        method == "GET"      ? http_->Get(path.c_str())
        : method == "POST"   ? http_->Post(path.c_str(), body, "application/json")
        : method == "PUT"    ? http_->Put(path.c_str(), body, "application/json")
        : method == "DELETE" ? http_->Delete(path.c_str())
                             : http_->Patch(path.c_str(), body, "application/json");
    if (!result) {
      *status = -1;
      return "";
    }
    *status = result->status;
    std::string text = result->body;
    if (!text.empty() && text.back() == '\n') text.pop_back();
    return text;
  }
  std::string Get(const std::string& path) {
    int status = 0;
    std::string body = Http("GET", path, "", &status);
    EXPECT_EQ(status, 200) << path << ": " << body;
    return body;
  }
  static std::string Code(const std::string& body) {
    google::protobuf::Struct json;
    if (!FromJson(body, &json).ok() || !json.fields().contains("code")) return "(" + body + ")";
    return json.fields().at("code").string_value();
  }

  bool metrics_ = false;
  TestCoordinator t_;
  std::unique_ptr<httplib::Client> http_;
};

// With /metrics (which costs ~2 s to stop).
class CoordinatorRestMetricsTest : public CoordinatorRestTest {
 protected:
  CoordinatorRestMetricsTest() { metrics_ = true; }
};

TEST_F(CoordinatorRestTest, SameAnswersAsGrpc) {
  EXPECT_EQ(Get("/v1/job"), ToJson(*t_.client->GetJob({})));
  EXPECT_EQ(Get("/v1/members"), ToJson(*t_.client->ListMembers({})));
  // And the JSON parses back into the very message gRPC returned.
  v1::JobStatus parsed;
  ASSERT_TRUE(FromJson(Get("/v1/job"), &parsed).ok());
  EXPECT_EQ(parsed.SerializeAsString(), t_.client->GetJob({})->SerializeAsString());
  EXPECT_EQ(parsed.max_lease_step(), 10);
  EXPECT_EQ(parsed.workers_registered(), 2);
}

TEST_F(CoordinatorRestTest, AdminCallsThroughOneAreSeenThroughTheOther) {
  int status = 0;
  std::string body = Http("POST", "/v1/freeze", R"({"atStep": "25"})", &status);
  EXPECT_EQ(status, 200) << body;
  v1::JobStatus via_grpc = *t_.client->GetJob({});
  EXPECT_EQ(via_grpc.freeze_step(), 25);
  EXPECT_EQ(body, ToJson(via_grpc));  // the answer is the new status

  v1::DelayFreezeRequest delay;
  delay.set_to_step(35);
  ASSERT_TRUE(t_.client->DelayFreeze(delay).ok());
  EXPECT_THAT(Get("/v1/job"), HasSubstr("\"freezeStep\":\"35\""));

  body = Http("POST", "/v1/freeze/delay", R"({"to_step": -1})", &status);
  EXPECT_EQ(status, 200) << body;
  EXPECT_EQ(t_.client->GetJob({})->freeze_step(), -1);

  body = Http("POST", "/v1/freeze", R"({"now": true})", &status);
  EXPECT_EQ(status, 200) << body;
  EXPECT_EQ(t_.client->GetJob({})->freeze_step(), 10);  // the furthest lease

  body = Http("POST", "/v1/stop", R"({"afterStep": "50"})", &status);
  EXPECT_EQ(status, 200) << body;
  EXPECT_EQ(t_.client->GetJob({})->stop_after_step(), 50);
  body = Http("POST", "/v1/stop", "", &status);  // as soon as safe
  EXPECT_EQ(status, 200) << body;
  EXPECT_EQ(t_.client->GetJob({})->stop_after_step(), 10);
}

TEST_F(CoordinatorRestTest, SameErrorsAsGrpc) {
  v1::FreezeRequest early;
  early.set_at_step(5);
  absl::Status grpc_error = t_.client->Freeze(early).status();
  int status = 0;
  std::string body = Http("POST", "/v1/freeze", R"({"at_step": 5})", &status);
  EXPECT_EQ(status, 409);
  EXPECT_EQ(Code(body), absl::StatusCodeToString(grpc_error.code()));
  EXPECT_THAT(body, HasSubstr(std::string(grpc_error.message())));
}

TEST_F(CoordinatorRestMetricsTest, BadRequestsChangeNothing) {
  const std::string job_before = Get("/v1/job");
  const std::string members_before = Get("/v1/members");
  struct Case {
    const char* method;
    const char* path;
    std::string body;
    int status;
    const char* code;
  };
  const Case cases[] = {
      {"POST", "/v1/freeze", "{\"now\": tr", 400, "INVALID_ARGUMENT"},
      {"POST", "/v1/freeze", "\xff\xfe\x00garbage", 400, "INVALID_ARGUMENT"},
      {"POST", "/v1/freeze", R"({"atStep": {"nested": 1}})", 400, "INVALID_ARGUMENT"},
      {"POST", "/v1/freeze", R"({"atStep": 1.5})", 400, "INVALID_ARGUMENT"},
      {"POST", "/v1/freeze", R"({"atStep": "-1"})", 400, "INVALID_ARGUMENT"},
      {"POST", "/v1/freeze", R"({"when": 3})", 400, "INVALID_ARGUMENT"},
      {"POST", "/v1/freeze", "{}", 400, "INVALID_ARGUMENT"},
      {"POST", "/v1/freeze", R"({"now": false})", 400, "INVALID_ARGUMENT"},
      {"POST", "/v1/freeze", R"({"atStep": "100"})", 409, "FAILED_PRECONDITION"},
      {"POST", "/v1/freeze/delay", R"({"toStep": "20"})", 400, "INVALID_ARGUMENT"},
      {"POST", "/v1/stop", R"({"afterStep": "3"})", 409, "FAILED_PRECONDITION"},
      {"POST", "/v1/stop", R"({"now": true, "afterStep": "60"})", 400, "INVALID_ARGUMENT"},
      {"POST", "/v1/stop", R"({"after_step": "x"})", 400, "INVALID_ARGUMENT"},
      {"POST", "/v1/job", "{}", 405, "UNIMPLEMENTED"},
      {"PUT", "/v1/members", "{}", 405, "UNIMPLEMENTED"},
      {"DELETE", "/v1/stop", "", 405, "UNIMPLEMENTED"},
      {"PATCH", "/v1/freeze", "{}", 405, "UNIMPLEMENTED"},
      {"GET", "/v1/freeze/delay", "", 405, "UNIMPLEMENTED"},
      {"GET", "/v1/jobs", "", 404, "NOT_FOUND"},
      {"POST", "/v2/freeze", "{}", 404, "NOT_FOUND"},
      {"GET", "/v1/job/../members", "", 404, "NOT_FOUND"},
      {"POST", "/v1/freeze", std::string(2 << 20, '{'), 413, "INVALID_ARGUMENT"},
  };
  for (const Case& c : cases) {
    int status = 0;
    const std::string body = Http(c.method, c.path, c.body, &status);
    const std::string what = absl::StrCat(c.method, " ", c.path, " ", c.body.substr(0, 40));
    EXPECT_EQ(status, c.status) << what << ": " << body;
    EXPECT_EQ(Code(body), c.code) << what << ": " << body;
  }
  EXPECT_EQ(Get("/v1/job"), job_before);
  EXPECT_EQ(Get("/v1/members"), members_before);
  // Errors are counted by method, REST and gRPC alike.
  const std::string metrics_address = t_.server->addresses().metrics;
  httplib::Client metrics(metrics_address.substr(0, metrics_address.rfind(':')),
                          std::stoi(metrics_address.substr(metrics_address.rfind(':') + 1)));
  auto scraped = metrics.Get("/metrics");
  ASSERT_TRUE(scraped);
  EXPECT_THAT(scraped->body, HasSubstr("onebit_coordinator_rpc_errors_total{method=\"Freeze\"} 9"));
}

}  // namespace
}  // namespace onebit
