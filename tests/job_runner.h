// Runs a whole job (deploy/local_job.h) for the checkpoint and recovery tests and collects
// what they compare: worker 0's final parameters (every worker must hold the same), the
// steps it ran in its last incarnation, the coordinator's log, and the restarts.
#ifndef ONEBIT_TESTS_JOB_RUNNER_H_
#define ONEBIT_TESTS_JOB_RUNNER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "config/job_config.h"
#include "deploy/local_job.h"

namespace onebit::testing_jobs {

struct JobRun {
  std::string params;      // worker 0's final parameters (.npy bytes)
  int64_t steps_run = 0;   // steps worker 0 ran in the process that finished
  // Worker 0's summary: the job's recoveries and the step each resumed after.
  int64_t recoveries = -1;
  std::vector<int64_t> resumed_after;
  std::string coordinator_log;
  std::map<std::string, int> restarts;
  absl::Status status;     // WaitForWorkers
  bool SameParams(const JobRun& o) const { return !params.empty() && params == o.params; }
};

struct RunOptions {
  // Wait for the manifest of this step (0: none) before stopping every process.
  int64_t wait_for_checkpoint = 0;
  std::map<int, std::vector<std::string>> flags_of_worker;
  std::map<int, std::vector<std::string>> flags_of_server;
  std::vector<std::string> coordinator_flags;
  // Called with the running job after the checks above, before it is stopped.
  std::function<void(launcher::LocalJob&)> before_stop;
};

// Runs `config` under TEST_TMPDIR/name. Test expectations (gtest) on the way: the job
// completes, every worker ends with the same parameters.
JobRun RunJob(const std::string& name, const JobConfig& config, const RunOptions& options = {});

// A small synthetic job: `workers` workers, `mode` peer or ps (2 shards), checkpoints every
// 10 steps into `checkpoint_dir` (none if empty), fast failure detection for tests.
JobConfig SmallJob(const std::string& mode, int workers, int64_t steps, int64_t freeze_step,
                   const std::string& checkpoint_dir);

std::string ReadAll(const std::string& path);
std::string ManifestPath(const std::string& checkpoint_dir, int64_t step);

}  // namespace onebit::testing_jobs

#endif  // ONEBIT_TESTS_JOB_RUNNER_H_
