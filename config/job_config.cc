#include "config/job_config.h"

#include <cmath>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <set>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "common/status_macros.h"

namespace onebit {
namespace {

using google::protobuf::Value;

// A key's handler: validates the value found at `path` and stores it.
using Handler = std::function<absl::Status(const Value& v, const std::string& path)>;

absl::Status Bad(const std::string& path, absl::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", message));
}

std::string Join(const std::string& path, const std::string& key) {
  return path.empty() ? key : absl::StrCat(path, ".", key);
}

// Visits the keys of an object; unknown keys are errors that list the known ones.
absl::Status Object(const Value& v, const std::string& path,
                    const std::map<std::string, Handler>& handlers) {
  if (v.kind_case() != Value::kStructValue) return Bad(path.empty() ? "(top level)" : path, "must be an object");
  for (const auto& [key, child] : v.struct_value().fields()) {
    auto it = handlers.find(key);
    if (it == handlers.end()) {
      std::vector<std::string> known;
      for (const auto& [k, h] : handlers) known.push_back(k);
      return Bad(Join(path, key), absl::StrCat("unknown key (known here: ", absl::StrJoin(known, ", "), ")"));
    }
    ONEBIT_RETURN_IF_ERROR(it->second(child, Join(path, key)));
  }
  return absl::OkStatus();
}

Handler Number(double* out, double min, double max, bool min_exclusive = false) {
  return [=](const Value& v, const std::string& path) -> absl::Status {
    if (v.kind_case() != Value::kNumberValue) return Bad(path, "must be a number");
    const double x = v.number_value();
    if (!std::isfinite(x) || x < min || x > max || (min_exclusive && x == min)) {
      return Bad(path, absl::StrCat("must be in ", min_exclusive ? "(" : "[", min, ", ", max,
                                    "], got ", x));
    }
    *out = x;
    return absl::OkStatus();
  };
}

template <typename Int>
Handler Integer(Int* out, int64_t min, int64_t max) {
  return [=](const Value& v, const std::string& path) -> absl::Status {
    if (v.kind_case() != Value::kNumberValue || std::floor(v.number_value()) != v.number_value()) {
      return Bad(path, "must be an integer");
    }
    const double x = v.number_value();
    if (x < static_cast<double>(min) || x > static_cast<double>(max)) {
      return Bad(path, absl::StrCat("must be in [", min, ", ", max, "], got ", x));
    }
    *out = static_cast<Int>(x);
    return absl::OkStatus();
  };
}

Handler String(std::string* out, std::set<std::string> allowed = {}) {
  return [=](const Value& v, const std::string& path) -> absl::Status {
    if (v.kind_case() != Value::kStringValue) return Bad(path, "must be a string");
    if (!allowed.empty() && !allowed.count(v.string_value())) {
      return Bad(path, absl::StrCat("must be one of ", absl::StrJoin(allowed, ", "), ", got '",
                                    v.string_value(), "'"));
    }
    *out = v.string_value();
    return absl::OkStatus();
  };
}

Handler Bool(bool* out) {
  return [=](const Value& v, const std::string& path) -> absl::Status {
    if (v.kind_case() != Value::kBoolValue) return Bad(path, "must be true or false");
    *out = v.bool_value();
    return absl::OkStatus();
  };
}

Handler Betas(double* beta1, double* beta2) {
  return [=](const Value& v, const std::string& path) -> absl::Status {
    if (v.kind_case() != Value::kListValue || v.list_value().values_size() != 2) {
      return Bad(path, "must be a list of two numbers [beta1, beta2]");
    }
    ONEBIT_RETURN_IF_ERROR(Number(beta1, 0, 1)(v.list_value().values(0), path + "[0]"));
    ONEBIT_RETURN_IF_ERROR(Number(beta2, 0, 1)(v.list_value().values(1), path + "[1]"));
    if (*beta1 >= 1 || *beta2 >= 1) return Bad(path, "betas must be < 1");
    return absl::OkStatus();
  };
}

Handler Layers(std::vector<int>* out) {
  return [=](const Value& v, const std::string& path) -> absl::Status {
    if (v.kind_case() != Value::kListValue || v.list_value().values_size() < 1 ||
        v.list_value().values_size() > 8) {
      return Bad(path, "must be a list of 1 to 8 layer widths");
    }
    out->clear();
    for (int i = 0; i < v.list_value().values_size(); ++i) {
      int width = 0;
      ONEBIT_RETURN_IF_ERROR(
          Integer(&width, 1, 65536)(v.list_value().values(i), absl::StrCat(path, "[", i, "]")));
      out->push_back(width);
    }
    return absl::OkStatus();
  };
}

constexpr int64_t kMaxSteps = int64_t{1} << 40;
constexpr int64_t kMaxParameters = 400'000'000;  // BERT-Large is 340M

absl::Status Parse(const Value& root, JobConfig* c) {
  OptimizerConfig& o = c->optimizer;
  int64_t train_batch = -1;
  ONEBIT_RETURN_IF_ERROR(Object(
      root, "",
      {{"train_micro_batch_size_per_gpu", Integer(&c->micro_batch, 1, 1 << 20)},
       {"train_batch_size", Integer(&train_batch, 1, int64_t{1} << 40)},
       {"steps", Integer(&c->steps, 1, kMaxSteps)},
       {"seed", Integer(&c->seed, 0, int64_t{1} << 53)},
       {"optimizer",
        [&](const Value& v, const std::string& path) {
          return Object(
              v, path,
              {{"type", String(&o.type, {"OneBitAdam", "Adam"})},
               {"params", [&](const Value& p, const std::string& pp) {
                  return Object(
                      p, pp,
                      {{"lr", Number(&o.lr, 0, 1e3)},
                       {"betas", Betas(&o.beta1, &o.beta2)},
                       {"eps", Number(&o.eps, 0, 1, /*min_exclusive=*/true)},
                       {"weight_decay", Number(&o.weight_decay, 0, 1e3)},
                       {"freeze_step", Integer(&o.freeze_step, 0, kMaxSteps)},
                       {"comm_backend_name", String(&o.comm_backend_name, {"gloo", "nccl"})}});
                }}});
        }},
       {"onebit", [&](const Value& v, const std::string& path) {
          return Object(
              v, path,
              {{"workers", Integer(&c->workers, 1, 1024)},
               {"device", String(&c->device, {"cpu", "cuda"})},
               {"cpu_threads", Integer(&c->cpu_threads, 0, 256)},
               {"lease_steps", Integer(&c->lease_steps, 1, 1 << 20)},
               {"log_every", Integer(&c->log_every, 1, kMaxSteps)},
               {"exchange",
                [&](const Value& e, const std::string& ep) {
                  return Object(e, ep,
                                {{"mode", String(&c->exchange.mode, {"peer", "ps", "hierarchical"})},
                                 {"servers", Integer(&c->exchange.servers, 0, 1024)},
                                 {"local_size", Integer(&c->exchange.local_size, 1, 1024)},
                                 {"inter", String(&c->exchange.inter, {"peer", "ps"})},
                                 {"warmup_dtype", String(&c->exchange.warmup_dtype,
                                                         {"fp32", "bf16", "fp16"})},
                                 {"warmup_order", String(&c->exchange.warmup_order,
                                                         {"auto", "rank", "ring"})},
                                 {"overlap", Bool(&c->exchange.overlap)},
                                 {"compressor", String(&c->exchange.compressor,
                                                       {"onebit", "int8"})}});
                }},
               {"freeze",
                [&](const Value& f, const std::string& fp) {
                  FreezeConfig& z = c->freeze;
                  return Object(f, fp,
                                {{"mode", String(&z.mode, {"static", "automatic"})},
                                 {"threshold", Number(&z.threshold, 0, 1e6, true)},
                                 {"reports_in_a_row", Integer(&z.reports_in_a_row, 1, 1 << 20)},
                                 {"report_interval", Integer(&z.report_interval, 1, kMaxSteps)},
                                 {"min_warmup", Integer(&z.min_warmup, 0, kMaxSteps)},
                                 {"max_warmup", Integer(&z.max_warmup, 0, kMaxSteps)}});
                }},
               {"workload",
                [&](const Value& w, const std::string& wp) {
                  WorkloadConfig& k = c->workload;
                  return Object(w, wp,
                                {{"type", String(&k.type, {"fashion_mnist", "synthetic"})},
                                 {"hidden", Layers(&k.hidden)},
                                 {"data_dir", String(&k.data_dir)},
                                 {"eval_every", Integer(&k.eval_every, 0, kMaxSteps)},
                                 {"parameters", Integer(&k.parameters, 1, kMaxParameters)}});
                }},
               {"checkpoint",
                [&](const Value& k, const std::string& kp) {
                  CheckpointConfig& q = c->checkpoint;
                  return Object(k, kp,
                                {{"dir", String(&q.dir)},
                                 {"every_steps", Integer(&q.every_steps, 0, kMaxSteps)},
                                 {"keep", Integer(&q.keep, 1, 1 << 20)},
                                 {"resume", Bool(&q.resume)},
                                 {"async", Bool(&q.async)}});
                }},
               {"failure",
                [&](const Value& f, const std::string& fp) {
                  FailureConfig& q = c->failure;
                  constexpr double kDay = 86400;
                  return Object(f, fp,
                                {{"heartbeat_timeout_s", Number(&q.heartbeat_timeout_s, 0, kDay, true)},
                                 {"rejoin_timeout_s", Number(&q.rejoin_timeout_s, 0, kDay, true)},
                                 {"max_restarts", Integer(&q.max_restarts, 0, 1 << 20)},
                                 {"coordinator_retry_s", Number(&q.coordinator_retry_s, 0, kDay, true)},
                                 {"gloo_timeout_s", Number(&q.gloo_timeout_s, 0, kDay, true)},
                                 {"rendezvous_timeout_s", Number(&q.rendezvous_timeout_s, 0, kDay, true)},
                                 {"ps_step_deadline_s", Number(&q.ps_step_deadline_s, 0, kDay, true)}});
                }},
               {"security",
                [&](const Value& k, const std::string& kp) {
                  SecurityConfig& q = c->security;
                  return Object(
                      k, kp,
                      {{"tls",
                        [&](const Value& t, const std::string& tp) {
                          return Object(t, tp,
                                        {{"ca_cert", String(&q.tls.ca_cert)},
                                         {"cert", String(&q.tls.cert)},
                                         {"key", String(&q.tls.key)},
                                         {"mutual", Bool(&q.tls.mutual)},
                                         {"server_name", String(&q.tls.server_name)}});
                        }},
                       {"admin_token_file", String(&q.admin_token_file)},
                       {"member_token_file", String(&q.member_token_file)}});
                }},
               {"ports", [&](const Value& p, const std::string& pp) {
                  PortsConfig& q = c->ports;
                  return Object(p, pp,
                                {{"coordinator", Integer(&q.coordinator, 0, 65535)},
                                 {"coordinator_rest", Integer(&q.coordinator_rest, 0, 65535)},
                                 {"metrics", Integer(&q.metrics, 0, 65535)},
                                 {"server", Integer(&q.server, 0, 65535)}});
                }}});
        }}}));

  // Checks that span several keys.
  if (train_batch >= 0 && train_batch != c->micro_batch * c->workers) {
    return Bad("train_batch_size",
               absl::StrCat("must equal train_micro_batch_size_per_gpu * onebit.workers = ",
                            c->micro_batch * c->workers, " (no gradient accumulation), got ",
                            train_batch));
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
  if (x.mode != "peer" && x.warmup_dtype != "fp32") {
    return Bad("onebit.exchange.warmup_dtype",
               absl::StrCat("only peer mode can carry ", x.warmup_dtype,
                            " (the parameter-server and hierarchical warmups are fp32)"));
  }
  if (x.warmup_order == "ring" && x.mode != "peer") {
    return Bad("onebit.exchange.warmup_order",
               "only peer mode sums round a ring (the parameter-server shards sum in rank order)");
  }
  if (x.warmup_order == "ring" && x.warmup_dtype != "fp32") {
    return Bad("onebit.exchange.warmup_order",
               absl::StrCat("the ring adds on the wire, so it needs warmup_dtype fp32, not ",
                            x.warmup_dtype));
  }
  if (x.mode != "peer" && x.overlap) {
    return Bad("onebit.exchange.overlap",
               "only peer mode overlaps the exchange with the backward pass");
  }
  if (x.mode == "hierarchical" && c->workers % x.local_size != 0) {
    return Bad("onebit.exchange.local_size",
               absl::StrCat("must divide onebit.workers = ", c->workers, ", got ", x.local_size));
  }
  if (x.mode == "hierarchical" && x.inter == "ps" && x.servers % x.local_size != 0) {
    return Bad("onebit.exchange.servers",
               absl::StrCat("must be a multiple of local_size = ", x.local_size,
                            " with inter ps (each local rank has its own shards), got ",
                            x.servers));
  }
  if (o.comm_backend_name == "nccl" && c->device != "cuda") {
    return Bad("optimizer.params.comm_backend_name", "nccl needs onebit.device = cuda");
  }
  if (c->checkpoint.every_steps > 0 && c->checkpoint.dir.empty()) {
    return Bad("onebit.checkpoint.dir", "is required with every_steps");
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

// A JSON string literal's contents.
std::string Quote(const std::string& s) {
  std::string out;
  for (char ch : s) {
    if (ch == '"' || ch == '\\') out += '\\';
    if (static_cast<unsigned char>(ch) < 0x20) {
      out += absl::StrFormat("\\u%04x", ch);
    } else {
      out += ch;
    }
  }
  return out;
}

}  // namespace

std::string EffectiveWarmupOrder(const ExchangeConfig& exchange) {
  if (exchange.warmup_order != "auto") return exchange.warmup_order;
  // With overlap the sums run per bucket, and a ring's order depends on where its chunks
  // start: only the rank order gives the same bits with overlap on and off.
  return exchange.mode == "peer" && exchange.warmup_dtype == "fp32" && !exchange.overlap
             ? "ring"
             : "rank";
}

absl::StatusOr<JobConfig> ParseJobConfig(absl::string_view json) {
  Value root;
  google::protobuf::util::JsonParseOptions options;
  const auto parsed = google::protobuf::util::JsonStringToMessage(
      google::protobuf::StringPiece(json.data(), json.size()), &root, options);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("not valid JSON: ", parsed.message().as_string()));
  }
  JobConfig config;
  ONEBIT_RETURN_IF_ERROR(Parse(root, &config));
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

std::string JobConfigToJson(const JobConfig& c) {
  const OptimizerConfig& o = c.optimizer;
  return absl::StrFormat(
      R"({
  "train_micro_batch_size_per_gpu": %d,
  "steps": %d,
  "seed": %d,
  "optimizer": {
    "type": "%s",
    "params": {"lr": %.17g, "betas": [%.17g, %.17g], "eps": %.17g, "weight_decay": %.17g,
               "freeze_step": %d, "comm_backend_name": "%s"}
  },
  "onebit": {
    "workers": %d,
    "device": "%s",
    "cpu_threads": %d,
    "lease_steps": %d,
    "log_every": %d,
    "exchange": {"mode": "%s", "servers": %d, "local_size": %d, "inter": "%s",
                 "warmup_dtype": "%s", "warmup_order": "%s", "overlap": %s,
                 "compressor": "%s"},
    "freeze": {"mode": "%s", "threshold": %.17g, "reports_in_a_row": %d, "report_interval": %d,
               "min_warmup": %d, "max_warmup": %d},
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
      c.micro_batch, c.steps, c.seed, o.type, o.lr, o.beta1, o.beta2, o.eps, o.weight_decay,
      o.freeze_step, o.comm_backend_name, c.workers, c.device, c.cpu_threads, c.lease_steps,
      c.log_every, c.exchange.mode, c.exchange.servers, c.exchange.local_size, c.exchange.inter,
      c.exchange.warmup_dtype, c.exchange.warmup_order, c.exchange.overlap ? "true" : "false",
      c.exchange.compressor, c.freeze.mode, c.freeze.threshold,
      c.freeze.reports_in_a_row, c.freeze.report_interval, c.freeze.min_warmup,
      c.freeze.max_warmup, c.workload.type, absl::StrJoin(c.workload.hidden, ", "),
      Quote(c.workload.data_dir), c.workload.eval_every, c.workload.parameters, c.ports.coordinator,
      c.ports.coordinator_rest, c.ports.metrics, c.ports.server, Quote(c.checkpoint.dir),
      c.checkpoint.every_steps, c.checkpoint.keep, c.checkpoint.resume ? "true" : "false",
      c.checkpoint.async ? "true" : "false",
      c.failure.heartbeat_timeout_s, c.failure.rejoin_timeout_s, c.failure.max_restarts,
      c.failure.coordinator_retry_s, c.failure.gloo_timeout_s, c.failure.rendezvous_timeout_s,
      c.failure.ps_step_deadline_s, Quote(c.security.tls.ca_cert), Quote(c.security.tls.cert),
      Quote(c.security.tls.key), c.security.tls.mutual ? "true" : "false",
      Quote(c.security.tls.server_name), Quote(c.security.admin_token_file),
      Quote(c.security.member_token_file));
}

bool UsesServers(const ExchangeConfig& exchange) {
  return exchange.mode == "ps" || (exchange.mode == "hierarchical" && exchange.inter == "ps");
}

int ServerCount(const JobConfig& config) {
  return UsesServers(config.exchange) ? config.exchange.servers : 0;
}

}  // namespace onebit
