// Every worker switches to compression at the same step. W simulated workers (threads,
// each with its own gRPC client) loop Lease -> run steps -> ReportStats against a real
// coordinator, deciding the stage of each step only from their own leases, as a real
// worker does; they do not run in lockstep, so leases are granted in every interleaving.
// Each scenario checks that all workers ran every step in the same stage, and where the
// switch happened: static freeze_step, automatic (variance change under the threshold),
// automatic at max_warmup, and an operator's freeze (now, or at a step, over gRPC and
// REST), delay, and stop.
#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "coordinator/coordinator_client.h"
#include "coordinator/test_coordinator.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "httplib.h"

namespace onebit {
namespace {

struct WorkerRun {
  int rank = -1;
  std::vector<v1::Stage> stages;  // stages[s] for step s (index 0 unused)
  int64_t last_step = 0;
  absl::Status status;
};

// Holds every worker before it runs step `step` + 1 until released, so an operator's call
// lands at a known point: all leases end at `step` then (lease_steps divides it).
class Gate {
 public:
  Gate(int64_t step, int workers) : step_(step), workers_(workers) {}
  void Arrive() {
    absl::MutexLock lock(&mu_);
    ++arrived_;
    auto released = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return released_; };
    mu_.Await(absl::Condition(&released));
  }
  void WaitForAll() {
    absl::MutexLock lock(&mu_);
    auto all = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return arrived_ == workers_; };
    if (!mu_.AwaitWithTimeout(absl::Condition(&all), absl::Seconds(60))) {
      ADD_FAILURE() << "only " << arrived_ << " of " << workers_ << " workers reached the gate";
      released_ = true;  // let the others go rather than hang
    }
  }
  void Release() {
    absl::MutexLock lock(&mu_);
    released_ = true;
  }
  int64_t step() const { return step_; }

 private:
  const int64_t step_;
  const int workers_;
  absl::Mutex mu_;
  int arrived_ ABSL_GUARDED_BY(mu_) = 0;
  bool released_ ABSL_GUARDED_BY(mu_) = false;
};

struct Scenario {
  int workers = 4;
  int64_t report_interval = 5;
  std::function<double(int64_t step)> variance_change = [](int64_t) { return 1.0; };
  Gate* gate = nullptr;
};

void RunWorker(const std::string& address, int index, const Scenario& scenario, WorkerRun* run) {
  GrpcClientOptions options;
  options.address = address;
  options.rpc_timeout = absl::Seconds(20);
  std::unique_ptr<CoordinatorClient> client = *NewGrpcCoordinatorClient(options);
  v1::RegisterRequest reg;
  reg.set_role(v1::ROLE_WORKER);
  reg.set_instance_id(absl::StrCat("worker-", index));
  reg.set_requested_rank(-1);
  absl::StatusOr<v1::RegisterResponse> registered = client->Register(reg);
  if (!registered.ok()) {
    run->status = registered.status();
    return;
  }
  run->rank = registered->rank();
  std::mt19937 jitter(index);
  int64_t through = 0, freeze = -1;
  run->stages.push_back(v1::STAGE_UNSPECIFIED);
  for (int64_t step = 1;; ++step) {
    if (scenario.gate != nullptr && step == scenario.gate->step() + 1) scenario.gate->Arrive();
    if (step > through) {
      v1::LeaseRequest lease;
      lease.set_rank(run->rank);
      lease.set_next_step(step);
      absl::StatusOr<v1::LeaseResponse> granted = client->Lease(lease);
      if (!granted.ok()) {
        run->status = granted.status();
        return;
      }
      through = granted->through_step();
      freeze = granted->freeze_step();
      if (through < step) break;  // the job is over
    }
    // The stage of this step, from what this worker's leases said.
    const v1::Stage stage = freeze >= 0 && step > freeze ? v1::STAGE_COMPRESSION : v1::STAGE_WARMUP;
    run->stages.push_back(stage);
    if (jitter() % 4 == 0) absl::SleepFor(absl::Microseconds(jitter() % 2000));
    run->last_step = step;
    v1::StatsReport report;
    report.set_rank(run->rank);
    report.set_step(step);
    report.set_stage(stage);
    report.set_loss(1.0 / step);
    report.set_variance_change(-1);
    if (stage == v1::STAGE_WARMUP && step % scenario.report_interval == 0) {
      report.set_variance_change(scenario.variance_change(step));
    } else if (step % 10 != 0) {
      continue;
    }
    absl::StatusOr<v1::StatsReportResponse> reported = client->ReportStats(report);
    if (!reported.ok()) {
      run->status = reported.status();
      return;
    }
  }
  // The last step, so that the coordinator knows this worker is done.
  v1::StatsReport last;
  last.set_rank(run->rank);
  last.set_step(run->last_step);
  last.set_stage(run->stages.back());
  last.set_variance_change(-1);
  run->status = client->ReportStats(last).status();
}

