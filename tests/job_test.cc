// Whole jobs as real processes on loopback (coordinator, shards, workers): every worker
// switches at the same step under static, automatic and operator-forced freezing, and ps
// mode gives the same parameters as peer mode when there are as many shards as workers.
#include <sys/stat.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "config/job_config.h"
#include "deploy/local_job.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "tests/test_paths.h"

namespace onebit {
namespace {

using launcher::LocalJob;
using launcher::LocalJobOptions;
using launcher::NumberField;

std::string BinDir() { return testing_paths::RunfilesRoot(); }
std::string TmpDir() { return testing_paths::TestTmpDir(); }

// A small synthetic job over gloo (peer) or shards (ps).
JobConfig SmallJob(int workers, int64_t steps) {
  JobConfig c;
  c.workers = workers;
  c.steps = steps;
  c.micro_batch = 8;
  c.lease_steps = 4;
  c.log_every = 10;
  c.workload.type = "synthetic";
  c.workload.parameters = 5003;
  c.optimizer.lr = 1e-2;
  return c;
}

// Writes the config, runs the job to the end, returns the workers' summaries.
struct Ran {
  std::vector<google::protobuf::Value> summaries;
};

class JobTest : public ::testing::Test {
 protected:
  // Starts `config` under a fresh directory named `name`.
  std::unique_ptr<LocalJob> StartJob(const std::string& name, const JobConfig& config,
                                     std::vector<std::string> worker_flags = {}) {
    const std::string dir = TmpDir() + "/" + name;
    mkdir(dir.c_str(), 0755);
    const std::string path = dir + "/job.json";
    std::ofstream(path) << JobConfigToJson(config);
    LocalJobOptions options;
    options.bin_dir = BinDir();
    options.dir = dir;
    options.config_path = path;
    options.echo_all = false;
    options.worker_flags = std::move(worker_flags);
    options.coordinator_flags = {"--linger=0s"};
    auto job = std::make_unique<LocalJob>(options, config);
    const absl::Status started = job->Start();
    EXPECT_TRUE(started.ok()) << started;
    return job;
  }

  std::vector<google::protobuf::Value> Finish(LocalJob& job) {
    const absl::Status done = job.WaitForWorkers(absl::Seconds(120));
    EXPECT_TRUE(done.ok()) << done;
    auto summaries = job.Summaries();
    job.Stop();
    EXPECT_TRUE(summaries.ok()) << summaries.status();
    return summaries.ok() ? *summaries : std::vector<google::protobuf::Value>{};
  }

