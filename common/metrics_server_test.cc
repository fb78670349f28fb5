#include "common/metrics_server.h"

#include <memory>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "prometheus/counter.h"
#include "prometheus/registry.h"

namespace onebit {
namespace {

using ::testing::HasSubstr;

httplib::Result Get(int port, const std::string& path) {
  httplib::Client client("127.0.0.1", port);
  client.set_connection_timeout(5);
  client.set_read_timeout(5);
  return client.Get(path.c_str());
}

TEST(MetricsServerTest, ServesMetricsAndProbesOnOnePort) {
  auto server = MetricsServer::Start("127.0.0.1", 0);
  ASSERT_TRUE(server.ok()) << server.status();
  auto registry = std::make_shared<prometheus::Registry>();
  prometheus::BuildCounter().Name("onebit_test_total").Help("a test counter").Register(*registry)
      .Add({}).Increment(3);
  (*server)->RegisterCollectable(registry);
  const int port = (*server)->port();
  EXPECT_GT(port, 0);
  EXPECT_EQ((*server)->address(), "127.0.0.1:" + std::to_string(port));

  httplib::Result metrics = Get(port, "/metrics");
  ASSERT_TRUE(metrics) << httplib::to_string(metrics.error());
  EXPECT_EQ(metrics->status, 200);
  EXPECT_THAT(metrics->body, HasSubstr("onebit_test_total 3"));

  httplib::Result health = Get(port, "/healthz");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  EXPECT_EQ(health->body, "ok\n");

  // Not ready until the owner says so, with the reason in the body.
  httplib::Result ready = Get(port, "/readyz");
  ASSERT_TRUE(ready);
  EXPECT_EQ(ready->status, 503);
  EXPECT_EQ(ready->body, "not ready: starting\n");
  EXPECT_FALSE((*server)->Readiness().ok());

  (*server)->SetReady();
  ready = Get(port, "/readyz");
  ASSERT_TRUE(ready);
  EXPECT_EQ(ready->status, 200);
  EXPECT_EQ(ready->body, "ready\n");
  EXPECT_TRUE((*server)->Readiness().ok());

  (*server)->SetNotReady("shutting down");
  ready = Get(port, "/readyz");
  ASSERT_TRUE(ready);
  EXPECT_EQ(ready->status, 503);
  EXPECT_EQ(ready->body, "not ready: shutting down\n");
  // Liveness does not follow readiness.
  health = Get(port, "/healthz");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
}

TEST(MetricsServerTest, OtherPathsAndMethods) {
  auto server = MetricsServer::Start("127.0.0.1", 0);
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  httplib::Result missing = Get(port, "/nothing");
  ASSERT_TRUE(missing);
  EXPECT_EQ(missing->status, 404);
  httplib::Client client("127.0.0.1", port);
  httplib::Result posted = client.Post("/healthz", "x", "text/plain");
  ASSERT_TRUE(posted);
  EXPECT_EQ(posted->status, 405);
  httplib::Result head = client.Head("/healthz");
  ASSERT_TRUE(head);
  EXPECT_EQ(head->status, 200);
  EXPECT_TRUE(head->body.empty());
  // A query string does not change the path.
  httplib::Result query = Get(port, "/healthz?verbose=1");
  ASSERT_TRUE(query);
  EXPECT_EQ(query->status, 200);
}

TEST(MetricsServerTest, TwoServersInOneProcessAnswerForThemselves) {
  auto a = MetricsServer::Start("127.0.0.1", 0);
  auto b = MetricsServer::Start("127.0.0.1", 0);
  ASSERT_TRUE(a.ok() && b.ok());
  (*a)->SetReady();
  (*b)->SetNotReady("waiting for the coordinator");
  httplib::Result ra = Get((*a)->port(), "/readyz");
  httplib::Result rb = Get((*b)->port(), "/readyz");
  ASSERT_TRUE(ra && rb);
  EXPECT_EQ(ra->status, 200);
  EXPECT_EQ(rb->status, 503);
  EXPECT_THAT(rb->body, HasSubstr("waiting for the coordinator"));

  // Once destroyed, the port is released: a new server can bind it.
  const int port = (*a)->port();
  a->reset();
  auto again = MetricsServer::Start("127.0.0.1", port);
  ASSERT_TRUE(again.ok()) << again.status();
  httplib::Result ragain = Get(port, "/readyz");
  ASSERT_TRUE(ragain);
  EXPECT_EQ(ragain->status, 503);  // a new server starts not ready
}

TEST(MetricsServerTest, PortInUseOrOutOfRangeIsAnError) {
  auto a = MetricsServer::Start("127.0.0.1", 0);
  ASSERT_TRUE(a.ok());
  auto b = MetricsServer::Start("127.0.0.1", (*a)->port());
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(b.status().message()), HasSubstr(std::to_string((*a)->port())));
  EXPECT_EQ(MetricsServer::Start("127.0.0.1", 70000).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace onebit
