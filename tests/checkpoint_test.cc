// Checkpoints of whole jobs as real processes (coordinator, shards, workers on loopback):
// a job stopped after a committed checkpoint and started again continues bit for bit, in
// peer and ps mode, with the switch before or after the checkpoint; a damaged newest
// checkpoint falls back to the previous one; another world size resumes with the error
// buffers reset.
#include <sys/stat.h>

#include <cstdlib>
#include <memory>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "config/job_config.h"
#include "common/subprocess.h"
#include "httplib.h"
#include "tests/job_runner.h"
#include "gtest/gtest.h"
#include "tests/test_paths.h"

namespace onebit {
namespace {

namespace fs = std::filesystem;
using testing_jobs::JobRun;
using testing_jobs::ReadAll;
using testing_jobs::RunJob;
using testing_jobs::RunOptions;
using testing_jobs::SmallJob;

std::string TmpDir() { return testing_paths::TestTmpDir(); }

// Waits for the manifest of `step` before stopping every process.
RunOptions WaitFor(int64_t step) {
  RunOptions o;
  o.wait_for_checkpoint = step;
  return o;
}

struct ResumeCase {
  std::string mode;
  int64_t freeze_step;  // 5: switch before the checkpoint; 15: in the resumed half
  bool async = false;   // parts written by a thread while training goes on
};

JobConfig Checkpointed(const ResumeCase& p, int64_t steps, const std::string& ckpt) {
  JobConfig c = SmallJob(p.mode, 3, steps, p.freeze_step, ckpt);
  c.checkpoint.async = p.async;
  return c;
}

class ResumeTest : public ::testing::TestWithParam<ResumeCase> {};

// 20 steps straight, or 10 + checkpoint + every process stopped + restart + 10: the same
// bits.
TEST_P(ResumeTest, StopAndResumeIsBitIdentical) {
  const ResumeCase& p = GetParam();
  const std::string tag = absl::StrCat(p.mode, "-f", p.freeze_step, p.async ? "-async" : "");
  const JobRun straight = RunJob("straight-" + tag, SmallJob(p.mode, 3, 20, p.freeze_step, ""));
  const std::string ckpt = TmpDir() + "/ckpt-" + tag;
  const JobRun first = RunJob("first-" + tag, Checkpointed(p, 10, ckpt), WaitFor(10));
  ASSERT_TRUE(fs::exists(ckpt + "/step-000000010/MANIFEST.json"));
  ASSERT_TRUE(fs::exists(ckpt + "/step-000000010/worker-00002.part"));
  if (p.mode == "ps") {
    ASSERT_TRUE(fs::exists(ckpt + "/step-000000010/server-00001.part"));
  }
  const JobRun resumed = RunJob("second-" + tag, Checkpointed(p, 20, ckpt), WaitFor(20));
  EXPECT_EQ(resumed.steps_run, 10) << "the second run must resume, not start over";
  EXPECT_NE(resumed.coordinator_log.find("resuming from the checkpoint of step 10"),
            std::string::npos) << resumed.coordinator_log;
  EXPECT_TRUE(resumed.SameParams(straight)) << "resumed parameters differ from the uninterrupted run";
  // The interrupted run (10 steps) differs from both: the comparison means something.
  EXPECT_FALSE(first.SameParams(straight));
}

INSTANTIATE_TEST_SUITE_P(Modes, ResumeTest,
                         ::testing::Values(ResumeCase{"peer", 5}, ResumeCase{"peer", 15},
                                           ResumeCase{"ps", 5}, ResumeCase{"ps", 15},
                                           ResumeCase{"peer", 5, /*async=*/true},
                                           ResumeCase{"ps", 15, /*async=*/true}),
                         [](const auto& info) {
                           return absl::StrCat(info.param.mode, "_freeze", info.param.freeze_step,
                                               info.param.async ? "_async" : "");
                         });

// The newest checkpoint's part is damaged: the coordinator says so and resumes from the
// one before, which still gives the uninterrupted run's bits.
TEST(CheckpointTest, DamagedNewestCheckpointFallsBackToThePreviousOne) {
  const JobRun straight = RunJob("fallback-straight", SmallJob("peer", 2, 20, 5, ""));
  const std::string ckpt = TmpDir() + "/ckpt-fallback";
  RunJob("fallback-first", SmallJob("peer", 2, 20, 5, ckpt), WaitFor(20));
  ASSERT_TRUE(fs::exists(ckpt + "/step-000000010/MANIFEST.json"));
  {
    std::fstream part(ckpt + "/step-000000020/worker-00001.part",
                      std::ios::in | std::ios::out | std::ios::binary);
    ASSERT_TRUE(part.good());
    part.seekp(100);
    part.put('\x55');
  }
  // A job of 20 steps that resumes from step 10 runs 11..20 again.
  const JobRun second = RunJob("fallback-second", SmallJob("peer", 2, 20, 5, ckpt), WaitFor(20));
  EXPECT_EQ(second.steps_run, 10);
  EXPECT_TRUE(second.SameParams(straight));
  const std::string& log = second.coordinator_log;
  EXPECT_NE(log.find("step 20 is damaged"), std::string::npos) << log;
  EXPECT_NE(log.find("resuming from the checkpoint of step 10"), std::string::npos) << log;
}

// Another world size: parameters and optimizer state carry over, the error buffers start
// at zero, and the logs say so.
TEST(CheckpointTest, AnotherWorldSizeResumesWithTheErrorsReset) {
  const std::string ckpt = TmpDir() + "/ckpt-resize";
  RunJob("resize-first", SmallJob("peer", 2, 10, 5, ckpt), WaitFor(10));
  const JobRun second = RunJob("resize-second", SmallJob("peer", 3, 20, 5, ckpt), WaitFor(20));
  EXPECT_EQ(second.steps_run, 10);
  const std::string& log = second.coordinator_log;
  EXPECT_NE(log.find("error buffers reset"), std::string::npos) << log;
  EXPECT_NE(log.find("workers 2 -> 3"), std::string::npos) << log;
}

// On demand: onebitctl and REST schedule checkpoints in a running job, list them, and the
// coordinator's metrics show the newest.
TEST(CheckpointTest, OperatorCheckpointsThroughOnebitctlAndRest) {
  const std::string ckpt = TmpDir() + "/ckpt-operator";
  JobConfig config = SmallJob("peer", 2, 1000000, 5, ckpt);  // runs until stopped
  config.checkpoint.every_steps = 0;                          // on demand only
  const std::string dir = TmpDir() + "/operator";
  fs::create_directories(dir);
  std::ofstream(dir + "/job.json") << JobConfigToJson(config);
  launcher::LocalJobOptions options;
  options.bin_dir = testing_paths::RunfilesRoot();
  options.dir = dir;
  options.config_path = dir + "/job.json";
  options.echo_all = false;
  options.coordinator_flags = {"--linger=0s"};
  launcher::LocalJob job(options, config);
  ASSERT_TRUE(job.Start().ok());

  auto onebitctl = [&](const std::vector<std::string>& args) {
    ProcessOptions p;
    p.argv = {testing_paths::Runfile("tools/onebitctl"), "--coordinator=" + job.grpc_address()};
    p.argv.insert(p.argv.end(), args.begin(), args.end());
    p.log_path = dir + "/onebitctl.out";
    fs::remove(p.log_path);
    absl::StatusOr<std::unique_ptr<Process>> proc = Process::Start(p);
    EXPECT_TRUE(proc.ok());
    EXPECT_EQ((*proc)->Wait(absl::Seconds(30)).value_or(-1), 0);
    return ReadAll(p.log_path);
  };
  const std::string scheduled = onebitctl({"checkpoint"});
  const size_t at = scheduled.find("checkpoint scheduled after step ");
  ASSERT_NE(at, std::string::npos) << scheduled;
  const int64_t step = std::atoll(scheduled.c_str() + at + 32);
  ASSERT_GT(step, 0);
  const std::string manifest = testing_jobs::ManifestPath(ckpt, step);
  const absl::Time give_up = absl::Now() + absl::Seconds(60);
  while (!fs::exists(manifest) && absl::Now() < give_up) absl::SleepFor(absl::Milliseconds(20));
  ASSERT_TRUE(fs::exists(manifest)) << manifest;
  EXPECT_NE(onebitctl({"checkpoints"}).find("committed"), std::string::npos);

  const std::string rest = job.rest_address();
  httplib::Client http(rest.substr(0, rest.rfind(':')), std::stoi(rest.substr(rest.rfind(':') + 1)));
  httplib::Result posted = http.Post("/v1/checkpoints", "{}", "application/json");
  ASSERT_TRUE(posted);
  EXPECT_EQ(posted->status, 200) << posted->body;
  EXPECT_NE(posted->body.find("\"reason\":\"operator\""), std::string::npos) << posted->body;
  httplib::Result bad = http.Post("/v1/checkpoints", R"({"atStep": "-3"})", "application/json");
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->status, 400) << bad->body;
  httplib::Result listed = http.Get("/v1/checkpoints");
  ASSERT_TRUE(listed);
  EXPECT_EQ(listed->status, 200);
  EXPECT_NE(listed->body.find(absl::StrCat("\"step\":\"", step, "\"")), std::string::npos)
      << listed->body;
  const std::string metrics = job.metrics_address();
  httplib::Client prom(metrics.substr(0, metrics.rfind(':')),
                       std::stoi(metrics.substr(metrics.rfind(':') + 1)));
  httplib::Result scraped = prom.Get("/metrics");
  ASSERT_TRUE(scraped);
  EXPECT_NE(scraped->body.find("onebit_coordinator_checkpoints_committed_total"), std::string::npos);
  EXPECT_EQ(scraped->body.find("onebit_coordinator_last_checkpoint_step 0\n"), std::string::npos)
      << scraped->body;
  ASSERT_TRUE(http.Post("/v1/stop", "{}", "application/json"));
  EXPECT_TRUE(job.WaitForWorkers(absl::Seconds(60)).ok());
  job.Stop();
}

}  // namespace
}  // namespace onebit
