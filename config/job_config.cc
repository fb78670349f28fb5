#include "config/job_config.h"

#include <algorithm>
#include <fstream>
#include <map>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "common/status_macros.h"
#include "config/job_config_schema.h"

namespace onebit {
namespace {

using config_schema::JsonEscaped;

using config_schema::JobConfigKeys;
using config_schema::Object;
using config_schema::ParseState;
using config_schema::Value;

absl::Status Parse(const Value& root, JobConfig* c) {
  ParseState state;
  state.config = c;
  ONEBIT_RETURN_IF_ERROR(Object(root, "", JobConfigKeys(&state)));
  // A training script's job without steps runs until the scripts' loops end, as
  // onebit.torch reads such a config: the coordinator that reads the same file agrees.
  if (c->workload.type == "pytorch" && root.kind_case() == Value::kStructValue &&
      root.struct_value().fields().count("steps") == 0) {
    c->steps = kOpenEndedSteps;
  }
  return config_schema::CheckJobConfig(state);
}


// `text` with // and /* */ comments and trailing commas (before } or ]) taken out,
// outside strings; says which it found. Errors: an unterminated /* comment.
absl::StatusOr<std::string> StripJsonExtensions(absl::string_view text, bool* comments,
                                                bool* trailing_commas) {
  std::string no_comments;
  no_comments.reserve(text.size());
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char ch = text[i];
    const char next = i + 1 < text.size() ? text[i + 1] : '\0';
    if (in_string) {
      no_comments += ch;
      if (ch == '\\' && i + 1 < text.size()) {
        no_comments += text[++i];
      } else if (ch == '"') {
        in_string = false;
      }
    } else if (ch == '/' && next == '/') {
      *comments = true;
      const size_t end = text.find('\n', i);
      if (end == absl::string_view::npos) break;
      i = end - 1;  // the newline is kept
    } else if (ch == '/' && next == '*') {
      *comments = true;
      const size_t end = text.find("*/", i + 2);
      if (end == absl::string_view::npos) {
        return absl::InvalidArgumentError("not valid JSON: a /* comment is not closed");
      }
      no_comments += ' ';
      i = end + 1;
    } else {
      in_string = ch == '"';
      no_comments += ch;
    }
  }
  std::string out;
  out.reserve(no_comments.size());
  in_string = false;
  for (size_t i = 0; i < no_comments.size(); ++i) {
    const char ch = no_comments[i];
    if (in_string) {
      out += ch;
      if (ch == '\\' && i + 1 < no_comments.size()) {
        out += no_comments[++i];
      } else if (ch == '"') {
        in_string = false;
      }
      continue;
    }
    if (ch == ',') {
      const size_t next = no_comments.find_first_not_of(" \t\r\n", i + 1);
      const size_t last = out.find_last_not_of(" \t\r\n");
      const bool after_value = last != std::string::npos && out[last] != ',' &&
                               out[last] != '{' && out[last] != '[';
      if (after_value && next != std::string::npos &&
          (no_comments[next] == '}' || no_comments[next] == ']')) {
        *trailing_commas = true;
        continue;
      }
    }
    in_string = ch == '"';
    out += ch;
  }
  return out;
}

}  // namespace

absl::StatusOr<std::string> StrictJson(absl::string_view text) {
  bool comments = false, trailing_commas = false;
  return StripJsonExtensions(text, &comments, &trailing_commas);
}

std::string EffectiveWarmupOrder(const ExchangeConfig& exchange) {
  if (exchange.warmup_order != "auto") return exchange.warmup_order;
  // With overlap the sums run per bucket, and a ring's order depends on where a bucket's
  // chunks start, so overlap on and off differ in rounding with more than two workers
  // (rank order would agree bit for bit); the ring still wins: with the rank order's shift
  // steps, overlap made the GPT example's warmup step 1.14x DDP's at 100 Mbit/s, with the
  // ring 0.99x (BENCHMARKS.md, "Overlap of the warmup exchange").
  return WarmupBetweenWorkers(exchange) && exchange.warmup_dtype == "fp32" ? "ring" : "rank";
}

