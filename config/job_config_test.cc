#include "config/job_config.h"
#include "config/model_spec.h"

#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace onebit {
namespace {

constexpr char kFull[] = R"({
  "train_micro_batch_size_per_gpu": 32,
  "train_batch_size": 128,
  "gradient_accumulation_steps": 1,
  "gradient_clipping": 2.5,
  "steps": 300,
  "seed": 7,
  "optimizer": {
    "type": "OneBitAdam",
    "params": {"lr": 0.002, "betas": [0.8, 0.99], "eps": 1e-6, "weight_decay": 0.01,
               "freeze_step": 40, "comm_backend_name": "gloo", "bias_correction": false}
  },
  "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0.0001, "warmup_max_lr": 0.002,
                                               "warmup_num_steps": 30, "warmup_type": "linear"}},
  "fp16": {"enabled": false, "loss_scale": 0, "initial_scale_power": 15},
  "bf16": {"enabled": false},
  "onebit": {
    "workers": 4, "cpu_threads": 3,
    "device": "cpu",
    "exchange": {"mode": "ps", "servers": 2},
    "freeze": {"mode": "automatic", "threshold": 0.02, "reports_in_a_row": 2,
               "report_interval": 5, "min_warmup": 10, "max_warmup": 100},
    "momentum_mask": {"ranges": [[0, 10]], "auto_zero_grad": true},
    "lease_steps": 8,
    "workload": {"type": "fashion_mnist", "hidden": [300, 100], "eval_every": 50},
    "ports": {"coordinator": 5000, "metrics": 0},
    "log_every": 10,
    "checkpoint": {"dir": "/ckpt", "every_steps": 25, "keep": 2, "resume": false, "async": true},
    "failure": {"heartbeat_timeout_s": 2.5, "max_restarts": 1, "gloo_timeout_s": 7}
  }
})";

TEST(JobConfigTest, ParsesEveryKey) {
  auto c = ParseJobConfig(kFull);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->micro_batch, 32);
  EXPECT_EQ(c->steps, 300);
  EXPECT_EQ(c->seed, 7u);
  EXPECT_EQ(c->optimizer.kind, OptimizerKind::kOneBitAdam);
  EXPECT_DOUBLE_EQ(c->optimizer.lr, 0.002);
  EXPECT_DOUBLE_EQ(c->optimizer.beta1, 0.8);
  EXPECT_DOUBLE_EQ(c->optimizer.beta2, 0.99);
  EXPECT_DOUBLE_EQ(c->optimizer.eps, 1e-6);
  EXPECT_DOUBLE_EQ(c->optimizer.weight_decay, 0.01);
  EXPECT_EQ(c->optimizer.freeze_step, 40);
  EXPECT_FALSE(c->optimizer.bias_correction);
  EXPECT_EQ(TrainBatchSize(*c), 128);
  EXPECT_EQ(c->gradient_accumulation_steps, 1);
  EXPECT_DOUBLE_EQ(c->gradient_clipping, 2.5);
  EXPECT_EQ(c->scheduler.type, "WarmupLR");
  EXPECT_DOUBLE_EQ(c->scheduler.warmup_min_lr, 0.0001);
  EXPECT_DOUBLE_EQ(c->scheduler.warmup_max_lr, 0.002);
  EXPECT_EQ(c->scheduler.warmup_num_steps, 30);
  EXPECT_EQ(c->scheduler.warmup_type, "linear");
  EXPECT_FALSE(c->precision.fp16);
  EXPECT_EQ(c->precision.initial_scale_power, 15);
  EXPECT_FALSE(c->precision.bf16);
  EXPECT_EQ(c->momentum_mask.ranges, (std::vector<std::pair<int64_t, int64_t>>{{0, 10}}));
  EXPECT_TRUE(c->momentum_mask.auto_zero_grad);
  EXPECT_TRUE(c->notices.empty()) << ::testing::PrintToString(c->notices);
  EXPECT_EQ(c->workers, 4);
  EXPECT_EQ(c->cpu_threads, 3);
  EXPECT_EQ(c->exchange.mode, "ps");
  EXPECT_EQ(c->exchange.servers, 2);
  EXPECT_EQ(c->freeze.mode, "automatic");
  EXPECT_DOUBLE_EQ(c->freeze.threshold, 0.02);
  EXPECT_EQ(c->freeze.reports_in_a_row, 2);
  EXPECT_EQ(c->freeze.report_interval, 5);
  EXPECT_EQ(c->freeze.min_warmup, 10);
  EXPECT_EQ(c->freeze.max_warmup, 100);
  EXPECT_EQ(c->lease_steps, 8);
  EXPECT_EQ(c->workload.hidden, (std::vector<int>{300, 100}));
  EXPECT_EQ(c->workload.eval_every, 50);
  EXPECT_EQ(c->ports.coordinator, 5000);
  EXPECT_EQ(c->log_every, 10);
  EXPECT_EQ(c->checkpoint.dir, "/ckpt");
  EXPECT_EQ(c->checkpoint.every_steps, 25);
  EXPECT_EQ(c->checkpoint.keep, 2);
  EXPECT_FALSE(c->checkpoint.resume);
  EXPECT_TRUE(c->checkpoint.async);
  EXPECT_DOUBLE_EQ(c->failure.heartbeat_timeout_s, 2.5);
  EXPECT_EQ(c->failure.max_restarts, 1);
  EXPECT_DOUBLE_EQ(c->failure.gloo_timeout_s, 7);
  EXPECT_DOUBLE_EQ(c->failure.rejoin_timeout_s, 300);
}

