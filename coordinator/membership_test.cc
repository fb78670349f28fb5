#include "coordinator/membership.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace onebit {
namespace {

using ::testing::HasSubstr;

const absl::Time kT0 = absl::FromUnixSeconds(1700000000);

v1::RegisterRequest Req(v1::Role role, const std::string& id, int requested = -1) {
  v1::RegisterRequest r;
  r.set_role(role);
  r.set_instance_id(id);
  r.set_requested_rank(requested);
  r.set_address(id + ":1");
  return r;
}

v1::Heartbeat Hb(v1::Role role, int rank, const std::string& id, int64_t step = 0) {
  v1::Heartbeat h;
  h.set_role(role);
  h.set_rank(rank);
  h.set_instance_id(id);
  h.set_step(step);
  return h;
}

TEST(MembershipTest, WorkersGetRanksInArrivalOrderAndRetriesTheSameRank) {
  Membership m(3, 0, absl::Seconds(10));
  EXPECT_EQ(*m.Register(Req(v1::ROLE_WORKER, "a"), kT0), 0);
  EXPECT_EQ(*m.Register(Req(v1::ROLE_WORKER, "b", 0), kT0), 1);  // proto3 default 0 is taken
  EXPECT_EQ(*m.Register(Req(v1::ROLE_WORKER, "a"), kT0), 0);     // idempotent
  EXPECT_EQ(*m.Register(Req(v1::ROLE_WORKER, "c"), kT0), 2);
  absl::StatusOr<int> full = m.Register(Req(v1::ROLE_WORKER, "d"), kT0);
  EXPECT_EQ(full.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(full.status().message(), HasSubstr("all 3 worker slots"));
  EXPECT_EQ(m.Registered(v1::ROLE_WORKER), 3);
  EXPECT_EQ(*m.Register(Req(v1::ROLE_WORKER, "b"), kT0), 1);  // still idempotent when full
}

TEST(MembershipTest, ServersGetTheShardTheyAskForIfFree) {
  Membership m(1, 3, absl::Seconds(10));
  EXPECT_EQ(*m.Register(Req(v1::ROLE_SERVER, "s2", 2), kT0), 2);
  EXPECT_EQ(*m.Register(Req(v1::ROLE_SERVER, "x", 2), kT0), 0);  // taken: lowest free
  EXPECT_EQ(*m.Register(Req(v1::ROLE_SERVER, "y", -1), kT0), 1);
  EXPECT_EQ(m.Register(Req(v1::ROLE_SERVER, "z"), kT0).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(m.Registered(v1::ROLE_SERVER), 3);
  EXPECT_EQ(m.Registered(v1::ROLE_WORKER), 0);
}

TEST(MembershipTest, PeerModeHasNoServerSlots) {
  Membership m(1, 0, absl::Seconds(10));
  EXPECT_EQ(m.Register(Req(v1::ROLE_SERVER, "s"), kT0).status().code(),
            absl::StatusCode::kResourceExhausted);
}

TEST(MembershipTest, BadRegistrationsChangeNothing) {
  Membership m(2, 1, absl::Seconds(10));
  EXPECT_EQ(m.Register(Req(v1::ROLE_UNSPECIFIED, "a"), kT0).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(m.Register(Req(static_cast<v1::Role>(9), "a"), kT0).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(m.Register(Req(v1::ROLE_WORKER, ""), kT0).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(m.Register(Req(v1::ROLE_WORKER, std::string(300, 'x')), kT0).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(m.Register(Req(v1::ROLE_WORKER, "a", 2), kT0).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(m.Register(Req(v1::ROLE_WORKER, "a", -2), kT0).status().code(),
            absl::StatusCode::kInvalidArgument);
  v1::RegisterRequest long_address = Req(v1::ROLE_WORKER, "a");
  long_address.set_address(std::string(1000, 'h'));
  EXPECT_EQ(m.Register(long_address, kT0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(m.Registered(v1::ROLE_WORKER), 0);
  EXPECT_TRUE(m.List(kT0).empty());
}

TEST(MembershipTest, AnInstanceHasOneRole) {
  Membership m(2, 2, absl::Seconds(10));
  ASSERT_TRUE(m.Register(Req(v1::ROLE_WORKER, "a"), kT0).ok());
  absl::Status s = m.Register(Req(v1::ROLE_SERVER, "a"), kT0).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(s.message(), HasSubstr("already registered as worker 0"));
  EXPECT_EQ(m.Registered(v1::ROLE_SERVER), 0);
}

TEST(MembershipTest, HeartbeatsCheckIdentityAndKeepMembersAlive) {
  Membership m(2, 0, absl::Seconds(10));
  ASSERT_TRUE(m.Register(Req(v1::ROLE_WORKER, "a"), kT0).ok());
  ASSERT_TRUE(m.Register(Req(v1::ROLE_WORKER, "b"), kT0).ok());
  EXPECT_EQ(m.Alive(v1::ROLE_WORKER, kT0 + absl::Seconds(10)), 2);
  EXPECT_TRUE(m.Heartbeat(Hb(v1::ROLE_WORKER, 0, "a", 7), kT0 + absl::Seconds(8)).ok());
  EXPECT_EQ(m.Alive(v1::ROLE_WORKER, kT0 + absl::Seconds(11)), 1);
  EXPECT_EQ(m.Alive(v1::ROLE_WORKER, kT0 + absl::Seconds(19)), 0);
  std::vector<v1::Member> list = m.List(kT0 + absl::Seconds(11));
  ASSERT_EQ(list.size(), 2u);
  EXPECT_TRUE(list[0].alive());
  EXPECT_EQ(list[0].last_step(), 7);
  EXPECT_EQ(list[0].last_heartbeat_unix_ms(), absl::ToUnixMillis(kT0 + absl::Seconds(8)));
  EXPECT_FALSE(list[1].alive());
  // Back from the dead with the next heartbeat.
  EXPECT_TRUE(m.Heartbeat(Hb(v1::ROLE_WORKER, 1, "b"), kT0 + absl::Seconds(30)).ok());
  EXPECT_EQ(m.Alive(v1::ROLE_WORKER, kT0 + absl::Seconds(30)), 1);

  EXPECT_EQ(m.Heartbeat(Hb(v1::ROLE_WORKER, 1, "a"), kT0).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(m.Heartbeat(Hb(v1::ROLE_WORKER, 2, "a"), kT0).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(m.Heartbeat(Hb(v1::ROLE_SERVER, 0, "a"), kT0).code(),
            absl::StatusCode::kInvalidArgument);  // no server slots in this job
  EXPECT_EQ(m.Heartbeat(Hb(v1::ROLE_UNSPECIFIED, 0, "a"), kT0).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(m.Heartbeat(Hb(v1::ROLE_WORKER, 0, "a", -3), kT0).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(MembershipTest, HeartbeatFromAnUnregisteredRank) {
  Membership m(2, 0, absl::Seconds(10));
  absl::Status s = m.Heartbeat(Hb(v1::ROLE_WORKER, 1, "a"), kT0);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("not registered"));
}

TEST(MembershipTest, FirstSilentIsTheOldestDeadMemberAndCountsFollowHeartbeats) {
  Membership m(3, 2, absl::Seconds(10));
  for (const char* id : {"w0", "w1", "w2"}) ASSERT_TRUE(m.Register(Req(v1::ROLE_WORKER, id), kT0).ok());
  ASSERT_TRUE(m.Register(Req(v1::ROLE_SERVER, "s0", 0), kT0).ok());
  ASSERT_TRUE(m.Register(Req(v1::ROLE_SERVER, "s1", 1), kT0).ok());
  EXPECT_EQ(m.Registered(v1::ROLE_WORKER), 3);
  EXPECT_EQ(m.Registered(v1::ROLE_SERVER), 2);
  EXPECT_FALSE(m.FirstSilent(kT0 + absl::Seconds(10), 100).has_value());  // 10 s is still alive

  // Everyone beats at +5 s except worker 1 (+2 s) and server 1 (+3 s): worker 1 went
  // silent first, though the server's rank order would come later anyway.
  ASSERT_TRUE(m.Heartbeat(Hb(v1::ROLE_WORKER, 1, "w1", 7), kT0 + absl::Seconds(2)).ok());
  ASSERT_TRUE(m.Heartbeat(Hb(v1::ROLE_SERVER, 1, "s1"), kT0 + absl::Seconds(3)).ok());
  ASSERT_TRUE(m.Heartbeat(Hb(v1::ROLE_WORKER, 0, "w0", 7), kT0 + absl::Seconds(5)).ok());
  ASSERT_TRUE(m.Heartbeat(Hb(v1::ROLE_WORKER, 2, "w2", 7), kT0 + absl::Seconds(5)).ok());
  ASSERT_TRUE(m.Heartbeat(Hb(v1::ROLE_SERVER, 0, "s0"), kT0 + absl::Seconds(5)).ok());
  const absl::Time t = kT0 + absl::Seconds(14);
  EXPECT_EQ(m.Alive(v1::ROLE_WORKER, t), 2);
  EXPECT_EQ(m.Alive(v1::ROLE_SERVER, t), 1);
  EXPECT_FALSE(m.IsAlive(v1::ROLE_WORKER, 1, t));
  EXPECT_TRUE(m.IsAlive(v1::ROLE_WORKER, 0, t));
  EXPECT_FALSE(m.IsAlive(v1::ROLE_WORKER, 5, t));  // out of range: not alive, no crash
  std::optional<Membership::Silent> silent = m.FirstSilent(t, 100);
  ASSERT_TRUE(silent.has_value());
  EXPECT_EQ(silent->role, v1::ROLE_WORKER);
  EXPECT_EQ(silent->rank, 1);
  EXPECT_EQ(silent->instance_id, "w1");
  // A worker that ran the last step (7 >= 7) is no failure: the server is next.
  silent = m.FirstSilent(t, 7);
  ASSERT_TRUE(silent.has_value());
  EXPECT_EQ(silent->role, v1::ROLE_SERVER);
  EXPECT_EQ(silent->rank, 1);
  // A heartbeat brings the worker back, and the counts with it; registering again does too.
  ASSERT_TRUE(m.Heartbeat(Hb(v1::ROLE_WORKER, 1, "w1", 8), t).ok());
  ASSERT_TRUE(m.Register(Req(v1::ROLE_SERVER, "s1", 1), t).ok());
  EXPECT_EQ(m.Alive(v1::ROLE_WORKER, t), 3);
  EXPECT_EQ(m.Alive(v1::ROLE_SERVER, t), 2);
  EXPECT_EQ(m.Registered(v1::ROLE_SERVER), 2);
  EXPECT_FALSE(m.FirstSilent(t, 100).has_value());
  // Equal silences (workers 0 and 2 and server 0, all last heard at +5 s): workers before
  // servers, lower ranks first.
  silent = m.FirstSilent(t + absl::Seconds(2), 100);
  ASSERT_TRUE(silent.has_value());
  EXPECT_EQ(silent->role, v1::ROLE_WORKER);
  EXPECT_EQ(silent->rank, 0);
  silent = m.FirstSilent(t + absl::Seconds(2), 7);  // workers done: the server
  ASSERT_TRUE(silent.has_value());
  EXPECT_EQ(silent->role, v1::ROLE_SERVER);
  EXPECT_EQ(silent->rank, 0);
}

}  // namespace
}  // namespace onebit