bool WarmupBetweenWorkers(const ExchangeConfig& exchange) {
  return exchange.mode == "peer" || (exchange.mode == "ps" && exchange.warmup_over == "workers");
}

bool ScalesLoss(const JobConfig& config) {
  return config.precision.fp16 && (config.device == "cuda" || config.workload.type == "pytorch");
}

bool SchedulerCyclesBetas(const JobConfig& config) {
  return config.scheduler.type == "OneCycle" && config.scheduler.cycle_momentum;
}

bool ShardsSkipWarmup(const ExchangeConfig& exchange) {
  return UsesServers(exchange) && exchange.warmup_over == "workers";
}

absl::StatusOr<JobConfig> ParseJobConfig(absl::string_view json) {
  bool comments = false, trailing_commas = false;
  ONEBIT_ASSIGN_OR_RETURN(const std::string strict,
                          StripJsonExtensions(json, &comments, &trailing_commas));
  Value root;
  google::protobuf::util::JsonParseOptions options;
  const auto parsed = google::protobuf::util::JsonStringToMessage(strict, &root, options);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("not valid JSON: ", parsed.message().as_string()));
  }
  JobConfig config;
  ONEBIT_RETURN_IF_ERROR(Parse(root, &config));
  if (comments) {
    config.notices.push_back("(config): comments accepted (strict JSON, and DeepSpeed's "
                             "json.load, reject them)");
  }
  if (trailing_commas) {
    config.notices.push_back("(config): trailing commas accepted (strict JSON, and "
                             "DeepSpeed's json.load, reject them)");
  }
  std::sort(config.notices.begin(), config.notices.end());
  return config;
}

absl::StatusOr<JobConfig> LoadJobConfig(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open the job config"));
  std::stringstream text;
  text << in.rdbuf();
  absl::StatusOr<JobConfig> config = ParseJobConfig(text.str());
  if (!config.ok()) {
    return absl::Status(config.status().code(), absl::StrCat(path, ": ", config.status().message()));
  }
  return config;
}

namespace {

std::string G(double x) { return absl::StrFormat("%.17g", x); }
const char* B(bool b) { return b ? "true" : "false"; }

// The params keys with a value of their own, in the order JSON prints them; `line` starts
// a new line before the key. Keys a type takes without effect (Adam's adam_w_mode) have none.
struct ParamKey {
  const char* key;
  bool line;
  std::string (*value)(const OptimizerConfig&);
};
constexpr ParamKey kParamKeys[] = {
    {"freeze_step", false, [](const OptimizerConfig& o) { return absl::StrCat(o.freeze_step); }},
    {"update_clip", false, [](const OptimizerConfig& o) { return G(o.update_clip); }},
    {"var_freeze_step", true,
     [](const OptimizerConfig& o) { return absl::StrCat(o.var_freeze_step); }},
    {"var_update_scaler", false,
     [](const OptimizerConfig& o) { return absl::StrCat(o.var_update_scaler); }},
    {"local_step_scaler", false,
     [](const OptimizerConfig& o) { return absl::StrCat(o.local_step_scaler); }},
    {"local_step_clipper", false,
     [](const OptimizerConfig& o) { return absl::StrCat(o.local_step_clipper); }},
    {"max_coeff", true, [](const OptimizerConfig& o) { return G(o.max_coeff); }},
    {"min_coeff", false, [](const OptimizerConfig& o) { return G(o.min_coeff); }},
    {"coeff_beta", false, [](const OptimizerConfig& o) { return G(o.coeff_beta); }},
    {"factor_max", false, [](const OptimizerConfig& o) { return G(o.factor_max); }},
    {"factor_min", false, [](const OptimizerConfig& o) { return G(o.factor_min); }},
    {"factor_threshold", false, [](const OptimizerConfig& o) { return G(o.factor_threshold); }},
};

// The params of the optimizer's type, every one.
std::string OptimizerParamsJson(const OptimizerConfig& o) {
  std::string out = absl::StrFormat(
      R"("lr": %s, "betas": [%s, %s], "eps": %s, "weight_decay": %s,
               "bias_correction": %s, "comm_backend_name": "%s")",
      G(o.lr), G(o.beta1), G(o.beta2), G(o.eps), G(o.weight_decay), B(o.bias_correction),
      o.comm_backend_name);
  const std::vector<std::string>& own = Traits(o.kind).own_keys;
  for (const ParamKey& k : kParamKeys) {
    if (std::find(own.begin(), own.end(), k.key) == own.end()) continue;
    absl::StrAppend(&out, k.line ? ",\n               \"" : ", \"", k.key, "\": ", k.value(o));
  }
  return out;
}