TEST(JobConfigTest, EmptyObjectGivesDefaults) {
  auto c = ParseJobConfig("{}");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->optimizer.kind, OptimizerKind::kOneBitAdam);
  EXPECT_EQ(c->exchange.mode, "peer");
  EXPECT_EQ(c->exchange.warmup_dtype, "fp32");
  EXPECT_EQ(c->exchange.warmup_order, "auto");
  EXPECT_EQ(EffectiveWarmupOrder(c->exchange), "ring");
  EXPECT_FALSE(c->exchange.overlap);
  EXPECT_EQ(c->exchange.compressor, "onebit");
  EXPECT_EQ(c->workers, 1);
}

TEST(JobConfigTest, ACheckpointDirAloneCheckpointsEveryThousandStepsAndSaysSo) {
  auto alone = ParseJobConfig(R"({"onebit": {"checkpoint": {"dir": "/ckpt"}}})");
  ASSERT_TRUE(alone.ok()) << alone.status();
  EXPECT_EQ(alone->checkpoint.every_steps, kDefaultCheckpointEverySteps);
  EXPECT_EQ(kDefaultCheckpointEverySteps, 1000);
  EXPECT_THAT(alone->notices, testing::Contains(testing::HasSubstr(
                                  "onebit.checkpoint.every_steps: not given with a dir: a "
                                  "checkpoint every 1000 steps")));
  auto on_demand = ParseJobConfig(R"({"onebit": {"checkpoint": {"dir": "/c", "every_steps": 0}}})");
  ASSERT_TRUE(on_demand.ok()) << on_demand.status();
  EXPECT_EQ(on_demand->checkpoint.every_steps, 0);
  EXPECT_THAT(on_demand->notices, testing::Not(testing::Contains(testing::HasSubstr("every_steps"))));
  auto none = ParseJobConfig("{}");
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->checkpoint.every_steps, 0);
  // What the package and the launcher hand on keeps the resolved value.
  auto again = ParseJobConfig(JobConfigToJson(*alone));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->checkpoint.every_steps, 1000);
}

TEST(JobConfigTest, Compressor) {
  for (const std::string compressor : {"onebit", "int8"}) {
    for (const std::string mode : {"peer", "ps"}) {
      auto c = ParseJobConfig(R"({"onebit": {"exchange": {"mode": ")" + mode + R"(", "servers": )" +
                              (mode == "ps" ? "2" : "0") + R"(, "compressor": ")" + compressor +
                              R"("}}})");
      ASSERT_TRUE(c.ok()) << c.status();
      EXPECT_EQ(c->exchange.compressor, compressor);
      auto again = ParseJobConfig(JobConfigToJson(*c));
      ASSERT_TRUE(again.ok()) << again.status();
      EXPECT_EQ(again->exchange.compressor, compressor);
    }
  }
}

