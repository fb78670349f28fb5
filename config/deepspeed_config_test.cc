// DeepSpeed compatibility of the job config: the seed tutorials' configs as they are, every
// optimizer type's params, the batch rule, precision, top-level keys and their notices.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "config/job_config.h"
#include "config/seed_configs_test.h"
#include "gtest/gtest.h"

namespace onebit {
namespace {

using namespace seed_configs;  // NOLINT: the kSeed constants

// True when some notice starts with `prefix`.
bool HasNotice(const JobConfig& c, const std::string& prefix) {
  return std::any_of(c.notices.begin(), c.notices.end(),
                     [&](const std::string& n) { return n.rfind(prefix, 0) == 0; });
}

// Parses, and checks that the printed config parses to the same config.
JobConfig MustParse(const std::string& json) {
  auto c = ParseJobConfig(json);
  EXPECT_TRUE(c.ok()) << c.status() << "\n" << json;
  if (!c.ok()) return JobConfig{};
  auto again = ParseJobConfig(JobConfigToJson(*c));
  EXPECT_TRUE(again.ok()) << again.status() << "\n" << JobConfigToJson(*c);
  if (again.ok()) {
    EXPECT_EQ(JobConfigToJson(*again), JobConfigToJson(*c));
  }
  return *c;
}

TEST(SeedConfigsTest, OneBitAdamTutorialBertConfig) {
  // Has a trailing comma after "enabled": true.
  const JobConfig c = MustParse(kSeed000_1);
  EXPECT_EQ(c.optimizer.kind, OptimizerKind::kOneBitAdam);
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 4e-4);
  EXPECT_EQ(c.optimizer.freeze_step, 23000);
  EXPECT_EQ(c.optimizer.comm_backend_name, "nccl");
  EXPECT_EQ(c.device, "cuda");
  EXPECT_TRUE(c.precision.fp16);
  EXPECT_EQ(c.precision.initial_scale_power, 16);
  // No onebit block: one worker, so accumulation makes up the batch.
  EXPECT_EQ(c.workers, 1);
  EXPECT_EQ(TrainBatchSize(c), 4096);
  EXPECT_EQ(c.micro_batch, 16);
  EXPECT_EQ(c.gradient_accumulation_steps, 256);
  EXPECT_EQ(c.optimizer.beta1, 0.9);  // defaults where the seed says nothing
  EXPECT_EQ(c.optimizer.eps, 1e-8);
  EXPECT_FALSE(c.optimizer.bias_correction);
  EXPECT_TRUE(HasNotice(c, "optimizer.params.cuda_aware: accepted, no effect"));
  EXPECT_TRUE(HasNotice(c, "onebit.device: not given; cuda"));
  EXPECT_TRUE(HasNotice(c, "gradient_accumulation_steps: not given; 256"));
  EXPECT_TRUE(HasNotice(c, "(config): trailing commas accepted"));
  EXPECT_EQ(c.notices.size(), 4u) << ::testing::PrintToString(c.notices);
  EXPECT_TRUE(std::is_sorted(c.notices.begin(), c.notices.end()));
}

TEST(SeedConfigsTest, OneBitAdamTutorialPretrainingConfig) {
  const JobConfig c = MustParse(kSeed000_2);
  EXPECT_DOUBLE_EQ(c.optimizer.weight_decay, 0.01);
  EXPECT_FALSE(c.optimizer.bias_correction);
  EXPECT_DOUBLE_EQ(c.gradient_clipping, 1.0);
  EXPECT_TRUE(c.precision.fp16);
  EXPECT_EQ(c.precision.loss_scale, 0);
  EXPECT_EQ(c.precision.initial_scale_power, 16);
  EXPECT_TRUE(HasNotice(c, "steps_per_print: accepted, no effect"));
  EXPECT_TRUE(HasNotice(c, "prescale_gradients: accepted, no effect"));
}

TEST(SeedConfigsTest, GuideOneBitAdamWithZero) {
  const JobConfig c = MustParse(kSeed003_1);
  EXPECT_EQ(TrainBatchSize(c), 256);
  EXPECT_EQ(c.micro_batch, 256);  // only train_batch_size: accumulation 1
  EXPECT_EQ(c.gradient_accumulation_steps, 1);
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 1e-4);
  EXPECT_EQ(c.optimizer.beta2, 0.999);
  EXPECT_EQ(c.optimizer.freeze_step, 400);
  EXPECT_FALSE(c.exchange.shard_state);  // one worker, peer mode
  EXPECT_TRUE(HasNotice(c, "zero_optimization: stage 2 accepted, no effect in onebit (every "
                           "worker keeps the whole optimizer state: onebit.exchange.shard_state "
                           "shards it in mode hierarchical only, not peer)"));
}

TEST(SeedConfigsTest, GuideMinimal) {
  const JobConfig c = MustParse(kSeed003_2);
  EXPECT_EQ(c.optimizer.freeze_step, 1000);
  EXPECT_EQ(c.device, "cpu");
  EXPECT_TRUE(c.notices.empty()) << ::testing::PrintToString(c.notices);
}