class SwitchTest : public ::testing::Test {
 protected:
  void Start(const JobConfig& config) {
    absl::StatusOr<TestCoordinator> t = StartTestCoordinator(config);
    ASSERT_TRUE(t.ok()) << t.status();
    t_ = *std::move(t);
  }

  // Runs the workers to the end; `operator_action` runs meanwhile on this thread.
  std::vector<WorkerRun> RunJob(const Scenario& scenario,
                                const std::function<void()>& operator_action = nullptr) {
    std::vector<WorkerRun> runs(scenario.workers);
    std::vector<std::thread> threads;
    for (int i = 0; i < scenario.workers; ++i) {
      threads.emplace_back(RunWorker, t_.server->grpc_address(), i, std::cref(scenario), &runs[i]);
    }
    if (operator_action) operator_action();
    for (std::thread& t : threads) t.join();
    return runs;
  }

  // Every worker ran the same steps in the same stages; returns the switch step (the last
  // warmup step; -1 if none).
  int64_t CheckAgreement(const std::vector<WorkerRun>& runs, int64_t expected_last_step) {
    for (const WorkerRun& run : runs) {
      EXPECT_TRUE(run.status.ok()) << "rank " << run.rank << ": " << run.status;
      EXPECT_EQ(run.last_step, expected_last_step) << "rank " << run.rank;
      EXPECT_EQ(run.stages, runs[0].stages)
          << "rank " << run.rank << " disagrees with rank " << runs[0].rank;
    }
    const std::vector<v1::Stage>& stages = runs[0].stages;
    int64_t last_warmup = 0;  // warmup is a prefix: steps 1..last_warmup
    for (size_t s = 1; s < stages.size(); ++s) {
      if (stages[s] == v1::STAGE_WARMUP) {
        EXPECT_EQ(last_warmup, static_cast<int64_t>(s) - 1) << "warmup after compression";
        last_warmup = static_cast<int64_t>(s);
      }
    }
    return last_warmup;
  }

  void ExpectFinished() {
    bool finished = false;
    for (int i = 0; i < 100 && !finished; ++i) {
      finished = t_.server->coordinator()->Finished();
      if (!finished) absl::SleepFor(absl::Milliseconds(10));
    }
    EXPECT_TRUE(finished);
  }

  // Polls GetJob until `done` holds.
  void WaitForJob(const std::function<bool(const v1::JobStatus&)>& done) {
    for (int i = 0; i < 2000; ++i) {
      absl::StatusOr<v1::JobStatus> job = t_.client->GetJob({});
      if (job.ok() && done(*job)) return;
      absl::SleepFor(absl::Milliseconds(5));
    }
    ADD_FAILURE() << "job never reached the expected state";
  }

  TestCoordinator t_;
};

TEST_F(SwitchTest, StaticFreezeStep) {
  Start(TestJobConfig(4, 80, 7, 33));
  Scenario scenario;
  std::vector<WorkerRun> runs = RunJob(scenario);
  EXPECT_EQ(CheckAgreement(runs, 80), 33);
  ExpectFinished();
  EXPECT_EQ(t_.client->GetJob({})->stage(), v1::STAGE_COMPRESSION);
}