  // Every worker's first compression step; they must all agree. Returns it.
  int64_t CommonSwitchStep(const std::vector<google::protobuf::Value>& summaries) {
    EXPECT_FALSE(summaries.empty());
    int64_t first = -2;
    for (const auto& s : summaries) {
      const int64_t step = static_cast<int64_t>(NumberField(s, "first_compression_step"));
      if (first == -2) first = step;
      EXPECT_EQ(step, first) << "workers switched at different steps";
    }
    return first;
  }
};

TEST_F(JobTest, StaticFreezeSwitchesEveryWorkerAtTheSameStep) {
  JobConfig c = SmallJob(3, 30);
  c.optimizer.freeze_step = 13;
  auto job = StartJob("static", c);
  const auto summaries = Finish(*job);
  EXPECT_EQ(CommonSwitchStep(summaries), 14);
  for (const auto& s : summaries) {
    EXPECT_EQ(NumberField(s, "warmup_steps"), 13);
    EXPECT_EQ(NumberField(s, "compression_steps"), 17);
    // The memory a worker reports: its buffers, and the process's peak (Linux: VmHWM).
    EXPECT_GT(NumberField(s, "optimizer_state_bytes"), 0);
    EXPECT_GT(NumberField(s, "exchange_buffer_bytes"), 0);
    EXPECT_GT(NumberField(s, "peak_rss_bytes"),
              NumberField(s, "optimizer_state_bytes") + NumberField(s, "exchange_buffer_bytes"));
  }
}

TEST_F(JobTest, AutomaticFreezeSwitchesEveryWorkerAtTheSameStep) {
  JobConfig c = SmallJob(2, 60);
  c.freeze.mode = "automatic";
  c.freeze.report_interval = 4;
  c.freeze.reports_in_a_row = 2;
  c.freeze.threshold = 0.5;
  c.freeze.min_warmup = 8;
  c.freeze.max_warmup = 40;
  auto job = StartJob("automatic", c);
  const int64_t first = CommonSwitchStep(Finish(*job));
  EXPECT_GT(first, c.freeze.min_warmup);
  EXPECT_LE(first, c.freeze.max_warmup + 1);
}

TEST_F(JobTest, OperatorFreezeSwitchesEveryWorkerAtTheSameStep) {
  JobConfig c = SmallJob(2, 1000000);  // runs until the operator stops it
  c.optimizer.freeze_step = 100000;    // never, unless the operator says so
  auto job = StartJob("forced", c);
  httplib::Client rest("http://" + job->rest_address());
  // Wait until training is under way, then freeze now over REST.
  const absl::Time give_up = absl::Now() + absl::Seconds(60);
  for (;;) {
    auto r = rest.Get("/v1/job");
    ASSERT_TRUE(r) << "REST unreachable";
    auto job_status = launcher::ParseJsonValue(r->body, "/v1/job");
    ASSERT_TRUE(job_status.ok());
    if (NumberField(*job_status, "step") >= 10) break;
    ASSERT_LT(absl::Now(), give_up) << "the job did not start";
    absl::SleepFor(absl::Milliseconds(20));
  }
  auto r = rest.Post("/v1/freeze", R"({"now": true})", "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  auto status = launcher::ParseJsonValue(r->body, "freeze");
  ASSERT_TRUE(status.ok());
  const int64_t freeze = static_cast<int64_t>(NumberField(*status, "freezeStep"));
  EXPECT_GE(freeze, 10);
  // Let a few compression steps run, then stop the job as soon as is safe.
  for (;;) {
    auto j = rest.Get("/v1/job");
    ASSERT_TRUE(j);
    auto js = launcher::ParseJsonValue(j->body, "/v1/job");
    ASSERT_TRUE(js.ok());
    if (NumberField(*js, "step") >= freeze + 10) break;
    ASSERT_LT(absl::Now(), give_up + absl::Seconds(60)) << "no progress after the freeze";
    absl::SleepFor(absl::Milliseconds(20));
  }
  auto stop = rest.Post("/v1/stop", "{}", "application/json");
  ASSERT_TRUE(stop);
  ASSERT_EQ(stop->status, 200) << stop->body;
  EXPECT_EQ(CommonSwitchStep(Finish(*job)), freeze + 1);
}

// For each compressor (onebit.exchange.compressor; the shards learn it from the job config):
// ps and peer mode give the same bits, and the compressed steps send two blocks per step
// (peer: an all-to-all and an all-gather with the one other worker; ps: a push to each of
// the 2 shards) of BlockBytes(compressor, C), C = 5008 / 2.
TEST_F(JobTest, PsAndPeerGiveTheSameParameters) {
  for (const std::string compressor : {"onebit", "int8"}) {
    std::vector<std::string> files;
    for (const std::string mode : {"peer", "ps"}) {
      JobConfig c = SmallJob(2, 24);
      c.optimizer.freeze_step = 8;
      c.exchange.mode = mode;
      c.exchange.servers = mode == "ps" ? 2 : 0;
      c.exchange.compressor = compressor;
      // The shards sum in rank order; peer mode's default sums round a ring.
      if (mode == "peer") c.exchange.warmup_order = "rank";
      const std::string name = mode + "-" + compressor;
      const std::string out = TmpDir() + "/params-" + name + "-{i}.npy";
      auto job = StartJob("agree-" + name, c, {"--params_out=" + out});
      const auto summaries = Finish(*job);
      ASSERT_EQ(summaries.size(), 2u) << name;
      const double block = compressor == "int8" ? 8 + 2504 : 4 + 2504 / 8;
      for (const auto& s : summaries) {
        EXPECT_EQ(NumberField(s, "bytes_sent_compression"), 16 * 2 * block) << name;
      }
      for (int i = 0; i < 2; ++i) {
        files.push_back(TmpDir() + "/params-" + name + "-" + std::to_string(i) + ".npy");
      }
    }
    auto read = [](const std::string& path) {
      std::ifstream in(path, std::ios::binary);
      return std::string(std::istreambuf_iterator<char>(in), {});
    };
    const std::string first = read(files[0]);
    ASSERT_GT(first.size(), 5003u * 4);
    for (const std::string& f : files) EXPECT_EQ(read(f), first) << f << " differs from " << files[0];
  }
}

// 0/1 Adam over shards and 1-bit LAMB over gloo as whole jobs: they finish, every worker
// switches at the same step, and 0/1 Adam's local steps send nothing (its leases carry
// the schedule the workers check theirs against).
TEST_F(JobTest, ZeroOneAdamAndOneBitLambRunAsJobs) {
  {
    JobConfig c = SmallJob(3, 40);
    c.optimizer.kind = OptimizerKind::kZeroOneAdam;
    c.optimizer.var_freeze_step = 12;
    c.optimizer.var_update_scaler = 2;
    c.optimizer.local_step_scaler = 4;
    c.optimizer.local_step_clipper = 4;
    c.exchange.mode = "ps";
    c.exchange.servers = 2;
    auto job = StartJob("zero-one-ps", c);
    const auto summaries = Finish(*job);
    ASSERT_EQ(summaries.size(), 3u);
    EXPECT_EQ(CommonSwitchStep(summaries), 13);
    // Variance stage (12 steps): all communicate. Local steps 13..40: intervals 1 (13-16),
    // 2 (17-20), 4 (21-40): syncs at 13, 14, 15, 16, 18, 20, 24, 28, 32, 36, 40.
    for (const auto& s : summaries) {
      EXPECT_EQ(NumberField(s, "steps_communicated_warmup"), 12);
      EXPECT_EQ(NumberField(s, "steps_communicated_compression"), 11);
    }
  }
  {
    JobConfig c = SmallJob(2, 24);
    c.optimizer.kind = OptimizerKind::kOneBitLamb;
    c.optimizer.freeze_step = 8;
    auto job = StartJob("lamb-peer", c);
    const auto summaries = Finish(*job);
    ASSERT_EQ(summaries.size(), 2u);
    EXPECT_EQ(CommonSwitchStep(summaries), 9);
    for (const auto& s : summaries) EXPECT_EQ(NumberField(s, "steps_communicated_compression"), 16);
  }
}

// A worker whose config gives 0/1 Adam another schedule than the coordinator's stops at
// its first lease with an error that says so, instead of deadlocking at a sync the others
// do not run.
TEST_F(JobTest, AWorkerWithAnotherZeroOneScheduleStopsWithAnError) {
  JobConfig c = SmallJob(2, 30);
  c.optimizer.kind = OptimizerKind::kZeroOneAdam;
  c.optimizer.var_freeze_step = 4;
  c.optimizer.local_step_scaler = 2;
  c.failure.max_restarts = 0;  // no recovery to wait through: the job fails at once
  c.failure.heartbeat_timeout_s = 3;
  JobConfig other = c;
  other.optimizer.local_step_scaler = 3;
  const std::string other_path = TmpDir() + "/other-schedule.json";
  std::ofstream(other_path) << JobConfigToJson(other);
  auto job = StartJob("zero-one-mismatch", c, {"--config=" + other_path});
  const absl::Status done = job->WaitForWorkers(absl::Seconds(60));
  job->Stop();
  EXPECT_FALSE(done.ok());
  std::string logs;
  for (int i = 0; i < 2; ++i) {
    std::ifstream in(TmpDir() + "/zero-one-mismatch/worker-" + std::to_string(i) + ".log");
    logs += std::string(std::istreambuf_iterator<char>(in), {});
  }
  EXPECT_NE(logs.find("in the coordinator's schedule but at"), std::string::npos) << logs;
}

// Adam with the warmup exchange in bf16 (peer mode, 3 workers): half the warmup bytes of
// the fp32 run, every worker ends with the same bits, and it trains as well (the bowl's
// loss within 2% of the fp32 run's after 40 steps, and far below where it started). The
// fp32 run sums round the ring (the default); "fp32-rank" in rank order trains the same.
TEST_F(JobTest, Bf16WarmupHalvesTheBytesAndTrains) {
  std::map<std::string, std::vector<google::protobuf::Value>> runs;
  for (const std::string dtype : {"fp32", "bf16", "fp32-rank"}) {
    JobConfig c = SmallJob(3, 40);
    c.optimizer.kind = OptimizerKind::kAdam;
    c.exchange.warmup_dtype = dtype == "bf16" ? "bf16" : "fp32";
    if (dtype == "fp32-rank") c.exchange.warmup_order = "rank";
    const std::string out = TmpDir() + "/params-" + dtype + "-{i}.npy";
    auto job = StartJob("warmup-" + dtype, c, {"--params_out=" + out});
    runs[dtype] = Finish(*job);
    ASSERT_EQ(runs[dtype].size(), 3u);
    auto read = [](const std::string& path) {
      std::ifstream in(path, std::ios::binary);
      return std::string(std::istreambuf_iterator<char>(in), {});
    };
    const std::string first = read(TmpDir() + "/params-" + dtype + "-0.npy");
    ASSERT_GT(first.size(), 5003u * 4);
    for (int i = 1; i < 3; ++i) {
      EXPECT_EQ(read(TmpDir() + "/params-" + dtype + "-" + std::to_string(i) + ".npy"), first)
          << dtype << ": worker " << i << " differs from worker 0";
    }
  }
  for (int i = 0; i < 3; ++i) {
    // Against the rank-order fp32 run: the ring's chunks go round in another pattern, so
    // a rank's count differs from the rank order's by a chunk's rounding.
    EXPECT_EQ(2 * NumberField(runs["bf16"][i], "bytes_sent_warmup"),
              NumberField(runs["fp32-rank"][i], "bytes_sent_warmup"));
    EXPECT_GT(NumberField(runs["bf16"][i], "bytes_sent_warmup"), 0);
  }
  const double fp32 = NumberField(runs["fp32"][0], "last_loss");
  const double bf16 = NumberField(runs["bf16"][0], "last_loss");
  EXPECT_NEAR(bf16, fp32, 0.02 * fp32);
  EXPECT_NEAR(NumberField(runs["fp32-rank"][0], "last_loss"), fp32, 0.002 * fp32);
  // The job with one worker's first loss as the starting point.
  JobConfig c = SmallJob(1, 1);
  c.optimizer.kind = OptimizerKind::kAdam;
  auto one = StartJob("warmup-start", c);
  const auto start = Finish(*one);
  ASSERT_EQ(start.size(), 1u);
  EXPECT_LT(bf16, 0.5 * NumberField(start[0], "last_loss"));
}

// 2 nodes x 2 workers, hierarchical: the inter-node path over gloo peers, over shards (2
// per slice, as many as nodes), and over shards with the warmup between the nodes' workers
// (exchange.warmup_over workers) gives the same bits; every worker ends the same; only the
// compressed slices cross nodes.
TEST_F(JobTest, HierarchicalOverPeerAndPsGiveTheSameParameters) {
  constexpr int kWorkers = 4, kLocal = 2, kNodes = kWorkers / kLocal;
  std::vector<std::string> files;
  for (const std::string variant : {"peer", "ps", "ps-warmup-workers"}) {
    const std::string inter = variant == "peer" ? "peer" : "ps";
    JobConfig c = SmallJob(kWorkers, 24);
    c.optimizer.freeze_step = 8;
    c.exchange.mode = "hierarchical";
    c.exchange.local_size = kLocal;
    c.exchange.inter = inter;
    c.exchange.servers = inter == "ps" ? kNodes * kLocal : 0;
    if (variant == "ps-warmup-workers") c.exchange.warmup_over = "workers";
    const std::string out = TmpDir() + "/params-h" + variant + "-{i}.npy";
    auto job = StartJob("hierarchical-" + variant, c, {"--params_out=" + out});
    const auto summaries = Finish(*job);
    ASSERT_EQ(summaries.size(), static_cast<size_t>(kWorkers));
    EXPECT_EQ(CommonSwitchStep(summaries), 9);
    for (const auto& s : summaries) {
      const double inter_bytes = NumberField(s, "inter_node_bytes_sent_compression");
      const double all_bytes = NumberField(s, "bytes_sent_compression");
      EXPECT_GT(inter_bytes, 0);
      EXPECT_GT(all_bytes, inter_bytes);  // the fp32 reduce-scatter stays inside the node
      if (inter == "peer") {
        // One all-to-all and one all-gather of the worker's slice blocks with the other node.
        const size_t slice = (5003 / kLocal + 1 + 15) / 16 * 16;  // ceil(n/2) up to 16
        EXPECT_EQ(inter_bytes, 16.0 * 2 * (kNodes - 1) * (4 + slice / kNodes / 8));
      }
    }
    for (int i = 0; i < kWorkers; ++i) {
      files.push_back(TmpDir() + "/params-h" + variant + "-" + std::to_string(i) + ".npy");
    }
  }
  auto read = [](const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  const std::string first = read(files[0]);
  ASSERT_GT(first.size(), 5003u * 4);
  for (const std::string& f : files) EXPECT_EQ(read(f), first) << f << " differs from " << files[0];
}

}  // namespace
}  // namespace onebit