TEST(SeedConfigsTest, GuideOneBitLamb) {
  const JobConfig c = MustParse(kSeed003_3);
  EXPECT_EQ(c.optimizer.kind, OptimizerKind::kOneBitLamb);
  EXPECT_DOUBLE_EQ(c.optimizer.max_coeff, 0.3);
  EXPECT_DOUBLE_EQ(c.optimizer.min_coeff, 0.01);
  EXPECT_EQ(c.optimizer.coeff_beta, 0.9);  // defaults
  EXPECT_EQ(c.optimizer.factor_max, 4.0);
  EXPECT_EQ(c.optimizer.factor_min, 0.5);
  EXPECT_EQ(c.optimizer.factor_threshold, 0.1);
  EXPECT_TRUE(c.optimizer.bias_correction);
  EXPECT_EQ(c.optimizer.freeze_step, 1000);
  // All three batch keys and no onebit.workers: 65536 / (256 * 32) = 8 workers.
  EXPECT_EQ(c.workers, 8);
  EXPECT_EQ(c.gradient_accumulation_steps, 32);
  EXPECT_TRUE(HasNotice(c, "onebit.workers: not given; 8"));
  EXPECT_TRUE(HasNotice(c, "optimizer.params.bias_correction: true"));
}

TEST(SeedConfigsTest, GuideCompressionTrainingIsRefused) {
  auto c = ParseJobConfig(kSeed003_4);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(std::string(c.status().message()).find("compression_training: not supported"),
            std::string::npos)
      << c.status();
}

TEST(SeedConfigsTest, GuideHuggingFaceAuto) {
  const JobConfig c = MustParse(kSeed003_5);
  EXPECT_EQ(c.micro_batch, 64);  // onebit's default: "auto" is not given
  EXPECT_EQ(TrainBatchSize(c), 64);
  EXPECT_TRUE(HasNotice(c, "train_batch_size: \"auto\""));
  EXPECT_TRUE(HasNotice(c, "train_micro_batch_size_per_gpu: \"auto\""));
}

TEST(SeedConfigsTest, GuideProductionOneBitAdam) {
  const JobConfig c = MustParse(kSeed003_6);
  EXPECT_EQ(c.workers, 8);  // 512 / (8 * 8)
  EXPECT_EQ(c.micro_batch, 8);
  EXPECT_EQ(c.gradient_accumulation_steps, 8);
  EXPECT_DOUBLE_EQ(c.gradient_clipping, 1.0);
  EXPECT_EQ(c.precision.loss_scale_window, 1000);
  EXPECT_EQ(c.optimizer.freeze_step, 2000);
  EXPECT_EQ(c.scheduler.type, "WarmupDecayLR");
  EXPECT_EQ(c.scheduler.warmup_min_lr, 0);
  EXPECT_DOUBLE_EQ(c.scheduler.warmup_max_lr, 1e-4);
  EXPECT_EQ(c.scheduler.warmup_num_steps, 2000);
  EXPECT_EQ(c.scheduler.total_num_steps, 100000);
  EXPECT_EQ(c.scheduler.warmup_type, "log");
}

TEST(SeedConfigsTest, GuideMultiNodeOneBitLamb) {
  const JobConfig c = MustParse(kSeed003_7);
  EXPECT_TRUE(c.precision.bf16);
  EXPECT_FALSE(c.precision.fp16);
  EXPECT_EQ(c.workers, 8);  // 32768 / (128 * 32)
  EXPECT_EQ(c.optimizer.kind, OptimizerKind::kOneBitLamb);
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 5e-4);
  EXPECT_TRUE(HasNotice(c, "zero_optimization: stage 1"));
}

TEST(SeedConfigsTest, GuideSnippetsWithComments) {
  EXPECT_EQ(MustParse(kSeed003_8).optimizer.freeze_step, 2000);
  EXPECT_EQ(MustParse(kSeed003_9).optimizer.kind, OptimizerKind::kOneBitAdam);
  EXPECT_TRUE(MustParse(kSeed003_10).precision.bf16);
  EXPECT_EQ(MustParse(kSeed003_11).optimizer.freeze_step, 5000);
  EXPECT_DOUBLE_EQ(MustParse(kSeed003_12).optimizer.lr, 5e-5);
  const JobConfig profiling = MustParse(kSeed003_13);
  EXPECT_TRUE(HasNotice(profiling, "wall_clock_breakdown: accepted, no effect"));
  EXPECT_TRUE(HasNotice(profiling, "(config): comments accepted"));
  const JobConfig lamb = MustParse(kSeed003_14);
  EXPECT_DOUBLE_EQ(lamb.optimizer.max_coeff, 0.5);
  EXPECT_DOUBLE_EQ(lamb.optimizer.min_coeff, 0.005);
  const JobConfig big = MustParse(kSeed003_15);
  EXPECT_EQ(TrainBatchSize(big), 65536);
  EXPECT_EQ(big.micro_batch, 65536);
  EXPECT_DOUBLE_EQ(big.optimizer.lr, 1e-3);
}