// GPU workers may use gloo and the ps shards (staged through the host); NCCL as before.
TEST(JobConfigTest, GpuWorkersOverEveryExchange) {
  for (const char* text : {
           R"({"onebit": {"device": "cuda", "exchange": {"mode": "peer"}}})",
           R"({"onebit": {"device": "cuda", "exchange": {"mode": "ps", "servers": 2}}})",
           R"({"optimizer": {"params": {"comm_backend_name": "nccl"}},
               "onebit": {"device": "cuda", "workers": 4, "exchange": {"mode": "hierarchical",
               "local_size": 2, "inter": "ps", "servers": 2}}})",
           R"({"optimizer": {"params": {"comm_backend_name": "nccl"}},
               "onebit": {"device": "cuda", "workers": 4, "exchange": {"mode": "hierarchical",
               "local_size": 2, "inter_transport": "gloo"}}})",
           R"({"optimizer": {"params": {"comm_backend_name": "nccl"}},
               "onebit": {"device": "cuda", "exchange": {"overlap": true}}})",
           R"({"onebit": {"exchange": {"mode": "ps", "servers": 2, "warmup_over": "workers",
               "overlap": true}}})"}) {
    auto c = ParseJobConfig(text);
    EXPECT_TRUE(c.ok()) << text << ": " << c.status();
  }
}

TEST(JobConfigTest, InterTransport) {
  for (const std::string t : {"auto", "gloo", "nccl"}) {
    auto c = ParseJobConfig(R"({"optimizer": {"params": {"comm_backend_name": "nccl"}},
        "onebit": {"device": "cuda", "workers": 2, "exchange": {
        "mode": "hierarchical", "local_size": 1, "inter_transport": ")" + t + R"("}}})");
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_EQ(c->exchange.inter_transport, t);
    auto again = ParseJobConfig(JobConfigToJson(*c));
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_EQ(again->exchange.inter_transport, t);
  }
  for (const char* bad : {
           R"({"onebit": {"exchange": {"inter_transport": "gloo"}}})",
           R"({"onebit": {"workers": 2, "exchange": {"mode": "hierarchical", "inter": "ps",
               "servers": 1, "warmup_over": "shards", "inter_transport": "gloo"}}})",
           R"({"onebit": {"workers": 2, "exchange": {"mode": "hierarchical",
               "inter_transport": "nccl"}}})",
           R"({"onebit": {"workers": 2, "exchange": {"mode": "hierarchical",
               "inter_transport": "mpi"}}})"}) {
    auto c = ParseJobConfig(bad);
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(c.status().message().find("inter_transport"), absl::string_view::npos) << bad;
  }
}

TEST(JobConfigTest, Overlap) {
  for (const bool on : {true, false}) {
    auto c = ParseJobConfig(std::string(R"({"onebit": {"exchange": {"overlap": )") +
                            (on ? "true" : "false") + "}}}");
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_EQ(c->exchange.overlap, on);
    auto again = ParseJobConfig(JobConfigToJson(*c));
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_EQ(again->exchange.overlap, on);
  }
}

TEST(JobConfigTest, WarmupDtype) {
  for (const std::string dtype : {"fp32", "bf16", "fp16"}) {
    auto c = ParseJobConfig(R"({"onebit": {"exchange": {"warmup_dtype": ")" + dtype + R"("}}})");
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_EQ(c->exchange.warmup_dtype, dtype);
    auto again = ParseJobConfig(JobConfigToJson(*c));
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_EQ(again->exchange.warmup_dtype, dtype);
  }
}

