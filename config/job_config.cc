#include "config/job_config.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <set>
#include <sstream>

#include "absl/strings/ascii.h"
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
    *out = x == 0 ? 0.0 : x;  // -0 prints as "-0", which JSON reads back as 0
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
// Data parallel: each worker holds the whole model and its fp32 state (~24 bytes a parameter
// with onebit's errors), so 8.6B is past what one 80 GB device holds. In ps mode PsLayout
// also wants a push (4 bytes x parameters / shards) under 2 GiB. 1.07B runs on a GPU
// (tools/gpu/step_bench.py --model 1b).
constexpr int64_t kMaxParameters = int64_t{1} << 33;

using Notices = std::vector<std::string>;

// Sets *given, then runs `h`: for keys whose absence means something.
Handler Given(bool* given, Handler h) {
  return [=](const Value& v, const std::string& path) {
    *given = true;
    return h(v, path);
  };
}

// A key accepted without effect: one notice.
Handler Ignored(Notices* notices, std::string why) {
  return [=](const Value&, const std::string& path) {
    notices->push_back(absl::StrCat(path, ": accepted, no effect in onebit (", why, ")"));
    return absl::OkStatus();
  };
}

// A boolean that must be `supported`; the other value is an error saying `why`.
Handler OnlyBool(bool supported, std::string why) {
  return [=](const Value& v, const std::string& path) -> absl::Status {
    bool b = supported;
    ONEBIT_RETURN_IF_ERROR(Bool(&b)(v, path));
    if (b != supported) return Bad(path, why);
    return absl::OkStatus();
  };
}

// A DeepSpeed feature onebit does not have: {"enabled": false} (or no "enabled" where
// DeepSpeed's default is off) is a notice; anything enabled is an error saying `why`.
Handler Unsupported(Notices* notices, std::string why, bool enabled_by_default = false) {
  return [=](const Value& v, const std::string& path) -> absl::Status {
    bool enabled = enabled_by_default;
    if (v.kind_case() == Value::kStructValue) {
      auto it = v.struct_value().fields().find("enabled");
      if (it != v.struct_value().fields().end()) {
        ONEBIT_RETURN_IF_ERROR(Bool(&enabled)(it->second, Join(path, "enabled")));
      }
    } else if (v.kind_case() == Value::kBoolValue) {
      enabled = v.bool_value();
    } else {
      enabled = true;
    }
    if (enabled) return Bad(path, absl::StrCat("not supported by onebit (", why, ")"));
    notices->push_back(absl::StrCat(path, ": disabled; accepted, no effect in onebit"));
    return absl::OkStatus();
  };
}

// A batch-size key: an integer, or "auto" (Hugging Face's spelling) meaning not given.
Handler BatchKey(int64_t* out, bool* given, int64_t max, Notices* notices) {
  return [=](const Value& v, const std::string& path) -> absl::Status {
    if (v.kind_case() == Value::kStringValue && v.string_value() == "auto") {
      notices->push_back(absl::StrCat(path, ": \"auto\" taken as not given (derived from the "
                                            "other batch keys and onebit.workers)"));
      return absl::OkStatus();
    }
    *given = true;
    return Integer(out, 1, max)(v, path);
  };
}

// DeepSpeed's optimizer names are case-insensitive; "" when `name` is none of ours.
std::string CanonicalOptimizer(const std::string& name) {
  const std::string lower = absl::AsciiStrToLower(name);
  if (lower == "onebitadam") return "OneBitAdam";
  if (lower == "zerooneadam") return "ZeroOneAdam";
  if (lower == "onebitlamb") return "OneBitLamb";
  if (lower == "adam" || lower == "adamw") return "Adam";
  return "";
}

// Runs `object`'s "type" through `type` first (a JSON object's keys come in no order),
// then every key through `handlers` ("type" included, as a no-op).
absl::Status TypedObject(const Value& v, const std::string& path, const Handler& type,
                         std::map<std::string, Handler> handlers) {
  if (v.kind_case() != Value::kStructValue) return Bad(path, "must be an object");
  auto t = v.struct_value().fields().find("type");
  if (t != v.struct_value().fields().end()) {
    ONEBIT_RETURN_IF_ERROR(type(t->second, Join(path, "type")));
  }
  handlers["type"] = [](const Value&, const std::string&) { return absl::OkStatus(); };
  return Object(v, path, handlers);
}

