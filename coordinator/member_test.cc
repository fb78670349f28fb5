// A member's verdicts: what the job's status asks of it, and what it learns when its
// coordinator restarted since it registered (the shard that never registered again).
#include "coordinator/member.h"

#include <memory>
#include <optional>
#include <string>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "coordinator/clock.h"
#include "coordinator/coordinator.h"
#include "coordinator/inprocess_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace onebit {
namespace {

using ::testing::HasSubstr;

v1::JobStatus Job(const std::string& id, int64_t generation, v1::JobState state) {
  v1::JobStatus job;
  job.set_job_id(id);
  job.set_generation(generation);
  job.set_state(state);
  return job;
}

TEST(VerdictForTest, TheJobsStateDecides) {
  const MemberIdentity worker{"j", 2, /*leave_on_success=*/false};
  const MemberIdentity shard{"j", 2, /*leave_on_success=*/true};
  EXPECT_FALSE(VerdictFor(Job("j", 2, v1::JOB_STATE_RUNNING), worker).has_value());
  EXPECT_FALSE(VerdictFor(Job("j", 2, v1::JOB_STATE_RECOVERING), shard).has_value());
  // Succeeded: the shard leaves, the worker ends on its own.
  EXPECT_FALSE(VerdictFor(Job("j", 2, v1::JOB_STATE_SUCCEEDED), worker).has_value());
  EXPECT_EQ(VerdictFor(Job("j", 2, v1::JOB_STATE_SUCCEEDED), shard)->exit_code, kMemberExitDone);
  v1::JobStatus failed = Job("j", 2, v1::JOB_STATE_FAILED);
  failed.set_failure_reason("worker 1 diverged");
  std::optional<MemberVerdict> v = VerdictFor(failed, worker);
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(v->exit_code, kMemberExitJobFailed);
  EXPECT_EQ(kMemberExitJobFailed, 78);  // documented for supervisors: keep it
  EXPECT_THAT(v->reason, HasSubstr("worker 1 diverged"));
  EXPECT_THAT(v->reason, HasSubstr("exiting with 78 (do not restart)"));
  // A newer generation, or another job behind the same address: restart and register.
  v = VerdictFor(Job("j", 3, v1::JOB_STATE_RECOVERING), shard);
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(v->exit_code, kMemberExitRestart);
  EXPECT_THAT(v->reason, HasSubstr("generation 3 (the coordinator restarted)"));
  v = VerdictFor(Job("other", 1, v1::JOB_STATE_STARTING), shard);
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(v->exit_code, kMemberExitRestart);
  EXPECT_THAT(v->reason, HasSubstr("now runs job other, not j"));
  // An older generation is no news (a member that registered after a recovery).
  EXPECT_FALSE(VerdictFor(Job("j", 1, v1::JOB_STATE_RUNNING), shard).has_value());
}

// A coordinator in generation 2 with one shard registered, then "restarted": a new
// Coordinator recovering in generation 3 (as onebit-coordinator starts from its state file).
class RestartedCoordinatorTest : public ::testing::Test {
 protected:
  static std::unique_ptr<Coordinator> Make(int64_t generation, bool recovering) {
    CoordinatorOptions options;
    options.config.workers = 2;
    options.config.steps = 100;
    options.config.exchange.mode = "ps";
    options.config.exchange.servers = 2;
    options.config.optimizer.freeze_step = 50;
    options.job_id = "job";
    options.generation = generation;
    options.recovering = recovering;
    return *Coordinator::Create(options, Clock::Real(), nullptr);
  }