TEST_F(SwitchTest, StaticFreezeAtZeroCompressesFromTheFirstStep) {
  Start(TestJobConfig(3, 20, 4, 0));
  std::vector<WorkerRun> runs = RunJob(Scenario{3});
  EXPECT_EQ(CheckAgreement(runs, 20), 0);
}

TEST_F(SwitchTest, AutomaticWhenTheVarianceSettles) {
  JobConfig config = TestJobConfig(4, 120, 5, 0);
  config.freeze.mode = "automatic";
  config.freeze.threshold = 0.05;
  config.freeze.reports_in_a_row = 3;
  config.freeze.report_interval = 5;
  config.freeze.min_warmup = 20;
  config.freeze.max_warmup = 100;
  Start(config);
  Scenario scenario;
  // Under 0.05 from step 25 on: reports at 25, 30, 35 make three in a row at 35.
  scenario.variance_change = [](int64_t step) { return 0.5 * std::exp(-step / 10.0); };
  std::vector<WorkerRun> runs = RunJob(scenario);
  const int64_t freeze = CheckAgreement(runs, 120);
  // At the third report under the threshold, or after the furthest lease at that time
  // (workers run ahead of each other, so up to max_warmup).
  EXPECT_GE(freeze, 35);
  EXPECT_LE(freeze, 100);
  EXPECT_EQ(freeze % 5, 0);  // leases end on multiples of lease_steps
  v1::JobStatus job = *t_.client->GetJob({});
  EXPECT_EQ(job.freeze_step(), freeze);
  EXPECT_EQ(job.freeze_mode(), v1::FREEZE_MODE_AUTOMATIC);
}

TEST_F(SwitchTest, AutomaticWaitsForMinWarmup) {
  JobConfig config = TestJobConfig(3, 80, 5, 0);
  config.freeze.mode = "automatic";
  config.freeze.reports_in_a_row = 2;
  config.freeze.report_interval = 5;
  config.freeze.min_warmup = 42;
  config.freeze.max_warmup = 70;
  Start(config);
  Scenario scenario{3};
  scenario.variance_change = [](int64_t) { return 0.0; };
  std::vector<WorkerRun> runs = RunJob(scenario);
  const int64_t freeze = CheckAgreement(runs, 80);
  EXPECT_GE(freeze, 45);  // the first report step >= 42
  EXPECT_LE(freeze, 70);
}

TEST_F(SwitchTest, AutomaticAtMaxWarmupExactly) {
  JobConfig config = TestJobConfig(4, 90, 6, 0);
  config.freeze.mode = "automatic";
  config.freeze.report_interval = 5;
  config.freeze.min_warmup = 10;
  config.freeze.max_warmup = 47;  // not a multiple of lease_steps
  Start(config);
  Scenario scenario;
  scenario.variance_change = [](int64_t) { return 0.9; };  // never settles
  std::vector<WorkerRun> runs = RunJob(scenario);
  EXPECT_EQ(CheckAgreement(runs, 90), 47);
}

TEST_F(SwitchTest, OperatorFreezeNowOverGrpc) {
  Start(TestJobConfig(4, 80, 5, 1000));  // the static step lies past the end
  Gate gate(30, 4);
  Scenario scenario;
  scenario.gate = &gate;
  std::vector<WorkerRun> runs = RunJob(scenario, [&] {
    gate.WaitForAll();
    v1::FreezeRequest now;
    now.set_now(true);
    absl::StatusOr<v1::JobStatus> job = t_.client->Freeze(now);
    EXPECT_TRUE(job.ok()) << job.status();
    EXPECT_EQ(job->freeze_step(), 30);  // every lease ends at 30
    gate.Release();
  });
  EXPECT_EQ(CheckAgreement(runs, 80), 30);
}