// The params of one type out of a family (optimizers, schedulers): a key that only other
// types take is an error that says so, not "unknown key".
absl::Status TypedParams(const Value& v, const std::string& path, const std::string& type,
                         const std::map<std::string, std::vector<std::string>>& keys_of_type,
                         const std::map<std::string, Handler>& all) {
  const std::vector<std::string>& mine = keys_of_type.at(type);
  std::map<std::string, Handler> handlers;
  for (const std::string& k : mine) handlers[k] = all.at(k);
  for (const auto& [other, keys] : keys_of_type) {
    if (other == type) continue;
    for (const std::string& k : keys) {
      if (handlers.count(k)) continue;
      handlers[k] = [type, keys_of_type, k](const Value&, const std::string& p) {
        std::vector<std::string> takers;
        for (const auto& [t, ks] : keys_of_type) {
          if (std::find(ks.begin(), ks.end(), k) != ks.end()) takers.push_back(t);
        }
        return Bad(p, absl::StrCat("not a parameter of ", type, " (", absl::StrJoin(takers, ", "),
                                   takers.size() == 1 ? " takes it)" : " take it)"));
      };
    }
  }
  return Object(v, path, handlers);
}

absl::Status ParseOptimizer(const Value& v, const std::string& path, OptimizerConfig* o,
                            bool* backend_given, Notices* notices) {
  auto type = [&](const Value& t, const std::string& tp) -> absl::Status {
    std::string name;
    ONEBIT_RETURN_IF_ERROR(String(&name)(t, tp));
    const std::string canonical = CanonicalOptimizer(name);
    if (canonical.empty()) {
      return Bad(tp, absl::StrCat("must be one of OneBitAdam, ZeroOneAdam, OneBitLamb, Adam "
                                  "(case-insensitive; AdamW is Adam), got '", name, "'"));
    }
    o->type = canonical;
    return absl::OkStatus();
  };
  const std::vector<std::string> common = {"lr", "betas", "eps", "weight_decay", "bias_correction",
                                           "comm_backend_name", "cuda_aware", "eps_inside_sqrt",
                                           "amsgrad", "max_grad_norm"};
  auto with = [&](std::vector<std::string> more) {
    std::vector<std::string> keys = common;
    keys.insert(keys.end(), more.begin(), more.end());
    return keys;
  };
  const std::map<std::string, std::vector<std::string>> keys_of_type = {
      {"OneBitAdam", with({"freeze_step"})},
      {"ZeroOneAdam",
       with({"var_freeze_step", "var_update_scaler", "local_step_scaler", "local_step_clipper"})},
      {"OneBitLamb", with({"freeze_step", "max_coeff", "min_coeff", "coeff_beta", "factor_max",
                           "factor_min", "factor_threshold"})},
      // onebit's Adam is 1-bit Adam's warmup throughout: it takes freeze_step (unused) and
      // the 1-bit keys, so that a config can switch type alone.
      {"Adam", with({"freeze_step", "adam_w_mode", "torch_adam", "set_grad_none"})},
  };
  const std::map<std::string, Handler> all = {
      {"lr", Number(&o->lr, 0, 1e3)},
      {"betas", Betas(&o->beta1, &o->beta2)},
      {"eps", Number(&o->eps, 0, 1, /*min_exclusive=*/true)},
      {"weight_decay", Number(&o->weight_decay, 0, 1e3)},
      {"bias_correction",
       [=](const Value& b, const std::string& bp) -> absl::Status {
         ONEBIT_RETURN_IF_ERROR(Bool(&o->bias_correction)(b, bp));
         if (o->bias_correction && o->type != "Adam") {
           notices->push_back(absl::StrCat(
               bp, ": true: onebit applies Adam's bias correction; DeepSpeed's 1-bit "
                   "optimizers accept this key and never apply it, so results differ from "
                   "DeepSpeed's (false matches them)"));
         }
         return absl::OkStatus();
       }},
      {"comm_backend_name",
       [=](const Value& b, const std::string& bp) -> absl::Status {
         std::string name;
         ONEBIT_RETURN_IF_ERROR(String(&name, {"gloo", "nccl", "mpi"})(b, bp));
         if (name == "mpi") {
           notices->push_back(absl::StrCat(bp, ": mpi: onebit has no MPI backend; gloo "
                                               "carries the same exchange"));
           name = "gloo";
         }
         o->comm_backend_name = name;
         *backend_given = true;
         return absl::OkStatus();
       }},
      {"cuda_aware",
       [=](const Value& b, const std::string& bp) -> absl::Status {
         bool ignored = false;
         ONEBIT_RETURN_IF_ERROR(Bool(&ignored)(b, bp));
         return Ignored(notices, "it steers DeepSpeed's MPI backend; onebit has none")(b, bp);
       }},
      {"eps_inside_sqrt",
       [=](const Value& b, const std::string& bp) -> absl::Status {
         bool inside = false;
         ONEBIT_RETURN_IF_ERROR(Bool(&inside)(b, bp));
         if (inside) {
           notices->push_back(absl::StrCat(bp, ": true accepted, no effect: eps is added "
                                               "outside the sqrt (DeepSpeed's 1-bit "
                                               "optimizers ignore this key too)"));
         }
         return absl::OkStatus();
       }},
      {"amsgrad", OnlyBool(false, "true is not supported (DeepSpeed's 1-bit optimizers refuse "
                                  "the AMSGrad variant too)")},
      {"max_grad_norm",
       [](const Value&, const std::string& bp) {
         return Bad(bp, "not supported as an optimizer parameter (as in DeepSpeed): use the "
                        "top-level gradient_clipping");
       }},
      {"freeze_step", Integer(&o->freeze_step, 0, kMaxSteps)},
      {"var_freeze_step", Integer(&o->var_freeze_step, 0, kMaxSteps)},
      {"var_update_scaler", Integer(&o->var_update_scaler, 1, kMaxSteps)},
      {"local_step_scaler", Integer(&o->local_step_scaler, 1, kMaxSteps)},
      {"local_step_clipper", Integer(&o->local_step_clipper, 1, kMaxSteps)},
      {"max_coeff", Number(&o->max_coeff, 0, 1e6, /*min_exclusive=*/true)},
      {"min_coeff", Number(&o->min_coeff, 0, 1e6)},
      {"coeff_beta", Number(&o->coeff_beta, 0, 1)},
      {"factor_max", Number(&o->factor_max, 0, 1e6, /*min_exclusive=*/true)},
      {"factor_min", Number(&o->factor_min, 0, 1e6, /*min_exclusive=*/true)},
      {"factor_threshold", Number(&o->factor_threshold, 0, 1e6)},
      {"adam_w_mode", OnlyBool(true, "false (L2 regularisation in the gradient) is not "
                                     "supported: onebit's weight decay is decoupled (AdamW)")},
      {"torch_adam", [=](const Value& b, const std::string& bp) -> absl::Status {
         bool ignored = false;
         ONEBIT_RETURN_IF_ERROR(Bool(&ignored)(b, bp));
         return Ignored(notices, "it picks DeepSpeed's Adam implementation")(b, bp);
       }},
      {"set_grad_none", [=](const Value& b, const std::string& bp) -> absl::Status {
         bool ignored = false;
         ONEBIT_RETURN_IF_ERROR(Bool(&ignored)(b, bp));
         return Ignored(notices, "PyTorch gradient memory")(b, bp);
       }},
  };
  ONEBIT_RETURN_IF_ERROR(TypedObject(
      v, path, type,
      {{"params",
        [&](const Value& p, const std::string& pp) {
          return TypedParams(p, pp, o->type, keys_of_type, all);
        }},
       {"legacy_fusion", [=](const Value& b, const std::string& bp) -> absl::Status {
          bool ignored = false;
          ONEBIT_RETURN_IF_ERROR(Bool(&ignored)(b, bp));
          return Ignored(notices, "DeepSpeed's fused-kernel choice")(b, bp);
        }}}));
  const std::string pp = Join(path, "params");
  if (o->coeff_beta >= 1) return Bad(Join(pp, "coeff_beta"), "must be < 1");
  if (o->min_coeff > o->max_coeff) {
    return Bad(Join(pp, "min_coeff"),
               absl::StrCat("must be <= max_coeff = ", o->max_coeff, ", got ", o->min_coeff));
  }
  if (o->factor_min > o->factor_max) {
    return Bad(Join(pp, "factor_min"),
               absl::StrCat("must be <= factor_max = ", o->factor_max, ", got ", o->factor_min));
  }
  return absl::OkStatus();
}