TEST(DeepSpeedConfigTest, ZeroOneAdamParams) {
  const JobConfig c = MustParse(R"({"optimizer": {"type": "ZeroOneAdam", "params": {
      "lr": 1e-3, "betas": [0.8, 0.99], "eps": 1e-6, "weight_decay": 0.1, "bias_correction": false,
      "var_freeze_step": 40, "var_update_scaler": 8, "local_step_scaler": 100,
      "local_step_clipper": 4, "cuda_aware": false, "comm_backend_name": "gloo",
      "eps_inside_sqrt": false, "amsgrad": false}}})");
  EXPECT_EQ(c.optimizer.kind, OptimizerKind::kZeroOneAdam);
  EXPECT_EQ(c.optimizer.var_freeze_step, 40);
  EXPECT_EQ(c.optimizer.var_update_scaler, 8);
  EXPECT_EQ(c.optimizer.local_step_scaler, 100);
  EXPECT_EQ(c.optimizer.local_step_clipper, 4);
  EXPECT_DOUBLE_EQ(c.optimizer.beta1, 0.8);
  EXPECT_EQ(c.notices, std::vector<std::string>{
                           "optimizer.params.cuda_aware: accepted, no effect in onebit (it steers "
                           "DeepSpeed's MPI backend; onebit has none)"});
  const JobConfig defaults = MustParse(R"({"optimizer": {"type": "ZeroOneAdam"}})");
  EXPECT_EQ(defaults.optimizer.var_freeze_step, 100000);
  EXPECT_EQ(defaults.optimizer.var_update_scaler, 16);
  EXPECT_EQ(defaults.optimizer.local_step_scaler, 32678);
  EXPECT_EQ(defaults.optimizer.local_step_clipper, 16);
}

TEST(DeepSpeedConfigTest, OneBitLambParamsRoundTrip) {
  const JobConfig c = MustParse(R"({"optimizer": {"type": "OneBitLamb", "params": {
      "freeze_step": 7, "max_coeff": 2.5, "min_coeff": 0.5, "coeff_beta": 0.8, "factor_max": 3,
      "factor_min": 0.25, "factor_threshold": 0.2}}})");
  EXPECT_EQ(c.optimizer.freeze_step, 7);
  EXPECT_DOUBLE_EQ(c.optimizer.max_coeff, 2.5);
  EXPECT_DOUBLE_EQ(c.optimizer.min_coeff, 0.5);
  EXPECT_DOUBLE_EQ(c.optimizer.coeff_beta, 0.8);
  EXPECT_DOUBLE_EQ(c.optimizer.factor_max, 3);
  EXPECT_DOUBLE_EQ(c.optimizer.factor_min, 0.25);
  EXPECT_DOUBLE_EQ(c.optimizer.factor_threshold, 0.2);
  auto again = ParseJobConfig(JobConfigToJson(c));
  ASSERT_TRUE(again.ok());
  EXPECT_DOUBLE_EQ(again->optimizer.factor_threshold, 0.2);
  EXPECT_DOUBLE_EQ(again->optimizer.coeff_beta, 0.8);
}

TEST(DeepSpeedConfigTest, TypeNamesAreCaseInsensitive) {
  EXPECT_EQ(MustParse(R"({"optimizer": {"type": "onebitadam"}})").optimizer.kind, OptimizerKind::kOneBitAdam);
  EXPECT_EQ(MustParse(R"({"optimizer": {"type": "ZEROONEADAM"}})").optimizer.kind, OptimizerKind::kZeroOneAdam);
  EXPECT_EQ(MustParse(R"({"optimizer": {"type": "OnebitLamb"}})").optimizer.kind, OptimizerKind::kOneBitLamb);
  EXPECT_EQ(MustParse(R"({"optimizer": {"type": "AdamW"}})").optimizer.kind, OptimizerKind::kAdam);
  // The type is read first whatever the order of the keys.
  EXPECT_EQ(MustParse(R"({"optimizer": {"params": {"max_coeff": 1}, "type": "OneBitLamb"}})")
                .optimizer.max_coeff, 1);
}

TEST(DeepSpeedConfigTest, AdamTakesOneBitKeysAndDeepSpeedsAdamKeys) {
  const JobConfig c = MustParse(R"({"optimizer": {"type": "Adam", "params": {
      "freeze_step": 10, "adam_w_mode": true, "torch_adam": false, "amsgrad": false}}})");
  EXPECT_EQ(c.optimizer.kind, OptimizerKind::kAdam);
  EXPECT_TRUE(HasNotice(c, "optimizer.params.torch_adam: accepted, no effect"));
  // DeepSpeed's Adam applies bias correction: no notice that results differ.
  const JobConfig corrected = MustParse(R"({"optimizer": {"type": "Adam", "legacy_fusion": false,
      "params": {"bias_correction": true}}})");
  EXPECT_TRUE(corrected.optimizer.bias_correction);
  EXPECT_EQ(corrected.notices, std::vector<std::string>{
      "optimizer.legacy_fusion: accepted, no effect in onebit (DeepSpeed's fused-kernel choice)"});
}

TEST(DeepSpeedConfigTest, CommBackendMpiRunsOnGloo) {
  const JobConfig c = MustParse(R"({"optimizer": {"params": {"comm_backend_name": "mpi",
                                                              "cuda_aware": true}}})");
  EXPECT_EQ(c.optimizer.comm_backend_name, "gloo");
  EXPECT_EQ(c.device, "cpu");
  EXPECT_TRUE(HasNotice(c, "optimizer.params.comm_backend_name: mpi"));
  // An explicit device wins over nccl's implication only by being an error.
  EXPECT_EQ(MustParse(R"({"optimizer": {"params": {"comm_backend_name": "nccl"}},
                          "onebit": {"device": "cuda"}})").notices.size(), 0u);
}

