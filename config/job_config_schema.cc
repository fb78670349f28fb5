#include "config/job_config_schema.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <set>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "config/optimizer_kind.h"

namespace onebit {
namespace config_schema {

absl::Status Bad(const std::string& path, absl::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", message));
}

std::string Join(const std::string& path, const std::string& key) {
  return path.empty() ? key : absl::StrCat(path, ".", key);
}

absl::Status Object(const Value& v, const std::string& path, const Keys& keys) {
  if (v.kind_case() != Value::kStructValue) return Bad(path.empty() ? "(top level)" : path, "must be an object");
  // In name order, so that of several bad keys the same one is named every time (the
  // map's own order changes from run to run).
  std::vector<std::string> names;
  for (const auto& [key, child] : v.struct_value().fields()) names.push_back(key);
  std::sort(names.begin(), names.end());
  for (const std::string& key : names) {
    auto it = keys.find(key);
    if (it == keys.end()) {
      std::vector<std::string> known;
      for (const auto& [k, h] : keys) known.push_back(k);
      return Bad(Join(path, key), absl::StrCat("unknown key (known here: ", absl::StrJoin(known, ", "), ")"));
    }
    ONEBIT_RETURN_IF_ERROR(it->second.parse(v.struct_value().fields().at(key), Join(path, key)));
  }
  return absl::OkStatus();
}

namespace {

const char* B(bool b) { return b ? "true" : "false"; }

// A bound as the reference prints it: 2^k for the large powers of two the table uses as
// limits ("2^40" reads better than 1099511627776), the number otherwise.
std::string Readable(int64_t v) {
  if (v >= (int64_t{1} << 20) && (v & (v - 1)) == 0) {
    int k = 0;
    while ((int64_t{1} << k) != v) ++k;
    return absl::StrCat("2^", k);
  }
  return absl::StrCat(v);
}


// ---- Handlers of one value: each knows its type, its range and its field.

Key Number(double* out, double min, double max, bool min_exclusive = false) {
  Key k;
  k.parse = [=](const Value& v, const std::string& path) -> absl::Status {
    if (v.kind_case() != Value::kNumberValue) return Bad(path, "must be a number");
    const double x = v.number_value();
    if (!std::isfinite(x) || x < min || x > max || (min_exclusive && x == min)) {
      return Bad(path, absl::StrCat("must be in ", min_exclusive ? "(" : "[", min, ", ", max,
                                    "], got ", x));
    }
    *out = x == 0 ? 0.0 : x;  // -0 prints as "-0", which JSON reads back as 0
    return absl::OkStatus();
  };
  k.type = "number";
  k.allowed = absl::StrCat(min_exclusive ? "(" : "[", min, ", ", max, "]");
  k.value = [out] { return absl::StrCat(*out); };
  k.example = [=] {
    double x = std::clamp(*out, min, max);
    if (min_exclusive && x == min) x = max;
    return absl::StrCat(x);
  };
  return k;
}

template <typename Int>
Key Integer(Int* out, int64_t min, int64_t max) {
  Key k;
  k.parse = [=](const Value& v, const std::string& path) -> absl::Status {
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
  k.type = "integer";
  k.allowed = absl::StrCat("[", Readable(min), ", ", Readable(max), "]");
  k.value = [out] { return absl::StrCat(*out); };
  k.example = [=] { return absl::StrCat(std::clamp<int64_t>(static_cast<int64_t>(*out), min, max)); };
  return k;
}

Key String(std::string* out, std::set<std::string> allowed = {}) {
  Key k;
  k.parse = [=](const Value& v, const std::string& path) -> absl::Status {
    if (v.kind_case() != Value::kStringValue) return Bad(path, "must be a string");
    if (!allowed.empty() && !allowed.count(v.string_value())) {
      return Bad(path, absl::StrCat("must be one of ", absl::StrJoin(allowed, ", "), ", got '",
                                    v.string_value(), "'"));
    }
    *out = v.string_value();
    return absl::OkStatus();
  };
  k.type = "string";
  std::vector<std::string> choices;
  for (const std::string& a : allowed) choices.push_back(JsonString(a));
  k.allowed = absl::StrJoin(choices, ", ");
  k.value = [out] { return JsonString(*out); };
  k.example = [=] {
    return JsonString(allowed.empty() || allowed.count(*out) ? *out : *allowed.begin());
  };
  return k;
}

Key Bool(bool* out) {
  Key k;
  k.parse = [=](const Value& v, const std::string& path) -> absl::Status {
    if (v.kind_case() != Value::kBoolValue) return Bad(path, "must be true or false");
    *out = v.bool_value();
    return absl::OkStatus();
  };
  k.type = "boolean";
  k.value = [out] { return std::string(B(*out)); };
  k.example = k.value;
  return k;
}

Key Betas(double* beta1, double* beta2) {
  Key k;
  k.parse = [=](const Value& v, const std::string& path) -> absl::Status {
    if (v.kind_case() != Value::kListValue || v.list_value().values_size() != 2) {
      return Bad(path, "must be a list of two numbers [beta1, beta2]");
    }
    ONEBIT_RETURN_IF_ERROR(Number(beta1, 0, 1).parse(v.list_value().values(0), path + "[0]"));
    ONEBIT_RETURN_IF_ERROR(Number(beta2, 0, 1).parse(v.list_value().values(1), path + "[1]"));
    if (*beta1 >= 1 || *beta2 >= 1) return Bad(path, "betas must be < 1");
    return absl::OkStatus();
  };
  k.type = "[number, number]";
  k.allowed = "each in [0, 1)";
  k.value = [=] { return absl::StrCat("[", *beta1, ", ", *beta2, "]"); };
  k.example = k.value;
  return k;
}

Key Layers(std::vector<int>* out) {
  Key k;
  k.parse = [=](const Value& v, const std::string& path) -> absl::Status {
    if (v.kind_case() != Value::kListValue || v.list_value().values_size() < 1 ||
        v.list_value().values_size() > 8) {
      return Bad(path, "must be a list of 1 to 8 layer widths");
    }
    out->clear();
    for (int i = 0; i < v.list_value().values_size(); ++i) {
      int width = 0;
      ONEBIT_RETURN_IF_ERROR(Integer(&width, 1, 65536)
                                 .parse(v.list_value().values(i), absl::StrCat(path, "[", i, "]")));
      out->push_back(width);
    }
    return absl::OkStatus();
  };
  k.type = "list of integers";
  k.allowed = "1 to 8 widths, each in [1, 65536]";
  k.value = [out] { return absl::StrCat("[", absl::StrJoin(*out, ", "), "]"); };
  k.example = k.value;
  return k;
}

constexpr int64_t kMaxSteps = int64_t{1} << 40;
// Data parallel: each worker holds the whole model and its fp32 state (~24 bytes a parameter
// with onebit's errors), so 8.6B is past what one 80 GB device holds. In ps mode PsLayout
// also wants a push (4 bytes x parameters / shards) under 2 GiB. 1.07B runs on a GPU
// (tools/gpu/step_bench.py --model 1b).
constexpr int64_t kMaxParameters = int64_t{1} << 33;

// onebit.momentum_mask.ranges: [[begin, end], ...], 0 <= begin < end, at most
// kMaxMaskRanges of them (each member sends its config when it registers, under the
// coordinator's 4 MiB message limit; a mask of scattered zeros is a .npy's job).
Key Ranges(std::vector<std::pair<int64_t, int64_t>>* out) {
  Key k;
  k.parse = [=](const Value& v, const std::string& path) -> absl::Status {
    if (v.kind_case() != Value::kListValue) {
      return Bad(path, "must be a list of [begin, end] element ranges");
    }
    if (v.list_value().values_size() > kMaxMaskRanges) {
      return Bad(path, absl::StrCat(v.list_value().values_size(), " ranges, more than ",
                                    kMaxMaskRanges, ": give a mask of scattered zeros as a .npy "
                                    "(onebit.momentum_mask.npy)"));
    }
    out->clear();
    for (int i = 0; i < v.list_value().values_size(); ++i) {
      const Value& r = v.list_value().values(i);
      const std::string rp = absl::StrCat(path, "[", i, "]");
      if (r.kind_case() != Value::kListValue || r.list_value().values_size() != 2) {
        return Bad(rp, "must be a list of two integers [begin, end)");
      }
      int64_t begin = 0, end = 0;
      ONEBIT_RETURN_IF_ERROR(
          Integer(&begin, 0, kMaxParameters).parse(r.list_value().values(0), rp + "[0]"));
      ONEBIT_RETURN_IF_ERROR(
          Integer(&end, 0, kMaxParameters).parse(r.list_value().values(1), rp + "[1]"));
      if (begin >= end) {
        return Bad(rp, absl::StrCat("begin must be < end (a half-open range [begin, end)), got [",
                                    begin, ", ", end, "]"));
      }
      out->emplace_back(begin, end);
    }
    return absl::OkStatus();
  };
  k.type = "list of [begin, end]";
  k.allowed = absl::StrCat("0 <= begin < end <= ", Readable(kMaxParameters), "; at most ",
                           kMaxMaskRanges);
  k.value = [out] {
    std::vector<std::string> parts;
    for (const auto& [begin, end] : *out) parts.push_back(absl::StrCat("[", begin, ", ", end, "]"));
    return absl::StrCat("[", absl::StrJoin(parts, ", "), "]");
  };
  k.example = [] { return std::string("[[0, 10]]"); };
  return k;
}

// A batch-size key: an integer, or "auto" (Hugging Face's spelling) meaning not given.
Key BatchKey(int64_t* out, bool* given, int64_t max, Notices* notices) {
  Key k = Integer(out, 1, max);
  k.parse = [=, integer = k.parse](const Value& v, const std::string& path) -> absl::Status {
    if (v.kind_case() == Value::kStringValue && v.string_value() == "auto") {
      notices->push_back(absl::StrCat(path, ": \"auto\" taken as not given (derived from the "
                                            "other batch keys and onebit.workers)"));
      return absl::OkStatus();
    }
    *given = true;
    return integer(v, path);
  };
  k.type = "integer or \"auto\"";
  return k;
}

// ---- Wrappers.

// Sets *given, then runs `k`: for keys whose absence means something.
Key Given(bool* given, Key k) {
  k.parse = [given, inner = std::move(k.parse)](const Value& v, const std::string& path) {
    *given = true;
    return inner(v, path);
  };
  return k;
}

// Runs `after` (at the key's path) once `k` has parsed its value.
Key Then(Key k, std::function<absl::Status(const std::string& path)> after) {
  k.parse = [inner = std::move(k.parse), after](const Value& v,
                                                const std::string& path) -> absl::Status {
    ONEBIT_RETURN_IF_ERROR(inner(v, path));
    return after(path);
  };
  return k;
}

// An object of `keys`.
Key Section(Keys keys) {
  Key k;
  k.keys = std::make_shared<const Keys>(std::move(keys));
  k.parse = [keys = k.keys](const Value& v, const std::string& path) {
    return Object(v, path, *keys);
  };
  k.type = "object";
  k.example = [] { return std::string("{}"); };
  return k;
}

// An object whose "type" is parsed first (a JSON object's keys come in no order), then every
// key ("type" included, as a no-op).
Key TypedObject(Key type, Keys rest) {
  auto handlers = std::make_shared<Keys>(rest);
  (*handlers)["type"].parse = [](const Value&, const std::string&) { return absl::OkStatus(); };
  rest["type"] = std::move(type);
  Key k = Section(std::move(rest));
  k.parse = [keys = k.keys, handlers](const Value& v, const std::string& path) -> absl::Status {
    if (v.kind_case() != Value::kStructValue) return Bad(path, "must be an object");
    auto t = v.struct_value().fields().find("type");
    if (t != v.struct_value().fields().end()) {
      ONEBIT_RETURN_IF_ERROR(keys->at("type").parse(t->second, Join(path, "type")));
    }
    return Object(v, path, *handlers);
  };
  return k;
}

using KeysOfType = std::map<std::string, std::vector<std::string>>;

// The params of one type out of a family (optimizers, schedulers), the type's name read
// from type() when they are parsed: a key that only other types take is an error that says
// so, not "unknown key".
Key TypedParams(std::function<std::string()> type, KeysOfType keys_of_type, Keys all) {
  for (auto& [key, k] : all) {
    for (const auto& [t, ks] : keys_of_type) {
      if (std::find(ks.begin(), ks.end(), key) != ks.end()) k.types.push_back(t);
    }
  }
  Key params = Section(std::move(all));
  params.parse = [type, keys_of_type, all = params.keys](const Value& v,
                                                         const std::string& path) {
    const std::string name = type();
    const std::vector<std::string>& mine = keys_of_type.at(name);
    Keys handlers;
    for (const std::string& k : mine) handlers[k].parse = all->at(k).parse;
    for (const auto& [other, keys] : keys_of_type) {
      if (other == name) continue;
      for (const std::string& k : keys) {
        if (handlers.count(k)) continue;
        handlers[k].parse = [type = name, keys_of_type, k](const Value&, const std::string& p) {
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
  };
  return params;
}

// ---- DeepSpeed's keys that onebit accepts without effect or refuses. Each carries its own
// meaning: what onebit does with it.

// A key accepted without effect: one notice.
Key Ignored(Notices* notices, std::string why) {
  Key k;
  k.parse = [=](const Value&, const std::string& path) {
    notices->push_back(absl::StrCat(path, ": accepted, no effect in onebit (", why, ")"));
    return absl::OkStatus();
  };
  k.kind = KeyKind::kNoEffect;
  k.type = "any";
  k.meaning = absl::StrCat("Accepted, no effect in onebit (notice): ", why, ".");
  k.example = [] { return std::string("true"); };
  return k;
}

// A boolean accepted without effect: one notice.
Key IgnoredBool(Notices* notices, std::string why) {
  Key k = Ignored(notices, why);
  k.parse = [ignored = k.parse](const Value& v, const std::string& path) -> absl::Status {
    bool b = false;
    ONEBIT_RETURN_IF_ERROR(Bool(&b).parse(v, path));
    return ignored(v, path);
  };
  k.type = "boolean";
  return k;
}

// A boolean that means nothing here: true is a notice "path: `notice`", false nothing.
Key NoticeIfTrue(Notices* notices, std::string notice) {
  Key k;
  k.parse = [=](const Value& v, const std::string& path) -> absl::Status {
    bool on = false;
    ONEBIT_RETURN_IF_ERROR(Bool(&on).parse(v, path));
    if (on) notices->push_back(absl::StrCat(path, ": ", notice));
    return absl::OkStatus();
  };
  k.kind = KeyKind::kNoEffect;
  k.type = "boolean";
  k.meaning = absl::StrCat("No effect in onebit; true gives the notice \"", notice, "\".");
  k.example = [] { return std::string("true"); };
  return k;
}

// A boolean that must be `supported`; the other value is an error saying `why`.
Key OnlyBool(bool supported, std::string why) {
  Key k;
  k.parse = [=](const Value& v, const std::string& path) -> absl::Status {
    bool b = supported;
    ONEBIT_RETURN_IF_ERROR(Bool(&b).parse(v, path));
    if (b != supported) return Bad(path, why);
    return absl::OkStatus();
  };
  k.kind = KeyKind::kOnly;
  k.type = "boolean";
  k.allowed = B(supported);
  k.meaning = absl::StrCat("Accepted as ", B(supported), " only (no effect); ", B(!supported),
                           " is an error: ", why, ".");
  k.example = [supported] { return std::string(B(supported)); };
  return k;
}

// A DeepSpeed feature onebit does not have: {"enabled": false} (or no "enabled" where
// DeepSpeed's default is off) is a notice; anything enabled is an error saying `why`.
Key Unsupported(Notices* notices, std::string why, bool enabled_by_default = false) {
  Key k;
  k.parse = [=](const Value& v, const std::string& path) -> absl::Status {
    bool enabled = enabled_by_default;
    if (v.kind_case() == Value::kStructValue) {
      auto it = v.struct_value().fields().find("enabled");
      if (it != v.struct_value().fields().end()) {
        ONEBIT_RETURN_IF_ERROR(Bool(&enabled).parse(it->second, Join(path, "enabled")));
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
  k.kind = KeyKind::kUnsupported;
  k.type = "object or boolean";
  k.allowed = enabled_by_default ? "{\"enabled\": false}, false"
                                 : "{\"enabled\": false}, an object without \"enabled\", false";
  k.meaning = absl::StrCat("Not supported by onebit (", why,
                           "): enabled is an error; disabled is accepted, no effect (notice).");
  k.example = [] { return std::string("{\"enabled\": false}"); };
  return k;
}

// A key that is always an error saying `why`.
Key Rejected(std::string why) {
  Key k;
  k.parse = [why](const Value&, const std::string& path) { return Bad(path, why); };
  k.kind = KeyKind::kRejected;
  k.type = "any";
  k.meaning = absl::StrCat("An error: ", why, ".");
  return k;
}

// ---- The blocks.

// The optimizer types' names joined by `sep`, each between `quote`s.
std::string OptimizerNames(const char* sep, const char* quote) {
  std::vector<std::string> names;
  for (const OptimizerTraits& t : AllOptimizerTraits()) {
    names.push_back(absl::StrCat(quote, t.name, quote));
  }
  return absl::StrJoin(names, sep);
}

Key OptimizerBlock(ParseState* s) {
  OptimizerConfig* o = &s->config->optimizer;
  Notices* notices = &s->config->notices;
  Key type;
  type.parse = [o](const Value& t, const std::string& tp) -> absl::Status {
    std::string name;
    ONEBIT_RETURN_IF_ERROR(String(&name).parse(t, tp));
    absl::StatusOr<OptimizerKind> kind = ParseOptimizerKind(name);
    if (!kind.ok()) {
      return Bad(tp, absl::StrCat("must be one of ", OptimizerNames(", ", ""),
                                  " (case-insensitive; AdamW is Adam), got '", name, "'"));
    }
    o->kind = *kind;
    return absl::OkStatus();
  };
  type.type = "string";
  type.allowed =
      absl::StrCat(OptimizerNames(", ", "\""), " (any case; \"AdamW\" is \"Adam\")");
  type.value = [o] { return JsonString(Traits(o->kind).name); };
  type.example = type.value;
  type.meaning =
      "The optimizer: 1-bit Adam, 0/1 Adam, 1-bit LAMB, or Adam (full precision throughout: "
      "1-bit Adam's warmup forever; its weight decay is decoupled, as AdamW's).";

  const std::vector<std::string> common = {"lr", "betas", "eps", "weight_decay", "bias_correction",
                                           "comm_backend_name", "cuda_aware", "eps_inside_sqrt",
                                           "amsgrad", "max_grad_norm"};
  KeysOfType keys_of_type;
  for (const OptimizerTraits& t : AllOptimizerTraits()) {
    std::vector<std::string>& keys = keys_of_type[t.name];
    keys = common;
    keys.insert(keys.end(), t.own_keys.begin(), t.own_keys.end());
  }
  Keys all = {
      {"lr", Number(&o->lr, 0, 1e3).Means(
                 "The learning rate; replaced by the scheduler's value when `scheduler` is set.")},
      {"betas", Betas(&o->beta1, &o->beta2).Means("Adam's [beta1, beta2].")},
      {"eps", Number(&o->eps, 0, 1, /*min_exclusive=*/true)
                  .Means("Added to the denominator outside the sqrt.")},
      {"weight_decay", Number(&o->weight_decay, 0, 1e3)
                           .Means("Decoupled weight decay (as AdamW's).")},
      {"bias_correction",
       Then(Bool(&o->bias_correction),
            [o, notices](const std::string& bp) {
              if (o->bias_correction && Traits(o->kind).compresses) {
                notices->push_back(absl::StrCat(
                    bp, ": true: onebit applies Adam's bias correction; DeepSpeed's 1-bit "
                        "optimizers accept this key and never apply it, so results differ from "
                        "DeepSpeed's (false matches them)"));
              }
              return absl::OkStatus();
            })
           .Means("Adam's bias correction. DeepSpeed's 1-bit optimizers accept the key and "
                  "never apply it. So true gives a notice that results differ from "
                  "DeepSpeed's, except for Adam. Adam's default is false too (DeepSpeed's "
                  "Adam: true), because it is 1-bit Adam's full-precision baseline.")},
      {"comm_backend_name",
       Then(String(&o->comm_backend_name, {"gloo", "nccl", "mpi"}),
            [s, o, notices](const std::string& bp) {
              if (o->comm_backend_name == "mpi") {
                notices->push_back(absl::StrCat(bp, ": mpi: onebit has no MPI backend; gloo "
                                                    "carries the same exchange"));
                o->comm_backend_name = "gloo";
              }
              s->backend_given = true;
              return absl::OkStatus();
            })
           .Means("The workers' transport: gloo (CPU or GPU) or nccl (GPU). mpi runs on gloo, "
                  "with a notice. With nccl and no onebit.device, the device is cuda, with a "
                  "notice; with device cpu, nccl is an error.")},
      {"cuda_aware", IgnoredBool(notices, "it steers DeepSpeed's MPI backend; onebit has none")},
      {"eps_inside_sqrt",
       NoticeIfTrue(notices, "true accepted, no effect: eps is added outside the sqrt "
                             "(DeepSpeed's 1-bit optimizers ignore this key too)")},
      {"amsgrad", OnlyBool(false, "true is not supported (DeepSpeed's 1-bit optimizers refuse "
                                  "the AMSGrad variant too)")},
      {"max_grad_norm", Rejected("not supported as an optimizer parameter (as in DeepSpeed): "
                                 "use the top-level gradient_clipping")},
      {"update_clip",
       Number(&o->update_clip, 0, 1e6)
           .Means("onebit's own: the bound on each element's m/(sqrt(v)+eps) on the steps whose "
                  "variance is frozen. Those are 1-bit Adam's compression stage, and 0/1 Adam's "
                  "steps between variance updates. The weight decay is added after the clip. "
                  "It stops the elements whose variance froze at ~0 (dead units, unused "
                  "embedding rows) from moving by scale/eps when the 1-bit momentum gives them "
                  "+-scale. 0: no clip, as DeepSpeed. Adam accepts it and never freezes.")},
      {"freeze_step", Integer(&o->freeze_step, 0, kMaxSteps)
                          .Means("The last warmup step (static freeze, onebit.freeze.mode "
                                 "static). Adam accepts it and never freezes.")},
      {"var_freeze_step", Integer(&o->var_freeze_step, 0, kMaxSteps)
                              .Means("The last step that may update the variance (the end of "
                                     "0/1 Adam's variance stage).")},
      {"var_update_scaler", Integer(&o->var_update_scaler, 1, kMaxSteps)
                                .Means("kappa: variance updates before var_interval doubles.")},
      {"local_step_scaler", Integer(&o->local_step_scaler, 1, kMaxSteps)
                                .Means("Local steps before local_step_interval doubles.")},
      {"local_step_clipper", Integer(&o->local_step_clipper, 1, kMaxSteps)
                                 .Means("H: the largest local_step_interval.")},
      {"max_coeff", Number(&o->max_coeff, 0, 1e6, /*min_exclusive=*/true)
                        .Means("The trust ratio's upper clamp.")},
      {"min_coeff", Number(&o->min_coeff, 0, 1e6)
                        .Means("The trust ratio's lower clamp; at most max_coeff.")},
      {"coeff_beta", Number(&o->coeff_beta, 0, 1)
                         .Means("The factor of the trust ratio's running average; below 1.")},
      {"factor_max", Number(&o->factor_max, 0, 1e6, /*min_exclusive=*/true)
                         .Means("The compression stage's upper clamp of the variance factor.")},
      {"factor_min", Number(&o->factor_min, 0, 1e6, /*min_exclusive=*/true)
                         .Means("The compression stage's lower clamp of the variance factor; "
                                "at most factor_max.")},
      {"factor_threshold", Number(&o->factor_threshold, 0, 1e6)
                               .Means("How far the variance factor may move from a group's "
                                      "last factor in one step.")},
      {"adam_w_mode", OnlyBool(true, "false (L2 regularisation in the gradient) is not "
                                     "supported: onebit's weight decay is decoupled (AdamW)")},
      {"torch_adam", IgnoredBool(notices, "it picks DeepSpeed's Adam implementation")},
      {"set_grad_none", IgnoredBool(notices, "PyTorch gradient memory")},
  };
  Key params = TypedParams([o] { return std::string(Traits(o->kind).name); },
                           std::move(keys_of_type), std::move(all))
                   .Means("The type's hyper-parameters (the Types column says which type takes "
                          "which); a key of another type is an error, as DeepSpeed's "
                          "constructor would raise.");
  Key block = TypedObject(
      std::move(type),
      {{"params", std::move(params)},
       {"legacy_fusion", IgnoredBool(notices, "DeepSpeed's fused-kernel choice")}});
  return Then(std::move(block),
              [o](const std::string& path) {
                const std::string pp = Join(path, "params");
                if (o->coeff_beta >= 1) return Bad(Join(pp, "coeff_beta"), "must be < 1");
                if (o->min_coeff > o->max_coeff) {
                  return Bad(Join(pp, "min_coeff"), absl::StrCat("must be <= max_coeff = ",
                                                                 o->max_coeff, ", got ",
                                                                 o->min_coeff));
                }
                if (o->factor_min > o->factor_max) {
                  return Bad(Join(pp, "factor_min"), absl::StrCat("must be <= factor_max = ",
                                                                  o->factor_max, ", got ",
                                                                  o->factor_min));
                }
                return absl::OkStatus();
              })
      .Means("DeepSpeed's optimizer block: the type and its params (docs/algorithms.md has the "
             "math of each type).");
}

Key SchedulerBlock(ParseState* s) {
  SchedulerConfig* sc = &s->config->scheduler;
  Notices* notices = &s->config->notices;
  Key type = Given(&s->scheduler_type_given,
                   String(&sc->type, {"WarmupLR", "WarmupDecayLR", "OneCycle", "WarmupCosineLR"}))
                 .Means("The schedule; required with the block (no block: optimizer.params.lr "
                        "throughout).");
  const std::vector<std::string> warmup = {"warmup_min_lr", "warmup_max_lr", "warmup_num_steps",
                                           "warmup_type", "last_batch_iteration"};
  std::vector<std::string> warmup_decay = warmup;
  warmup_decay.push_back("total_num_steps");
  KeysOfType keys_of_type = {
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
  Keys all = {
      {"warmup_min_lr", Number(&sc->warmup_min_lr, 0, 1e3).Means("The lr at the warmup's start.")},
      {"warmup_max_lr", Number(&sc->warmup_max_lr, 0, 1e3)
                            .Means("The lr at the warmup's end (and WarmupLR's after it).")},
      {"warmup_num_steps", Integer(&sc->warmup_num_steps, 0, kMaxSteps)
                               .Means("Steps of the warmup (at least 2, as in DeepSpeed).")},
      {"warmup_type", String(&sc->warmup_type, {"log", "linear"}).Means("The warmup's curve.")},
      {"total_num_steps",
       Given(&s->total_given, Integer(&sc->total_num_steps, 1, kMaxSteps))
           .Means("Required. The schedule's last step: WarmupDecayLR decays linearly to 0 "
                  "there (a value below warmup_num_steps gives a notice); WarmupCosineLR's must "
                  "be above warmup_num_steps.")},
      {"warmup_min_ratio", Number(&sc->warmup_min_ratio, 0, 1)
                               .Means("The warmup's start, a fraction of optimizer.params.lr.")},
      {"cos_min_ratio", Number(&sc->cos_min_ratio, 0, 1)
                            .Means("The cosine's end, a fraction of optimizer.params.lr.")},
      {"cycle_min_lr", Given(&s->min_lr_given, Number(&sc->cycle_min_lr, 0, 1e3))
                           .Means("Required. The cycle's lowest lr.")},
      {"cycle_max_lr", Given(&s->max_lr_given, Number(&sc->cycle_max_lr, 0, 1e3))
                           .Means("Required. The cycle's highest lr.")},
      {"decay_lr_rate", Number(&sc->decay_lr_rate, 0, 1e6)
                            .Means("After the cycle: lr = cycle_min_lr / (1 + decay_lr_rate * "
                                   "steps since / decay_step_size).")},
      {"cycle_first_step_size", Integer(&sc->cycle_first_step_size, 1, kMaxSteps)
                                    .Means("Steps of the cycle's first (rising) half.")},
      {"cycle_second_step_size", Integer(&sc->cycle_second_step_size, 1, kMaxSteps)
                                     .Means("Steps of the cycle's second half; the default -1 "
                                            "means cycle_first_step_size.")},
      {"cycle_first_stair_count", Integer(&sc->cycle_first_stair_count, 0, kMaxSteps)
                                      .Means("Accepted, not used (notice when > 0): as in "
                                             "DeepSpeed's OneCycle, the cycle is continuous.")},
      {"cycle_second_stair_count", Integer(&sc->cycle_second_stair_count, 0, kMaxSteps)
                                       .Means("Accepted, not used (notice when > 0); the "
                                              "default -1 means cycle_first_stair_count.")},
      {"decay_step_size", Integer(&sc->decay_step_size, 0, kMaxSteps)
                              .Means("The steps of the decays after the cycle; 0: no decay.")},
      {"cycle_momentum", Bool(&sc->cycle_momentum)
                             .Means("Cycle beta1 inversely to the lr (beta2 = 0.99, as "
                                    "DeepSpeed does).")},
      {"cycle_min_mom", Number(&sc->cycle_min_mom, 0, 1).Means("beta1's lowest; below 1.")},
      {"cycle_max_mom", Number(&sc->cycle_max_mom, 0, 1).Means("beta1's highest; below 1.")},
      {"decay_mom_rate", Number(&sc->decay_mom_rate, 0, 1e6)
                             .Means("After the cycle: beta1's decay, as decay_lr_rate's.")},
      {"last_batch_iteration",
       Integer(&s->last_batch_iteration, -1, kMaxSteps)
           .Means("-1 only: onebit computes the schedule from the step, so a resumed job "
                  "continues it by itself.")},
  };
  Key params = TypedParams([sc] { return sc->type; }, std::move(keys_of_type), std::move(all))
                   .Means("The type's parameters (the Types column says which type takes "
                          "which); defaults are DeepSpeed's.");
  params.parse = [s, typed = std::move(params.parse)](const Value& p, const std::string& pp) {
    if (!s->scheduler_type_given) {
      return Bad(Join(pp.substr(0, pp.size() - std::string(".params").size()), "type"),
                 "is required with params");
    }
    return typed(p, pp);
  };
  Key block = TypedObject(std::move(type), {{"params", std::move(params)}});
  return Then(std::move(block),
              [s, sc, notices](const std::string& path) {
                if (!s->scheduler_type_given) return Bad(Join(path, "type"), "is required");
                const std::string pp = Join(path, "params");
                if (s->last_batch_iteration != -1) {
                  return Bad(Join(pp, "last_batch_iteration"),
                             "must be -1: onebit computes the schedule from the step, so a "
                             "resumed job continues it by itself");
                }
                const int64_t warmup_steps = std::max<int64_t>(2, sc->warmup_num_steps);  // as DeepSpeed
                if ((sc->type == "WarmupDecayLR" || sc->type == "WarmupCosineLR") &&
                    !s->total_given) {
                  return Bad(Join(pp, "total_num_steps"), absl::StrCat("is required for ", sc->type));
                }
                if (sc->type == "WarmupDecayLR" && sc->total_num_steps < warmup_steps) {
                  notices->push_back(absl::StrCat(
                      Join(pp, "total_num_steps"), ": ", sc->total_num_steps,
                      " is less than warmup_num_steps ", warmup_steps,
                      " (as DeepSpeed, the lr drops to 0 after the warmup)"));
                }
                if (sc->type == "WarmupCosineLR" && sc->total_num_steps <= warmup_steps) {
                  return Bad(Join(pp, "total_num_steps"),
                             absl::StrCat("must be > warmup_num_steps = ", warmup_steps, ", got ",
                                          sc->total_num_steps));
                }
                if (sc->type == "OneCycle") {
                  if (!s->min_lr_given) return Bad(Join(pp, "cycle_min_lr"), "is required for OneCycle");
                  if (!s->max_lr_given) return Bad(Join(pp, "cycle_max_lr"), "is required for OneCycle");
                  if (sc->cycle_min_mom >= 1 || sc->cycle_max_mom >= 1) {
                    return Bad(Join(pp, sc->cycle_min_mom >= 1 ? "cycle_min_mom" : "cycle_max_mom"),
                               "must be < 1");
                  }
                  if (sc->cycle_first_stair_count > 0 || sc->cycle_second_stair_count > 0) {
                    notices->push_back(absl::StrCat(
                        Join(pp, "cycle_first_stair_count"),
                        ": stair counts accepted, not used (DeepSpeed's OneCycle "
                        "does not use them either: the cycle is continuous)"));
                  }
                }
                return absl::OkStatus();
              })
      .Means("DeepSpeed's learning-rate scheduler (deepspeed/runtime/lr_schedules.py); "
             "config/lr_schedule.h computes the lr of a step. No block: optimizer.params.lr "
             "throughout.");
}

Key Fp16Block(PrecisionConfig* p, Notices* notices) {
  return Section({
      {"enabled", Bool(&p->fp16).Means("The CUDA workloads compute in fp16; a PyTorch "
                                       "script's loss is scaled (opt.scale(loss)).")},
      {"loss_scale", Number(&p->loss_scale, 0, 1e38)
                         .Means("0: dynamic loss scaling; > 0: this fixed scale.")},
      {"initial_scale_power", Integer(&p->initial_scale_power, 0, 100)
                                  .Means("Dynamic: the scale starts at 2^initial_scale_power.")},
      {"loss_scale_window", Integer(&p->loss_scale_window, 1, 1 << 30)
                                .Means("Dynamic: steps without overflow before the scale "
                                       "doubles.")},
      {"hysteresis", Integer(&p->hysteresis, 1, 1 << 30)
                         .Means("Dynamic: overflows tolerated before the scale halves.")},
      {"consecutive_hysteresis", Bool(&p->consecutive_hysteresis)
                                     .Means("Dynamic: DeepSpeed's consecutive_hysteresis (the "
                                            "tolerance refills after a step without "
                                            "overflow).")},
      {"min_loss_scale", Number(&p->min_loss_scale, 0, 1e38, /*min_exclusive=*/true)
                             .Means("Dynamic: the smallest scale.")},
      {"auto_cast",
       NoticeIfTrue(notices, "accepted, no effect in onebit (the CUDA workloads choose what "
                             "runs in fp16)")},
      {"fp16_master_weights_and_grads",
       OnlyBool(false, "true is not supported: master parameters and optimizer state stay fp32")},
  }).Means("DeepSpeed's fp16 block. The CUDA workloads compute in fp16; master parameters and "
           "optimizer state stay fp32. The CPU path computes in fp32 whatever the block says, "
           "with a notice. Every worker agrees on the loss scale: a step that overflowed on "
           "any worker is skipped on all. With workload pytorch (onebit.torch), on any "
           "device, the script's torch.autocast decides what computes in fp16. onebit then "
           "scales the loss: call backward() on opt.scale(loss), in place of torch's "
           "GradScaler. Not together with bf16.");
}

Key Bf16Block(PrecisionConfig* p, Notices* notices) {
  const std::string notice = "accepted, no effect in onebit (a DeepSpeed bf16 optimizer detail)";
  return Section({
      {"enabled", Bool(&p->bf16).Means("The CUDA workloads compute in bf16.")},
      {"immediate_grad_update", NoticeIfTrue(notices, notice)},
      {"check_grad_overflow", NoticeIfTrue(notices, notice)},
  }).Means("DeepSpeed's bf16 block. The CUDA workloads compute in bf16; master parameters and "
           "optimizer state stay fp32. The CPU path computes in fp32 whatever the block says, "
           "with a notice. With workload pytorch the block has no effect, with a notice: the "
           "script's torch.autocast decides. Not together with fp16.");
}

constexpr char kZeroStage3[] =
    "3 is not supported with 1-bit optimizers (it partitions the parameters; onebit keeps them "
    "whole on every worker)";

// Records the stage; CheckJobConfig decides what it does, since that depends on the
// exchange and the optimizer, which may come after the block. A setting, not a key without
// effect: stage 1 or 2 may turn on onebit.exchange.shard_state.
Key ZeroBlock(ParseState* s) {
  Key k;
  k.parse = [s](const Value& v, const std::string& path) -> absl::Status {
    if (v.kind_case() != Value::kStructValue) return Bad(path, "must be an object");
    int stage = 0;
    auto it = v.struct_value().fields().find("stage");
    if (it != v.struct_value().fields().end()) {
      ONEBIT_RETURN_IF_ERROR(Integer(&stage, 0, 3).parse(it->second, Join(path, "stage")));
    }
    if (stage == 3) return Bad(Join(path, "stage"), kZeroStage3);
    s->zero_stage = stage;
    return absl::OkStatus();
  };
  k.type = "object";
  k.allowed = "\"stage\" 0, 1 or 2 (other keys are not read)";
  k.value = [] { return std::string("{\"stage\": 0}"); };  // DeepSpeed's default
  k.meaning = absl::StrCat(
      "Stage 1 or 2 turns on onebit.exchange.shard_state, with a notice, where it applies: "
      "mode hierarchical, local_size >= 2, an optimizer other than ZeroOneAdam, and "
      "shard_state not given. Elsewhere the stage has no effect, and a notice says why: every "
      "worker keeps the whole optimizer state (DeepSpeed itself refuses ZeRO with its 1-bit "
      "optimizers). Stage 0: no effect (notice). Stage ", kZeroStage3, ".");
  k.example = [] { return std::string("{\"stage\": 1}"); };
  return k;
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
      {"zero_allow_untested_optimizer",
       "onebit.exchange.shard_state says where onebit shards the optimizer state"},
      {"zero_force_ds_cpu_optimizer", "no ZeRO-Offload in onebit"},
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
      {"disable_allgather",
       "onebit's sharded state (onebit.exchange.shard_state) all-gathers the parameters "
       "inside each node"},
      {"timers", "onebit exports Prometheus metrics"},
      {"autotuning", "a DeepSpeed tuning tool"},
  };
  return *keys;
}

Key OnebitBlock(ParseState* s) {
  JobConfig* c = s->config;
  ExchangeConfig* x = &c->exchange;
  FreezeConfig* z = &c->freeze;
  MomentumMaskConfig* m = &c->momentum_mask;
  WorkloadConfig* w = &c->workload;
  CheckpointConfig* q = &c->checkpoint;
  FailureConfig* f = &c->failure;
  SecurityConfig* sec = &c->security;
  PortsConfig* p = &c->ports;
  constexpr double kDay = 86400;
  return Section({
      {"workers",
       Given(&s->workers_given, Integer(&c->workers, 1, 1024))
           .Means("Worker processes (data-parallel ranks). Not given while all three batch "
                  "keys are: train_batch_size / (micro * accumulation), with a notice.")},
      {"device",
       Given(&s->device_given, String(&c->device, {"cpu", "cuda"}))
           .Means("Where workers compute. Not given with comm_backend_name nccl: cuda, with a "
                  "notice.")},
      {"cpu_threads",
       Integer(&c->cpu_threads, 0, 256)
           .Means("Threads of the CPU kernels (compression, optimizer update) in each worker "
                  "and shard. 0: the CPUs the process may use, divided among the workers that "
                  "share the machine (LOCAL_WORLD_SIZE). Any value gives the same bits.")},
      {"lease_steps", Integer(&c->lease_steps, 1, 1 << 20)
                          .Means("Steps one lease grants a worker: how far it runs before it asks "
                                 "the coordinator again.")},
      {"log_every", Integer(&c->log_every, 1, kMaxSteps)
                        .Means("Steps between the workers' log lines.")},
      {"exchange",
       Section({
           {"mode", String(&x->mode, {"peer", "ps", "hierarchical"})
                        .Means("peer: every worker is the server of its own chunk; ps: "
                               "dedicated parameter-server shards; hierarchical: full "
                               "precision inside a node, 1-bit between nodes (see inter).")},
           {"servers", Integer(&x->servers, 0, 1024)
                           .Means("Parameter-server shards: at least 1 in ps mode and "
                                  "hierarchical over inter ps, 0 otherwise.")},
           {"local_size", Integer(&x->local_size, 1, 1024)
                              .Means("Hierarchical: workers per node (ranks are node-major); "
                                     "must divide onebit.workers. 1 in the other modes.")},
           {"inter", String(&x->inter, {"peer", "ps"})
                         .Means("Hierarchical: how a node's slice crosses nodes; with ps, "
                                "servers must be a multiple of local_size.")},
           {"inter_transport",
            String(&x->inter_transport, {"auto", "gloo", "nccl"})
                .Means("Hierarchical over inter peer (or inter ps with warmup_over workers): "
                       "the transport between nodes; auto is comm_backend_name; nccl needs "
                       "device cuda.")},
           {"warmup_over",
            Given(&s->warmup_over_given, String(&x->warmup_over, {"shards", "workers"}))
                .Means("With shards (ps, or hierarchical over inter ps): where the warmup's "
                       "full-precision sums go. shards: through the shards. workers: between "
                       "the workers, as in peer mode; the shards then serve only the "
                       "compressed stage. workers needs OneBitAdam or OneBitLamb. Not given: "
                       "workers for those two, as fast as DDP's step or faster wherever the "
                       "shards run (BENCHMARKS.md), shards for the others.")
                .DefaultIs("workers with shards and OneBitAdam or OneBitLamb, else shards")},
           {"warmup_dtype",
            String(&x->warmup_dtype, {"fp32", "bf16", "fp16"})
                .Means("What the full-precision (warmup) exchange carries on the wire; bf16 "
                       "and fp16 halve the bytes (fp16 overflows past 65504). Only where the "
                       "warmup goes between the workers (peer mode, ps with warmup_over "
                       "workers).")},
           {"warmup_order",
            String(&x->warmup_order, {"auto", "rank", "ring"})
                .Means("The fixed order of the full-precision sums. rank: rank 0 up, the "
                       "shards' order. ring: for a warmup between the workers with the fp32 "
                       "wire. auto: ring where the warmup goes between the workers with the "
                       "fp32 wire, rank otherwise.")},
           {"overlap", Bool(&x->overlap)
                           .Means("Peer mode, or ps with warmup_over \"workers\": exchange "
                                  "the full-precision gradient layer by layer during the "
                                  "backward pass (workloads that announce layers). Same bits "
                                  "either way; on GPUs only with nccl.")},
           {"compressor",
            String(&x->compressor, {"onebit", "int8", "fp8"})
                .Means("The compressed exchange's wire format: onebit (1 bit and a scale per "
                       "block), int8 (a code per element; 4x fewer bytes than fp32) or fp8 "
                       "(an e4m3 code per element and a power-of-two scale per 32; 3.9x "
                       "fewer).")},
           {"shard_state",
            Given(&s->shard_state_given, Bool(&x->shard_state))
                .Means("Hierarchical with local_size >= 2: each worker keeps the optimizer "
                       "state of its slice of the node only (ZeRO stage 1 inside the node); "
                       "the parameters stay whole, all-gathered inside the node after each "
                       "update. Same bits as false. Not with ZeroOneAdam (its local steps "
                       "keep each worker's own state). Not given: true with "
                       "zero_optimization.stage 1 or 2 where it applies, false otherwise.")},
       }).Means("How workers exchange gradients and momenta.")},
      {"freeze",
       Section({
           {"mode", String(&z->mode, {"static", "automatic"})
                        .Means("static: freeze at optimizer.params.freeze_step; automatic: "
                               "when the variance settles (the keys below).")},
           {"threshold", Number(&z->threshold, 0, 1e6, true)
                             .Means("Automatic: freeze when ||v_t - v_{t-k}|| / ||v_t|| stays "
                                    "under this (k = report_interval).")},
           {"reports_in_a_row", Integer(&z->reports_in_a_row, 1, 1 << 20)
                                    .Means("Automatic: reports under the threshold in a row "
                                           "before the freeze.")},
           {"report_interval", Integer(&z->report_interval, 1, kMaxSteps)
                                   .Means("Automatic: steps between variance reports.")},
           {"min_warmup", Integer(&z->min_warmup, 0, kMaxSteps)
                              .Means("Automatic: no freeze before this step.")},
           {"max_warmup", Integer(&z->max_warmup, 0, kMaxSteps)
                              .Means("Automatic: the freeze at this step at the latest; at "
                                     "least min_warmup.")},
       }).Means("When the warmup ends and compression starts.")},
      {"momentum_mask",
       Section({
           {"npy", String(&m->npy)
                       .Means("A 1-D .npy of the parameter count's values in {0, 1} (float32, "
                              "bool or uint8); \"\": none. Relative to each process's working "
                              "directory.")},
           {"ranges", Ranges(&m->ranges)
                          .Means("Element ranges [begin, end) that are masked (0 there, 1 "
                                 "elsewhere); any order, overlaps fine. Not together with "
                                 "npy.")},
           {"auto_zero_grad", Bool(&m->auto_zero_grad)
                                  .Means("Also mask every element whose gradient stayed "
                                         "exactly zero on every worker through the warmup.")},
       }).Means("After every exchange m *= mask (docs/algorithms.md, \"Momentum masks\"); "
                "supplied at every start, never restored from a checkpoint.")},
      {"workload",
       Section({
           {"type", String(&w->type, {"fashion_mnist", "synthetic", "pytorch"})
                        .Means("The model: fashion_mnist, synthetic, or pytorch (a training "
                               "script using the Python package, python/onebit).")},
           {"hidden", Layers(&w->hidden).Means("fashion_mnist: the hidden layers' widths.")},
           {"data_dir", String(&w->data_dir).Means("fashion_mnist: where the data set is.")},
           {"eval_every", Integer(&w->eval_every, 0, kMaxSteps)
                              .Means("Steps between test-set evaluations; 0: only at the end.")},
           {"parameters",
            Integer(&w->parameters, 0, kMaxParameters)
                .Means("synthetic, pytorch: the model's parameter count, checked by each "
                       "worker; 0 (pytorch only): learned from the first worker.")},
       }).Means("What the workers train.")},
      {"checkpoint",
       Section({
           {"dir", String(&q->dir)
                       .Means("Where every process reads and writes checkpoints (a shared "
                              "volume across machines); \"\": no checkpoints and no resume.")},
           {"every_steps", Given(&s->checkpoint_every_given,
                                 Integer(&q->every_steps, 0, kMaxSteps))
                               .Means(absl::StrCat(
                                   "A checkpoint after every multiple of this step (needs "
                                   "dir); 0: on demand only. Not given with a dir: every ",
                                   kDefaultCheckpointEverySteps, " steps (a notice says so)."))},
           {"keep", Integer(&q->keep, 1, 1 << 20)
                        .Means("Committed checkpoints kept (the newest).")},
           {"resume", Bool(&q->resume)
                          .Means("Resume from the newest committed checkpoint in dir when the "
                                 "coordinator starts.")},
           {"async", Bool(&q->async)
                         .Means("false: a worker writes its part before its next step; true: "
                                "training pauses only for a host snapshot, a thread writes.")},
       }).Means("Two-phase-commit checkpoints (checkpoint/manifest.h).")},
      {"failure",
       Section({
           {"heartbeat_timeout_s", Number(&f->heartbeat_timeout_s, 0, kDay, true)
                                       .Means("A member without a heartbeat this long is "
                                              "dead; the others exit 75 to be restarted.")},
           {"rejoin_timeout_s", Number(&f->rejoin_timeout_s, 0, kDay, true)
                                    .Means("The job fails when the membership is not back "
                                           "within this after a failure.")},
           {"max_restarts", Integer(&f->max_restarts, 0, 1 << 20)
                                .Means("Recoveries before the job is declared failed (a restarted coordinator counts as one).")},
           {"coordinator_retry_s", Number(&f->coordinator_retry_s, 0, kDay, true)
                                       .Means("How long members retry an unreachable "
                                              "coordinator.")},
           {"gloo_timeout_s", Number(&f->gloo_timeout_s, 0, kDay, true)
                                  .Means("gloo: connecting the mesh, and each collective.")},
           {"rendezvous_timeout_s", Number(&f->rendezvous_timeout_s, 0, kDay, true)
                                        .Means("Waiting for peers' rendezvous data (NCCL ids, "
                                               "shard addresses).")},
           {"ps_step_deadline_s", Number(&f->ps_step_deadline_s, 0, kDay, true)
                                      .Means("ps mode: the longest one step's push and pull "
                                             "may take.")},
       }).Means("Failure detection and recovery, and the timeouts of every wait; a recovered "
                "job resumes from the last committed checkpoint.")},
      {"security",
       Section({
           {"tls",
            Section({
                {"ca_cert", String(&sec->tls.ca_cert)
                                .Means("The CA every certificate of the job chains to.")},
                {"cert", String(&sec->tls.cert)
                             .Means("This process's certificate; goes with key.")},
                {"key", String(&sec->tls.key).Means("This process's private key.")},
                {"mutual", Bool(&sec->tls.mutual)
                               .Means("Servers require and verify a client certificate of the "
                                      "job's CA.")},
                {"server_name", String(&sec->tls.server_name)
                                    .Means("Clients check servers' certificates against this "
                                           "name instead of the dialled host.")},
            }).Means("Any of ca_cert, cert, key turns TLS on for every gRPC port and the REST "
                     "mirror (HTTPS). cert and key go together; ca_cert needs them; mutual TLS "
                     "needs ca_cert.")},
           {"admin_token_file", String(&sec->admin_token_file)
                                    .Means("The file of the bearer token that guards the calls "
                                           "that change the job.")},
           {"member_token_file", String(&sec->member_token_file)
                                     .Means("The file of the bearer token of the job's "
                                            "processes' calls and of reads.")},
       }).Means("The secured control plane (docs/security.md); none set: plaintext and open. "
                "Paths as given; each binary's flags override.")},
      {"ports",
       Section({
           {"coordinator", Integer(&p->coordinator, 0, 65535)
                               .Means("The coordinator's gRPC port; 0: any free one.")},
           {"coordinator_rest", Integer(&p->coordinator_rest, 0, 65535)
                                    .Means("The coordinator's REST mirror; 0: any free one.")},
           {"metrics", Integer(&p->metrics, 0, 65535)
                           .Means("The Prometheus /metrics port; 0: any free one.")},
           {"server", Integer(&p->server, 0, 65535)
                          .Means("A parameter-server shard's port; 0: any free one.")},
       }).Means("0 picks a free port; a process reports what it bound to the coordinator.")},
  }).Means("onebit's own settings.");
}

}  // namespace

Keys JobConfigKeys(ParseState* s) {
  JobConfig* c = s->config;
  Notices* notices = &c->notices;
  Keys top = {
      {"train_micro_batch_size_per_gpu",
       BatchKey(&c->micro_batch, &s->micro_given, 1 << 20, notices)
           .Means("Samples per worker and micro batch.")},
      {"train_batch_size",
       BatchKey(&s->train_batch, &s->train_batch_given, int64_t{1} << 40, notices)
           .DefaultIs("micro * accumulation * workers")
           .Means("Samples per optimizer step over all workers: train_micro_batch_size_per_gpu "
                  "* gradient_accumulation_steps * onebit.workers.")},
      {"gradient_accumulation_steps",
       BatchKey(&s->accumulation, &s->accumulation_given, 1 << 20, notices)
           .Means("Micro batches per optimizer step; the trainer averages their gradients "
                  "before the exchange.")},
      {"gradient_clipping", Number(&c->gradient_clipping, 0, 1e12)
                                .Means("Clip the averaged gradient's global L2 norm to this; 0: "
                                       "off.")},
      {"steps", Integer(&c->steps, 1, kMaxSteps)
                    .Means("Optimizer steps of the job. Without it a training script's job "
                           "(workload pytorch) runs until the scripts' loops end; others "
                           "take the default.")},
      {"seed", Integer(&c->seed, 0, int64_t{1} << 53)
                   .Means("The job's random seed (initial model, data order).")},
      {"optimizer", OptimizerBlock(s)},
      {"scheduler", SchedulerBlock(s)},
      {"fp16", Fp16Block(&c->precision, notices)},
      {"bf16", Bf16Block(&c->precision, notices)},
      {"zero_optimization", ZeroBlock(s)},
      {"amp", Unsupported(notices, "Apex AMP; use fp16 or bf16")},
      {"compression_training",
       Unsupported(notices, "DeepSpeed's quantization-aware training changes the model", true)},
      {"elasticity", Unsupported(notices, "elastic batch sizes; onebit.workers is fixed")},
      {"sparse_attention", Unsupported(notices, "it changes the model", true)},
      {"progressive_layer_drop", Unsupported(notices, "it changes the model")},
      {"eigenvalue", Unsupported(notices, "eigenvalue-based quantization schedules")},
      {"curriculum_learning", Unsupported(notices, "it changes the data order")},
      {"data_efficiency", Unsupported(notices, "it changes the data order")},
      {"onebit", OnebitBlock(s)},
  };
  Key bfloat16 = Bf16Block(&c->precision, notices);  // DeepSpeed's old name of bf16
  bfloat16.alias_of = "bf16";
  bfloat16.meaning = "DeepSpeed's old name of bf16.";
  top["bfloat16"] = std::move(bfloat16);
  for (const auto& [key, why] : EngineOnlyKeys()) top[key] = Ignored(notices, why);
  return top;
}

}  // namespace config_schema
}  // namespace onebit