absl::Status ParseScheduler(const Value& v, const std::string& path, SchedulerConfig* s,
                            Notices* notices) {
  bool type_given = false;
  auto type = [&](const Value& t, const std::string& tp) -> absl::Status {
    type_given = true;
    return String(&s->type, {"WarmupLR", "WarmupDecayLR", "OneCycle", "WarmupCosineLR"})(t, tp);
  };
  const std::vector<std::string> warmup = {"warmup_min_lr", "warmup_max_lr", "warmup_num_steps",
                                           "warmup_type", "last_batch_iteration"};
  std::vector<std::string> warmup_decay = warmup;
  warmup_decay.push_back("total_num_steps");
  const std::map<std::string, std::vector<std::string>> keys_of_type = {
      {"WarmupLR", warmup},
      {"WarmupDecayLR", warmup_decay},
      {"WarmupCosineLR", {"total_num_steps", "warmup_min_ratio", "warmup_num_steps",
                          "cos_min_ratio", "warmup_type", "last_batch_iteration"}},
      {"OneCycle", {"cycle_min_lr", "cycle_max_lr", "decay_lr_rate", "cycle_first_step_size",
                    "cycle_second_step_size", "cycle_first_stair_count",
                    "cycle_second_stair_count", "decay_step_size", "cycle_momentum",
                    "cycle_min_mom", "cycle_max_mom", "decay_mom_rate",
                    "last_batch_iteration"}},
  };
  bool total_given = false, min_lr_given = false, max_lr_given = false;
  int64_t last_batch_iteration = -1;
  const std::map<std::string, Handler> all = {
      {"warmup_min_lr", Number(&s->warmup_min_lr, 0, 1e3)},
      {"warmup_max_lr", Number(&s->warmup_max_lr, 0, 1e3)},
      {"warmup_num_steps", Integer(&s->warmup_num_steps, 0, kMaxSteps)},
      {"warmup_type", String(&s->warmup_type, {"log", "linear"})},
      {"total_num_steps", Given(&total_given, Integer(&s->total_num_steps, 1, kMaxSteps))},
      {"warmup_min_ratio", Number(&s->warmup_min_ratio, 0, 1)},
      {"cos_min_ratio", Number(&s->cos_min_ratio, 0, 1)},
      {"cycle_min_lr", Given(&min_lr_given, Number(&s->cycle_min_lr, 0, 1e3))},
      {"cycle_max_lr", Given(&max_lr_given, Number(&s->cycle_max_lr, 0, 1e3))},
      {"decay_lr_rate", Number(&s->decay_lr_rate, 0, 1e6)},
      {"cycle_first_step_size", Integer(&s->cycle_first_step_size, 1, kMaxSteps)},
      {"cycle_second_step_size", Integer(&s->cycle_second_step_size, 1, kMaxSteps)},
      {"cycle_first_stair_count", Integer(&s->cycle_first_stair_count, 0, kMaxSteps)},
      {"cycle_second_stair_count", Integer(&s->cycle_second_stair_count, 0, kMaxSteps)},
      {"decay_step_size", Integer(&s->decay_step_size, 0, kMaxSteps)},
      {"cycle_momentum", Bool(&s->cycle_momentum)},
      {"cycle_min_mom", Number(&s->cycle_min_mom, 0, 1)},
      {"cycle_max_mom", Number(&s->cycle_max_mom, 0, 1)},
      {"decay_mom_rate", Number(&s->decay_mom_rate, 0, 1e6)},
      {"last_batch_iteration", Integer(&last_batch_iteration, -1, kMaxSteps)},
  };
  ONEBIT_RETURN_IF_ERROR(TypedObject(
      v, path, type,
      {{"params", [&](const Value& p, const std::string& pp) {
          if (!type_given) return Bad(Join(path, "type"), "is required with params");
          return TypedParams(p, pp, s->type, keys_of_type, all);
        }}}));
  if (!type_given) return Bad(Join(path, "type"), "is required");
  const std::string pp = Join(path, "params");
  if (last_batch_iteration != -1) {
    return Bad(Join(pp, "last_batch_iteration"),
               "must be -1: onebit computes the schedule from the step, so a resumed job "
               "continues it by itself");
  }
  const int64_t warmup_steps = std::max<int64_t>(2, s->warmup_num_steps);  // as DeepSpeed
  if ((s->type == "WarmupDecayLR" || s->type == "WarmupCosineLR") && !total_given) {
    return Bad(Join(pp, "total_num_steps"), absl::StrCat("is required for ", s->type));
  }
  if (s->type == "WarmupDecayLR" && s->total_num_steps < warmup_steps) {
    notices->push_back(absl::StrCat(Join(pp, "total_num_steps"), ": ", s->total_num_steps,
                                    " is less than warmup_num_steps ", warmup_steps,
                                    " (as DeepSpeed, the lr drops to 0 after the warmup)"));
  }
  if (s->type == "WarmupCosineLR" && s->total_num_steps <= warmup_steps) {
    return Bad(Join(pp, "total_num_steps"),
               absl::StrCat("must be > warmup_num_steps = ", warmup_steps, ", got ",
                            s->total_num_steps));
  }
  if (s->type == "OneCycle") {
    if (!min_lr_given) return Bad(Join(pp, "cycle_min_lr"), "is required for OneCycle");
    if (!max_lr_given) return Bad(Join(pp, "cycle_max_lr"), "is required for OneCycle");
    if (s->cycle_min_mom >= 1 || s->cycle_max_mom >= 1) {
      return Bad(Join(pp, s->cycle_min_mom >= 1 ? "cycle_min_mom" : "cycle_max_mom"),
                 "must be < 1");
    }
    if (s->cycle_first_stair_count > 0 || s->cycle_second_stair_count > 0) {
      notices->push_back(absl::StrCat(Join(pp, "cycle_first_stair_count"),
                                      ": stair counts accepted, not used (DeepSpeed's OneCycle "
                                      "does not use them either: the cycle is continuous)"));
    }
  }
  return absl::OkStatus();
}