// The scheduler block with every param of its type; "" without a scheduler.
std::string SchedulerJson(const SchedulerConfig& s) {
  if (s.type.empty()) return "";
  std::string params;
  if (s.type == "WarmupLR" || s.type == "WarmupDecayLR") {
    params = absl::StrCat("\"warmup_min_lr\": ", G(s.warmup_min_lr), ", \"warmup_max_lr\": ",
                          G(s.warmup_max_lr), ", \"warmup_num_steps\": ", s.warmup_num_steps,
                          ", \"warmup_type\": \"", s.warmup_type, "\"");
    if (s.type == "WarmupDecayLR") {
      absl::StrAppend(&params, ", \"total_num_steps\": ", s.total_num_steps);
    }
  } else if (s.type == "WarmupCosineLR") {
    params = absl::StrCat("\"total_num_steps\": ", s.total_num_steps, ", \"warmup_min_ratio\": ",
                          G(s.warmup_min_ratio), ", \"warmup_num_steps\": ", s.warmup_num_steps,
                          ", \"cos_min_ratio\": ", G(s.cos_min_ratio), ", \"warmup_type\": \"",
                          s.warmup_type, "\"");
  } else {  // OneCycle
    params = absl::StrCat(
        "\"cycle_min_lr\": ", G(s.cycle_min_lr), ", \"cycle_max_lr\": ", G(s.cycle_max_lr),
        ", \"decay_lr_rate\": ", G(s.decay_lr_rate), ",\n                          "
        "\"cycle_first_step_size\": ", s.cycle_first_step_size);
    if (s.cycle_second_step_size >= 0) {
      absl::StrAppend(&params, ", \"cycle_second_step_size\": ", s.cycle_second_step_size);
    }
    absl::StrAppend(&params, ", \"cycle_first_stair_count\": ", s.cycle_first_stair_count);
    if (s.cycle_second_stair_count >= 0) {
      absl::StrAppend(&params, ", \"cycle_second_stair_count\": ", s.cycle_second_stair_count);
    }
    absl::StrAppend(&params, ",\n                          \"decay_step_size\": ",
                    s.decay_step_size, ", \"cycle_momentum\": ", B(s.cycle_momentum),
                    ", \"cycle_min_mom\": ", G(s.cycle_min_mom), ", \"cycle_max_mom\": ",
                    G(s.cycle_max_mom), ", \"decay_mom_rate\": ", G(s.decay_mom_rate));
  }
  return absl::StrCat("  \"scheduler\": {\"type\": \"", s.type, "\",\n                \"params\": {",
                      params, "}},\n");
}

std::string RangesJson(const std::vector<std::pair<int64_t, int64_t>>& ranges) {
  std::vector<std::string> parts;
  for (const auto& [begin, end] : ranges) parts.push_back(absl::StrCat("[", begin, ", ", end, "]"));
  return absl::StrCat("[", absl::StrJoin(parts, ", "), "]");
}

}  // namespace

