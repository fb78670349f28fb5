#include "tests/job_runner.h"

#include <filesystem>
#include <fstream>
#include <iterator>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "checkpoint/manifest.h"
#include "gtest/gtest.h"
#include "tests/test_paths.h"

namespace onebit::testing_jobs {

namespace fs = std::filesystem;

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::string ManifestPath(const std::string& checkpoint_dir, int64_t step) {
  return checkpoint::JoinPath(checkpoint::JoinPath(checkpoint_dir, checkpoint::StepDirName(step)),
                              checkpoint::kManifestFile);
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
  // Fast detection, so that the recovery tests take seconds.
  c.failure.heartbeat_timeout_s = 2;
  c.failure.gloo_timeout_s = 10;
  c.failure.ps_step_deadline_s = 10;
  c.failure.rejoin_timeout_s = 60;
  c.failure.coordinator_retry_s = 30;
  return c;
}

JobRun RunJob(const std::string& name, const JobConfig& config, const RunOptions& run) {
  const std::string dir = testing_paths::TestTmpDir() + "/" + name;
  fs::create_directories(dir);
  const std::string path = dir + "/job.json";
  std::ofstream(path) << JobConfigToJson(config);
  launcher::LocalJobOptions options;
  options.bin_dir = testing_paths::RunfilesRoot();
  options.dir = dir;
  options.config_path = path;
  options.echo_all = false;
  options.worker_flags = {"--params_out=" + dir + "/params-{i}.npy"};
  options.coordinator_flags = {"--linger=0s"};
  options.coordinator_flags.insert(options.coordinator_flags.end(), run.coordinator_flags.begin(),
                                   run.coordinator_flags.end());
  options.flags_of_worker = run.flags_of_worker;
  options.flags_of_server = run.flags_of_server;
  launcher::LocalJob job(options, config);
  JobRun out;
  out.status = job.Start();
  EXPECT_TRUE(out.status.ok()) << name << ": " << out.status;
  if (out.status.ok()) out.status = job.WaitForWorkers(absl::Seconds(240));
  if (out.status.ok() && run.wait_for_checkpoint > 0) {
    const std::string manifest = ManifestPath(config.checkpoint.dir, run.wait_for_checkpoint);
    const absl::Time give_up = absl::Now() + absl::Seconds(30);
    while (!fs::exists(manifest) && absl::Now() < give_up) absl::SleepFor(absl::Milliseconds(20));
    EXPECT_TRUE(fs::exists(manifest)) << manifest;
  }
  absl::StatusOr<std::vector<google::protobuf::Value>> summaries = job.Summaries();
  if (run.before_stop) run.before_stop(job);
  out.restarts = job.restarts();
  job.Stop();  // every process goes: SIGTERM, then SIGKILL
  out.coordinator_log = ReadAll(dir + "/coordinator.log");
  if (!out.status.ok()) return out;
  out.params = ReadAll(dir + "/params-0.npy");
  EXPECT_GT(out.params.size(), 5003u * 4) << name;
  for (int i = 1; i < config.workers; ++i) {
    EXPECT_EQ(ReadAll(absl::StrCat(dir, "/params-", i, ".npy")), out.params) << name << " worker " << i;
  }
  EXPECT_TRUE(summaries.ok() && !summaries->empty()) << name;
  if (summaries.ok() && !summaries->empty()) {
    const google::protobuf::Value& summary = (*summaries)[0];
    out.steps_run = static_cast<int64_t>(launcher::NumberField(summary, "warmup_steps") +
                                         launcher::NumberField(summary, "compression_steps"));
    out.recoveries = static_cast<int64_t>(launcher::NumberField(summary, "recoveries"));
    out.resumed_after = launcher::IntegerListField(summary, "resumed_after_steps");
  }
  return out;
}

}  // namespace onebit::testing_jobs