// Sharded optimizer state: hierarchical mode with local_size >= 2, not 0/1 Adam; it
// survives the JSON the launcher and the package hand on.
TEST(JobConfigTest, ShardState) {
  auto plain = ParseJobConfig("{}");
  ASSERT_TRUE(plain.ok());
  EXPECT_FALSE(plain->exchange.shard_state);
  for (const char* type : {"OneBitAdam", "OneBitLamb", "Adam"}) {
    for (const char* inter : {R"("inter": "peer")", R"("inter": "ps", "servers": 2)"}) {
      const std::string json = absl::StrCat(
          R"({"optimizer": {"type": ")", type, R"("}, "onebit": {"workers": 4, "exchange": {
          "mode": "hierarchical", "local_size": 2, )", inter, R"(, "shard_state": true}}})");
      auto c = ParseJobConfig(json);
      ASSERT_TRUE(c.ok()) << json << ": " << c.status();
      EXPECT_TRUE(c->exchange.shard_state) << json;
      EXPECT_TRUE(c->notices.empty()) << ::testing::PrintToString(c->notices);
      auto again = ParseJobConfig(JobConfigToJson(*c));
      ASSERT_TRUE(again.ok()) << again.status();
      EXPECT_TRUE(again->exchange.shard_state) << json;
      EXPECT_EQ(JobConfigToJson(*again), JobConfigToJson(*c));
    }
  }
  // false is accepted anywhere (it is the default).
  for (const char* json : {
           R"({"onebit": {"exchange": {"shard_state": false}}})",
           R"({"optimizer": {"type": "ZeroOneAdam"}, "onebit": {"workers": 4, "exchange": {
               "mode": "hierarchical", "local_size": 2, "shard_state": false}}})"}) {
    auto c = ParseJobConfig(json);
    ASSERT_TRUE(c.ok()) << json << ": " << c.status();
    EXPECT_FALSE(c->exchange.shard_state);
  }
  const struct {
    const char* json;
    const char* error;
  } bad[] = {
      {R"({"onebit": {"exchange": {"shard_state": true}}})",
       "onebit.exchange.shard_state: only applies to mode hierarchical, not peer (it shards the "
       "optimizer state across the workers of each node)"},
      {R"({"onebit": {"workers": 2, "exchange": {"mode": "ps", "servers": 1,
           "shard_state": true}}})",
       "onebit.exchange.shard_state: only applies to mode hierarchical, not ps (it shards the "
       "optimizer state across the workers of each node)"},
      {R"({"onebit": {"workers": 2, "exchange": {"mode": "hierarchical", "shard_state": true}}})",
       "onebit.exchange.shard_state: needs local_size >= 2 (the workers of a node share the "
       "state), got 1"},
      {R"({"optimizer": {"type": "ZeroOneAdam"}, "onebit": {"workers": 4, "exchange": {
           "mode": "hierarchical", "local_size": 2, "shard_state": true}}})",
       "onebit.exchange.shard_state: not with ZeroOneAdam: 0/1 Adam's local steps keep each "
       "worker's own parameters and momentum (docs/algorithms.md, \"Local steps\"), so a node "
       "has no state to share; use OneBitAdam or OneBitLamb, or shard_state false"},
      {R"({"onebit": {"exchange": {"shard_state": 1}}})",
       "onebit.exchange.shard_state: must be true or false"},
  };
  for (const auto& b : bad) {
    auto c = ParseJobConfig(b.json);
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << b.json;
    EXPECT_EQ(c.status().message(), b.error) << b.json;
  }
}

// ps mode's warmup between the workers: the peer warmup's wire and order options apply.
TEST(JobConfigTest, WarmupOver) {
  // Not given: between the workers for the optimizers with one switch (the fast path
  // wherever the shards run), through the shards for the others; given, as given.
  auto c = ParseJobConfig(R"({"onebit": {"exchange": {"mode": "ps", "servers": 2}}})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->exchange.warmup_over, "workers");
  EXPECT_TRUE(WarmupBetweenWorkers(c->exchange));
  for (const char* kind : {"OneBitLamb", "ZeroOneAdam", "Adam"}) {
    c = ParseJobConfig(absl::StrCat(R"({"optimizer": {"type": ")", kind,
                                    R"("}, "onebit": {"exchange": {"mode": "ps", "servers": 2}}})"));
    ASSERT_TRUE(c.ok()) << kind << ": " << c.status();
    EXPECT_EQ(c->exchange.warmup_over, std::string(kind) == "OneBitLamb" ? "workers" : "shards")
        << kind;
  }
  c = ParseJobConfig(R"({"onebit": {"exchange": {"mode": "ps", "servers": 2,
      "warmup_over": "shards"}}})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->exchange.warmup_over, "shards");
  EXPECT_FALSE(WarmupBetweenWorkers(c->exchange));
  c = ParseJobConfig(R"({"onebit": {"workers": 4, "exchange": {"mode": "hierarchical",
      "local_size": 2, "inter": "ps", "servers": 2}}})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(ShardsSkipWarmup(c->exchange));
  EXPECT_EQ(ParseJobConfig("{}")->exchange.warmup_over, "shards");  // peer: no shards
  c = ParseJobConfig(R"({"optimizer": {"type": "OneBitLamb"}, "onebit": {"exchange": {
      "mode": "ps", "servers": 2, "warmup_over": "workers", "warmup_dtype": "bf16"}}})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(WarmupBetweenWorkers(c->exchange));
  auto again = ParseJobConfig(JobConfigToJson(*c));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->exchange.warmup_over, "workers");
  EXPECT_EQ(again->exchange.warmup_dtype, "bf16");
  c = ParseJobConfig(R"({"onebit": {"exchange": {"mode": "ps", "servers": 2,
      "warmup_over": "workers", "warmup_order": "ring"}}})");
  ASSERT_TRUE(c.ok()) << c.status();
  // Hierarchical over shards: the slices' warmup between the nodes, in rank order.
  c = ParseJobConfig(R"({"onebit": {"workers": 4, "exchange": {"mode": "hierarchical",
      "local_size": 2, "inter": "ps", "servers": 2, "warmup_over": "workers",
      "inter_transport": "gloo"}}})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(ShardsSkipWarmup(c->exchange));
  EXPECT_FALSE(WarmupBetweenWorkers(c->exchange));
  EXPECT_EQ(EffectiveWarmupOrder(c->exchange), "rank");
}