TEST(DeepSpeedConfigTest, BatchRule) {
  struct Case {
    const char* json;
    int64_t train_batch, micro, accumulation;
    int workers;
  };
  const Case cases[] = {
      {R"({})", 64, 64, 1, 1},
      {R"({"onebit": {"workers": 4}})", 256, 64, 1, 4},
      {R"({"train_micro_batch_size_per_gpu": 8, "onebit": {"workers": 4}})", 32, 8, 1, 4},
      {R"({"train_batch_size": 96, "onebit": {"workers": 4}})", 96, 24, 1, 4},
      {R"({"train_batch_size": 96, "train_micro_batch_size_per_gpu": 8,
           "onebit": {"workers": 4}})", 96, 8, 3, 4},
      {R"({"train_batch_size": 96, "gradient_accumulation_steps": 3,
           "onebit": {"workers": 4}})", 96, 8, 3, 4},
      {R"({"train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 3,
           "onebit": {"workers": 4}})", 96, 8, 3, 4},
      {R"({"gradient_accumulation_steps": 2, "onebit": {"workers": 2}})", 256, 64, 2, 2},
      {R"({"train_batch_size": 96, "train_micro_batch_size_per_gpu": 8,
           "gradient_accumulation_steps": 3, "onebit": {"workers": 4}})", 96, 8, 3, 4},
      {R"({"train_batch_size": 96, "train_micro_batch_size_per_gpu": 8,
           "gradient_accumulation_steps": 3})", 96, 8, 3, 4},
  };
  for (const Case& k : cases) {
    const JobConfig c = MustParse(k.json);
    EXPECT_EQ(TrainBatchSize(c), k.train_batch) << k.json;
    EXPECT_EQ(c.micro_batch, k.micro) << k.json;
    EXPECT_EQ(c.gradient_accumulation_steps, k.accumulation) << k.json;
    EXPECT_EQ(c.workers, k.workers) << k.json;
  }
}

TEST(DeepSpeedConfigTest, NoticesOfTopLevelKeys) {
  const JobConfig c = MustParse(R"({"wall_clock_breakdown": true, "steps_per_print": 10,
      "zero_optimization": {"stage": 0}, "amp": {"enabled": false},
      "fp16": {"enabled": true, "auto_cast": true}, "tensorboard": {"enabled": true}})");
  EXPECT_EQ(c.notices.size(), 7u) << ::testing::PrintToString(c.notices);
  EXPECT_TRUE(HasNotice(c, "amp: disabled"));
  // DeepSpeed's amp is off unless "enabled" says otherwise.
  EXPECT_TRUE(HasNotice(MustParse(R"({"amp": {"opt_level": "O1"}})"), "amp: disabled"));
  EXPECT_TRUE(HasNotice(c, "fp16.auto_cast: accepted, no effect"));
  EXPECT_TRUE(HasNotice(c, "fp16.enabled: the CPU workloads compute in fp32"));
  EXPECT_TRUE(HasNotice(c, "tensorboard: accepted, no effect"));
  // The same notices for the same config every time, sorted.
  auto again = ParseJobConfig(R"({"tensorboard": {"enabled": true}, "wall_clock_breakdown": true,
      "amp": {"enabled": false}, "zero_optimization": {"stage": 0}, "steps_per_print": 10,
      "fp16": {"auto_cast": true, "enabled": true}})");
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->notices, c.notices);
}