absl::Status ParsePrecision(const Value& v, const std::string& path, bool fp16,
                            PrecisionConfig* p, Notices* notices) {
  auto flag_notice = [=](std::string why) {
    return [=](const Value& b, const std::string& bp) -> absl::Status {
      bool on = false;
      ONEBIT_RETURN_IF_ERROR(Bool(&on)(b, bp));
      if (on) return Ignored(notices, why)(b, bp);
      return absl::OkStatus();
    };
  };
  if (!fp16) {
    return Object(v, path,
                  {{"enabled", Bool(&p->bf16)},
                   {"immediate_grad_update", flag_notice("a DeepSpeed bf16 optimizer detail")},
                   {"check_grad_overflow", flag_notice("a DeepSpeed bf16 optimizer detail")}});
  }
  return Object(
      v, path,
      {{"enabled", Bool(&p->fp16)},
       {"loss_scale", Number(&p->loss_scale, 0, 1e38)},
       {"initial_scale_power", Integer(&p->initial_scale_power, 0, 100)},
       {"loss_scale_window", Integer(&p->loss_scale_window, 1, 1 << 30)},
       {"hysteresis", Integer(&p->hysteresis, 1, 1 << 30)},
       {"consecutive_hysteresis", Bool(&p->consecutive_hysteresis)},
       {"min_loss_scale", Number(&p->min_loss_scale, 0, 1e38, /*min_exclusive=*/true)},
       {"auto_cast", flag_notice("the CUDA workloads choose what runs in fp16")},
       {"fp16_master_weights_and_grads",
        OnlyBool(false, "true is not supported: master parameters and optimizer state stay fp32")}});
}

