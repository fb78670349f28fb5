// The coordinator over real gRPC on 127.0.0.1: membership, rendezvous, leases, sessions,
// liveness, metrics, and bad inputs answered with clear errors and no state change.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "coordinator/coordinator_client.h"
#include "proto/proto_json.h"
#include "coordinator/test_coordinator.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "httplib.h"

namespace onebit {
namespace {

using ::testing::HasSubstr;

v1::RegisterRequest Worker(const std::string& id, int requested = -1) {
  v1::RegisterRequest r;
  r.set_role(v1::ROLE_WORKER);
  r.set_instance_id(id);
  r.set_requested_rank(requested);
  r.set_address(id + ".local:1");
  return r;
}

v1::RegisterRequest Server(const std::string& id, int requested) {
  v1::RegisterRequest r = Worker(id, requested);
  r.set_role(v1::ROLE_SERVER);
  return r;
}

v1::LeaseRequest LeaseReq(int rank, int64_t next) {
  v1::LeaseRequest r;
  r.set_rank(rank);
  r.set_next_step(next);
  return r;
}

// A TCP relay to the coordinator whose link can go silent: paused, it stops moving bytes
// either way and closes nothing (no RST, no FIN), as a link set down does.
class SilentLink {
 public:
  explicit SilentLink(const std::string& target) {
    target_port_ = std::stoi(target.substr(target.rfind(':') + 1));
    listen_fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    EXPECT_EQ(bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), len), 0);
    EXPECT_EQ(listen(listen_fd_, 8), 0);
    getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    threads_.emplace_back([this] { Accept(); });
  }
  ~SilentLink() {
    stop_ = true;
    for (std::thread& t : threads_) t.join();
    for (int fd : fds_) close(fd);
    close(listen_fd_);
  }
  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }
  void Pause() { paused_ = true; }

 private:
  void Accept() {
    while (!stop_) {
      pollfd p{listen_fd_, POLLIN, 0};
      if (poll(&p, 1, 50) <= 0) continue;
      const int client = accept(listen_fd_, nullptr, nullptr);
      const int server = socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in addr{};
      addr.sin_family = AF_INET;
      addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      addr.sin_port = htons(target_port_);
      if (client < 0 || connect(server, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
        ADD_FAILURE() << "the relay could not connect";
        return;
      }
      fds_.insert(fds_.end(), {client, server});
      pumps_.emplace_back([this, client, server] { Pump(client, server); });
      pumps_.emplace_back([this, client, server] { Pump(server, client); });
    }
    for (std::thread& t : pumps_) t.join();
  }
  void Pump(int from, int to) {
    char buffer[16384];
    while (!stop_) {
      if (paused_) {
        absl::SleepFor(absl::Milliseconds(20));
        continue;
      }
      pollfd p{from, POLLIN, 0};
      if (poll(&p, 1, 20) <= 0) continue;
      const ssize_t n = read(from, buffer, sizeof(buffer));
      if (n <= 0) return;
      for (ssize_t off = 0; off < n;) {
        const ssize_t w = write(to, buffer + off, n - off);
        if (w <= 0) return;
        off += w;
      }
    }
  }

  int listen_fd_ = -1, port_ = 0, target_port_ = 0;
  std::atomic<bool> stop_{false}, paused_{false};
  std::vector<int> fds_;             // the Accept thread's
  std::vector<std::thread> pumps_;   // the Accept thread's
  std::vector<std::thread> threads_;
};

class CoordinatorServiceTest : public ::testing::Test {
 protected:
  void Start(JobConfig config, absl::Duration heartbeat_timeout = absl::Seconds(60),
             bool metrics = false) {
    TestCoordinatorOptions options;
    options.heartbeat_timeout = heartbeat_timeout;
    options.metrics = metrics;
    absl::StatusOr<TestCoordinator> t = StartTestCoordinator(config, options);
    ASSERT_TRUE(t.ok()) << t.status();
    t_ = *std::move(t);
  }
  void SetUp() override {
    JobConfig config = TestJobConfig(3, 100, 10, 40);
    config.exchange.mode = "ps";
    config.exchange.servers = 2;
    Start(config);
  }
  CoordinatorClient& client() { return *t_.client; }
  std::string JobJson() { return ToJson(*client().GetJob({})); }
  std::string MembersJson() { return ToJson(*client().ListMembers({})); }