// ZeRO stage 1 or 2 is onebit.exchange.shard_state where it applies (hierarchical,
// local_size >= 2, not 0/1 Adam, the key not given); elsewhere a notice says why it does
// nothing. The printed config keeps what the stage decided.
TEST(DeepSpeedConfigTest, ZeroStageShardsTheStateInsideNodes) {
  const auto config = [](const std::string& zero, const std::string& type,
                         const std::string& exchange) {
    return absl::StrCat(R"({"zero_optimization": )", zero, R"(, "optimizer": {"type": ")", type,
                        R"("}, "onebit": {"workers": 4, "exchange": )", exchange, "}}");
  };
  const std::string hier = R"({"mode": "hierarchical", "local_size": 2})";
  const std::string sharded =
      ": the optimizer state is sharded across each node's workers "
      "(onebit.exchange.shard_state true)";
  for (const char* type : {"OneBitAdam", "OneBitLamb"}) {
    JobConfig c = MustParse(config(R"({"stage": 1})", type, hier));
    EXPECT_TRUE(c.exchange.shard_state) << type;
    EXPECT_EQ(c.notices, std::vector<std::string>{"zero_optimization: stage 1" + sharded});
    c = MustParse(config(R"({"stage": 2, "overlap_comm": true})", type, hier));
    EXPECT_TRUE(c.exchange.shard_state) << type;
    EXPECT_EQ(c.notices,
              std::vector<std::string>{
                  "zero_optimization: stage 2" + sharded +
                  "; each worker's own gradient stays whole, since backward writes it, and the "
                  "reduced gradient is its slice"});
  }
  // Given true, the stage agrees and says so.
  JobConfig c = MustParse(config(R"({"stage": 1})", "OneBitAdam",
                                 R"({"mode": "hierarchical", "local_size": 2,
                                     "shard_state": true})"));
  EXPECT_TRUE(c.exchange.shard_state);
  EXPECT_EQ(c.notices, std::vector<std::string>{"zero_optimization: stage 1" + sharded});

  // Elsewhere: no effect, and the notice says why.
  const std::string no_effect =
      "accepted, no effect in onebit (every worker keeps the whole optimizer state: ";
  const struct {
    std::string zero, type, exchange, notice;
  } unsharded[] = {
      {R"({"stage": 1})", "OneBitAdam", R"({"mode": "peer"})",
       "zero_optimization: stage 1 " + no_effect +
           "onebit.exchange.shard_state shards it in mode hierarchical only, not peer)"},
      {R"({"stage": 2})", "OneBitAdam", R"({"mode": "ps", "servers": 2})",
       "zero_optimization: stage 2 " + no_effect +
           "onebit.exchange.shard_state shards it in mode hierarchical only, not ps)"},
      {R"({"stage": 1})", "OneBitAdam", R"({"mode": "hierarchical", "local_size": 1})",
       "zero_optimization: stage 1 " + no_effect +
           "onebit.exchange.local_size is 1, so a node has no other worker to share it with)"},
      {R"({"stage": 1})", "ZeroOneAdam", hier,
       "zero_optimization: stage 1 " + no_effect +
           "0/1 Adam's local steps keep each worker's own parameters and momentum "
           "(docs/algorithms.md, \"Local steps\"), so a node has no state to share)"},
      {R"({"stage": 2})", "OneBitLamb",
       R"({"mode": "hierarchical", "local_size": 2, "shard_state": false})",
       "zero_optimization: stage 2 " + no_effect + "onebit.exchange.shard_state is false)"},
      {R"({"stage": 0})", "OneBitAdam", hier,
       "zero_optimization: stage 0 accepted, no effect in onebit (onebit.exchange.shard_state "
       "says whether the optimizer state is sharded)"},
      {"{}", "OneBitAdam", hier,
       "zero_optimization: stage 0 accepted, no effect in onebit (onebit.exchange.shard_state "
       "says whether the optimizer state is sharded)"},
  };
  for (const auto& u : unsharded) {
    const std::string json = config(u.zero, u.type, u.exchange);
    c = MustParse(json);
    EXPECT_FALSE(c.exchange.shard_state) << json;
    EXPECT_EQ(c.notices, std::vector<std::string>{u.notice}) << json;
  }
  // Stage 0 leaves a given shard_state as it is; no block, no notice.
  c = MustParse(config(R"({"stage": 0})", "OneBitAdam",
                       R"({"mode": "hierarchical", "local_size": 2, "shard_state": true})"));
  EXPECT_TRUE(c.exchange.shard_state);
  c = MustParse(R"({"onebit": {"workers": 4, "exchange": {"mode": "hierarchical",
      "local_size": 2}}})");
  EXPECT_FALSE(c.exchange.shard_state);
  EXPECT_TRUE(c.notices.empty()) << ::testing::PrintToString(c.notices);
}

TEST(DeepSpeedConfigTest, PrecisionRoundTrips) {
  const JobConfig c = MustParse(R"({"fp16": {"enabled": true, "loss_scale": 128,
      "initial_scale_power": 12, "loss_scale_window": 500, "hysteresis": 3,
      "consecutive_hysteresis": true, "min_loss_scale": 0.5}, "onebit": {"device": "cuda"}})");
  const PrecisionConfig& p = c.precision;
  EXPECT_TRUE(p.fp16);
  EXPECT_EQ(p.loss_scale, 128);
  EXPECT_EQ(p.initial_scale_power, 12);
  EXPECT_EQ(p.loss_scale_window, 500);
  EXPECT_EQ(p.hysteresis, 3);
  EXPECT_TRUE(p.consecutive_hysteresis);
  EXPECT_EQ(p.min_loss_scale, 0.5);
  EXPECT_TRUE(c.notices.empty()) << ::testing::PrintToString(c.notices);
  EXPECT_TRUE(MustParse(R"({"bfloat16": {"enabled": true}})").precision.bf16);
}

// Where fp16's loss scaling runs: the CUDA workloads, and a PyTorch script's (onebit.torch)
// on any device; bf16 there is the script's torch.autocast, so the block has no effect.
TEST(DeepSpeedConfigTest, Fp16ScalesTheLossOfCudaWorkloadsAndOfPyTorchScripts) {
  EXPECT_TRUE(ScalesLoss(MustParse(R"({"fp16": {"enabled": true}, "onebit": {"device": "cuda"}})")));
  const JobConfig cpu = MustParse(R"({"fp16": {"enabled": true}})");
  EXPECT_FALSE(ScalesLoss(cpu));
  EXPECT_TRUE(HasNotice(cpu, "fp16.enabled: the CPU workloads compute in fp32"));
  const JobConfig script =
      MustParse(R"({"fp16": {"enabled": true}, "onebit": {"workload": {"type": "pytorch"}}})");
  EXPECT_TRUE(ScalesLoss(script));
  EXPECT_FALSE(HasNotice(script, "fp16.enabled"));
  const JobConfig bf16 =
      MustParse(R"({"bf16": {"enabled": true}, "onebit": {"workload": {"type": "pytorch"}}})");
  EXPECT_FALSE(ScalesLoss(bf16));
  EXPECT_TRUE(HasNotice(bf16, "bf16.enabled: no effect with workload pytorch"));
  EXPECT_FALSE(ScalesLoss(MustParse(R"({"onebit": {"workload": {"type": "pytorch"}}})")));
}