TEST(JobConfigTest, WarmupOrder) {
  for (const std::string order : {"auto", "rank", "ring"}) {
    auto c = ParseJobConfig(R"({"onebit": {"exchange": {"warmup_order": ")" + order + R"("}}})");
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_EQ(c->exchange.warmup_order, order);
    auto again = ParseJobConfig(JobConfigToJson(*c));
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_EQ(again->exchange.warmup_order, order);
  }
  // auto: the ring where it can run, rank order elsewhere.
  ExchangeConfig x;
  EXPECT_EQ(EffectiveWarmupOrder(x), "ring");
  x.warmup_dtype = "bf16";
  EXPECT_EQ(EffectiveWarmupOrder(x), "rank");
  x.warmup_dtype = "fp32";
  x.mode = "ps";
  EXPECT_EQ(EffectiveWarmupOrder(x), "rank");
  x.warmup_over = "workers";  // the workers' allreduce, as in peer mode
  EXPECT_EQ(EffectiveWarmupOrder(x), "ring");
  x.warmup_over = "shards";
  x.mode = "hierarchical";
  EXPECT_EQ(EffectiveWarmupOrder(x), "rank");
  x.mode = "peer";
  x.overlap = true;  // the ring per bucket: faster on shaped links than the rank order
  EXPECT_EQ(EffectiveWarmupOrder(x), "ring");
  x.overlap = false;
  x.warmup_order = "rank";
  x.mode = "peer";
  EXPECT_EQ(EffectiveWarmupOrder(x), "rank");
}

TEST(JobConfigTest, SecurityBlock) {
  auto c = ParseJobConfig(R"({"onebit": {"security": {
      "tls": {"ca_cert": "/s/ca.pem", "cert": "/s/node.pem", "key": "/s/node.key"},
      "admin_token_file": "/s/admin", "member_token_file": "/s/member"}}})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->security.tls.ca_cert, "/s/ca.pem");
  EXPECT_EQ(c->security.tls.cert, "/s/node.pem");
  EXPECT_EQ(c->security.tls.key, "/s/node.key");
  EXPECT_TRUE(c->security.tls.mutual);
  EXPECT_EQ(c->security.admin_token_file, "/s/admin");
  EXPECT_EQ(c->security.member_token_file, "/s/member");
  auto again = ParseJobConfig(JobConfigToJson(*c));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(JobConfigToJson(*again), JobConfigToJson(*c));
  // TLS without client certificates needs no CA in the config.
  auto server_only = ParseJobConfig(
      R"({"onebit": {"security": {"tls": {"cert": "/c", "key": "/k", "mutual": false}}}})");
  EXPECT_TRUE(server_only.ok()) << server_only.status();
  // Off by default.
  auto plain = ParseJobConfig("{}");
  ASSERT_TRUE(plain.ok());
  EXPECT_TRUE(plain->security.tls.cert.empty());
  EXPECT_TRUE(plain->security.admin_token_file.empty());
}

TEST(JobConfigTest, RoundTripsThroughJson) {
  auto c = ParseJobConfig(kFull);
  ASSERT_TRUE(c.ok());
  c->workload.data_dir = "/tmp/a \"quoted\" dir";
  c->momentum_mask.ranges.clear();
  c->momentum_mask.npy = "/masks/a \"quoted\" mask.npy";
  auto again = ParseJobConfig(JobConfigToJson(*c));
  ASSERT_TRUE(again.ok()) << again.status() << "\n" << JobConfigToJson(*c);
  EXPECT_EQ(JobConfigToJson(*again), JobConfigToJson(*c));
  EXPECT_EQ(again->workload.data_dir, c->workload.data_dir);
  EXPECT_EQ(again->momentum_mask.npy, c->momentum_mask.npy);
  EXPECT_EQ(again->scheduler.warmup_num_steps, 30);
  EXPECT_DOUBLE_EQ(again->gradient_clipping, 2.5);
  EXPECT_TRUE(again->notices.empty()) << ::testing::PrintToString(again->notices);
}