std::string JobConfigToJson(const JobConfig& c) {
  const OptimizerConfig& o = c.optimizer;
  const PrecisionConfig& p = c.precision;
  return absl::StrFormat(
      R"({
  "train_batch_size": %d,
  "train_micro_batch_size_per_gpu": %d,
  "gradient_accumulation_steps": %d,
  "gradient_clipping": %.17g,
  "steps": %d,
  "seed": %d,
  "optimizer": {
    "type": "%s",
    "params": {%s}
  },
%s  "fp16": {"enabled": %s, "loss_scale": %.17g, "initial_scale_power": %d,
           "loss_scale_window": %d, "hysteresis": %d, "consecutive_hysteresis": %s,
           "min_loss_scale": %.17g},
  "bf16": {"enabled": %s},
  "onebit": {
    "workers": %d,
    "device": "%s",
    "cpu_threads": %d,
    "lease_steps": %d,
    "log_every": %d,
    "exchange": {"mode": "%s", "servers": %d, "local_size": %d, "inter": "%s",
                 "inter_transport": "%s", "warmup_over": "%s", "warmup_dtype": "%s",
                 "warmup_order": "%s", "overlap": %s, "compressor": "%s", "shard_state": %s},
    "freeze": {"mode": "%s", "threshold": %.17g, "reports_in_a_row": %d, "report_interval": %d,
               "min_warmup": %d, "max_warmup": %d},
    "momentum_mask": {"npy": "%s", "ranges": %s, "auto_zero_grad": %s},
    "workload": {"type": "%s", "hidden": [%s], "data_dir": "%s", "eval_every": %d,
                 "parameters": %d},
    "ports": {"coordinator": %d, "coordinator_rest": %d, "metrics": %d, "server": %d},
    "checkpoint": {"dir": "%s", "every_steps": %d, "keep": %d, "resume": %s, "async": %s},
    "failure": {"heartbeat_timeout_s": %.17g, "rejoin_timeout_s": %.17g, "max_restarts": %d,
                "coordinator_retry_s": %.17g, "gloo_timeout_s": %.17g, "rendezvous_timeout_s": %.17g,
                "ps_step_deadline_s": %.17g},
    "security": {"tls": {"ca_cert": "%s", "cert": "%s", "key": "%s", "mutual": %s, "server_name": "%s"},
                 "admin_token_file": "%s", "member_token_file": "%s"}
  }
}
)",
      TrainBatchSize(c), c.micro_batch, c.gradient_accumulation_steps, c.gradient_clipping,
      c.steps, c.seed, Traits(o.kind).name, OptimizerParamsJson(o), SchedulerJson(c.scheduler),
      B(p.fp16), p.loss_scale, p.initial_scale_power, p.loss_scale_window, p.hysteresis,
      B(p.consecutive_hysteresis), p.min_loss_scale, B(p.bf16), c.workers, c.device, c.cpu_threads, c.lease_steps,
      c.log_every, c.exchange.mode, c.exchange.servers, c.exchange.local_size, c.exchange.inter,
      c.exchange.inter_transport, c.exchange.warmup_over, c.exchange.warmup_dtype,
      c.exchange.warmup_order, c.exchange.overlap ? "true" : "false",
      c.exchange.compressor, B(c.exchange.shard_state), c.freeze.mode, c.freeze.threshold,
      c.freeze.reports_in_a_row, c.freeze.report_interval, c.freeze.min_warmup,
      c.freeze.max_warmup, JsonEscaped(c.momentum_mask.npy), RangesJson(c.momentum_mask.ranges),
      B(c.momentum_mask.auto_zero_grad), c.workload.type, absl::StrJoin(c.workload.hidden, ", "),
      JsonEscaped(c.workload.data_dir), c.workload.eval_every, c.workload.parameters, c.ports.coordinator,
      c.ports.coordinator_rest, c.ports.metrics, c.ports.server, JsonEscaped(c.checkpoint.dir),
      c.checkpoint.every_steps, c.checkpoint.keep, c.checkpoint.resume ? "true" : "false",
      c.checkpoint.async ? "true" : "false",
      c.failure.heartbeat_timeout_s, c.failure.rejoin_timeout_s, c.failure.max_restarts,
      c.failure.coordinator_retry_s, c.failure.gloo_timeout_s, c.failure.rendezvous_timeout_s,
      c.failure.ps_step_deadline_s, JsonEscaped(c.security.tls.ca_cert), JsonEscaped(c.security.tls.cert),
      JsonEscaped(c.security.tls.key), c.security.tls.mutual ? "true" : "false",
      JsonEscaped(c.security.tls.server_name), JsonEscaped(c.security.admin_token_file),
      JsonEscaped(c.security.member_token_file));
}