TEST(DeepSpeedConfigTest, MomentumMaskConfig) {
  const JobConfig c = MustParse(R"({"onebit": {"momentum_mask": {
      "ranges": [[10, 20], [0, 5], [15, 30]], "auto_zero_grad": true}}})");
  const std::vector<std::pair<int64_t, int64_t>> ranges = {{10, 20}, {0, 5}, {15, 30}};
  EXPECT_EQ(c.momentum_mask.ranges, ranges);
  EXPECT_TRUE(c.momentum_mask.auto_zero_grad);
  EXPECT_TRUE(c.momentum_mask.npy.empty());
  const JobConfig npy = MustParse(R"({"onebit": {"momentum_mask": {"npy": "/m/mask \"1\".npy"}}})");
  EXPECT_EQ(npy.momentum_mask.npy, "/m/mask \"1\".npy");
  EXPECT_FALSE(npy.momentum_mask.auto_zero_grad);
  EXPECT_TRUE(MustParse("{}").momentum_mask.ranges.empty());
  // As many ranges as a registration carries, and no more.
  auto with_ranges = [](int count) {
    std::string list;
    for (int i = 0; i < count; ++i) list += (i ? ", [" : "[") + std::to_string(2 * i) + ", " +
                                            std::to_string(2 * i + 1) + "]";
    return ParseJobConfig(R"({"onebit": {"momentum_mask": {"ranges": [)" + list + "]}}}");
  };
  ASSERT_TRUE(with_ranges(kMaxMaskRanges).ok());
  EXPECT_EQ(with_ranges(kMaxMaskRanges)->momentum_mask.ranges.size(), size_t{kMaxMaskRanges});
  const absl::Status many = with_ranges(kMaxMaskRanges + 1).status();
  EXPECT_EQ(many.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(many.message().find("onebit.momentum_mask.ranges: 10001 ranges, more than 10000: "
                                "give a mask of scattered zeros as a .npy"),
            std::string::npos)
      << many;
}

TEST(DeepSpeedConfigTest, EveryNewFieldRoundTrips) {
  JobConfig c = MustParse(R"({"train_batch_size": 96, "train_micro_batch_size_per_gpu": 8,
      "gradient_clipping": 0.5, "onebit": {"workers": 4, "device": "cuda",
        "momentum_mask": {"ranges": [[1, 2]], "auto_zero_grad": true}},
      "optimizer": {"type": "OneBitLamb", "params": {"bias_correction": true, "max_coeff": 3}},
      "scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 0.01, "cycle_max_lr": 0.1,
        "cycle_first_step_size": 50, "cycle_second_step_size": 70, "decay_step_size": 9,
        "decay_lr_rate": 0.5, "cycle_second_stair_count": 0, "cycle_momentum": false,
        "cycle_min_mom": 0.7, "cycle_max_mom": 0.95, "decay_mom_rate": 0.01}},
      "bf16": {"enabled": true}})");
  const JobConfig again = MustParse(JobConfigToJson(c));
  EXPECT_EQ(again.gradient_accumulation_steps, 3);
  EXPECT_EQ(again.gradient_clipping, 0.5);
  EXPECT_TRUE(again.optimizer.bias_correction);
  EXPECT_EQ(again.optimizer.max_coeff, 3);
  EXPECT_TRUE(again.precision.bf16);
  EXPECT_EQ(again.scheduler.cycle_second_step_size, 70);
  EXPECT_EQ(again.scheduler.cycle_second_stair_count, 0);
  EXPECT_EQ(again.scheduler.decay_step_size, 9);
  EXPECT_EQ(again.scheduler.cycle_min_mom, 0.7);
  EXPECT_EQ(again.scheduler.decay_mom_rate, 0.01);
  EXPECT_FALSE(again.scheduler.cycle_momentum);
  EXPECT_TRUE(again.momentum_mask.auto_zero_grad);
  // Derived values are printed explicitly: the printed config derives nothing again.
  EXPECT_FALSE(HasNotice(again, "onebit.device"));
  EXPECT_FALSE(HasNotice(again, "gradient_accumulation_steps"));
  for (const char* type : {"WarmupLR", "WarmupDecayLR", "WarmupCosineLR"}) {
    c.scheduler = SchedulerConfig{};
    c.scheduler.type = type;
    c.scheduler.warmup_type = "linear";
    c.scheduler.total_num_steps = 5000;
    c.scheduler.warmup_min_ratio = 0.25;
    const JobConfig s = MustParse(JobConfigToJson(c));
    EXPECT_EQ(s.scheduler.type, type);
    EXPECT_EQ(s.scheduler.warmup_type, "linear");
    if (std::string(type) != "WarmupLR") EXPECT_EQ(s.scheduler.total_num_steps, 5000);
    if (std::string(type) == "WarmupCosineLR") EXPECT_EQ(s.scheduler.warmup_min_ratio, 0.25);
  }
  c.optimizer = OptimizerConfig{};
  c.optimizer.kind = OptimizerKind::kZeroOneAdam;
  c.optimizer.local_step_clipper = 3;
  EXPECT_EQ(MustParse(JobConfigToJson(c)).optimizer.local_step_clipper, 3);
}

// Found by the fuzzer: -0 printed as "-0" read back as 0 and printed as "0".
TEST(DeepSpeedConfigTest, NegativeZeroRoundTrips) {
  const JobConfig c = MustParse(R"({"optimizer": {"params": {"lr": -0e3, "weight_decay": -0.0}},
                                    "gradient_clipping": -0})");
  EXPECT_FALSE(std::signbit(c.optimizer.lr));
  EXPECT_FALSE(std::signbit(c.gradient_clipping));
}