  TestCoordinator t_;
};

TEST_F(CoordinatorServiceTest, RanksInArrivalOrderIdempotentAndBounded) {
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<v1::RegisterResponse> r = client().Register(Worker(absl::StrCat("w", i)));
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->rank(), i);
    EXPECT_EQ(r->world_size(), 3);
    EXPECT_EQ(r->num_servers(), 2);
    EXPECT_EQ(r->job_id(), "test-job");
  }
  EXPECT_EQ(client().Register(Worker("w1"))->rank(), 1);  // the same instance again
  absl::Status full = client().Register(Worker("w3")).status();
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(full.message(), HasSubstr("all 3 worker slots are taken"));
  EXPECT_EQ(client().Register(Server("s1", 1))->rank(), 1);
  EXPECT_EQ(client().Register(Server("s0", -1))->rank(), 0);
  EXPECT_EQ(client().Register(Server("s2", 1)).status().code(),
            absl::StatusCode::kResourceExhausted);
  v1::JobStatus job = *client().GetJob({});
  EXPECT_EQ(job.workers_registered(), 3);
  EXPECT_EQ(job.servers_registered(), 2);
  v1::ListMembersResponse members = *client().ListMembers({});
  ASSERT_EQ(members.members_size(), 5);
  EXPECT_EQ(members.members(0).instance_id(), "w0");
  EXPECT_EQ(members.members(0).address(), "w0.local:1");
  EXPECT_EQ(members.members(3).role(), v1::ROLE_SERVER);
  EXPECT_EQ(members.members(3).instance_id(), "s0");
  EXPECT_TRUE(members.members(4).alive());
}

TEST_F(CoordinatorServiceTest, ConcurrentRegistrationsGetDistinctRanks) {
  std::vector<int> ranks(3, -1);
  std::vector<std::thread> threads;
  for (int i = 0; i < 3; ++i) {
    threads.emplace_back([&, i] {
      absl::StatusOr<v1::RegisterResponse> r = client().Register(Worker(absl::StrCat("c", i)));
      if (r.ok()) ranks[i] = r->rank();
    });
  }
  for (std::thread& t : threads) t.join();
  std::sort(ranks.begin(), ranks.end());
  EXPECT_EQ(ranks, (std::vector<int>{0, 1, 2}));
}

TEST_F(CoordinatorServiceTest, BadRegistrationsAreRefusedClearly) {
  const std::string before = JobJson();
  v1::RegisterRequest no_role = Worker("x");
  no_role.set_role(v1::ROLE_UNSPECIFIED);
  absl::Status s = client().Register(no_role).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("role must be ROLE_WORKER or ROLE_SERVER"));
  v1::RegisterRequest unknown_role = Worker("x");
  unknown_role.set_role(static_cast<v1::Role>(42));
  EXPECT_THAT(client().Register(unknown_role).status().message(), HasSubstr("42"));
  EXPECT_THAT(client().Register(Worker("")).status().message(),
              HasSubstr("instance_id must not be empty"));
  EXPECT_THAT(client().Register(Worker("x", -7)).status().message(),
              HasSubstr("requested_rank -7 is out of range"));
  EXPECT_THAT(client().Register(Worker("x", 3)).status().message(),
              HasSubstr("requested_rank 3 is out of range"));
  EXPECT_EQ(client().Register(Worker(std::string(100000, 'i'))).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(JobJson(), before);
  EXPECT_EQ(MembersJson(), "{\"members\":[]}");
}

