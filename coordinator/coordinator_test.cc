// The handler implementation without any transport: a fake clock, direct calls.
#include "coordinator/coordinator.h"

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>

#include "absl/synchronization/notification.h"
#include "coordinator/clock.h"
#include "proto/proto_json.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace onebit {
namespace {

using ::testing::HasSubstr;

JobConfig SmallJob() {
  JobConfig config;
  config.workers = 2;
  config.steps = 100;
  config.lease_steps = 10;
  config.optimizer.freeze_step = 30;
  config.exchange.mode = "ps";
  config.exchange.servers = 1;
  return config;
}

// A member's report of its checkpoint part of `step`, named as the coordinator expects.
v1::CommitPartRequest PartRequest(v1::Role role, int rank, const std::string& id, int64_t step) {
  v1::CommitPartRequest r;
  r.set_instance_id(id);
  r.set_step(step);
  r.mutable_part()->set_role(role);
  r.mutable_part()->set_rank(rank);
  r.mutable_part()->set_file(role == v1::ROLE_SERVER ? absl::StrCat("server-0000", rank, ".part")
                                                     : absl::StrCat("worker-0000", rank, ".part"));
  r.mutable_part()->set_bytes(100 + rank);
  r.mutable_part()->set_crc32(7);
  return r;
}

class CoordinatorTest : public ::testing::Test {
 protected:
  void SetUp() override { Make(SmallJob()); }

  void Make(const JobConfig& config) {
    CoordinatorOptions options;
    options.config = config;
    options.job_id = "job-1";
    options.heartbeat_timeout = absl::Seconds(5);
    absl::StatusOr<std::unique_ptr<Coordinator>> c = Coordinator::Create(options, &clock_, nullptr);
    ASSERT_TRUE(c.ok()) << c.status();
    coordinator_ = *std::move(c);
  }

  // A coordinator of `config` (1,234 parameters) whose committed manifests go into
  // *written, with workers w0, w1 and shard s0 registered; resumed after `resume`'s step
  // (freeze step 30) where one is given.
  void MakeCheckpointing(JobConfig config, std::vector<v1::CheckpointManifest>* written,
                         std::optional<v1::ResumeFrom> resume = std::nullopt) {
    config.checkpoint.dir = "/unused";  // the commit function is the only writer
    CoordinatorOptions options;
    options.config = config;
    options.job_id = "job-1";
    options.num_parameters = 1234;
    if (resume.has_value()) {
      options.resume = *resume;
      options.resume_freeze_step = 30;
    }
    options.commit_checkpoint = [written](const v1::CheckpointManifest& m) {
      written->push_back(m);
      return absl::OkStatus();
    };
    absl::StatusOr<std::unique_ptr<Coordinator>> c = Coordinator::Create(options, &clock_, nullptr);
    ASSERT_TRUE(c.ok()) << c.status();
    coordinator_ = *std::move(c);
    ASSERT_EQ(RegisterWorker("w0"), 0);
    ASSERT_EQ(RegisterWorker("w1"), 1);
    v1::RegisterRequest server;
    server.set_role(v1::ROLE_SERVER);
    server.set_instance_id("s0");
    ASSERT_TRUE(coordinator_->Register(server).ok());
  }

  int RegisterWorker(const std::string& id) {
    v1::RegisterRequest r;
    r.set_role(v1::ROLE_WORKER);
    r.set_instance_id(id);
    r.set_requested_rank(-1);
    absl::StatusOr<v1::RegisterResponse> response = coordinator_->Register(r);
    EXPECT_TRUE(response.ok()) << response.status();
    return response.ok() ? response->rank() : -1;
  }

  // A peer job of two workers with a checkpoint every 10 steps, whose manifests go to
  // `commit` (the checkpoint directory is never touched).
  static CoordinatorOptions PeerCheckpointing(
      std::function<absl::Status(const v1::CheckpointManifest&)> commit) {
    JobConfig config = SmallJob();
    config.exchange.mode = "peer";
    config.exchange.servers = 0;
    config.checkpoint.dir = "/unused";
    config.checkpoint.every_steps = 10;
    CoordinatorOptions options;
    options.config = config;
    options.job_id = "job-1";
    options.commit_checkpoint = std::move(commit);
    return options;
  }

  absl::StatusOr<v1::LeaseResponse> Lease(int rank, int64_t next) {
    v1::LeaseRequest r;
    r.set_rank(rank);
    r.set_next_step(next);
    return coordinator_->Lease(r);
  }

  v1::StatsReport Stats(int rank, int64_t step, v1::Stage stage, double vc = -1) {
    v1::StatsReport r;
    r.set_rank(rank);
    r.set_step(step);
    r.set_stage(stage);
    r.set_loss(0.5);
    r.set_variance_change(vc);
    r.set_step_seconds(0.01);
    return r;
  }

  std::string JobJson() { return ToJson(*coordinator_->GetJob(v1::GetJobRequest())); }

  FakeClock clock_;
  std::unique_ptr<Coordinator> coordinator_;
};

TEST_F(CoordinatorTest, BadConfigsNameTheKey) {
  CoordinatorOptions options;
  options.config = SmallJob();
  options.config.lease_steps = 0;
  absl::Status s = Coordinator::Create(options, &clock_, nullptr).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("onebit.lease_steps"));
  options.config = SmallJob();
  options.config.freeze.mode = "sometimes";
  EXPECT_THAT(Coordinator::Create(options, &clock_, nullptr).status().message(),
              HasSubstr("onebit.freeze.mode"));
  options.config = SmallJob();
  options.config.exchange.servers = 0;
  EXPECT_THAT(Coordinator::Create(options, &clock_, nullptr).status().message(),
              HasSubstr("onebit.exchange.servers"));
}

TEST_F(CoordinatorTest, RegisterAnswersTheJobShape) {
  v1::RegisterRequest r;
  r.set_role(v1::ROLE_SERVER);
  r.set_instance_id("s");
  r.set_requested_rank(0);
  absl::StatusOr<v1::RegisterResponse> response = coordinator_->Register(r);
  ASSERT_TRUE(response.ok());
  EXPECT_EQ(response->rank(), 0);
  EXPECT_EQ(response->world_size(), 2);
  EXPECT_EQ(response->num_servers(), 1);
  EXPECT_EQ(response->job_id(), "job-1");
  v1::JobStatus job = *coordinator_->GetJob(v1::GetJobRequest());
  EXPECT_EQ(job.servers_registered(), 1);
  EXPECT_EQ(job.workers_registered(), 0);
  EXPECT_EQ(job.freeze_step(), 30);
  EXPECT_EQ(job.freeze_mode(), v1::FREEZE_MODE_STATIC);
  EXPECT_EQ(job.stop_after_step(), 100);
  EXPECT_EQ(job.exchange_mode(), "ps");
  EXPECT_EQ(job.stage(), v1::STAGE_WARMUP);
}