// Configs built in code (tests, the launcher) print a consistent train_batch_size.
TEST(DeepSpeedConfigTest, ConfigBuiltInCodePrintsAConsistentBatch) {
  JobConfig c;
  c.micro_batch = 8;
  c.workers = 4;
  c.gradient_accumulation_steps = 2;
  const JobConfig again = MustParse(JobConfigToJson(c));
  EXPECT_EQ(TrainBatchSize(again), 64);
  EXPECT_EQ(again.micro_batch, 8);
  EXPECT_EQ(again.gradient_accumulation_steps, 2);
  EXPECT_EQ(again.workers, 4);
}

// Each bad config must fail with INVALID_ARGUMENT and a message containing `path`.
TEST(DeepSpeedConfigTest, RejectsBadConfigsNamingTheKey) {
  const std::pair<const char*, const char*> cases[] = {
      {R"({"optimizer": {"type": "ZeroOneAdam", "params": {"max_coeff": 1}}})",
       "optimizer.params.max_coeff: not a parameter of ZeroOneAdam (OneBitLamb takes it)"},
      {R"({"optimizer": {"type": "ZeroOneAdam", "params": {"freeze_step": 1}}})",
       "optimizer.params.freeze_step: not a parameter of ZeroOneAdam"},
      {R"({"optimizer": {"type": "OneBitAdam", "params": {"var_freeze_step": 1}}})",
       "optimizer.params.var_freeze_step: not a parameter of OneBitAdam (ZeroOneAdam takes it)"},
      {R"({"optimizer": {"type": "OneBitLamb", "params": {"adam_w_mode": true}}})",
       "optimizer.params.adam_w_mode: not a parameter of OneBitLamb (Adam takes it)"},
      {R"({"optimizer": {"type": "OneBitAdam", "params": {"momentum": 0.9}}})",
       "optimizer.params.momentum: unknown key"},
      {R"({"optimizer": {"type": "Lamb"}})", "optimizer.type: must be one of"},
      {R"({"optimizer": {"type": 1}})", "optimizer.type: must be a string"},
      {R"({"optimizer": {"params": {"amsgrad": true}}})", "optimizer.params.amsgrad: true is not"},
      {R"({"optimizer": {"params": {"max_grad_norm": 1.0}}})",
       "optimizer.params.max_grad_norm: not supported as an optimizer parameter"},
      {R"({"optimizer": {"params": {"cuda_aware": "no"}}})", "optimizer.params.cuda_aware"},
      {R"({"optimizer": {"params": {"bias_correction": 1}}})", "optimizer.params.bias_correction"},
      {R"({"optimizer": {"type": "Adam", "params": {"adam_w_mode": false}}})",
       "optimizer.params.adam_w_mode: false"},
      {R"({"optimizer": {"params": {"eps": -1e-8}}})", "optimizer.params.eps"},
      {R"({"optimizer": {"params": {"betas": [1.0, 0.9]}}})", "optimizer.params.betas"},
      {R"({"optimizer": {"params": {"betas": [-0.1, 0.9]}}})", "optimizer.params.betas[0]"},
      {R"({"optimizer": {"type": "ZeroOneAdam", "params": {"var_update_scaler": 0}}})",
       "optimizer.params.var_update_scaler"},
      {R"({"optimizer": {"type": "ZeroOneAdam", "params": {"local_step_scaler": 0}}})",
       "optimizer.params.local_step_scaler"},
      {R"({"optimizer": {"type": "ZeroOneAdam", "params": {"local_step_clipper": 0.5}}})",
       "optimizer.params.local_step_clipper"},
      {R"({"optimizer": {"type": "OneBitLamb", "params": {"min_coeff": 2, "max_coeff": 1}}})",
       "optimizer.params.min_coeff: must be <= max_coeff"},
      {R"({"optimizer": {"type": "OneBitLamb", "params": {"max_coeff": 0}}})",
       "optimizer.params.max_coeff"},
      {R"({"optimizer": {"type": "OneBitLamb", "params": {"factor_min": 5}}})",
       "optimizer.params.factor_min: must be <= factor_max"},
      {R"({"optimizer": {"type": "OneBitLamb", "params": {"factor_min": 0}}})",
       "optimizer.params.factor_min"},
      {R"({"optimizer": {"type": "OneBitLamb", "params": {"coeff_beta": 1}}})",
       "optimizer.params.coeff_beta: must be < 1"},
      {R"({"optimizer": {"type": "OneBitLamb", "params": {"factor_threshold": -0.1}}})",
       "optimizer.params.factor_threshold"},
      {R"({"gradient_clipping": -1})", "gradient_clipping"},
      {R"({"gradient_clipping": "1.0"})", "gradient_clipping: must be a number"},
      {R"({"train_batch_size": 100, "train_micro_batch_size_per_gpu": 8,
           "gradient_accumulation_steps": 3, "onebit": {"workers": 4}})",
       "train_batch_size: must equal train_micro_batch_size_per_gpu * gradient_accumulation_steps"
       " * onebit.workers = 8 * 3 * 4 = 96, got 100"},
      {R"({"train_batch_size": 100, "train_micro_batch_size_per_gpu": 8,
           "gradient_accumulation_steps": 3})",
       "train_batch_size: must be a multiple of train_micro_batch_size_per_gpu * "
       "gradient_accumulation_steps"},
      {R"({"train_batch_size": 100, "train_micro_batch_size_per_gpu": 8,
           "onebit": {"workers": 4}})",
       "train_batch_size: must be a multiple of train_micro_batch_size_per_gpu * onebit.workers"},
      {R"({"train_batch_size": 100, "gradient_accumulation_steps": 3})",
       "train_batch_size: must be a multiple of gradient_accumulation_steps * onebit.workers"},
      {R"({"train_batch_size": 10, "onebit": {"workers": 4}})",
       "train_batch_size: must be a multiple of gradient_accumulation_steps * onebit.workers = 1 * 4"},
      {R"({"train_batch_size": 1099511627776})",
       "train_batch_size: implies train_micro_batch_size_per_gpu"},
      {R"({"train_batch_size": 1048576, "train_micro_batch_size_per_gpu": 1,
           "gradient_accumulation_steps": 1})",
       "train_batch_size: implies onebit.workers"},
      {R"({"gradient_accumulation_steps": 0})", "gradient_accumulation_steps"},
      {R"({"train_batch_size": "big"})", "train_batch_size: must be an integer"},
      {R"({"fp16": {"enabled": true}, "bf16": {"enabled": true}})",
       "fp16.enabled: fp16 and bf16 cannot both be enabled"},
      {R"({"fp16": {"enabled": "yes"}})", "fp16.enabled"},
      {R"({"fp16": {"loss_scale": -1}})", "fp16.loss_scale"},
      {R"({"fp16": {"min_loss_scale": 0}})", "fp16.min_loss_scale"},
      {R"({"fp16": {"loss_scale_window": 0}})", "fp16.loss_scale_window"},
      {R"({"fp16": {"fp16_master_weights_and_grads": true}})",
       "fp16.fp16_master_weights_and_grads: true is not supported"},
      {R"({"fp16": {"enable": true}})", "fp16.enable: unknown key"},
      {R"({"bf16": {"enabled": true, "loss_scale": 1}})", "bf16.loss_scale: unknown key"},
      {R"({"zero_optimization": {"stage": 3}})", "zero_optimization.stage: 3 is not supported"},
      {R"({"zero_optimization": {"stage": 4}})", "zero_optimization.stage"},
      {R"({"amp": {"enabled": true}})", "amp: not supported by onebit"},
      {R"({"elasticity": {"enabled": true}})", "elasticity: not supported"},
      {R"({"sparse_attention": {"mode": "fixed"}})", "sparse_attention: not supported"},
      {R"({"train_iters": 10})", "train_iters: unknown key"},
      {R"({"onebit": {"momentum_mask": {"npy": "m.npy", "ranges": [[0, 1]]}}})",
       "onebit.momentum_mask.ranges: give npy or ranges, not both"},
      {R"({"onebit": {"momentum_mask": {"ranges": [[5, 5]]}}})",
       "onebit.momentum_mask.ranges[0]: begin must be < end"},
      {R"({"onebit": {"momentum_mask": {"ranges": [[5]]}}})", "onebit.momentum_mask.ranges[0]"},
      {R"({"onebit": {"momentum_mask": {"ranges": [[-1, 5]]}}})",
       "onebit.momentum_mask.ranges[0][0]"},
      {R"({"onebit": {"momentum_mask": {"ranges": [[0, 1.5]]}}})",
       "onebit.momentum_mask.ranges[0][1]"},
      {R"({"onebit": {"momentum_mask": {"ranges": {"0": 1}}}})", "onebit.momentum_mask.ranges"},
      {R"({"onebit": {"momentum_mask": {"auto_zero_grad": 1}}})",
       "onebit.momentum_mask.auto_zero_grad"},
      {R"({"onebit": {"momentum_mask": {"file": "m.npy"}}})", "onebit.momentum_mask.file: unknown"},
      {"{\"steps\": 3 /* unterminated", "not valid JSON: a /* comment is not closed"},
      {R"({"steps": 3,, })", "not valid JSON"},
      {R"({, })", "not valid JSON"},
      {R"({"hidden": [, ]})", "not valid JSON"},
  };
  for (const auto& [json, path] : cases) {
    auto parsed = ParseJobConfig(json);
    ASSERT_FALSE(parsed.ok()) << json;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << json;
    EXPECT_NE(std::string(parsed.status().message()).find(path), std::string::npos)
        << json << " -> " << parsed.status().message();
  }
}

TEST(DeepSpeedConfigTest, CommentsAndCommasInsideStringsAreKept) {
  const JobConfig c = MustParse(R"({
    // a comment with "quotes" and a , before }
    "onebit": {"checkpoint": {"dir": "/a//b,}/* not a comment */", "every_steps": 1,},
               "workload": {"data_dir": "C:\\x\" // still the string,]"}}, /* block
    comment */
  })");
  EXPECT_EQ(c.checkpoint.dir, "/a//b,}/* not a comment */");
  EXPECT_EQ(c.workload.data_dir, "C:\\x\" // still the string,]");
  EXPECT_TRUE(HasNotice(c, "(config): comments accepted"));
  EXPECT_TRUE(HasNotice(c, "(config): trailing commas accepted"));
}

}  // namespace
}  // namespace onebit