TEST_F(CoordinatorServiceTest, KeyValueRendezvous) {
  v1::KvSetRequest set;
  set.set_key("nccl/unique_id");
  set.set_value(std::string("\0\1\2\3", 4));
  ASSERT_TRUE(client().KvSet(set).ok());
  ASSERT_TRUE(client().KvSet(set).ok());  // a retry
  v1::KvSetRequest other = set;
  other.set_value("different");
  EXPECT_EQ(client().KvSet(other).status().code(), absl::StatusCode::kAlreadyExists);

  v1::KvGetRequest get;
  get.set_key("nccl/unique_id");
  absl::StatusOr<v1::KvGetResponse> got = client().KvGet(get);
  ASSERT_TRUE(got.ok());
  EXPECT_TRUE(got->found());
  EXPECT_EQ(got->value(), set.value());
  get.set_key("absent");
  EXPECT_FALSE(client().KvGet(get)->found());

  // A waiting get returns when another process sets the key...
  std::thread setter([&] {
    absl::SleepFor(absl::Milliseconds(100));
    v1::KvSetRequest late;
    late.set_key("late");
    late.set_value("v");
    ASSERT_TRUE(client().KvSet(late).ok());
  });
  v1::KvGetRequest wait;
  wait.set_key("late");
  wait.set_wait(true);
  wait.set_timeout_ms(10000);
  const absl::Time start = absl::Now();
  got = client().KvGet(wait);
  setter.join();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->value(), "v");
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  // ...and times out cleanly when nobody does.
  wait.set_key("never");
  wait.set_timeout_ms(100);
  absl::Status timeout = client().KvGet(wait).status();
  EXPECT_EQ(timeout.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(timeout.message(), HasSubstr("'never' was not set within"));
}