// Each bad config must fail with INVALID_ARGUMENT and a message containing `path`.
struct BadCase {
  const char* json;
  const char* path;
};

TEST(JobConfigTest, RejectsBadConfigsNamingTheKey) {
  const BadCase cases[] = {
      {R"({"stepz": 3})", "stepz: unknown key"},
      {R"({"optimizer": {"type": "Lamb"}})", "optimizer.type"},
      {R"({"optimizer": {"params": {"lr": -1}}})", "optimizer.params.lr"},
      {R"({"optimizer": {"params": {"betas": [0.9]}}})", "optimizer.params.betas"},
      {R"({"optimizer": {"params": {"betas": [0.9, 1.0]}}})", "optimizer.params.betas"},
      {R"({"optimizer": {"params": {"eps": 0}}})", "optimizer.params.eps"},
      {R"({"optimizer": {"params": {"freeze_step": 1.5}}})", "optimizer.params.freeze_step"},
      {R"({"optimizer": {"params": {"freeze_step": "10"}}})", "optimizer.params.freeze_step"},
      {R"({"optimizer": {"params": {"comm_backend_name": "hccl"}}})",
       "optimizer.params.comm_backend_name"},
      {R"({"optimizer": {"params": {"comm_backend_name": "nccl"}}, "onebit": {"device": "cpu"}})",
       "optimizer.params.comm_backend_name: nccl needs"},
      {R"({"onebit": {"device": "cuda", "workers": 2, "exchange": {"mode": "hierarchical",
          "local_size": 2}}})",
       "optimizer.params.comm_backend_name: a hierarchical job on GPUs needs nccl"},
      {R"({"onebit": {"device": "cuda", "exchange": {"overlap": true}}})",
       "onebit.exchange.overlap: on GPUs only with comm_backend_name nccl"},
      {R"({"optimizer": {"params": {"momentum": 0.9}}})", "optimizer.params.momentum"},
      {R"({"onebit": {"workers": 0}})", "onebit.workers"},
      {R"({"onebit": {"exchange": {"mode": "ps"}}})", "onebit.exchange.servers"},
      {R"({"onebit": {"exchange": {"mode": "ring"}}})", "onebit.exchange.mode"},
      {R"({"onebit": {"exchange": {"servers": 2}}})", "onebit.exchange.servers"},
      {R"({"onebit": {"exchange": {"warmup_dtype": "fp8"}}})", "onebit.exchange.warmup_dtype"},
      {R"({"onebit": {"exchange": {"warmup_order": "tree"}}})", "onebit.exchange.warmup_order"},
      {R"({"onebit": {"exchange": {"mode": "ps", "servers": 1, "warmup_over": "shards",
           "warmup_order": "ring"}}})",
       "onebit.exchange.warmup_order: only a warmup between the workers"},
      {R"({"onebit": {"exchange": {"warmup_over": "workers"}}})",
       "onebit.exchange.warmup_over: only applies where there are shards"},
      {R"({"onebit": {"exchange": {"mode": "ps", "servers": 1, "warmup_over": "peer"}}})",
       "onebit.exchange.warmup_over"},
      {R"({"optimizer": {"type": "ZeroOneAdam"},
          "onebit": {"exchange": {"mode": "ps", "servers": 1, "warmup_over": "workers"}}})",
       "onebit.exchange.warmup_over: workers needs an optimizer with one switch"},
      {R"({"optimizer": {"type": "Adam"},
          "onebit": {"exchange": {"mode": "ps", "servers": 1, "warmup_over": "workers"}}})",
       "the shards would idle"},
      {R"({"onebit": {"exchange": {"warmup_dtype": "bf16", "warmup_order": "ring"}}})",
       "onebit.exchange.warmup_order: the ring adds on the wire"},
      {R"({"onebit": {"exchange": {"warmup_dtype": 16}}})", "onebit.exchange.warmup_dtype"},
      {R"({"onebit": {"exchange": {"mode": "ps", "servers": 1, "warmup_over": "shards",
           "warmup_dtype": "bf16"}}})",
       "onebit.exchange.warmup_dtype: only a warmup between the workers"},
      {R"({"onebit": {"exchange": {"overlap": "yes"}}})",
       "onebit.exchange.overlap: must be true or false"},
      {R"({"onebit": {"exchange": {"overlap": 1}}})", "onebit.exchange.overlap"},
      {R"({"onebit": {"exchange": {"compressor": "int4"}}})", "onebit.exchange.compressor"},
      {R"({"onebit": {"exchange": {"compressor": 8}}})", "onebit.exchange.compressor"},
      {R"({"onebit": {"exchange": {"mode": "ps", "servers": 1, "warmup_over": "shards",
           "overlap": true}}})",
       "onebit.exchange.overlap: only a warmup between the workers overlaps"},
      {R"({"onebit": {"workers": 4, "exchange": {"mode": "hierarchical", "local_size": 2,
           "inter": "ps", "servers": 2, "warmup_over": "workers", "overlap": true}}})",
       "onebit.exchange.overlap: only a warmup between the workers overlaps"},
      {R"({"onebit": {"freeze": {"threshold": 0}}})", "onebit.freeze.threshold"},
      {R"({"onebit": {"freeze": {"min_warmup": 10, "max_warmup": 5}}})", "onebit.freeze.max_warmup"},
      {R"({"onebit": {"workload": {"hidden": []}}})", "onebit.workload.hidden"},
      {R"({"onebit": {"workload": {"hidden": [100, 0]}}})", "onebit.workload.hidden[1]"},
      {R"({"onebit": {"workload": {"parameters": 1e12}}})", "onebit.workload.parameters"},
      {R"({"onebit": {"workload": {"type": "synthetic", "parameters": 0}}})",
       "onebit.workload.parameters: must be >= 1 (0, learned from the workers' models, is for "
       "type pytorch)"},
      {R"({"onebit": {"workload": {"type": "pytorch", "parameters": -1}}})",
       "onebit.workload.parameters"},
      {R"({"onebit": {"ports": {"metrics": 70000}}})", "onebit.ports.metrics"},
      {R"({"onebit": {"cpu_threads": -1}})", "onebit.cpu_threads"},
      {R"({"onebit": {"cpu_threads": 1.5}})", "onebit.cpu_threads"},
      {R"({"onebit": 3})", "onebit: must be an object"},
      {R"({"onebit": {"checkpoint": {"every_steps": 10}}})", "onebit.checkpoint.dir"},
      {R"({"onebit": {"checkpoint": {"dir": "/c", "keep": 0}}})", "onebit.checkpoint.keep"},
      {R"({"onebit": {"checkpoint": {"resume": 1}}})", "onebit.checkpoint.resume"},
      {R"({"onebit": {"failure": {"heartbeat_timeout_s": 0}}})", "onebit.failure.heartbeat_timeout_s"},
      {R"({"onebit": {"failure": {"max_restarts": -1}}})", "onebit.failure.max_restarts"},
      {R"({"onebit": {"security": {"tls": {"cert": "/c.pem"}}}})", "onebit.security.tls.key"},
      {R"({"onebit": {"security": {"tls": {"ca_cert": "/ca.pem"}}}})", "onebit.security.tls.cert"},
      {R"({"onebit": {"security": {"tls": {"cert": "/c", "key": "/k"}}}})",
       "onebit.security.tls.ca_cert: is required with mutual TLS"},
      {R"({"onebit": {"security": {"tls": {"mutual": "yes"}}}})", "onebit.security.tls.mutual"},
      {R"({"onebit": {"security": {"admin_token": "x"}}})", "onebit.security.admin_token: unknown key"},
      {R"({"train_batch_size": 100, "train_micro_batch_size_per_gpu": 32})", "train_batch_size"},
      {R"([1, 2])", "must be an object"},
      {R"({"steps": )", "not valid JSON"},
  };
  for (const BadCase& c : cases) {
    auto parsed = ParseJobConfig(c.json);
    ASSERT_FALSE(parsed.ok()) << c.json;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << c.json;
    EXPECT_NE(std::string(parsed.status().message()).find(c.path), std::string::npos)
        << c.json << " -> " << parsed.status().message();
  }
}

