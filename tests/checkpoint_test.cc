// Checkpoints of whole jobs as real processes (coordinator, shards, workers on loopback):
// a job stopped after a committed checkpoint and started again continues bit for bit, in
// peer and ps mode, with the switch before or after the checkpoint; a damaged newest
// checkpoint falls back to the previous one; another world size resumes with the error
// buffers reset.
#include <sys/stat.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "config/job_config.h"
#include "deploy/local_job.h"
#include "gtest/gtest.h"
#include "tests/test_paths.h"

namespace onebit {
namespace {

namespace fs = std::filesystem;
using launcher::LocalJob;
using launcher::LocalJobOptions;

std::string TmpDir() { return testing_paths::TestTmpDir(); }

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

JobConfig SmallJob(const std::string& mode, int workers, int64_t steps, int64_t freeze_step,
                   const std::string& checkpoint_dir) {
  JobConfig c;
  c.workers = workers;
  c.steps = steps;
  c.micro_batch = 8;
  c.lease_steps = 4;
  c.log_every = 5;
  c.workload.type = "synthetic";
  c.workload.parameters = 5003;
  c.optimizer.lr = 1e-2;
  c.optimizer.freeze_step = freeze_step;
  c.exchange.mode = mode;
  c.exchange.servers = mode == "ps" ? 2 : 0;
  c.checkpoint.dir = checkpoint_dir;
  c.checkpoint.every_steps = checkpoint_dir.empty() ? 0 : 10;
  return c;
}

struct Ran {
  std::string params;       // worker 0's final parameters (.npy bytes)
  int64_t steps_run = 0;    // steps worker 0 ran in this process
  std::string coordinator_log;
  bool operator==(const Ran& o) const { return params == o.params; }
};

// Runs `config` to the end under TmpDir()/name, waiting for the manifest of
// `wait_for_step` (0: none) before stopping every process.
Ran RunJob(const std::string& name, const JobConfig& config, int64_t wait_for_step = 0) {
  const std::string dir = TmpDir() + "/" + name;
  fs::create_directories(dir);
  const std::string path = dir + "/job.json";
  std::ofstream(path) << JobConfigToJson(config);
  LocalJobOptions options;
  options.bin_dir = testing_paths::RunfilesRoot();
  options.dir = dir;
  options.config_path = path;
  options.echo_all = false;
  const std::string out = dir + "/params-{i}.npy";
  options.worker_flags = {"--params_out=" + out};
  options.coordinator_flags = {"--linger=0s"};
  LocalJob job(options, config);
  absl::Status status = job.Start();
  EXPECT_TRUE(status.ok()) << status;
  status = job.WaitForWorkers(absl::Seconds(120));
  EXPECT_TRUE(status.ok()) << status;
  if (wait_for_step > 0) {
    const std::string manifest =
        absl::StrCat(config.checkpoint.dir, "/step-", std::string(9 - std::to_string(wait_for_step).size(), '0'),
                     wait_for_step, "/MANIFEST.json");
    const absl::Time give_up = absl::Now() + absl::Seconds(30);
    while (!fs::exists(manifest) && absl::Now() < give_up) absl::SleepFor(absl::Milliseconds(20));
    EXPECT_TRUE(fs::exists(manifest)) << manifest;
  }
  absl::StatusOr<std::vector<google::protobuf::Value>> summaries = job.Summaries();
  job.Stop();  // every process goes: SIGTERM, then SIGKILL
  Ran ran;
  ran.params = ReadAll(dir + "/params-0.npy");
  EXPECT_GT(ran.params.size(), 5003u * 4) << name;
  for (int i = 1; i < config.workers; ++i) {
    EXPECT_EQ(ReadAll(absl::StrCat(dir, "/params-", i, ".npy")), ran.params) << name << " worker " << i;
  }
  EXPECT_TRUE(summaries.ok() && !summaries->empty()) << name;
  if (summaries.ok() && !summaries->empty()) {
    ran.steps_run = static_cast<int64_t>(launcher::NumberField((*summaries)[0], "warmup_steps") +
                                         launcher::NumberField((*summaries)[0], "compression_steps"));
  }
  ran.coordinator_log = ReadAll(dir + "/coordinator.log");
  return ran;
}

struct ResumeCase {
  std::string mode;
  int64_t freeze_step;  // 5: switch before the checkpoint; 15: in the resumed half
};

class ResumeTest : public ::testing::TestWithParam<ResumeCase> {};

// 20 steps straight, or 10 + checkpoint + every process stopped + restart + 10: the same
// bits.
TEST_P(ResumeTest, StopAndResumeIsBitIdentical) {
  const ResumeCase& p = GetParam();
  const std::string tag = absl::StrCat(p.mode, "-f", p.freeze_step);
  const Ran straight = RunJob("straight-" + tag, SmallJob(p.mode, 3, 20, p.freeze_step, ""));
  const std::string ckpt = TmpDir() + "/ckpt-" + tag;
  const Ran first = RunJob("first-" + tag, SmallJob(p.mode, 3, 10, p.freeze_step, ckpt), 10);
  ASSERT_TRUE(fs::exists(ckpt + "/step-000000010/MANIFEST.json"));
  ASSERT_TRUE(fs::exists(ckpt + "/step-000000010/worker-00002.part"));
  if (p.mode == "ps") ASSERT_TRUE(fs::exists(ckpt + "/step-000000010/server-00001.part"));
  const Ran resumed = RunJob("second-" + tag, SmallJob(p.mode, 3, 20, p.freeze_step, ckpt), 20);
  EXPECT_EQ(resumed.steps_run, 10) << "the second run must resume, not start over";
  EXPECT_NE(resumed.coordinator_log.find("resuming from the checkpoint of step 10"),
            std::string::npos) << resumed.coordinator_log;
  EXPECT_TRUE(resumed == straight) << "resumed parameters differ from the uninterrupted run";
  // The interrupted run (10 steps) differs from both: the comparison means something.
  EXPECT_FALSE(first == straight);
}

INSTANTIATE_TEST_SUITE_P(Modes, ResumeTest,
                         ::testing::Values(ResumeCase{"peer", 5}, ResumeCase{"peer", 15},
                                           ResumeCase{"ps", 5}, ResumeCase{"ps", 15}),
                         [](const auto& info) {
                           return absl::StrCat(info.param.mode, "_freeze", info.param.freeze_step);
                         });

// The newest checkpoint's part is damaged: the coordinator says so and resumes from the
// one before, which still gives the uninterrupted run's bits.
TEST(CheckpointTest, DamagedNewestCheckpointFallsBackToThePreviousOne) {
  const Ran straight = RunJob("fallback-straight", SmallJob("peer", 2, 20, 5, ""));
  const std::string ckpt = TmpDir() + "/ckpt-fallback";
  RunJob("fallback-first", SmallJob("peer", 2, 20, 5, ckpt), /*wait_for_step=*/20);
  ASSERT_TRUE(fs::exists(ckpt + "/step-000000010/MANIFEST.json"));
  {
    std::fstream part(ckpt + "/step-000000020/worker-00001.part",
                      std::ios::in | std::ios::out | std::ios::binary);
    ASSERT_TRUE(part.good());
    part.seekp(100);
    part.put('\x55');
  }
  // A job of 20 steps that resumes from step 10 runs 11..20 again.
  const Ran second = RunJob("fallback-second", SmallJob("peer", 2, 20, 5, ckpt), 20);
  EXPECT_EQ(second.steps_run, 10);
  EXPECT_TRUE(second == straight);
  const std::string& log = second.coordinator_log;
  EXPECT_NE(log.find("step 20 is damaged"), std::string::npos) << log;
  EXPECT_NE(log.find("resuming from the checkpoint of step 10"), std::string::npos) << log;
}

// Another world size: parameters and optimizer state carry over, the error buffers start
// at zero, and the logs say so.
TEST(CheckpointTest, AnotherWorldSizeResumesWithTheErrorsReset) {
  const std::string ckpt = TmpDir() + "/ckpt-resize";
  RunJob("resize-first", SmallJob("peer", 2, 10, 5, ckpt), /*wait_for_step=*/10);
  const Ran second = RunJob("resize-second", SmallJob("peer", 3, 20, 5, ckpt), 20);
  EXPECT_EQ(second.steps_run, 10);
  const std::string& log = second.coordinator_log;
  EXPECT_NE(log.find("error buffers reset"), std::string::npos) << log;
  EXPECT_NE(log.find("workers 2 -> 3"), std::string::npos) << log;
}

}  // namespace
}  // namespace onebit