std::string JobTerms(const JobConfig& config, const std::string& mask_summary) {
  const JobConfig d;
  JobConfig c = config;
  c.device = d.device;
  c.cpu_threads = d.cpu_threads;
  c.log_every = d.log_every;
  c.ports = d.ports;
  c.workload.data_dir = d.workload.data_dir;
  c.workload.eval_every = d.workload.eval_every;
  c.momentum_mask.npy = mask_summary;
  c.checkpoint.dir = d.checkpoint.dir;
  c.checkpoint.keep = d.checkpoint.keep;
  c.checkpoint.async = d.checkpoint.async;
  c.checkpoint.resume = d.checkpoint.resume;
  c.failure = d.failure;
  c.security = d.security;
  return JobConfigToJson(c);
}

namespace {

// Every leaf of a JSON value by its dotted path, printed as JSON.
void Leaves(const Value& v, const std::string& path, std::map<std::string, std::string>* out) {
  if (v.kind_case() == Value::kStructValue) {
    for (const auto& [key, child] : v.struct_value().fields()) {
      Leaves(child, path.empty() ? key : absl::StrCat(path, ".", key), out);
    }
    return;
  }
  std::string text;
  if (!google::protobuf::util::MessageToJsonString(v, &text).ok()) text = "?";
  (*out)[path] = text;
}

std::map<std::string, std::string> LeavesOf(const std::string& json) {
  Value root;
  std::map<std::string, std::string> out;
  if (google::protobuf::util::JsonStringToMessage(json, &root).ok()) Leaves(root, "", &out);
  return out;
}

}  // namespace

std::string JobTermsDifference(const std::string& first, const std::string& other,
                               const std::string& first_label, size_t max_keys) {
  if (first == other) return "";
  const std::map<std::string, std::string> a = LeavesOf(first), b = LeavesOf(other);
  std::vector<std::string> keys;
  for (const auto& [key, value] : a) {
    auto it = b.find(key);
    if (it == b.end() || it->second != value) keys.push_back(key);
  }
  for (const auto& [key, value] : b) {
    if (a.count(key) == 0) keys.push_back(key);
  }
  std::sort(keys.begin(), keys.end());
  if (keys.empty()) return "the configs differ";  // only in what JSON numbers cannot show
  std::vector<std::string> parts;
  for (size_t i = 0; i < keys.size() && i < max_keys; ++i) {
    auto value = [&](const std::map<std::string, std::string>& m) {
      auto it = m.find(keys[i]);
      return it == m.end() ? std::string("(none)") : it->second;
    };
    parts.push_back(absl::StrCat(keys[i], " ", value(b), " (", first_label, ": ", value(a), ")"));
  }
  if (keys.size() > max_keys) {
    parts.push_back(absl::StrCat("and ", keys.size() - max_keys, " more"));
  }
  return absl::StrJoin(parts, "; ");
}

namespace {

// The field of the params key Traits(kind).warmup_end_key.
int64_t OptimizerConfig::*WarmupEndField(OptimizerKind kind) {
  return absl::string_view(Traits(kind).warmup_end_key) == "var_freeze_step"
             ? &OptimizerConfig::var_freeze_step
             : &OptimizerConfig::freeze_step;
}

}  // namespace

int64_t WarmupEndStep(const OptimizerConfig& optimizer) {
  return optimizer.*WarmupEndField(optimizer.kind);
}

int64_t* MutableWarmupEndStep(OptimizerConfig* optimizer) {
  return &(optimizer->*WarmupEndField(optimizer->kind));
}

int64_t TrainBatchSize(const JobConfig& config) {
  return config.micro_batch * config.gradient_accumulation_steps * config.workers;
}

bool UsesServers(const ExchangeConfig& exchange) {
  return exchange.mode == "ps" || (exchange.mode == "hierarchical" && exchange.inter == "ps");
}

int ServerCount(const JobConfig& config) {
  return UsesServers(config.exchange) ? config.exchange.servers : 0;
}

}  // namespace onebit