TEST_F(SwitchTest, OperatorFreezeNowWhileWorkersRun) {
  Start(TestJobConfig(4, 150, 5, 1000));
  Scenario scenario;
  int64_t answered = -1;
  std::vector<WorkerRun> runs = RunJob(scenario, [&] {
    WaitForJob([](const v1::JobStatus& job) { return job.step() >= 20; });
    v1::FreezeRequest now;
    now.set_now(true);
    absl::StatusOr<v1::JobStatus> job = t_.client->Freeze(now);
    ASSERT_TRUE(job.ok()) << job.status();
    answered = job->freeze_step();
  });
  const int64_t freeze = CheckAgreement(runs, 150);
  EXPECT_EQ(freeze, answered);
  EXPECT_GE(freeze, 20);
}

TEST_F(SwitchTest, OperatorFreezeAtStepOverRest) {
  Start(TestJobConfig(3, 80, 5, 1000));
  Gate gate(20, 3);
  Scenario scenario{3};
  scenario.gate = &gate;
  std::vector<WorkerRun> runs = RunJob(scenario, [&] {
    gate.WaitForAll();
    const std::string rest = t_.server->rest_address();
    httplib::Client http(rest.substr(0, rest.rfind(':')),
                         std::stoi(rest.substr(rest.rfind(':') + 1)));
    auto early = http.Post("/v1/freeze", R"({"atStep": "12"})", "application/json");
    ASSERT_TRUE(early);
    EXPECT_EQ(early->status, 409);  // leases already run through 20
    EXPECT_THAT(early->body, ::testing::HasSubstr("earliest freeze step is 20"));
    auto ok = http.Post("/v1/freeze", R"({"atStep": "44"})", "application/json");
    ASSERT_TRUE(ok);
    EXPECT_EQ(ok->status, 200) << ok->body;
    EXPECT_EQ(t_.client->GetJob({})->freeze_step(), 44);  // seen over gRPC
    gate.Release();
  });
  EXPECT_EQ(CheckAgreement(runs, 80), 44);
}

TEST_F(SwitchTest, OperatorDelaysTheStaticSwitch) {
  Start(TestJobConfig(4, 80, 5, 30));
  Gate gate(25, 4);
  Scenario scenario;
  scenario.gate = &gate;
  std::vector<WorkerRun> runs = RunJob(scenario, [&] {
    gate.WaitForAll();
    v1::DelayFreezeRequest delay;
    delay.set_to_step(52);
    absl::StatusOr<v1::JobStatus> job = t_.client->DelayFreeze(delay);
    EXPECT_TRUE(job.ok()) << job.status();
    gate.Release();
    // Once a lease runs past 52 the switch is fixed.
    WaitForJob([](const v1::JobStatus& j) { return j.max_lease_step() > 52; });
    delay.set_to_step(70);
    EXPECT_EQ(t_.client->DelayFreeze(delay).status().code(), absl::StatusCode::kFailedPrecondition);
  });
  EXPECT_EQ(CheckAgreement(runs, 80), 52);
}

TEST_F(SwitchTest, OperatorStopsTheJobEarly) {
  Start(TestJobConfig(4, 200, 5, 30));
  Gate gate(60, 4);
  Scenario scenario;
  scenario.gate = &gate;
  std::vector<WorkerRun> runs = RunJob(scenario, [&] {
    gate.WaitForAll();
    v1::StopRequest stop;
    stop.set_now(true);
    absl::StatusOr<v1::JobStatus> job = t_.client->Stop(stop);
    EXPECT_TRUE(job.ok()) << job.status();
    EXPECT_EQ(job->stop_after_step(), 60);
    gate.Release();
  });
  EXPECT_EQ(CheckAgreement(runs, 60), 30);
  ExpectFinished();
}

TEST_F(SwitchTest, AdamNeverSwitches) {
  JobConfig config = TestJobConfig(2, 40, 8, 10);
  config.optimizer.kind = OptimizerKind::kAdam;
  Start(config);
  std::vector<WorkerRun> runs = RunJob(Scenario{2});
  EXPECT_EQ(CheckAgreement(runs, 40), 40);  // warmup (full precision) throughout
}

}  // namespace
}  // namespace onebit
