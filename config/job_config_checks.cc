// The checks that span several keys, once every key of the config is parsed
// (config/job_config_schema.h has the keys).
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "config/job_config.h"
#include "config/job_config_schema.h"
#include "config/optimizer_kind.h"

namespace onebit {
namespace config_schema {
namespace {

// DeepSpeed's batch rule (deepspeed/runtime/config.py, _set_batch_related_parameters and
// _batch_assertion) with onebit.workers as the world size: train_batch_size ==
// micro * accumulation * workers, any two of the three batch keys give the third. -1 / false:
// not given. Unlike DeepSpeed (which floors and then asserts), indivisible sizes are errors.
absl::Status ResolveBatch(int64_t train_batch, bool micro_given, int64_t accumulation,
                          bool workers_given, JobConfig* c) {
  constexpr int64_t kMaxMicro = 1 << 20, kMaxAccumulation = 1 << 20, kMaxWorkers = 1024;
  int64_t micro = c->micro_batch;
  const bool batch_given = train_batch > 0, accumulation_given = accumulation > 0;
  if (batch_given && micro_given && accumulation_given && !workers_given) {
    if (train_batch % (micro * accumulation) != 0) {
      return Bad("train_batch_size",
                 absl::StrCat("must be a multiple of train_micro_batch_size_per_gpu * "
                              "gradient_accumulation_steps = ", micro, " * ", accumulation,
                              " (onebit.workers is train_batch_size / that), got ", train_batch));
    }
    const int64_t workers = train_batch / (micro * accumulation);
    if (workers > kMaxWorkers) {
      return Bad("train_batch_size",
                 absl::StrCat("implies onebit.workers = ", train_batch, " / (", micro, " * ",
                              accumulation, ") = ", workers, ", more than ", kMaxWorkers));
    }
    c->workers = static_cast<int>(workers);
    c->notices.push_back(absl::StrCat(
        "onebit.workers: not given; ", workers, " = train_batch_size / "
        "(train_micro_batch_size_per_gpu * gradient_accumulation_steps) = ", train_batch, " / (",
        micro, " * ", accumulation, ")"));
  }
  const int64_t w = c->workers;
  if (batch_given && micro_given && accumulation_given) {
    if (train_batch != micro * accumulation * w) {
      return Bad("train_batch_size",
                 absl::StrCat("must equal train_micro_batch_size_per_gpu * "
                              "gradient_accumulation_steps * onebit.workers = ", micro, " * ",
                              accumulation, " * ", w, " = ", micro * accumulation * w, ", got ",
                              train_batch));
    }
  } else if (batch_given && micro_given) {
    if (train_batch % (micro * w) != 0) {
      return Bad("train_batch_size",
                 absl::StrCat("must be a multiple of train_micro_batch_size_per_gpu * "
                              "onebit.workers = ", micro, " * ", w,
                              " (gradient_accumulation_steps is train_batch_size / that), got ",
                              train_batch));
    }
    accumulation = train_batch / (micro * w);
    if (accumulation > kMaxAccumulation) {
      return Bad("train_batch_size", absl::StrCat("implies gradient_accumulation_steps = ",
                                                  accumulation, ", more than ", kMaxAccumulation));
    }
    if (accumulation > 1) {
      c->notices.push_back(absl::StrCat(
          "gradient_accumulation_steps: not given; ", accumulation, " = train_batch_size / "
          "(train_micro_batch_size_per_gpu * onebit.workers) = ", train_batch, " / (", micro,
          " * ", w, ")"));
    }
  } else if (batch_given) {
    if (!accumulation_given) accumulation = 1;
    if (train_batch % (accumulation * w) != 0) {
      return Bad("train_batch_size",
                 absl::StrCat("must be a multiple of gradient_accumulation_steps * "
                              "onebit.workers = ", accumulation, " * ", w,
                              " (train_micro_batch_size_per_gpu is train_batch_size / that), got ",
                              train_batch));
    }
    micro = train_batch / (accumulation * w);
    if (micro > kMaxMicro) {
      return Bad("train_batch_size", absl::StrCat("implies train_micro_batch_size_per_gpu = ",
                                                  micro, ", more than ", kMaxMicro));
    }
  } else if (!accumulation_given) {
    accumulation = 1;
  }
  c->micro_batch = micro;
  c->gradient_accumulation_steps = accumulation;
  return absl::OkStatus();
}

// 0/1 Adam and shard_state (docs/algorithms.md, "Local steps"): sharding its variance stage
// alone would lower nothing, since the local stage is its peak.
constexpr char kZeroOneAdamHasNoSharedState[] =
    "0/1 Adam's local steps keep each worker's own parameters and momentum (docs/algorithms.md, "
    "\"Local steps\"), so a node has no state to share";

// onebit.exchange.shard_state against the exchange and the optimizer, and what
// zero_optimization.stage makes of it: stage 1 or 2 turns it on where it applies and it is
// not given; elsewhere the stage is a notice that says why it does nothing.
absl::Status ResolveShardState(const ParseState& state) {
  JobConfig* c = state.config;
  ExchangeConfig& x = c->exchange;
  const bool zero_one_adam = c->optimizer.kind == OptimizerKind::kZeroOneAdam;
  constexpr char kKey[] = "onebit.exchange.shard_state";
  if (x.shard_state && x.mode != "hierarchical") {
    return Bad(kKey, absl::StrCat("only applies to mode hierarchical, not ", x.mode,
                                  " (it shards the optimizer state across the workers of "
                                  "each node)"));
  }
  if (x.shard_state && x.local_size < 2) {
    return Bad(kKey, absl::StrCat("needs local_size >= 2 (the workers of a node share the "
                                  "state), got ", x.local_size));
  }
  if (x.shard_state && zero_one_adam) {
    return Bad(kKey, absl::StrCat("not with ZeroOneAdam: ", kZeroOneAdamHasNoSharedState,
                                  "; use OneBitAdam or OneBitLamb, or shard_state false"));
  }
  const int stage = state.zero_stage;
  if (stage < 0) return absl::OkStatus();
  if (stage == 0) {
    c->notices.push_back("zero_optimization: stage 0 accepted, no effect in onebit "
                         "(onebit.exchange.shard_state says whether the optimizer state is "
                         "sharded)");
    return absl::OkStatus();
  }
  std::string why_not;  // why the stage shards nothing here
  if (x.mode != "hierarchical") {
    why_not = absl::StrCat("onebit.exchange.shard_state shards it in mode hierarchical only, "
                           "not ", x.mode);
  } else if (x.local_size < 2) {
    why_not = "onebit.exchange.local_size is 1, so a node has no other worker to share it with";
  } else if (zero_one_adam) {
    why_not = absl::StrCat(kZeroOneAdamHasNoSharedState);
  } else if (state.shard_state_given && !x.shard_state) {
    why_not = "onebit.exchange.shard_state is false";
  }
  if (!why_not.empty()) {
    c->notices.push_back(absl::StrCat("zero_optimization: stage ", stage,
                                      " accepted, no effect in onebit (every worker keeps the "
                                      "whole optimizer state: ", why_not, ")"));
    return absl::OkStatus();
  }
  x.shard_state = true;
  c->notices.push_back(absl::StrCat(
      "zero_optimization: stage ", stage, ": the optimizer state is sharded across each node's "
      "workers (onebit.exchange.shard_state true)",
      stage == 2 ? "; each worker's own gradient stays whole, since backward writes it, and "
                   "the reduced gradient is its slice"
                 : ""));
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckJobConfig(const ParseState& state) {
  JobConfig* c = state.config;
  const OptimizerConfig& o = c->optimizer;
  Notices* notices = &c->notices;
  const int64_t train_batch = state.train_batch, accumulation = state.accumulation;
  const bool train_batch_given = state.train_batch_given, micro_given = state.micro_given,
             accumulation_given = state.accumulation_given,
             workers_given = state.workers_given, device_given = state.device_given;
  // Checks that span several keys.
  ONEBIT_RETURN_IF_ERROR(ResolveBatch(train_batch_given ? train_batch : -1,
                                      micro_given, accumulation_given ? accumulation : -1,
                                      workers_given, c));
  if (!device_given && o.comm_backend_name == "nccl") {
    c->device = "cuda";
    notices->push_back("onebit.device: not given; cuda, because optimizer.params."
                       "comm_backend_name is nccl");
  }
  const PrecisionConfig& precision = c->precision;
  if (precision.fp16 && precision.bf16) {
    return Bad("fp16.enabled", "fp16 and bf16 cannot both be enabled");
  }
  if (c->workload.type == "pytorch") {
    // The script's model computes in what its torch.autocast says; fp16 is loss scaling.
    if (precision.bf16) {
      notices->push_back("bf16.enabled: no effect with workload pytorch (the script's "
                         "torch.autocast decides what computes in bf16; no loss scaling needed)");
    }
  } else if ((precision.fp16 || precision.bf16) && c->device == "cpu") {
    notices->push_back(absl::StrCat(precision.fp16 ? "fp16" : "bf16",
                                    ".enabled: the CPU workloads compute in fp32 (only "
                                    "onebit.device cuda computes in fp16 or bf16)"));
  }
  if (c->workload.parameters == 0 && c->workload.type != "pytorch") {
    return Bad("onebit.workload.parameters",
               "must be >= 1 (0, learned from the workers' models, is for type pytorch)");
  }
  if (!c->momentum_mask.npy.empty() && !c->momentum_mask.ranges.empty()) {
    return Bad("onebit.momentum_mask.ranges", "give npy or ranges, not both");
  }
  // With shards, the warmup goes between the workers by default where the optimizer allows:
  // that was as fast as DDP's step with the shards beside the workers or apart, and through
  // colocated shards 1.2-1.8x (BENCHMARKS.md, "ps shards beside the workers").
  if (!state.warmup_over_given && UsesServers(c->exchange) && Traits(o.kind).one_switch) {
    c->exchange.warmup_over = "workers";
  }
  const ExchangeConfig& x = c->exchange;
  if (UsesServers(x) && x.servers < 1) {
    return Bad("onebit.exchange.servers", x.mode == "ps" ? "must be >= 1 in ps mode"
                                                         : "must be >= 1 with inter ps");
  }
  if (!UsesServers(x) && x.servers != 0) {
    return Bad("onebit.exchange.servers", "only applies to mode ps or inter ps");
  }
  if (x.mode != "hierarchical" && (x.local_size != 1 || x.inter != "peer")) {
    return Bad(x.local_size != 1 ? "onebit.exchange.local_size" : "onebit.exchange.inter",
               "only applies to mode hierarchical");
  }
  if (x.warmup_over != "shards" && !UsesServers(x)) {
    return Bad("onebit.exchange.warmup_over",
               "only applies where there are shards (mode ps, or hierarchical with inter ps)");
  }
  if (x.warmup_over == "workers" && !Traits(o.kind).one_switch) {
    std::vector<std::string> one_switch;
    for (const OptimizerTraits& t : AllOptimizerTraits()) {
      if (t.one_switch) one_switch.push_back(t.name);
    }
    return Bad("onebit.exchange.warmup_over",
               absl::StrCat(
                   "workers needs an optimizer with one switch to compression (",
                   absl::StrJoin(one_switch, ", "), "), not ", Traits(o.kind).name,
                   !Traits(o.kind).compresses
                       ? " (it never compresses: the shards would idle; use mode peer)"
                       : " (its full-precision and compressed steps alternate)"));
  }
  if (!WarmupBetweenWorkers(x) && x.warmup_dtype != "fp32") {
    return Bad("onebit.exchange.warmup_dtype",
               absl::StrCat("only a warmup between the workers can carry ", x.warmup_dtype,
                            " (peer mode, or ps with warmup_over workers; the shards' and the "
                            "hierarchical warmups are fp32)"));
  }
  if (x.warmup_order == "ring" && !WarmupBetweenWorkers(x)) {
    return Bad("onebit.exchange.warmup_order",
               "only a warmup between the workers sums round a ring (peer mode, or ps with "
               "warmup_over workers; the parameter-server shards sum in rank order)");
  }
  if (x.warmup_order == "ring" && x.warmup_dtype != "fp32") {
    return Bad("onebit.exchange.warmup_order",
               absl::StrCat("the ring adds on the wire, so it needs warmup_dtype fp32, not ",
                            x.warmup_dtype));
  }
  if (x.overlap && !WarmupBetweenWorkers(x)) {
    return Bad("onebit.exchange.overlap",
               "only a warmup between the workers overlaps the backward pass (peer mode, or ps "
               "with warmup_over \"workers\")");
  }
  if (x.mode == "hierarchical" && c->workers % x.local_size != 0) {
    return Bad("onebit.exchange.local_size",
               absl::StrCat("must divide onebit.workers = ", c->workers, ", got ", x.local_size));
  }
  ONEBIT_RETURN_IF_ERROR(ResolveShardState(state));
  if (x.mode == "hierarchical" && x.inter == "ps" && x.servers % x.local_size != 0) {
    return Bad("onebit.exchange.servers",
               absl::StrCat("must be a multiple of local_size = ", x.local_size,
                            " with inter ps (each local rank has its own shards), got ",
                            x.servers));
  }
  if (o.comm_backend_name == "nccl" && c->device != "cuda") {
    return Bad("optimizer.params.comm_backend_name", "nccl needs onebit.device = cuda");
  }
  if (x.inter_transport != "auto" &&
      (x.mode != "hierarchical" || (x.inter != "peer" && !ShardsSkipWarmup(x)))) {
    return Bad("onebit.exchange.inter_transport",
               "only applies to mode hierarchical, inter peer (or inter ps with warmup_over "
               "workers)");
  }
  if (x.inter_transport == "nccl" && c->device != "cuda") {
    return Bad("onebit.exchange.inter_transport", "nccl needs onebit.device = cuda");
  }
  // GPU workers over gloo (or ps shards) compress on the device and stage only what goes
  // on the wire through the host (worker/transport/staged_transport.h); the node's group
  // of a hierarchical job and the overlapped sum run on the device's buffers while the
  // backward pass uses the device, which only NCCL does.
  if (c->device == "cuda" && o.comm_backend_name != "nccl" && x.mode == "hierarchical") {
    return Bad("optimizer.params.comm_backend_name",
               "a hierarchical job on GPUs needs nccl (the group inside each node)");
  }
  if (c->device == "cuda" && o.comm_backend_name != "nccl" && x.overlap) {
    return Bad("onebit.exchange.overlap", "on GPUs only with comm_backend_name nccl");
  }
  if (c->checkpoint.every_steps > 0 && c->checkpoint.dir.empty()) {
    return Bad("onebit.checkpoint.dir", "is required with every_steps");
  }
  if (!c->checkpoint.dir.empty() && !state.checkpoint_every_given) {
    c->checkpoint.every_steps = kDefaultCheckpointEverySteps;
    c->notices.push_back(absl::StrCat(
        "onebit.checkpoint.every_steps: not given with a dir: a checkpoint every ",
        kDefaultCheckpointEverySteps, " steps (0: on demand only)"));
  }
  const TlsConfig& tls = c->security.tls;
  if (tls.cert.empty() != tls.key.empty()) {
    return Bad(tls.cert.empty() ? "onebit.security.tls.cert" : "onebit.security.tls.key",
               "cert and key go together");
  }
  if (!tls.ca_cert.empty() && tls.cert.empty()) {
    return Bad("onebit.security.tls.cert",
               "is required with ca_cert (the coordinator and the shards serve with it)");
  }
  if (!tls.cert.empty() && tls.mutual && tls.ca_cert.empty()) {
    return Bad("onebit.security.tls.ca_cert", "is required with mutual TLS");
  }
  if (c->freeze.max_warmup < c->freeze.min_warmup) {
    return Bad("onebit.freeze.max_warmup", "must be >= min_warmup");
  }
  return absl::OkStatus();
}

}  // namespace config_schema
}  // namespace onebit