absl::Status ParseZero(const Value& v, const std::string& path, Notices* notices) {
  if (v.kind_case() != Value::kStructValue) return Bad(path, "must be an object");
  int stage = 0;
  auto it = v.struct_value().fields().find("stage");
  if (it != v.struct_value().fields().end()) {
    ONEBIT_RETURN_IF_ERROR(Integer(&stage, 0, 3)(it->second, Join(path, "stage")));
  }
  if (stage == 3) {
    return Bad(Join(path, "stage"),
               "3 is not supported with 1-bit optimizers (it partitions the parameters; onebit "
               "keeps them whole on every worker)");
  }
  notices->push_back(absl::StrCat(
      path, ": stage ", stage,
      " accepted, no effect in onebit (every worker keeps the whole optimizer state; "
      "DeepSpeed itself refuses ZeRO with its 1-bit optimizers)"));
  return absl::OkStatus();
}

// onebit.momentum_mask.ranges: [[begin, end], ...], 0 <= begin < end.
Handler Ranges(std::vector<std::pair<int64_t, int64_t>>* out) {
  return [=](const Value& v, const std::string& path) -> absl::Status {
    if (v.kind_case() != Value::kListValue) {
      return Bad(path, "must be a list of [begin, end] element ranges");
    }
    out->clear();
    for (int i = 0; i < v.list_value().values_size(); ++i) {
      const Value& r = v.list_value().values(i);
      const std::string rp = absl::StrCat(path, "[", i, "]");
      if (r.kind_case() != Value::kListValue || r.list_value().values_size() != 2) {
        return Bad(rp, "must be a list of two integers [begin, end)");
      }
      int64_t begin = 0, end = 0;
      ONEBIT_RETURN_IF_ERROR(Integer(&begin, 0, kMaxParameters)(r.list_value().values(0), rp + "[0]"));
      ONEBIT_RETURN_IF_ERROR(Integer(&end, 0, kMaxParameters)(r.list_value().values(1), rp + "[1]"));
      if (begin >= end) {
        return Bad(rp, absl::StrCat("begin must be < end (a half-open range [begin, end)), got [",
                                    begin, ", ", end, "]"));
      }
      out->emplace_back(begin, end);
    }
    return absl::OkStatus();
  };
}