  static v1::RegisterRequest Shard(int index) {
    v1::RegisterRequest r;
    r.set_role(v1::ROLE_SERVER);
    r.set_instance_id("shard" + std::to_string(index));
    r.set_requested_rank(index);
    r.set_address("127.0.0.1:1");
    return r;
  }
};

TEST_F(RestartedCoordinatorTest, TheForgottenShardHearsTheNewGenerationThenItsSessionEnds) {
  std::unique_ptr<Coordinator> before = Make(2, false);
  std::unique_ptr<CoordinatorClient> old_client = NewInProcessCoordinatorClient(before.get());
  absl::StatusOr<v1::RegisterResponse> reg = old_client->Register(Shard(1));
  ASSERT_TRUE(reg.ok()) << reg.status();
  const MemberIdentity me{reg->job_id(), reg->generation(), /*leave_on_success=*/true};
  ASSERT_EQ(me.generation, 2);

  std::unique_ptr<Coordinator> after = Make(3, true);
  std::unique_ptr<CoordinatorClient> client = NewInProcessCoordinatorClient(after.get());
  absl::Mutex mu;
  std::optional<MemberVerdict> from_event;
  absl::Status ended;
  absl::Notification done;
  SessionOptions options;
  options.role = v1::ROLE_SERVER;
  options.rank = 1;
  options.instance_id = "shard1";
  options.heartbeat_interval = absl::Milliseconds(20);
  options.on_end = [&](const absl::Status& why) {
    {
      absl::MutexLock lock(&mu);
      ended = why;
    }
    done.Notify();
  };
  auto session = client->StartSession(options, [&](const v1::JobEvent& e) {
    absl::MutexLock lock(&mu);
    if (!from_event.has_value()) from_event = VerdictFor(e.job(), me);
  });
  ASSERT_TRUE(session.ok());
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  absl::MutexLock lock(&mu);
  ASSERT_TRUE(from_event.has_value()) << "the job's status did not come before the refusal";
  EXPECT_EQ(from_event->exit_code, kMemberExitRestart);
  EXPECT_EQ(ended.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(ended.message()), HasSubstr("server rank 1 is not registered"));
  // And asked after the fact, the job says the same.
  const MemberVerdict v = VerdictAfterSessionEnd(*client, me, ended);
  EXPECT_EQ(v.exit_code, kMemberExitRestart);
  EXPECT_THAT(v.reason, HasSubstr("generation 3"));
}

TEST_F(RestartedCoordinatorTest, WithoutNewsARefusedMemberRestartsAndAnUnreachableOneFails) {
  std::unique_ptr<Coordinator> c = Make(1, false);
  std::unique_ptr<CoordinatorClient> client = NewInProcessCoordinatorClient(c.get());
  const MemberIdentity me{"job", 1, true};
  MemberVerdict v = VerdictAfterSessionEnd(
      *client, me, absl::FailedPreconditionError("server rank 0 is not registered"));
  EXPECT_EQ(v.exit_code, kMemberExitRestart);
  EXPECT_THAT(v.reason, HasSubstr("not registered; exiting with 75"));
  v = VerdictAfterSessionEnd(*client, me, absl::UnavailableError("no answer for 2m"));
  EXPECT_EQ(v.exit_code, kMemberExitFailed);
  EXPECT_EQ(v.reason, "no answer for 2m");
}

// A worker whose training diverged reports it: the job fails at once, naming it; every
// member then hears 78, and a newcomer refused at registration learns the same.
TEST_F(RestartedCoordinatorTest, APermanentFailureIsReportedAndEveryoneExits78) {
  std::unique_ptr<Coordinator> c = Make(1, false);
  std::unique_ptr<CoordinatorClient> client = NewInProcessCoordinatorClient(c.get());
  ASSERT_TRUE(client->Register(Shard(0)).ok());
  const absl::Status diverged =
      MarkPermanent(absl::FailedPreconditionError("training diverged: the loss is nan"));
  // Not a member: refused, the job runs on.
  EXPECT_FALSE(ReportPermanentFailure(*client, v1::ROLE_SERVER, 1, "shard1", diverged, 5).ok());
  EXPECT_FALSE(c->Failed());
  ASSERT_TRUE(ReportPermanentFailure(*client, v1::ROLE_SERVER, 0, "shard0", diverged, 5).ok());
  EXPECT_TRUE(c->Failed());
  const MemberIdentity me{"job", 1, /*leave_on_success=*/true};
  std::optional<MemberVerdict> v = AwaitVerdict(*client, me, absl::ZeroDuration());
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(v->exit_code, kMemberExitJobFailed);
  EXPECT_THAT(v->reason, HasSubstr("server 0 (shard0) failed in step 5"));
  const absl::Status refused = client->Register(Shard(1)).status();
  v = VerdictAfterRegisterError(*client, refused);
  ASSERT_TRUE(v.has_value()) << refused;
  EXPECT_EQ(v->exit_code, kMemberExitJobFailed);
  // Other registration errors are the member's own (its exit code decides).
  EXPECT_FALSE(VerdictAfterRegisterError(*client, absl::UnavailableError("no answer")).has_value());
}

// A worker whose script raised says so before it leaves: the running job recovers at once,
// and the others hear 75 with that worker's name and error.
TEST_F(RestartedCoordinatorTest, ARestartableFailureIsReportedAndEveryoneExits75) {
  std::unique_ptr<Coordinator> c = Make(1, false);
  std::unique_ptr<CoordinatorClient> client = NewInProcessCoordinatorClient(c.get());
  ASSERT_TRUE(client->Register(Shard(0)).ok());
  ASSERT_TRUE(client->Register(Shard(1)).ok());
  const std::string why = "the script raised RuntimeError: boom";
  // Before the job runs: the member's registration or silence acts, not the report.
  for (int rank : {0, 1}) {
    v1::RegisterRequest w;
    w.set_role(v1::ROLE_WORKER);
    w.set_instance_id("w" + std::to_string(rank));
    w.set_requested_rank(rank);
    if (rank == 1) {
      ASSERT_TRUE(ReportRestartableFailure(*client, v1::ROLE_WORKER, 0, "w0", why, 3).ok());
      EXPECT_EQ(client->GetJob({})->generation(), 1);
    }
    ASSERT_TRUE(client->Register(w).ok());
  }
  ASSERT_EQ(client->GetJob({})->state(), v1::JOB_STATE_RUNNING);
  EXPECT_FALSE(ReportRestartableFailure(*client, v1::ROLE_WORKER, 1, "w9", why, 8).ok());
  ASSERT_TRUE(ReportRestartableFailure(*client, v1::ROLE_WORKER, 1, "w1", why, 8).ok());
  const std::optional<MemberVerdict> v =
      AwaitVerdict(*client, MemberIdentity{"job", 1, /*leave_on_success=*/false},
                   absl::ZeroDuration());
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(v->exit_code, kMemberExitRestart);
  EXPECT_THAT(v->reason, HasSubstr("the job recovers in generation 2 (worker 1 (w1) failed in "
                                   "step 8, which a restart may fix: " + why + ")"));
}

TEST(RecoveriesTextTest, SaysHowManyAndFromWhere) {
  v1::JobStatus job;
  EXPECT_EQ(RecoveriesText(job), "none");
  job.set_recoveries(2);
  v1::Recovery* r = job.add_recovery_log();
  r->set_generation(2);
  r->set_resume_step(40);
  r->set_reason("worker 2 (w2) sent no heartbeat for 10s");
  r = job.add_recovery_log();
  r->set_generation(3);
  r->set_reason("the coordinator restarted; generation 2 ended with it");
  EXPECT_EQ(RecoveriesText(job),
            "2: generation 2 resumed after step 40 (worker 2 (w2) sent no heartbeat for 10s); "
            "generation 3 restarted from step 0 (the coordinator restarted; generation 2 ended "
            "with it)");
}

}  // namespace
}  // namespace onebit
