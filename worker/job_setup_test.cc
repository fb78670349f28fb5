// The job config's precision blocks as the worker sees them: fp16 on a CUDA job turns on
// loss scaling with the config's keys and computes in fp16; bf16 computes in bf16 without
// scaling; a CPU job computes in fp32 whatever the config says.
#include "worker/job_setup.h"

#include <string>

#include "gtest/gtest.h"

namespace onebit {
namespace {

JobConfig Parse(const std::string& device, const std::string& precision) {
  const std::string json = R"({
    "train_micro_batch_size_per_gpu": 8, "steps": 10,
    "optimizer": {"type": "OneBitAdam", "params": {"lr": 1e-3, "freeze_step": 5}},
    )" + precision + R"(,
    "onebit": {"workers": 1, "device": ")" + device + R"(",
               "workload": {"type": "synthetic", "parameters": 100}}
  })";
  absl::StatusOr<JobConfig> config = ParseJobConfig(json);
  EXPECT_TRUE(config.ok()) << config.status();
  return config.ok() ? *config : JobConfig();
}

TEST(JobSetupTest, CpuThreadsShareTheMachineAmongItsWorkers) {
  JobConfig config;
  EXPECT_EQ(WorkerCpuThreads(-1, config, 8, nullptr), 8);  // alone: every usable core
  EXPECT_EQ(WorkerCpuThreads(-1, config, 8, "4"), 2);      // 4 workers on 8 cores
  EXPECT_EQ(WorkerCpuThreads(-1, config, 2, "4"), 1);      // never 0
  EXPECT_EQ(WorkerCpuThreads(-1, config, 8, "four"), 8);   // not a number: alone
  EXPECT_EQ(WorkerCpuThreads(-1, config, 8, "0"), 8);
  EXPECT_EQ(WorkerCpuThreads(3, config, 8, "4"), 3);       // the flag
  EXPECT_EQ(WorkerCpuThreads(0, config, 8, "4"), 2);       // the flag's 0: the default
  config.cpu_threads = 5;
  EXPECT_EQ(WorkerCpuThreads(-1, config, 8, "4"), 5);      // the config's
  EXPECT_EQ(WorkerCpuThreads(6, config, 8, "4"), 6);       // the flag over the config
}

TEST(JobSetupTest, Fp16OnCudaScalesTheLossWithTheConfigsKeys) {
  const JobConfig c = Parse("cuda", R"("fp16": {"enabled": true, "initial_scale_power": 12,
      "loss_scale_window": 200, "hysteresis": 3, "consecutive_hysteresis": true,
      "min_loss_scale": 4})");
  EXPECT_EQ(WorkloadPrecision(c), ComputePrecision::kFp16);
  const TrainerOptions t = TrainerOptionsFromConfig(c);
  ASSERT_TRUE(t.loss_scaling.has_value());
  EXPECT_EQ(t.loss_scaling->loss_scale, 0);
  EXPECT_EQ(t.loss_scaling->initial_scale_power, 12);
  EXPECT_EQ(t.loss_scaling->loss_scale_window, 200);
  EXPECT_EQ(t.loss_scaling->hysteresis, 3);
  EXPECT_TRUE(t.loss_scaling->consecutive_hysteresis);
  EXPECT_EQ(t.loss_scaling->min_loss_scale, 4);

  const JobConfig fixed = Parse("cuda", R"("fp16": {"enabled": true, "loss_scale": 128})");
  ASSERT_TRUE(TrainerOptionsFromConfig(fixed).loss_scaling.has_value());
  EXPECT_EQ(TrainerOptionsFromConfig(fixed).loss_scaling->loss_scale, 128);
}

TEST(JobSetupTest, Bf16ComputesInBf16WithoutScaling) {
  const JobConfig c = Parse("cuda", R"("bf16": {"enabled": true})");
  EXPECT_EQ(WorkloadPrecision(c), ComputePrecision::kBf16);
  EXPECT_FALSE(TrainerOptionsFromConfig(c).loss_scaling.has_value());
}

TEST(JobSetupTest, TheCpuComputesInFp32AndScalesNothing) {
  for (const char* block : {R"("fp16": {"enabled": true})", R"("bf16": {"enabled": true})",
                            R"("fp16": {"enabled": false})"}) {
    const JobConfig c = Parse("cpu", block);
    EXPECT_EQ(WorkloadPrecision(c), ComputePrecision::kFp32) << block;
    EXPECT_FALSE(TrainerOptionsFromConfig(c).loss_scaling.has_value()) << block;
  }
  const JobConfig plain = Parse("cuda", R"("fp16": {"enabled": false})");
  EXPECT_EQ(WorkloadPrecision(plain), ComputePrecision::kFp32);
  EXPECT_FALSE(TrainerOptionsFromConfig(plain).loss_scaling.has_value());
}

}  // namespace
}  // namespace onebit