TEST_F(CoordinatorServiceTest, KeyValueLimits) {
  v1::KvSetRequest set;
  set.set_key(std::string(513, 'k'));
  set.set_value("v");
  absl::Status s = client().KvSet(set).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("key is 513 bytes; the limit is 512"));
  set.set_key("");
  EXPECT_EQ(client().KvSet(set).status().code(), absl::StatusCode::kInvalidArgument);
  set.set_key("big");
  set.set_value(std::string((1 << 20) + 1, 'v'));
  EXPECT_THAT(client().KvSet(set).status().message(), HasSubstr("the limit is 1048576"));
  // Over gRPC's message limit: refused by gRPC itself, the coordinator carries on.
  set.set_value(std::string(5 << 20, 'v'));
  EXPECT_EQ(client().KvSet(set).status().code(), absl::StatusCode::kResourceExhausted);
  v1::KvGetRequest get;
  get.set_key("big");
  EXPECT_FALSE(client().KvGet(get)->found());
  get.set_wait(true);
  get.set_timeout_ms(-5);
  EXPECT_EQ(client().KvGet(get).status().code(), absl::StatusCode::kInvalidArgument);
  get.set_key(std::string(1000, 'k'));
  get.set_timeout_ms(10);
  EXPECT_EQ(client().KvGet(get).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(CoordinatorServiceTest, LeasesCarryTheSwitchAndTheStop) {
  ASSERT_TRUE(client().Register(Worker("w0")).ok());
  absl::StatusOr<v1::LeaseResponse> lease = client().Lease(LeaseReq(0, 1));
  ASSERT_TRUE(lease.ok()) << lease.status();
  EXPECT_EQ(lease->through_step(), 10);
  EXPECT_EQ(lease->freeze_step(), 40);
  EXPECT_EQ(lease->stop_after_step(), 100);
  EXPECT_EQ(client().GetJob({})->max_lease_step(), 10);

  const std::string before = JobJson();
  EXPECT_EQ(client().Lease(LeaseReq(1, 1)).status().code(),
            absl::StatusCode::kFailedPrecondition);  // rank 1 not registered
  EXPECT_EQ(client().Lease(LeaseReq(-1, 1)).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(client().Lease(LeaseReq(3, 1)).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(client().Lease(LeaseReq(0, -4)).status().code(), absl::StatusCode::kInvalidArgument);
  absl::Status skip = client().Lease(LeaseReq(0, 99)).status();
  EXPECT_EQ(skip.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(skip.message(), HasSubstr("holds a lease through step 10"));
  EXPECT_EQ(JobJson(), before);
}

TEST_F(CoordinatorServiceTest, StatsReportsAreValidated) {
  ASSERT_TRUE(client().Register(Worker("w0")).ok());
  ASSERT_TRUE(client().Lease(LeaseReq(0, 1)).ok());
  v1::StatsReport report;
  report.set_rank(0);
  report.set_step(5);
  report.set_stage(v1::STAGE_WARMUP);
  report.set_loss(2.5);
  report.set_variance_change(0.3);
  ASSERT_TRUE(client().ReportStats(report).ok());
  v1::JobStatus job = *client().GetJob({});
  EXPECT_EQ(job.step(), 5);
  EXPECT_DOUBLE_EQ(job.last_loss(), 2.5);
  EXPECT_DOUBLE_EQ(job.last_variance_change(), 0.3);
  // A later step without a loss (a script that gave none) is no last loss of 0.
  v1::StatsReport no_loss = report;
  no_loss.set_step(6);
  no_loss.set_loss(0.0);
  no_loss.set_no_loss(true);
  ASSERT_TRUE(client().ReportStats(no_loss).ok());
  job = *client().GetJob({});
  EXPECT_EQ(job.step(), 6);
  EXPECT_DOUBLE_EQ(job.last_loss(), 2.5);

  const std::string before = JobJson();
  v1::StatsReport bad = report;
  bad.set_stage(v1::STAGE_COMPRESSION);
  EXPECT_THAT(client().ReportStats(bad).status().message(),
              HasSubstr("reports step 5 in compression but switch after step 40"));
  bad = report;
  bad.set_step(11);
  EXPECT_EQ(client().ReportStats(bad).status().code(), absl::StatusCode::kFailedPrecondition);
  bad = report;
  bad.set_rank(7);
  EXPECT_EQ(client().ReportStats(bad).status().code(), absl::StatusCode::kInvalidArgument);
  bad = report;
  bad.set_stage(v1::STAGE_UNSPECIFIED);
  EXPECT_EQ(client().ReportStats(bad).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(JobJson(), before);
}

TEST_F(CoordinatorServiceTest, SessionsPushJobEvents) {
  ASSERT_TRUE(client().Register(Worker("w0")).ok());
  absl::Mutex mu;
  std::vector<v1::JobStatus> events;
  SessionOptions options;
  options.rank = 0;
  options.instance_id = "w0";
  options.heartbeat_interval = absl::Milliseconds(50);
  auto session = client().StartSession(options, [&](const v1::JobEvent& e) {
    absl::MutexLock lock(&mu);
    events.push_back(e.job());
  });
  ASSERT_TRUE(session.ok());
  auto wait_for = [&](auto predicate) {
    for (int i = 0; i < 500; ++i) {
      {
        absl::MutexLock lock(&mu);
        for (const v1::JobStatus& job : events) {
          if (predicate(job)) return true;
        }
      }
      absl::SleepFor(absl::Milliseconds(10));
    }
    return false;
  };
  EXPECT_TRUE(wait_for([](const v1::JobStatus& j) { return j.freeze_step() == 40; }));
  v1::FreezeRequest freeze;
  freeze.set_at_step(25);
  ASSERT_TRUE(client().Freeze(freeze).ok());
  EXPECT_TRUE(wait_for([](const v1::JobStatus& j) { return j.freeze_step() == 25; }));
  ASSERT_TRUE(client().Register(Worker("w1")).ok());
  EXPECT_TRUE(wait_for([](const v1::JobStatus& j) { return j.workers_registered() == 2; }));
  // Heartbeats carry the step.
  ASSERT_TRUE(client().Lease(LeaseReq(0, 1)).ok());
  (*session)->SetStep(7);
  bool stepped = false;
  for (int i = 0; i < 500 && !stepped; ++i) {
    stepped = client().ListMembers({})->members(0).last_step() == 7;
    if (!stepped) absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_TRUE(stepped);
  EXPECT_TRUE((*session)->Stop().ok());
}

TEST_F(CoordinatorServiceTest, SessionOfAnUnknownMemberEndsWithTheReason) {
  SessionOptions options;
  options.rank = 2;
  options.instance_id = "ghost";
  auto session = client().StartSession(options, nullptr);
  ASSERT_TRUE(session.ok());
  for (int i = 0; i < 500 && (*session)->status().ok(); ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  absl::Status status = (*session)->Stop();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(status.message(), HasSubstr("worker rank 2 is not registered"));
}

// What a member of a restarted coordinator meets: the coordinator does not know it. It
// hears the job's status (with the generation it must restart for) before the refusal, and
// the session tells its owner that it ended.
TEST_F(CoordinatorServiceTest, ARefusedSessionCarriesTheJobFirstAndEndsThroughOnEnd) {
  absl::Mutex mu;
  std::vector<v1::JobStatus> events;
  absl::Status ended;
  absl::Notification done;
  SessionOptions options;
  options.role = v1::ROLE_SERVER;
  options.rank = 1;
  options.instance_id = "forgotten-shard";
  options.heartbeat_interval = absl::Milliseconds(50);
  options.on_end = [&](const absl::Status& why) {
    {
      absl::MutexLock lock(&mu);
      ended = why;
    }
    done.Notify();
  };
  auto session = client().StartSession(options, [&](const v1::JobEvent& e) {
    absl::MutexLock lock(&mu);
    events.push_back(e.job());
  });
  ASSERT_TRUE(session.ok());
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  {
    absl::MutexLock lock(&mu);
    ASSERT_EQ(events.size(), 1u);
    EXPECT_EQ(events[0].job_id(), "test-job");
    EXPECT_EQ(events[0].generation(), 1);
    EXPECT_EQ(ended.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(ended.message(), HasSubstr("server rank 1 is not registered"));
  }
  EXPECT_EQ((*session)->Stop().code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(CoordinatorServiceTest, MembersDieWithoutHeartbeatsAndComeBack) {
  JobConfig config = TestJobConfig(2, 100, 10, 40);
  config.failure.max_restarts = 0;  // the dead member fails the job; the membership stays
  Start(config, absl::Milliseconds(300));
  ASSERT_TRUE(client().Register(Worker("w0")).ok());
  ASSERT_TRUE(client().Register(Worker("w1")).ok());
  SessionOptions options;
  options.rank = 0;
  options.instance_id = "w0";
  options.heartbeat_interval = absl::Milliseconds(50);
  auto session = client().StartSession(options, nullptr);
  ASSERT_TRUE(session.ok());
  int alive = -1;
  for (int i = 0; i < 300 && alive != 1; ++i) {
    absl::SleepFor(absl::Milliseconds(10));
    alive = client().GetJob({})->workers_alive();
  }
  EXPECT_EQ(alive, 1);  // w1 never sent a heartbeat
  v1::ListMembersResponse members = *client().ListMembers({});
  EXPECT_TRUE(members.members(0).alive());
  EXPECT_FALSE(members.members(1).alive());
  ASSERT_TRUE((*session)->Stop().ok());
  for (int i = 0; i < 300 && alive != 0; ++i) {
    absl::SleepFor(absl::Milliseconds(10));
    alive = client().GetJob({})->workers_alive();
  }
  EXPECT_EQ(alive, 0);
}

TEST_F(CoordinatorServiceTest, MetricsAreServed) {
  JobConfig config = TestJobConfig(3, 100, 10, 40);
  Start(config, absl::Seconds(60), /*metrics=*/true);
  ASSERT_TRUE(client().Register(Worker("w0")).ok());
  ASSERT_TRUE(client().Lease(LeaseReq(0, 1)).ok());
  EXPECT_FALSE(client().Lease(LeaseReq(0, 50)).ok());
  const std::string address = t_.server->addresses().metrics;
  const size_t colon = address.rfind(':');
  httplib::Client http(address.substr(0, colon), std::stoi(address.substr(colon + 1)));
  auto response = http.Get("/metrics");
  ASSERT_TRUE(response);
  EXPECT_EQ(response->status, 200);
  for (const char* line :
       {"onebit_coordinator_stage 0", "onebit_coordinator_freeze_step 40",
        "onebit_coordinator_max_lease_step 10", "onebit_coordinator_workers_registered 1",
        "onebit_coordinator_workers_alive 1", "onebit_coordinator_leases_granted_total 1",
        "onebit_coordinator_lease_seconds_count 1",
        "onebit_coordinator_rpc_errors_total{method=\"Lease\"} 1"}) {
    EXPECT_THAT(response->body, HasSubstr(line));
  }
}

// A member's session (rank 0, 100 ms heartbeats) whose end goes to *why and *done.
SessionOptions WatchedSession(const std::string& id, absl::Status* why, absl::Notification* done) {
  SessionOptions options;
  options.rank = 0;
  options.instance_id = id;
  options.heartbeat_interval = absl::Milliseconds(100);
  options.on_end = [why, done](const absl::Status& status) {
    *why = status;
    done->Notify();
  };
  return options;
}

// A link that goes silent gives no error to anyone. The member's channel pings the
// coordinator (GrpcClientOptions::keepalive; the coordinator answers however often, with
// no event to send), a ping that goes unanswered breaks the connection, and with no new
// stream within its silence limit the session ends (ABORTED) instead of waiting forever.
TEST_F(CoordinatorServiceTest, ASessionCutOffBySilenceEndsWithinItsLimit) {
  ASSERT_TRUE(client().Register(Worker("w0")).ok());
  SilentLink link(t_.server->addresses().grpc);
  GrpcClientOptions via_options;
  via_options.address = link.address();
  via_options.keepalive = absl::Milliseconds(250);
  auto via = NewGrpcCoordinatorClient(via_options);
  ASSERT_TRUE(via.ok());
  std::atomic<int> events{0};
  absl::Notification done;
  absl::Status ended;
  SessionOptions options = WatchedSession("w0", &ended, &done);
  options.silence_limit = absl::Seconds(1);
  auto session = (*via)->StartSession(options, [&](const v1::JobEvent&) { ++events; });
  ASSERT_TRUE(session.ok());
  // Pings 4 times a second on a quiet stream: the coordinator must not take them for abuse.
  absl::SleepFor(absl::Seconds(2));
  EXPECT_GE(events.load(), 1);
  EXPECT_FALSE(done.HasBeenNotified()) << ended;
  const absl::Time cut = absl::Now();
  link.Pause();
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_LE(absl::Now() - cut, absl::Seconds(3));
  EXPECT_EQ(ended.code(), absl::StatusCode::kAborted) << ended;
  EXPECT_THAT(ended.message(), HasSubstr("cut off"));
  (*session)->Stop().IgnoreError();
}

// A coordinator that is stopped says so as it ends the sessions: its members wait for it
// (a restart answers them; a stop of the whole job stops them too) instead of leaving
// after their silence limit, as a member cut off by a silent link does.
TEST_F(CoordinatorServiceTest, ACoordinatorThatStopsIsWaitedFor) {
  ASSERT_TRUE(client().Register(Worker("w0")).ok());
  std::atomic<int> events{0};
  absl::Notification done;
  absl::Status ended;
  SessionOptions options = WatchedSession("w0", &ended, &done);
  options.silence_limit = absl::Milliseconds(500);
  options.give_up_after = absl::Seconds(30);
  auto session = client().StartSession(options, [&](const v1::JobEvent&) { ++events; });
  ASSERT_TRUE(session.ok());
  for (int i = 0; i < 200 && events.load() == 0; ++i) absl::SleepFor(absl::Milliseconds(10));
  ASSERT_GE(events.load(), 1);
  t_.server->Shutdown();
  EXPECT_FALSE(done.WaitForNotificationWithTimeout(absl::Seconds(2)))
      << "left after a graceful stop: " << ended;
  (*session)->Stop().IgnoreError();
}

TEST(CoordinatorClientTest, ASessionGivesUpOnACoordinatorOutOfReach) {
  GrpcClientOptions client_options;
  client_options.address = "127.0.0.1:1";
  client_options.initial_backoff = absl::Milliseconds(10);
  client_options.max_backoff = absl::Milliseconds(50);
  auto client = NewGrpcCoordinatorClient(client_options);
  ASSERT_TRUE(client.ok());
  absl::Notification done;
  absl::Status ended;
  SessionOptions options;
  options.instance_id = "w";
  options.give_up_after = absl::Milliseconds(500);
  options.on_end = [&](const absl::Status& why) {
    ended = why;
    done.Notify();
  };
  const absl::Time start = absl::Now();
  auto session = (*client)->StartSession(options, nullptr);
  ASSERT_TRUE(session.ok());
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(20)));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(500));
  EXPECT_EQ(ended.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(ended.message(), HasSubstr("no answer from the coordinator at 127.0.0.1:1"));
  EXPECT_EQ((*session)->Stop().code(), absl::StatusCode::kUnavailable);
}

TEST(CoordinatorClientTest, UnreachableCoordinatorIsUnavailableAfterRetries) {
  GrpcClientOptions options;
  options.address = "127.0.0.1:1";
  options.max_attempts = 3;
  options.initial_backoff = absl::Milliseconds(10);
  auto client = NewGrpcCoordinatorClient(options);
  ASSERT_TRUE(client.ok());
  absl::Status s = (*client)->GetJob({}).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(s.message(), HasSubstr("coordinator at 127.0.0.1:1 is unavailable (3 attempts)"));
  options.address = "";
  EXPECT_EQ(NewGrpcCoordinatorClient(options).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace onebit