TEST(JobConfigTest, LoadNamesTheFile) {
  const std::string dir = std::getenv("TEST_TMPDIR");
  EXPECT_EQ(LoadJobConfig(dir + "/missing.json").status().code(), absl::StatusCode::kNotFound);
  const std::string path = dir + "/bad.json";
  std::ofstream(path) << R"({"onebit": {"workers": -2}})";
  auto c = LoadJobConfig(path);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(std::string(c.status().message()).find(path), std::string::npos);
  EXPECT_NE(std::string(c.status().message()).find("onebit.workers"), std::string::npos);
}

// A PyTorch job may leave its model's size to the workers (the coordinator learns it).
TEST(JobConfigTest, APyTorchModelsSizeMayBeLearned) {
  auto c = ParseJobConfig(R"({"onebit": {"workload": {"type": "pytorch", "parameters": 0}}})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->workload.parameters, 0);
  EXPECT_EQ(*WorkloadParameterCount(c->workload), 0u);
  auto again = ParseJobConfig(JobConfigToJson(*c));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->workload.parameters, 0);
}

// A training script's config without steps is open-ended, as onebit.torch reads it, so
// that onebit-launch's coordinator (which reads the same file) agrees; others keep 600.
TEST(JobConfigTest, AScriptsJobWithoutStepsIsOpenEnded) {
  auto script = ParseJobConfig(R"({"onebit": {"workload": {"type": "pytorch"}}})");
  ASSERT_TRUE(script.ok()) << script.status();
  EXPECT_EQ(script->steps, kOpenEndedSteps);
  auto given = ParseJobConfig(R"({"steps": 7, "onebit": {"workload": {"type": "pytorch"}}})");
  ASSERT_TRUE(given.ok()) << given.status();
  EXPECT_EQ(given->steps, 7);
  auto builtin = ParseJobConfig(R"({"onebit": {"workload": {"type": "synthetic"}}})");
  ASSERT_TRUE(builtin.ok()) << builtin.status();
  EXPECT_EQ(builtin->steps, 600);
}