// Top-level DeepSpeed keys that only steer DeepSpeed's engine, and why they mean nothing here.
const std::map<std::string, std::string>& EngineOnlyKeys() {
  static const auto* keys = new std::map<std::string, std::string>{
      {"steps_per_print", "onebit.log_every sets how often workers log"},
      {"wall_clock_breakdown", "onebit's /metrics has the step's phases"},
      {"memory_breakdown", "PyTorch memory"},
      {"dump_state", "DeepSpeed's engine state"},
      {"prescale_gradients", "onebit averages gradients in fp32"},
      {"gradient_predivide_factor", "onebit averages gradients in fp32"},
      {"communication_data_type", "see onebit.exchange.warmup_dtype"},
      {"sparse_gradients", "onebit exchanges dense gradients"},
      {"zero_allow_untested_optimizer", "no ZeRO in onebit"},
      {"zero_force_ds_cpu_optimizer", "no ZeRO in onebit"},
      {"flops_profiler", "a DeepSpeed profiler"},
      {"tensorboard", "onebit exports Prometheus metrics"},
      {"wandb", "onebit exports Prometheus metrics"},
      {"csv_monitor", "onebit-worker --history_csv writes a CSV"},
      {"comet", "onebit exports Prometheus metrics"},
      {"comms_logger", "onebit exports Prometheus metrics"},
      {"activation_checkpointing", "PyTorch activation memory"},
      {"aio", "DeepSpeed's NVMe offload"},
      {"checkpoint", "onebit.checkpoint configures checkpoints"},
      {"data_types", "onebit accumulates gradients in fp32"},
      {"dataloader_drop_last", "the workloads sample their own batches"},
      {"disable_allgather", "no ZeRO in onebit"},
      {"timers", "onebit exports Prometheus metrics"},
      {"autotuning", "a DeepSpeed tuning tool"},
  };
  return *keys;
}

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