// Every worker must train the model of the job: one that disagrees fails the job at once
// (a restart cannot fix it), naming it and both counts.
TEST_F(CoordinatorTest, AWorkerWhoseModelDisagreesFailsTheJobAtOnce) {
  auto worker = [](const std::string& id, int rank, int64_t n) {
    v1::RegisterRequest r;
    r.set_role(v1::ROLE_WORKER);
    r.set_instance_id(id);
    r.set_requested_rank(rank);
    r.set_num_parameters(n);
    return r;
  };
  EXPECT_EQ(coordinator_->Register(worker("w0", 0, -1)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(coordinator_->GetJob({})->num_parameters(), 0);  // not known yet
  ASSERT_TRUE(coordinator_->Register(worker("w0", 0, 120)).ok());  // learned: 120
  // The shards of a job whose config leaves the size to the workers size themselves by it.
  EXPECT_EQ(coordinator_->GetJob({})->num_parameters(), 120);
  absl::Status status = coordinator_->Register(worker("w1", 1, 100)).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(status.message(), HasSubstr("worker 1 (w1) has a model of 100 parameters; the "
                                          "job's has 120 (the first worker's)"));
  const v1::JobStatus job = *coordinator_->GetJob({});
  EXPECT_EQ(job.state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(job.failure_reason(), HasSubstr("has a model of 100 parameters"));

  // With the config's count, the first worker is held to it too.
  CoordinatorOptions options;
  options.config = SmallJob();
  options.num_parameters = 99;
  auto c = Coordinator::Create(options, &clock_, nullptr);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ((*c)->GetJob({})->num_parameters(), 99);
  EXPECT_TRUE((*c)->Register(worker("a", 0, 99)).ok());
  EXPECT_THAT((*c)->Register(worker("b", 1, 98)).status().message(),
              HasSubstr("has a model of 98 parameters; the job's has 99 (the job config's)"));
}

// Every worker of a job must train with the same config: one whose job-defining keys
// differ from the first worker's (another lr, a misedited deployment) fails the job at
// once, naming the keys and both values; what may differ per process (device, ports,
// paths, timeouts) does not count. Shards are held to the first shard's: a training script
// may amend the launch's config for its workers (onebit.torch's keyword arguments).
TEST_F(CoordinatorTest, AMemberWithAnotherConfigFailsTheJobNamingTheKeys) {
  auto member = [](v1::Role role, const std::string& id, int rank, const JobConfig& config) {
    v1::RegisterRequest r;
    r.set_role(role);
    r.set_instance_id(id);
    r.set_requested_rank(rank);
    r.set_job_terms(JobTerms(config));
    return r;
  };
  JobConfig own = SmallJob();
  own.device = "cuda";
  own.cpu_threads = 3;
  own.ports.metrics = 9100;
  own.checkpoint.dir = "/elsewhere";
  own.failure.heartbeat_timeout_s = 30;
  own.optimizer.lr = 0.003;  // the script's keyword argument, on every worker
  ASSERT_TRUE(coordinator_->Register(member(v1::ROLE_WORKER, "w0", 0, own)).ok());
  ASSERT_TRUE(coordinator_->Register(member(v1::ROLE_SERVER, "s0", 0, SmallJob())).ok());
  v1::RegisterRequest unsaid = member(v1::ROLE_WORKER, "w1", 1, SmallJob());
  unsaid.clear_job_terms();  // a member that does not say: not checked
  ASSERT_TRUE(coordinator_->Register(unsaid).ok());
  own.device = "cpu";  // per process
  ASSERT_TRUE(coordinator_->Register(member(v1::ROLE_WORKER, "w1", 1, own)).ok());

  JobConfig other = own;
  other.optimizer.lr = 0.002;
  other.optimizer.freeze_step = 40;
  absl::Status status = coordinator_->Register(member(v1::ROLE_WORKER, "w2", 1, other)).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(status.message(),
              HasSubstr("worker 1 (w2) has another config than worker 0 (w0): "
                        "optimizer.params.freeze_step 40 (worker 0's: 30); "
                        "optimizer.params.lr 0.002 (worker 0's: 0.003)"));
  const v1::JobStatus job = *coordinator_->GetJob({});
  EXPECT_EQ(job.state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(job.failure_reason(), HasSubstr("has another config than worker 0"));

  // Shards among themselves.
  JobConfig two_shards = SmallJob();
  two_shards.exchange.servers = 2;
  Make(two_shards);
  ASSERT_TRUE(coordinator_->Register(member(v1::ROLE_SERVER, "s0", 0, two_shards)).ok());
  other = two_shards;
  other.exchange.compressor = "int8";
  EXPECT_THAT(coordinator_->Register(member(v1::ROLE_SERVER, "s1", 1, other)).status().message(),
              HasSubstr("server 1 (s1) has another config than server 0 (s0): "
                        "onebit.exchange.compressor \"int8\" (server 0's: \"onebit\")"));
}

// One launch may run jobs in turn at one address (onebit.torch: a script's second optimizer
// after its first): a member of another job is told UNAVAILABLE, so it retries until its
// own job's coordinator answers, and neither joins nor fails this job, over or not.
TEST_F(CoordinatorTest, AMemberOfAnotherOfTheLaunchsJobsIsToldToRetry) {
  CoordinatorOptions options;
  options.config = SmallJob();
  options.job_id = "job-1";
  options.job_key = "the script's optimizer 1";
  auto c = Coordinator::Create(options, &clock_, nullptr);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ((*c)->GetJob({})->job_key(), "the script's optimizer 1");
  v1::RegisterRequest r;
  r.set_role(v1::ROLE_WORKER);
  r.set_instance_id("w");
  r.set_requested_rank(1);
  r.set_num_parameters(5);  // the next job's model: another size
  r.set_job_key("the script's optimizer 2");
  absl::Status status = (*c)->Register(r).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(status.message(), HasSubstr("this coordinator runs the script's optimizer 1 (job "
                                          "job-1), and this worker is for the script's "
                                          "optimizer 2: retrying"));
  EXPECT_EQ((*c)->GetJob({})->workers_registered(), 0);
  EXPECT_NE((*c)->GetJob({})->state(), v1::JOB_STATE_FAILED);
  r.set_job_key("the script's optimizer 1");
  EXPECT_TRUE((*c)->Register(r).ok());
  // A member that names no key (onebit-worker) joins any job.
  r.clear_job_key();
  r.set_instance_id("w0");
  r.set_requested_rank(0);
  EXPECT_TRUE((*c)->Register(r).ok());
}

// A job without steps ends where its workers' training loops did (LeaseRequest.ended):
// ends after the same step succeed it; ends after different steps fail it, naming both.
TEST_F(CoordinatorTest, WorkersWhoseLoopsEndedEndTheJob) {
  auto ended = [](int rank, int64_t last) {
    v1::LeaseRequest r;
    r.set_rank(rank);
    r.set_next_step(last + 1);
    r.set_ended(true);
    return r;
  };
  JobConfig config = SmallJob();
  config.steps = kOpenEndedSteps;
  config.exchange.mode = "peer";
  config.exchange.servers = 0;
  Make(config);
  ASSERT_EQ(RegisterWorker("a"), 0);
  ASSERT_EQ(RegisterWorker("b"), 1);
  ASSERT_TRUE(Lease(0, 1).ok());  // leases run ahead of the end
  ASSERT_TRUE(Lease(1, 1).ok());
  absl::StatusOr<v1::LeaseResponse> r = coordinator_->Lease(ended(0, 7));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->stop_after_step(), 7);
  EXPECT_EQ(coordinator_->GetJob({})->state(), v1::JOB_STATE_RUNNING);  // b has not ended
  ASSERT_TRUE(coordinator_->Lease(ended(1, 7)).ok());
  EXPECT_EQ(coordinator_->GetJob({})->state(), v1::JOB_STATE_SUCCEEDED);

  Make(config);
  ASSERT_EQ(RegisterWorker("a"), 0);
  ASSERT_EQ(RegisterWorker("b"), 1);
  ASSERT_TRUE(coordinator_->Lease(ended(0, 7)).ok());
  absl::Status status = coordinator_->Lease(ended(1, 9)).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(status.message(), HasSubstr("worker 1's training loop ended after step 9, worker "
                                          "0's after step 7"));
  EXPECT_EQ(coordinator_->GetJob({})->state(), v1::JOB_STATE_FAILED);
}

TEST_F(CoordinatorTest, LeasesNeedARegisteredWorker) {
  EXPECT_EQ(Lease(0, 1).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(Lease(2, 1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Lease(-1, 1).status().code(), absl::StatusCode::kInvalidArgument);
  ASSERT_EQ(RegisterWorker("w0"), 0);
  absl::StatusOr<v1::LeaseResponse> lease = Lease(0, 1);
  ASSERT_TRUE(lease.ok()) << lease.status();
  EXPECT_EQ(lease->through_step(), 10);
  EXPECT_EQ(lease->freeze_step(), 30);
  EXPECT_EQ(lease->stop_after_step(), 100);
}

TEST_F(CoordinatorTest, StatsMustAgreeOnTheStage) {
  ASSERT_EQ(RegisterWorker("w0"), 0);
  ASSERT_TRUE(Lease(0, 1).ok());
  ASSERT_TRUE(Lease(0, 11).ok());
  ASSERT_TRUE(Lease(0, 21).ok());
  ASSERT_TRUE(Lease(0, 31).ok());
  EXPECT_TRUE(coordinator_->ReportStats(Stats(0, 30, v1::STAGE_WARMUP, 0.2)).ok());
  absl::Status wrong = coordinator_->ReportStats(Stats(0, 31, v1::STAGE_WARMUP)).status();
  EXPECT_EQ(wrong.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(wrong.message(), HasSubstr("switch after step 30"));
  EXPECT_TRUE(coordinator_->ReportStats(Stats(0, 31, v1::STAGE_COMPRESSION)).ok());
  v1::JobStatus job = *coordinator_->GetJob(v1::GetJobRequest());
  EXPECT_EQ(job.stage(), v1::STAGE_COMPRESSION);
  EXPECT_EQ(job.step(), 31);
  EXPECT_DOUBLE_EQ(job.last_loss(), 0.5);
  EXPECT_DOUBLE_EQ(job.last_variance_change(), 0.2);
}

TEST_F(CoordinatorTest, BadInputsChangeNothing) {
  ASSERT_EQ(RegisterWorker("w0"), 0);
  ASSERT_TRUE(Lease(0, 1).ok());
  const std::string before = JobJson();
  const std::string members_before = ToJson(*coordinator_->ListMembers({}));

  v1::RegisterRequest bad_register;
  bad_register.set_instance_id("x");
  EXPECT_EQ(coordinator_->Register(bad_register).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Lease(0, 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Lease(0, 50).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(coordinator_->ReportStats(Stats(0, 5, v1::STAGE_UNSPECIFIED)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(coordinator_->ReportStats(Stats(0, -5, v1::STAGE_WARMUP)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(coordinator_->ReportStats(Stats(0, 11, v1::STAGE_WARMUP)).status().code(),
            absl::StatusCode::kFailedPrecondition);  // beyond its lease
  v1::StatsReport negative_time = Stats(0, 5, v1::STAGE_WARMUP);
  negative_time.set_step_seconds(-1);
  EXPECT_EQ(coordinator_->ReportStats(negative_time).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(coordinator_->ReportStats(Stats(1, 5, v1::STAGE_WARMUP)).status().code(),
            absl::StatusCode::kFailedPrecondition);  // not registered
  v1::Heartbeat hb;
  hb.set_role(v1::ROLE_WORKER);
  hb.set_rank(0);
  hb.set_instance_id("someone else");
  EXPECT_EQ(coordinator_->Heartbeat(hb).code(), absl::StatusCode::kFailedPrecondition);
  hb.set_instance_id("w0");
  hb.set_step(11);
  EXPECT_EQ(coordinator_->Heartbeat(hb).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(coordinator_->Freeze(v1::FreezeRequest()).status().code(),
            absl::StatusCode::kInvalidArgument);
  v1::FreezeRequest now_false;
  now_false.set_now(false);
  EXPECT_EQ(coordinator_->Freeze(now_false).status().code(), absl::StatusCode::kInvalidArgument);
  v1::FreezeRequest too_early;
  too_early.set_at_step(5);
  absl::Status early = coordinator_->Freeze(too_early).status();
  EXPECT_EQ(early.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(early.message(), HasSubstr("earliest freeze step is 10"));
  v1::DelayFreezeRequest earlier;
  earlier.set_to_step(20);
  EXPECT_EQ(coordinator_->DelayFreeze(earlier).status().code(), absl::StatusCode::kInvalidArgument);
  v1::StopRequest both;
  both.set_now(true);
  both.set_after_step(50);
  EXPECT_EQ(coordinator_->Stop(both).status().code(), absl::StatusCode::kInvalidArgument);
  v1::StopRequest too_soon;
  too_soon.set_after_step(5);
  EXPECT_EQ(coordinator_->Stop(too_soon).status().code(), absl::StatusCode::kFailedPrecondition);
  v1::KvGetRequest negative_timeout;
  negative_timeout.set_key("k");
  negative_timeout.set_wait(true);
  negative_timeout.set_timeout_ms(-1);
  EXPECT_EQ(coordinator_->KvGet(negative_timeout).status().code(),
            absl::StatusCode::kInvalidArgument);

  EXPECT_EQ(JobJson(), before);
  EXPECT_EQ(ToJson(*coordinator_->ListMembers({})), members_before);
}

TEST_F(CoordinatorTest, KvThroughTheHandler) {
  v1::KvSetRequest set;
  set.set_key("nccl/id");
  set.set_value(std::string(128, '\x7f'));
  ASSERT_TRUE(coordinator_->KvSet(set).ok());
  v1::KvGetRequest get;
  get.set_key("nccl/id");
  absl::StatusOr<v1::KvGetResponse> got = coordinator_->KvGet(get);
  ASSERT_TRUE(got.ok());
  EXPECT_TRUE(got->found());
  EXPECT_EQ(got->value(), set.value());
  get.set_key("missing");
  EXPECT_FALSE(coordinator_->KvGet(get)->found());
  get.set_wait(true);
  get.set_timeout_ms(20);
  EXPECT_EQ(coordinator_->KvGet(get).status().code(), absl::StatusCode::kDeadlineExceeded);
}

TEST_F(CoordinatorTest, LivenessFollowsTheClockAndChangesTheVersion) {
  JobConfig config = SmallJob();
  config.failure.max_restarts = 0;  // a dead member fails the job, membership kept as it was
  Make(config);
  ASSERT_EQ(RegisterWorker("w0"), 0);
  ASSERT_EQ(RegisterWorker("w1"), 1);
  const uint64_t v0 = coordinator_->WaitForJobChange(0, absl::ZeroDuration());
  EXPECT_EQ(coordinator_->GetJob({})->workers_alive(), 2);
  clock_.Advance(absl::Seconds(3));
  v1::Heartbeat hb;
  hb.set_role(v1::ROLE_WORKER);
  hb.set_rank(0);
  hb.set_instance_id("w0");
  ASSERT_TRUE(coordinator_->Heartbeat(hb).ok());
  EXPECT_EQ(coordinator_->WaitForJobChange(v0, absl::ZeroDuration()), v0);  // nothing to push
  clock_.Advance(absl::Seconds(3));
  coordinator_->Tick();
  EXPECT_EQ(coordinator_->GetJob({})->workers_alive(), 1);
  const uint64_t v1 = coordinator_->WaitForJobChange(v0, absl::ZeroDuration());
  EXPECT_NE(v1, v0);
  const v1::ListMembersResponse list = *coordinator_->ListMembers({});
  const auto& members = list.members();
  ASSERT_EQ(members.size(), 2);
  EXPECT_TRUE(members[0].alive());
  EXPECT_FALSE(members[1].alive());
  const v1::JobStatus job = *coordinator_->GetJob({});
  EXPECT_EQ(job.state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(job.failure_reason(), HasSubstr("worker 1 (w1) sent no heartbeat"));
  EXPECT_THAT(job.failure_reason(), HasSubstr("max_restarts = 0"));
  EXPECT_TRUE(coordinator_->Failed());
  EXPECT_EQ(coordinator_->Register(v1::RegisterRequest()).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(CoordinatorTest, AdminChangesArePushedAndAnswerTheNewStatus) {
  ASSERT_EQ(RegisterWorker("w0"), 0);
  const uint64_t v0 = coordinator_->WaitForJobChange(0, absl::ZeroDuration());
  v1::FreezeRequest now;
  now.set_now(true);
  absl::StatusOr<v1::JobStatus> job = coordinator_->Freeze(now);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->freeze_step(), 0);
  EXPECT_NE(coordinator_->WaitForJobChange(v0, absl::ZeroDuration()), v0);
  v1::DelayFreezeRequest delay;
  delay.set_to_step(40);
  EXPECT_EQ(coordinator_->DelayFreeze(delay)->freeze_step(), 40);
  v1::StopRequest stop;  // empty: as soon as safe
  EXPECT_EQ(coordinator_->Stop(stop)->stop_after_step(), 0);
}

TEST_F(CoordinatorTest, FinishedOnceEveryWorkerReportedTheLastStep) {
  JobConfig config = SmallJob();
  config.steps = 5;
  Make(config);
  ASSERT_EQ(RegisterWorker("w0"), 0);
  ASSERT_TRUE(Lease(0, 1).ok());
  ASSERT_TRUE(coordinator_->ReportStats(Stats(0, 5, v1::STAGE_WARMUP)).ok());
  EXPECT_FALSE(coordinator_->Finished());  // rank 1 never registered
  ASSERT_EQ(RegisterWorker("w1"), 1);
  v1::RegisterRequest server;
  server.set_role(v1::ROLE_SERVER);
  server.set_instance_id("s0");
  ASSERT_TRUE(coordinator_->Register(server).ok());
  ASSERT_TRUE(Lease(1, 1).ok());
  v1::Heartbeat hb;
  hb.set_role(v1::ROLE_WORKER);
  hb.set_rank(1);
  hb.set_instance_id("w1");
  hb.set_step(5);
  ASSERT_TRUE(coordinator_->Heartbeat(hb).ok());
  EXPECT_TRUE(coordinator_->Finished());
  EXPECT_EQ(coordinator_->GetJob({})->state(), v1::JOB_STATE_SUCCEEDED);
  // Workers that ran the last step may go; that is no failure.
  clock_.Advance(absl::Seconds(60));
  coordinator_->Tick();
  EXPECT_EQ(coordinator_->GetJob({})->state(), v1::JOB_STATE_SUCCEEDED);
}

TEST_F(CoordinatorTest, AdamJobsReportNoFreezeMode) {
  JobConfig config = SmallJob();
  config.optimizer.kind = OptimizerKind::kAdam;
  Make(config);
  v1::JobStatus job = *coordinator_->GetJob({});
  EXPECT_EQ(job.freeze_mode(), v1::FREEZE_MODE_UNSPECIFIED);
  EXPECT_EQ(job.freeze_step(), -1);
  v1::FreezeRequest now;
  now.set_now(true);
  EXPECT_THAT(coordinator_->Freeze(now).status().message(), HasSubstr("Adam"));
}

// Two-phase commit: the manifest is written once, when the last part is in, and names
// exactly the parts reported.
TEST_F(CoordinatorTest, CheckpointCommitsWhenEveryPartIsIn) {
  JobConfig config = SmallJob();
  config.checkpoint.every_steps = 10;
  std::vector<v1::CheckpointManifest> written;
  MakeCheckpointing(config, &written);
  EXPECT_THAT(Lease(0, 1)->checkpoint_steps(), testing::ElementsAre(10));

  // Bad parts change nothing.
  EXPECT_EQ(coordinator_->CommitPart(PartRequest(v1::ROLE_WORKER, 0, "w0", 7)).status().code(),
            absl::StatusCode::kInvalidArgument);  // no checkpoint after step 7
  EXPECT_EQ(coordinator_->CommitPart(PartRequest(v1::ROLE_WORKER, 0, "w1", 10)).status().code(),
            absl::StatusCode::kFailedPrecondition);  // not rank 0's instance
  v1::CommitPartRequest escape = PartRequest(v1::ROLE_WORKER, 0, "w0", 10);
  escape.mutable_part()->set_file("../../etc/passwd");
  EXPECT_EQ(coordinator_->CommitPart(escape).status().code(), absl::StatusCode::kInvalidArgument);

  EXPECT_FALSE(coordinator_->CommitPart(PartRequest(v1::ROLE_WORKER, 0, "w0", 10))->committed());
  EXPECT_FALSE(coordinator_->CommitPart(PartRequest(v1::ROLE_WORKER, 0, "w0", 10))->committed());  // retry
  EXPECT_FALSE(coordinator_->CommitPart(PartRequest(v1::ROLE_SERVER, 0, "s0", 10))->committed());
  v1::ListCheckpointsResponse list = *coordinator_->ListCheckpoints({});
  ASSERT_EQ(list.checkpoints_size(), 1);
  EXPECT_FALSE(list.checkpoints(0).committed());
  EXPECT_EQ(list.checkpoints(0).parts_done(), 2);
  EXPECT_EQ(list.checkpoints(0).parts_expected(), 3);
  EXPECT_TRUE(written.empty());

  EXPECT_TRUE(coordinator_->CommitPart(PartRequest(v1::ROLE_WORKER, 1, "w1", 10))->committed());
  ASSERT_EQ(written.size(), 1u);
  EXPECT_EQ(written[0].step(), 10);
  EXPECT_EQ(written[0].parts_size(), 3);
  EXPECT_EQ(written[0].num_parameters(), 1234u);
  EXPECT_EQ(written[0].freeze_step(), 30);
  EXPECT_EQ(written[0].exchange_mode(), "ps servers=1");
  EXPECT_EQ(written[0].reason(), "every 10 steps");
  EXPECT_EQ(coordinator_->GetJob({})->last_checkpoint_step(), 10);
  // A late retry is answered, and writes nothing again.
  EXPECT_TRUE(coordinator_->CommitPart(PartRequest(v1::ROLE_WORKER, 1, "w1", 10))->committed());
  EXPECT_EQ(written.size(), 1u);

  // On demand: after the furthest lease, announced in the leases that cover it.
  v1::CheckpointRequest asap;
  absl::StatusOr<v1::CheckpointInfo> info = coordinator_->Checkpoint(asap);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->step(), 11);
  EXPECT_EQ(info->reason(), "operator");
  EXPECT_THAT(Lease(1, 1)->checkpoint_steps(), testing::ElementsAre(10));
  EXPECT_THAT(Lease(1, 11)->checkpoint_steps(), testing::ElementsAre(11, 20));
  v1::CheckpointRequest past;
  past.set_at_step(5);
  EXPECT_EQ(coordinator_->Checkpoint(past).status().code(), absl::StatusCode::kFailedPrecondition);
}

// ps with the warmup between the workers: a checkpoint in the warmup is complete with the
// workers' parts (the shards hold nothing yet, and a part of theirs is refused); one after
// the switch needs the shards' parts too.
TEST_F(CoordinatorTest, AWarmupBetweenTheWorkersIsCheckpointedWithoutTheShards) {
  JobConfig config = SmallJob();  // the switch after step 30
  config.exchange.warmup_over = "workers";
  config.checkpoint.every_steps = 30;
  std::vector<v1::CheckpointManifest> written;
  MakeCheckpointing(config, &written);
  ASSERT_TRUE(Lease(0, 1).ok());
  ASSERT_TRUE(Lease(0, 11).ok());
  EXPECT_THAT(Lease(0, 21)->checkpoint_steps(), testing::ElementsAre(30));

  // Step 30 is the warmup's last: two parts make it.
  absl::StatusOr<v1::CommitPartResponse> shard = coordinator_->CommitPart(
      PartRequest(v1::ROLE_SERVER, 0, "s0", 30));
  EXPECT_EQ(shard.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(shard.status().message()), HasSubstr("no shard parts"));
  EXPECT_FALSE(coordinator_->CommitPart(PartRequest(v1::ROLE_WORKER, 0, "w0", 30))->committed());
  EXPECT_EQ(coordinator_->ListCheckpoints({})->checkpoints(0).parts_expected(), 2);
  EXPECT_TRUE(coordinator_->CommitPart(PartRequest(v1::ROLE_WORKER, 1, "w1", 30))->committed());
  ASSERT_EQ(written.size(), 1u);
  EXPECT_EQ(written[0].parts_size(), 2);
  EXPECT_EQ(written[0].num_servers(), 1);

  // Step 60 compresses: the shard's part is expected.
  ASSERT_TRUE(Lease(0, 31).ok());
  ASSERT_TRUE(Lease(0, 41).ok());
  EXPECT_THAT(Lease(0, 51)->checkpoint_steps(), testing::ElementsAre(60));
  EXPECT_FALSE(coordinator_->CommitPart(PartRequest(v1::ROLE_WORKER, 0, "w0", 60))->committed());
  EXPECT_FALSE(coordinator_->CommitPart(PartRequest(v1::ROLE_WORKER, 1, "w1", 60))->committed());
  EXPECT_EQ(coordinator_->ListCheckpoints({})->checkpoints(1).parts_expected(), 3);
  EXPECT_TRUE(coordinator_->CommitPart(PartRequest(v1::ROLE_SERVER, 0, "s0", 60))->committed());
  ASSERT_EQ(written.size(), 2u);
  EXPECT_EQ(written[1].parts_size(), 3);
}

TEST_F(CoordinatorTest, CheckpointCallsFailWithoutACheckpointDir) {
  EXPECT_EQ(coordinator_->Checkpoint({}).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(coordinator_->CommitPart({}).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(coordinator_->ListCheckpoints({})->checkpoints_size(), 0);
}

TEST_F(CoordinatorTest, ResumedJobsTellTheirMembersAndStartAfterTheCheckpoint) {
  CoordinatorOptions options;
  options.config = SmallJob();
  options.job_id = "job-1";
  v1::ResumeFrom resume;
  resume.set_step(40);
  resume.set_name("step-000000040");
  options.resume = resume;
  options.resume_freeze_step = 30;
  coordinator_ = *Coordinator::Create(options, &clock_, nullptr);
  v1::RegisterRequest r;
  r.set_role(v1::ROLE_WORKER);
  r.set_instance_id("w0");
  absl::StatusOr<v1::RegisterResponse> reg = coordinator_->Register(r);
  ASSERT_TRUE(reg.ok());
  EXPECT_EQ(reg->resume().step(), 40);
  EXPECT_EQ(reg->resume().name(), "step-000000040");
  absl::StatusOr<v1::LeaseResponse> lease = Lease(0, 41);
  ASSERT_TRUE(lease.ok()) << lease.status();
  EXPECT_EQ(lease->through_step(), 50);
  EXPECT_EQ(lease->freeze_step(), 30);
  EXPECT_EQ(coordinator_->GetJob({})->resumed_from_step(), 40);
}

// A job resumed from the checkpoint of its last step (its coordinator killed after that
// checkpoint, before the job's end was recorded) has no step left: it succeeds once every
// member is back (before: it stayed "running", and its workers waited for its end forever;
// onebit-chaos found it with a kill right at the end).
TEST_F(CoordinatorTest, AJobResumedAfterItsLastStepSucceedsOnceEveryoneIsBack) {
  JobConfig config = SmallJob();
  config.checkpoint.every_steps = 10;
  std::vector<v1::CheckpointManifest> written;
  v1::ResumeFrom resume;
  resume.set_step(100);
  resume.set_name("step-000000100");
  MakeCheckpointing(config, &written, resume);
  coordinator_->Tick();
  EXPECT_TRUE(written.empty());
  EXPECT_EQ(coordinator_->GetJob({})->state(), v1::JOB_STATE_SUCCEEDED) << JobJson();
}

// A job that resumes from step 10 while a committed checkpoint of step 20 exists (a run
// that went further, or whose step 20 is damaged) writes step 20 again: the old one is not
// its own, so its parts are not answered "committed" and the manifest is written anew.
TEST_F(CoordinatorTest, CheckpointsAfterTheResumePointAreWrittenAgain) {
  std::vector<v1::CheckpointManifest> written;
  CoordinatorOptions options = PeerCheckpointing([&](const v1::CheckpointManifest& m) {
    written.push_back(m);
    return absl::OkStatus();
  });
  for (int64_t step : {10, 20}) {
    v1::CheckpointManifest m;
    m.set_step(step);
    options.committed.push_back(m);
  }
  v1::ResumeFrom resume;
  resume.set_step(10);
  resume.set_name("step-000000010");
  options.resume = resume;
  options.resume_freeze_step = 30;
  coordinator_ = *Coordinator::Create(options, &clock_, nullptr);
  v1::ListCheckpointsResponse list = *coordinator_->ListCheckpoints({});
  ASSERT_EQ(list.checkpoints_size(), 1);
  EXPECT_EQ(list.checkpoints(0).step(), 10);
  ASSERT_EQ(RegisterWorker("w0"), 0);
  ASSERT_EQ(RegisterWorker("w1"), 1);
  for (int rank : {0, 1}) {
    absl::StatusOr<v1::CommitPartResponse> done =
        coordinator_->CommitPart(PartRequest(v1::ROLE_WORKER, rank, rank == 0 ? "w0" : "w1", 20));
    ASSERT_TRUE(done.ok()) << done.status();
    EXPECT_EQ(done->committed(), rank == 1);
  }
  ASSERT_EQ(written.size(), 1u);
  EXPECT_EQ(written[0].step(), 20);
}

// The manifest's I/O runs without the coordinator's lock: while it is being written (here
// a commit that waits), leases, reports and the job's status are answered, and the job
// counts the checkpoint only once it is written.
TEST_F(CoordinatorTest, OtherCallsAreAnsweredWhileAManifestIsWritten) {
  absl::Notification entered, release;
  coordinator_ = *Coordinator::Create(PeerCheckpointing([&](const v1::CheckpointManifest&) {
                                        entered.Notify();
                                        release.WaitForNotification();
                                        return absl::OkStatus();
                                      }),
                                      &clock_, nullptr);
  ASSERT_EQ(RegisterWorker("w0"), 0);
  ASSERT_EQ(RegisterWorker("w1"), 1);
  ASSERT_TRUE(coordinator_->CommitPart(PartRequest(v1::ROLE_WORKER, 0, "w0", 10)).ok());
  absl::StatusOr<v1::CommitPartResponse> last;
  std::thread committer(
      [&] { last = coordinator_->CommitPart(PartRequest(v1::ROLE_WORKER, 1, "w1", 10)); });
  entered.WaitForNotification();
  EXPECT_TRUE(Lease(0, 1).ok());
  EXPECT_TRUE(coordinator_->ReportStats(Stats(0, 1, v1::STAGE_WARMUP)).ok());
  EXPECT_EQ(coordinator_->GetJob({})->last_checkpoint_step(), 0);
  release.Notify();
  committer.join();
  ASSERT_TRUE(last.ok()) << last.status();
  EXPECT_TRUE(last->committed());
  EXPECT_EQ(coordinator_->GetJob({})->last_checkpoint_step(), 10);
}

// A fresh job whose workers loaded saved states (onebit.torch's load_state_dict before the
// first step) starts after their step; workers that disagree fail it, naming both; a job
// with shards refuses (the states hold no server error); a checkpoint of the job wins.
TEST_F(CoordinatorTest, AFreshJobStartsAfterTheStepItsWorkersLoaded) {
  auto worker = [](const std::string& id, int rank, int64_t loaded) {
    v1::RegisterRequest r;
    r.set_role(v1::ROLE_WORKER);
    r.set_instance_id(id);
    r.set_requested_rank(rank);
    r.set_loaded_step(loaded);
    r.set_loaded_freeze_step(loaded > 0 ? 30 : -1);
    return r;
  };
  JobConfig peer = SmallJob();
  peer.exchange.mode = "peer";
  peer.exchange.servers = 0;
  Make(peer);
  absl::StatusOr<v1::RegisterResponse> a = coordinator_->Register(worker("a", 0, 40));
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->resume().step(), 40);
  EXPECT_EQ(a->resume().name(), "");  // each worker restores its own
  absl::StatusOr<v1::RegisterResponse> b = coordinator_->Register(worker("b", 1, 40));
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->resume().step(), 40);
  coordinator_->Tick();
  absl::StatusOr<v1::LeaseResponse> lease = Lease(0, 41);
  ASSERT_TRUE(lease.ok()) << lease.status();
  EXPECT_EQ(lease->through_step(), 50);
  EXPECT_EQ(lease->freeze_step(), 30);
  EXPECT_EQ(coordinator_->GetJob({})->resumed_from_step(), 40);

  Make(peer);
  ASSERT_TRUE(coordinator_->Register(worker("a", 0, 40)).ok());
  absl::Status status = coordinator_->Register(worker("b", 1, 0)).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(status.message(), HasSubstr("worker 1 (b) loaded no saved state; worker 0 (a) "
                                          "loaded a saved state of step 40"));
  EXPECT_EQ(coordinator_->GetJob({})->state(), v1::JOB_STATE_FAILED);

  Make(SmallJob());  // ps, one shard
  status = coordinator_->Register(worker("a", 0, 40)).status();
  EXPECT_THAT(status.message(), HasSubstr("holds no shard's server error"));
  EXPECT_EQ(coordinator_->GetJob({})->state(), v1::JOB_STATE_FAILED);

  CoordinatorOptions options;
  options.config = peer;
  v1::ResumeFrom checkpoint;
  checkpoint.set_step(60);
  checkpoint.set_name("step-000000060");
  options.resume = checkpoint;
  options.resume_freeze_step = 30;
  coordinator_ = *Coordinator::Create(options, &clock_, nullptr);
  a = coordinator_->Register(worker("a", 0, 40));
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->resume().name(), "step-000000060");
}

// A dead member starts a recovery: a new generation, an empty membership, the stage
// machine from the checkpoint plan_resume names; the job runs on once everyone is back.
TEST_F(CoordinatorTest, ADeadMemberStartsARecoveryFromTheLastCheckpoint) {
  JobConfig config = SmallJob();
  config.exchange.mode = "peer";
  config.exchange.servers = 0;
  config.failure.max_restarts = 1;
  config.failure.rejoin_timeout_s = 30;
  CoordinatorOptions options;
  options.config = config;
  options.job_id = "job-1";
  options.heartbeat_timeout = absl::Seconds(5);
  int plans = 0;
  options.plan_resume = [&plans]() -> absl::StatusOr<checkpoint::ResumePlan> {
    ++plans;
    checkpoint::ResumePlan plan;
    v1::ResumeFrom resume;
    resume.set_step(20);
    resume.set_name("step-000000020");
    plan.resume = resume;
    plan.freeze_step = -1;
    return plan;
  };
  std::vector<v1::CoordinatorState> persisted;
  options.persist = [&persisted](const v1::CoordinatorState& state) {
    persisted.push_back(state);
    return absl::OkStatus();
  };
  coordinator_ = *Coordinator::Create(options, &clock_, nullptr);
  EXPECT_EQ(coordinator_->GetJob({})->state(), v1::JOB_STATE_STARTING);
  ASSERT_EQ(RegisterWorker("w0"), 0);
  ASSERT_EQ(RegisterWorker("w1"), 1);
  EXPECT_EQ(coordinator_->GetJob({})->state(), v1::JOB_STATE_RUNNING);
  ASSERT_TRUE(Lease(0, 1).ok());
  v1::Heartbeat hb;
  hb.set_role(v1::ROLE_WORKER);
  hb.set_rank(0);
  hb.set_instance_id("w0");
  clock_.Advance(absl::Seconds(4));
  ASSERT_TRUE(coordinator_->Heartbeat(hb).ok());
  clock_.Advance(absl::Seconds(2));  // w1 silent for 6 s
  coordinator_->Tick();
  v1::JobStatus job = *coordinator_->GetJob({});
  EXPECT_EQ(job.state(), v1::JOB_STATE_RECOVERING);
  EXPECT_EQ(job.generation(), 2);
  EXPECT_EQ(job.recoveries(), 1);
  EXPECT_THAT(job.failure_reason(), HasSubstr("worker 1 (w1)"));
  EXPECT_EQ(job.workers_registered(), 0);
  EXPECT_EQ(plans, 1);
  ASSERT_EQ(persisted.size(), 1);
  EXPECT_EQ(persisted[0].generation(), 2);
  EXPECT_EQ(persisted[0].recoveries(), 1);
  EXPECT_FALSE(persisted[0].over());
  EXPECT_TRUE(persisted[0].recovering());  // a coordinator restarted now goes on with it
  // The recovery is on record: which generation, what failed, where it resumed.
  ASSERT_EQ(job.recovery_log_size(), 1);
  EXPECT_EQ(job.recovery_log(0).generation(), 2);
  EXPECT_EQ(job.recovery_log(0).resume_step(), 20);
  EXPECT_THAT(job.recovery_log(0).reason(), HasSubstr("worker 1 (w1) sent no heartbeat"));
  ASSERT_EQ(persisted[0].recovery_log_size(), 1);
  EXPECT_EQ(persisted[0].recovery_log(0).resume_step(), 20);
  // The old generation is gone: its heartbeat is refused, so it learns and restarts.
  EXPECT_EQ(coordinator_->Heartbeat(hb).code(), absl::StatusCode::kFailedPrecondition);
  // The new one resumes after step 20.
  v1::RegisterRequest r;
  r.set_role(v1::ROLE_WORKER);
  r.set_instance_id("w0-again");
  r.set_requested_rank(0);
  absl::StatusOr<v1::RegisterResponse> reg = coordinator_->Register(r);
  ASSERT_TRUE(reg.ok());
  EXPECT_EQ(reg->generation(), 2);
  EXPECT_EQ(reg->resume().step(), 20);
  r.set_instance_id("w1-again");
  r.set_requested_rank(1);
  ASSERT_TRUE(coordinator_->Register(r).ok());
  EXPECT_EQ(coordinator_->GetJob({})->state(), v1::JOB_STATE_RUNNING);
  // The recovery is over: a coordinator restarted from here on makes a new one.
  ASSERT_EQ(persisted.size(), 2);
  EXPECT_FALSE(persisted[1].recovering());
  EXPECT_EQ(persisted[1].recoveries(), 1);
  EXPECT_EQ(Lease(0, 1)->through_step(), 10);  // a rollback may ask again
  absl::StatusOr<v1::LeaseResponse> lease = Lease(1, 21);
  ASSERT_TRUE(lease.ok()) << lease.status();
  EXPECT_EQ(lease->through_step(), 30);
  // A second failure: no recovery left.
  clock_.Advance(absl::Seconds(6));
  coordinator_->Tick();
  job = *coordinator_->GetJob({});
  EXPECT_EQ(job.state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(job.failure_reason(), HasSubstr("no recovery left"));
  // The failure is saved as the job's end, with its reason (a restart stays FAILED).
  ASSERT_EQ(persisted.size(), 3);
  EXPECT_TRUE(persisted[2].over());
  EXPECT_FALSE(persisted[2].recovering());
  EXPECT_THAT(persisted[2].failure_reason(), HasSubstr("no recovery left"));
  EXPECT_EQ(persisted[2].recovery_log_size(), 1);
}

// After a kill, the member that went silent first is named, not the lowest rank among
// those silent by the time the coordinator looks (its peers often stop because of it).
TEST_F(CoordinatorTest, TheMemberThatWentSilentFirstIsBlamed) {
  JobConfig config = SmallJob();
  config.exchange.mode = "peer";
  config.exchange.servers = 0;
  config.workers = 3;
  config.failure.max_restarts = 0;
  Make(config);
  ASSERT_EQ(RegisterWorker("w0"), 0);
  ASSERT_EQ(RegisterWorker("w1"), 1);
  ASSERT_EQ(RegisterWorker("w2"), 2);
  auto beat = [this](int rank) {
    v1::Heartbeat hb;
    hb.set_role(v1::ROLE_WORKER);
    hb.set_rank(rank);
    hb.set_instance_id(absl::StrCat("w", rank));
    ASSERT_TRUE(coordinator_->Heartbeat(hb).ok());
  };
  clock_.Advance(absl::Seconds(1));
  beat(0);
  beat(1);  // w2 is killed here: its last heartbeat is at 0 s
  clock_.Advance(absl::Seconds(1));
  beat(0);  // w1 leaves after its collective with w2 broke: last heartbeat at 1 s
  clock_.Advance(absl::Seconds(6));  // both silent for more than 5 s when the clock ticks
  beat(0);
  coordinator_->Tick();
  const v1::JobStatus job = *coordinator_->GetJob({});
  EXPECT_EQ(job.state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(job.failure_reason(), HasSubstr("worker 2 (w2) sent no heartbeat"));
}

// A member's failure that no restart fixes fails the job at once, naming the member; only
// a member of the current generation may report one, and bad reports change nothing.
TEST_F(CoordinatorTest, AReportedPermanentFailureFailsTheJobAtOnce) {
  std::vector<v1::CoordinatorState> persisted;
  CoordinatorOptions options;
  options.config = SmallJob();
  options.job_id = "job-1";
  options.persist = [&persisted](const v1::CoordinatorState& state) {
    persisted.push_back(state);
    return absl::OkStatus();
  };
  coordinator_ = *Coordinator::Create(options, &clock_, nullptr);
  ASSERT_EQ(RegisterWorker("w0"), 0);
  ASSERT_EQ(RegisterWorker("w1"), 1);
  v1::FailureReport report;
  report.set_role(v1::ROLE_WORKER);
  report.set_rank(1);
  report.set_instance_id("w1");
  report.set_step(48);
  EXPECT_EQ(coordinator_->ReportFailure(report).status().code(),
            absl::StatusCode::kInvalidArgument);  // no reason
  report.set_reason("training diverged: the loss is nan at step 48");
  v1::FailureReport stranger = report;
  stranger.set_instance_id("w9");
  EXPECT_EQ(coordinator_->ReportFailure(stranger).status().code(),
            absl::StatusCode::kFailedPrecondition);
  stranger = report;
  stranger.set_rank(7);
  EXPECT_EQ(coordinator_->ReportFailure(stranger).status().code(),
            absl::StatusCode::kFailedPrecondition);
  stranger = report;
  stranger.set_role(v1::ROLE_UNSPECIFIED);
  EXPECT_EQ(coordinator_->ReportFailure(stranger).status().code(),
            absl::StatusCode::kInvalidArgument);
  stranger = report;
  stranger.set_step(-1);
  EXPECT_EQ(coordinator_->ReportFailure(stranger).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(coordinator_->GetJob({})->state(), v1::JOB_STATE_STARTING);  // 1 server missing
  EXPECT_TRUE(persisted.empty());

  const uint64_t before = coordinator_->WaitForJobChange(0, absl::ZeroDuration());
  absl::StatusOr<v1::JobStatus> job = coordinator_->ReportFailure(report);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(job->failure_reason(),
              HasSubstr("worker 1 (w1) failed in step 48, which no restart fixes: training "
                        "diverged: the loss is nan at step 48"));
  EXPECT_EQ(job->recoveries(), 0);
  EXPECT_NE(coordinator_->WaitForJobChange(before, absl::ZeroDuration()), before);  // pushed
  ASSERT_EQ(persisted.size(), 1);
  EXPECT_TRUE(persisted[0].over());
  EXPECT_EQ(persisted[0].failure_reason(), job->failure_reason());
  // A second report (the other worker diverged too) keeps the first reason.
  report.set_rank(0);
  report.set_instance_id("w0");
  report.set_reason("training diverged: the loss is inf");
  EXPECT_EQ(coordinator_->ReportFailure(report)->failure_reason(), job->failure_reason());
  // Newcomers learn that it is over, and why.
  v1::RegisterRequest r;
  r.set_role(v1::ROLE_SERVER);
  r.set_instance_id("s0");
  r.set_requested_rank(0);
  const absl::Status refused = coordinator_->Register(r).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.message(), HasSubstr("worker 1 (w1) failed in step 48"));
}

// Workers that step with other hyperparameters (a per-rank learning rate) fail the job
// at the first step both reported: their replicas would train apart.
TEST_F(CoordinatorTest, WorkersThatStepWithOtherHyperparametersFailTheJob) {
  ASSERT_EQ(RegisterWorker("w0"), 0);
  ASSERT_EQ(RegisterWorker("w1"), 1);
  ASSERT_TRUE(Lease(0, 1).ok());
  ASSERT_TRUE(Lease(1, 1).ok());
  auto stats = [this](int rank, int64_t step, double lr, uint64_t digest) {
    v1::StatsReport r = Stats(rank, step, v1::STAGE_WARMUP);
    r.set_lr(lr);
    r.set_hyper_digest(digest);
    return r;
  };
  ASSERT_TRUE(coordinator_->ReportStats(stats(0, 1, 0.01, 7)).ok());
  ASSERT_TRUE(coordinator_->ReportStats(stats(1, 1, 0.01, 7)).ok());
  ASSERT_TRUE(coordinator_->ReportStats(stats(1, 2, 0.01, 7)).ok());
  ASSERT_TRUE(coordinator_->ReportStats(stats(0, 2, 0.01, 0)).ok());  // 0: not given
  // The same lr, another digest: the betas, decays or clipping differ.
  ASSERT_TRUE(coordinator_->ReportStats(stats(0, 3, 0.01, 7)).ok());
  absl::Status differs = coordinator_->ReportStats(stats(1, 3, 0.01, 9)).status();
  EXPECT_EQ(differs.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(differs.message(), HasSubstr("worker 1 stepped step 3 with other hyperparameters "
                                           "than worker 0 (the same lr 0.01 now; the lr, betas"));
  v1::JobStatus job = *coordinator_->GetJob({});
  EXPECT_EQ(job.state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(job.failure_reason(), HasSubstr("ReduceLROnPlateau on its own loss"));

  Make(SmallJob());
  ASSERT_EQ(RegisterWorker("w0"), 0);
  ASSERT_EQ(RegisterWorker("w1"), 1);
  ASSERT_TRUE(Lease(0, 1).ok());
  ASSERT_TRUE(Lease(1, 1).ok());
  ASSERT_TRUE(coordinator_->ReportStats(stats(1, 10, 0.005, 8)).ok());
  differs = coordinator_->ReportStats(stats(0, 10, 0.01, 7)).status();
  EXPECT_THAT(differs.message(), HasSubstr("worker 0 stepped step 10 with other hyperparameters "
                                           "than worker 1 (lr 0.01 against 0.005)"));
  EXPECT_EQ(coordinator_->GetJob({})->state(), v1::JOB_STATE_FAILED);
}

// A worker whose script raised reports it as restartable: a running job recovers at once,
// naming that worker and the script's error (not whichever member a heartbeat timeout
// would find silent first); a job not running is left as it is; the same checks as for a
// permanent failure.
TEST_F(CoordinatorTest, AReportedRestartableFailureRecoversARunningJobAtOnce) {
  JobConfig config = SmallJob();
  config.exchange.mode = "peer";
  config.exchange.servers = 0;
  config.failure.max_restarts = 1;
  Make(config);
  v1::FailureReport report;
  report.set_role(v1::ROLE_WORKER);
  report.set_rank(1);
  report.set_instance_id("w1");
  report.set_step(8);
  report.set_restartable(true);
  report.set_reason("the script raised RuntimeError: boom");
  // Not a member yet: refused; the job is still starting.
  EXPECT_EQ(coordinator_->ReportFailure(report).status().code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_EQ(RegisterWorker("w0"), 0);
  ASSERT_EQ(RegisterWorker("w1"), 1);
  ASSERT_EQ(coordinator_->GetJob({})->state(), v1::JOB_STATE_RUNNING);
  v1::FailureReport stranger = report;
  stranger.set_instance_id("w9");
  EXPECT_EQ(coordinator_->ReportFailure(stranger).status().code(),
            absl::StatusCode::kFailedPrecondition);
  stranger = report;
  stranger.set_reason("");
  EXPECT_EQ(coordinator_->ReportFailure(stranger).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(coordinator_->GetJob({})->generation(), 1);

  const uint64_t before = coordinator_->WaitForJobChange(0, absl::ZeroDuration());
  absl::StatusOr<v1::JobStatus> job = coordinator_->ReportFailure(report);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->state(), v1::JOB_STATE_RECOVERING);
  EXPECT_EQ(job->generation(), 2);
  EXPECT_EQ(job->recoveries(), 1);
  EXPECT_EQ(job->failure_reason(),
            "worker 1 (w1) failed in step 8, which a restart may fix: the script raised "
            "RuntimeError: boom");
  EXPECT_NE(coordinator_->WaitForJobChange(before, absl::ZeroDuration()), before);  // pushed
  // The old generation's members are not members any more: a second report is refused.
  EXPECT_EQ(coordinator_->ReportFailure(report).status().code(),
            absl::StatusCode::kFailedPrecondition);
  // With no recovery left, the next one fails the job, as a heartbeat timeout would.
  ASSERT_EQ(RegisterWorker("w0-again"), 0);
  ASSERT_EQ(RegisterWorker("w1-again"), 1);
  report.set_instance_id("w1-again");
  job = coordinator_->ReportFailure(report);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(job->failure_reason(), HasSubstr("which a restart may fix: the script raised "
                                               "RuntimeError: boom; no recovery left"));
}

// A coordinator started from a state file that says the job FAILED (with this config)
// stays FAILED with that reason, and keeps the recoveries on record.
TEST_F(CoordinatorTest, AJobThatFailedStaysFailed) {
  CoordinatorOptions options;
  options.config = SmallJob();
  options.job_id = "job-1";
  options.generation = 3;
  options.recoveries = 2;
  v1::Recovery& r = options.recovery_log.emplace_back();
  r.set_generation(2);
  r.set_reason("worker 0 (w0) sent no heartbeat for 10s");
  r.set_resume_step(40);
  options.failed = "worker 1 (w1) failed in step 48, which no restart fixes: diverged";
  coordinator_ = *Coordinator::Create(options, &clock_, nullptr);
  const v1::JobStatus job = *coordinator_->GetJob({});
  EXPECT_EQ(job.state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(job.failure_reason(), options.failed);
  EXPECT_EQ(job.generation(), 3);
  ASSERT_EQ(job.recovery_log_size(), 1);
  EXPECT_EQ(job.recovery_log(0).resume_step(), 40);
  EXPECT_TRUE(coordinator_->Failed());
  v1::RegisterRequest w;
  w.set_role(v1::ROLE_WORKER);
  w.set_instance_id("w0-again");
  w.set_requested_rank(0);
  EXPECT_THAT(coordinator_->Register(w).status().message(), HasSubstr("failed in step 48"));
}

// Rank 0's script raised: its embedded coordinator starts a recovery before the process
// leaves (persisted, so that the launcher's restart resumes); a job not running is kept.
TEST_F(CoordinatorTest, RecoverStartsARecoveryOfARunningJobOnly) {
  JobConfig config = SmallJob();
  config.exchange.mode = "peer";
  config.exchange.servers = 0;
  config.failure.max_restarts = 1;
  CoordinatorOptions options;
  options.config = config;
  options.job_id = "job-1";
  std::vector<v1::CoordinatorState> persisted;
  options.persist = [&persisted](const v1::CoordinatorState& state) {
    persisted.push_back(state);
    return absl::OkStatus();
  };
  coordinator_ = *Coordinator::Create(options, &clock_, nullptr);
  coordinator_->Recover("before any member registered");
  EXPECT_EQ(coordinator_->GetJob({})->state(), v1::JOB_STATE_STARTING);
  ASSERT_EQ(RegisterWorker("w0"), 0);
  ASSERT_EQ(RegisterWorker("w1"), 1);
  coordinator_->Recover("rank 0, which runs the job's coordinator, stopped: the script raised "
                        "OSError: a batch could not be read");
  v1::JobStatus job = *coordinator_->GetJob({});
  EXPECT_EQ(job.state(), v1::JOB_STATE_RECOVERING);
  EXPECT_EQ(job.generation(), 2);
  EXPECT_EQ(job.recoveries(), 1);
  EXPECT_THAT(job.failure_reason(), HasSubstr("OSError: a batch could not be read"));
  ASSERT_FALSE(persisted.empty());
  EXPECT_EQ(persisted.back().generation(), 2);
  EXPECT_FALSE(persisted.back().over());
  coordinator_->Recover("again, while it recovers");  // one recovery, not two
  EXPECT_EQ(coordinator_->GetJob({})->generation(), 2);
  // The next generation runs; with no recovery left, the job fails instead.
  ASSERT_EQ(RegisterWorker("w0-again"), 0);
  ASSERT_EQ(RegisterWorker("w1-again"), 1);
  ASSERT_EQ(coordinator_->GetJob({})->state(), v1::JOB_STATE_RUNNING);
  coordinator_->Recover("rank 0 stopped a second time");
  job = *coordinator_->GetJob({});
  EXPECT_EQ(job.state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(job.failure_reason(), HasSubstr("rank 0 stopped a second time; no recovery left"));
}

TEST_F(CoordinatorTest, AMembershipThatDoesNotComeBackInTimeFailsTheJob) {
  JobConfig config = SmallJob();
  config.failure.rejoin_timeout_s = 30;
  Make(config);
  ASSERT_EQ(RegisterWorker("w0"), 0);
  clock_.Advance(absl::Seconds(4));
  coordinator_->Tick();
  EXPECT_EQ(coordinator_->GetJob({})->state(), v1::JOB_STATE_STARTING);
  v1::Heartbeat hb;
  hb.set_role(v1::ROLE_WORKER);
  hb.set_rank(0);
  hb.set_instance_id("w0");
  for (int i = 0; i < 10; ++i) {
    clock_.Advance(absl::Seconds(3));
    ASSERT_TRUE(coordinator_->Heartbeat(hb).ok());
  }
  const v1::JobStatus job = *coordinator_->GetJob({});
  EXPECT_EQ(job.state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(job.failure_reason(), HasSubstr("only 1 of 2 workers and 0 of 1 servers registered within 30 s"));
}

// A new process for the rank of a live member is refused; for a silent one, it is the
// replacement: the recovery starts at once and the newcomer joins the new generation.
TEST_F(CoordinatorTest, ANewProcessReplacesASilentMemberButNotALiveOne) {
  JobConfig config = SmallJob();
  config.exchange.mode = "peer";
  config.exchange.servers = 0;
  Make(config);
  ASSERT_EQ(RegisterWorker("w0"), 0);
  ASSERT_EQ(RegisterWorker("w1"), 1);
  v1::RegisterRequest r;
  r.set_role(v1::ROLE_WORKER);
  r.set_instance_id("w1-new");
  r.set_requested_rank(1);
  EXPECT_EQ(coordinator_->Register(r).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(coordinator_->GetJob({})->generation(), 1);
  v1::Heartbeat hb;
  hb.set_role(v1::ROLE_WORKER);
  hb.set_rank(0);
  hb.set_instance_id("w0");
  clock_.Advance(absl::Seconds(4));
  ASSERT_TRUE(coordinator_->Heartbeat(hb).ok());
  clock_.Advance(absl::Seconds(2));  // w1 silent for 6 s > 5 s; nobody ticked yet
  absl::StatusOr<v1::RegisterResponse> reg = coordinator_->Register(r);
  ASSERT_TRUE(reg.ok()) << reg.status();
  EXPECT_EQ(reg->rank(), 1);
  EXPECT_EQ(reg->generation(), 2);
  const v1::JobStatus job = *coordinator_->GetJob({});
  EXPECT_EQ(job.state(), v1::JOB_STATE_RECOVERING);
  EXPECT_THAT(job.failure_reason(), HasSubstr("worker 1 (w1) went silent and was replaced"));
  EXPECT_EQ(job.workers_registered(), 1);
}

}  // namespace
}  // namespace onebit