// Models past BERT-Large's size: GPT-2 XL (1.5B) and the 1.07B model tools/gpu runs.
TEST(JobConfigTest, BillionParameterModelsAreAccepted) {
  auto c = ParseJobConfig(
      R"({"onebit": {"workload": {"type": "pytorch", "parameters": 1558000000}}})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->workload.parameters, 1558000000);
  auto again = ParseJobConfig(JobConfigToJson(*c));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->workload.parameters, 1558000000);
}

// What every process of a job must agree on: per-process settings and paths left out,
// everything that moves the numbers in; a difference names its keys, a few at a time.
TEST(JobConfigTest, JobTermsLeaveOutWhatMayDifferPerProcess) {
  const JobConfig base;
  JobConfig local = base;
  local.device = "cuda";
  local.cpu_threads = 7;
  local.log_every = 1;
  local.ports.server = 7000;
  local.workload.data_dir = "/data";
  local.momentum_mask.npy = "/masks/m.npy";
  local.checkpoint.dir = "/ckpt";
  local.checkpoint.keep = 9;
  local.failure.gloo_timeout_s = 5;
  local.security.member_token_file = "/token";
  EXPECT_EQ(JobTerms(local), JobTerms(base));
  EXPECT_EQ(JobTermsDifference(JobTerms(base), JobTerms(local), "w", 3), "");
  // A mask file's contents, where a worker read it, stand in for its path.
  EXPECT_EQ(JobTermsDifference(JobTerms(local, "3 of 9 masked, digest 1"),
                               JobTerms(local, "2 of 9 masked, digest 2"), "worker 0's", 3),
            "onebit.momentum_mask.npy \"2 of 9 masked, digest 2\" (worker 0's: \"3 of 9 "
            "masked, digest 1\")");

  JobConfig other = base;
  other.seed = 2;
  other.micro_batch = 32;
  other.exchange.mode = "ps";
  other.workload.hidden = {64};
  EXPECT_EQ(JobTermsDifference(JobTerms(base), JobTerms(other), "the job's", 2),
            "onebit.exchange.mode \"ps\" (the job's: \"peer\"); onebit.workload.hidden "
            "[64] (the job's: [256,128]); and 3 more");  // seed, micro batch, train batch
  // A worker of another shard_state fails the job at registration, by name.
  other = base;
  other.exchange.shard_state = true;
  EXPECT_EQ(JobTermsDifference(JobTerms(base), JobTerms(other), "the job's", 3),
            "onebit.exchange.shard_state true (the job's: false)");
  other = base;
  other.scheduler.type = "WarmupLR";  // a block the job's config does not have
  EXPECT_EQ(JobTermsDifference(JobTerms(base), JobTerms(other), "the job's", 1).rfind(
                "scheduler.params.warmup_max_lr 0.001 (the job's: (none)); and ", 0),
            0u);
}

}  // namespace
}  // namespace onebit