absl::Status Parse(const Value& root, JobConfig* c) {
  OptimizerConfig& o = c->optimizer;
  Notices* notices = &c->notices;
  int64_t train_batch = 0, accumulation = 1;
  bool train_batch_given = false, micro_given = false, accumulation_given = false;
  bool workers_given = false, device_given = false, backend_given = false;
  std::map<std::string, Handler> top = {
      {"train_micro_batch_size_per_gpu", BatchKey(&c->micro_batch, &micro_given, 1 << 20, notices)},
      {"train_batch_size", BatchKey(&train_batch, &train_batch_given, int64_t{1} << 40, notices)},
      {"gradient_accumulation_steps",
       BatchKey(&accumulation, &accumulation_given, 1 << 20, notices)},
      {"gradient_clipping", Number(&c->gradient_clipping, 0, 1e12)},
      {"steps", Integer(&c->steps, 1, kMaxSteps)},
      {"seed", Integer(&c->seed, 0, int64_t{1} << 53)},
      {"optimizer",
       [&](const Value& v, const std::string& path) {
         return ParseOptimizer(v, path, &o, &backend_given, notices);
       }},
      {"scheduler",
       [&](const Value& v, const std::string& path) {
         return ParseScheduler(v, path, &c->scheduler, notices);
       }},
      {"fp16",
       [&](const Value& v, const std::string& path) {
         return ParsePrecision(v, path, /*fp16=*/true, &c->precision, notices);
       }},
      {"bf16",
       [&](const Value& v, const std::string& path) {
         return ParsePrecision(v, path, /*fp16=*/false, &c->precision, notices);
       }},
      {"bfloat16",  // DeepSpeed's old name of bf16
       [&](const Value& v, const std::string& path) {
         return ParsePrecision(v, path, /*fp16=*/false, &c->precision, notices);
       }},
      {"zero_optimization",
       [&](const Value& v, const std::string& path) { return ParseZero(v, path, notices); }},
      {"amp", Unsupported(notices, "Apex AMP; use fp16 or bf16")},
      {"compression_training",
       Unsupported(notices, "DeepSpeed's quantization-aware training changes the model", true)},
      {"elasticity", Unsupported(notices, "elastic batch sizes; onebit.workers is fixed")},
      {"sparse_attention", Unsupported(notices, "it changes the model", true)},
      {"progressive_layer_drop", Unsupported(notices, "it changes the model")},
      {"eigenvalue", Unsupported(notices, "eigenvalue-based quantization schedules")},
      {"curriculum_learning", Unsupported(notices, "it changes the data order")},
      {"data_efficiency", Unsupported(notices, "it changes the data order")},
      {"onebit", nullptr},  // set below
  };
  for (const auto& [key, why] : EngineOnlyKeys()) top[key] = Ignored(notices, why);
  top["onebit"] = [&](const Value& v, const std::string& path) {
          return Object(
              v, path,
              {{"workers", Given(&workers_given, Integer(&c->workers, 1, 1024))},
               {"device", Given(&device_given, String(&c->device, {"cpu", "cuda"}))},
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
                                 {"inter_transport", String(&c->exchange.inter_transport,
                                                            {"auto", "gloo", "nccl"})},
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
               {"momentum_mask",
                [&](const Value& m, const std::string& mp) {
                  MomentumMaskConfig& k = c->momentum_mask;
                  return Object(m, mp,
                                {{"npy", String(&k.npy)},
                                 {"ranges", Ranges(&k.ranges)},
                                 {"auto_zero_grad", Bool(&k.auto_zero_grad)}});
                }},
               {"workload",
                [&](const Value& w, const std::string& wp) {
                  WorkloadConfig& k = c->workload;
                  return Object(w, wp,
                                {{"type", String(&k.type, {"fashion_mnist", "synthetic", "pytorch"})},
                                 {"hidden", Layers(&k.hidden)},
                                 {"data_dir", String(&k.data_dir)},
                                 {"eval_every", Integer(&k.eval_every, 0, kMaxSteps)},
                                 {"parameters", Integer(&k.parameters, 0, kMaxParameters)}});
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
  };
  ONEBIT_RETURN_IF_ERROR(Object(root, "", top));

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
  if ((precision.fp16 || precision.bf16) && c->device == "cpu") {
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
  if (x.inter_transport != "auto" && (x.mode != "hierarchical" || x.inter != "peer")) {
    return Bad("onebit.exchange.inter_transport", "only applies to mode hierarchical, inter peer");
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
  return exchange.mode == "peer" && exchange.warmup_dtype == "fp32" ? "ring" : "rank";
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

// The params of the optimizer's type, every one.
std::string OptimizerParamsJson(const OptimizerConfig& o) {
  std::string out = absl::StrFormat(
      R"("lr": %s, "betas": [%s, %s], "eps": %s, "weight_decay": %s,
               "bias_correction": %s, "comm_backend_name": "%s")",
      G(o.lr), G(o.beta1), G(o.beta2), G(o.eps), G(o.weight_decay), B(o.bias_correction),
      o.comm_backend_name);
  if (o.type != "ZeroOneAdam") absl::StrAppend(&out, ", \"freeze_step\": ", o.freeze_step);
  if (o.type == "ZeroOneAdam") {
    absl::StrAppend(&out, ",\n               \"var_freeze_step\": ", o.var_freeze_step,
                    ", \"var_update_scaler\": ", o.var_update_scaler,
                    ", \"local_step_scaler\": ", o.local_step_scaler,
                    ", \"local_step_clipper\": ", o.local_step_clipper);
  }
  if (o.type == "OneBitLamb") {
    absl::StrAppend(&out, ",\n               \"max_coeff\": ", G(o.max_coeff),
                    ", \"min_coeff\": ", G(o.min_coeff), ", \"coeff_beta\": ", G(o.coeff_beta),
                    ", \"factor_max\": ", G(o.factor_max), ", \"factor_min\": ", G(o.factor_min),
                    ", \"factor_threshold\": ", G(o.factor_threshold));
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
                 "inter_transport": "%s", "warmup_dtype": "%s", "warmup_order": "%s", "overlap": %s,
                 "compressor": "%s"},
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
      c.steps, c.seed, o.type, OptimizerParamsJson(o), SchedulerJson(c.scheduler),
      B(p.fp16), p.loss_scale, p.initial_scale_power, p.loss_scale_window, p.hysteresis,
      B(p.consecutive_hysteresis), p.min_loss_scale, B(p.bf16), c.workers, c.device, c.cpu_threads, c.lease_steps,
      c.log_every, c.exchange.mode, c.exchange.servers, c.exchange.local_size, c.exchange.inter,
      c.exchange.inter_transport, c.exchange.warmup_dtype, c.exchange.warmup_order, c.exchange.overlap ? "true" : "false",
      c.exchange.compressor, c.freeze.mode, c.freeze.threshold,
      c.freeze.reports_in_a_row, c.freeze.report_interval, c.freeze.min_warmup,
      c.freeze.max_warmup, Quote(c.momentum_mask.npy), RangesJson(c.momentum_mask.ranges),
      B(c.momentum_mask.auto_zero_grad), c.workload.type, absl::StrJoin(c.workload.hidden, ", "),
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

int64_t WarmupEndStep(const OptimizerConfig& optimizer) {
  return optimizer.type == "ZeroOneAdam" ? optimizer.var_freeze_step : optimizer.freeze_step;
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
