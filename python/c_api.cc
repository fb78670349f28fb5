#include "python/c_api.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/json_string.h"
#include "config/job_config.h"
#include "python/embedded.h"

struct onebit_worker {
  std::unique_ptr<onebit::EmbeddedWorker> worker;
};
struct onebit_coordinator {
  std::unique_ptr<onebit::EmbeddedCoordinator> coordinator;
};
struct onebit_state {
  onebit::OptimizerState state;
};
struct onebit_options {
  onebit::WorkerProcessOptions options;
  std::vector<size_t> groups;
  std::vector<onebit::ParamRange> buckets;
};

namespace {

thread_local std::string last_error;

// The status as the C interface's answer: its code, with the message kept for
// onebit_last_error().
int Fail(const absl::Status& status) {
  if (status.ok()) return 0;
  last_error = std::string(status.message());
  return static_cast<int>(status.code());
}

// Runs `body` (returning absl::Status): no C++ exception crosses into the caller.
template <typename F>
int Guard(F&& body) {
  try {
    return Fail(body());
  } catch (const std::exception& e) {
    return Fail(absl::InternalError(absl::StrCat("onebit's core: ", e.what())));
  } catch (...) {
    return Fail(absl::InternalError("onebit's core: an unknown C++ exception"));
  }
}

char* Copy(const std::string& s) {
  char* out = static_cast<char*>(std::malloc(s.size() + 1));
  if (out != nullptr) std::memcpy(out, s.c_str(), s.size() + 1);
  return out;
}

absl::Status Null(const char* what) {
  return absl::InvalidArgumentError(absl::StrCat(what, " is null"));
}

// A state section's entries as (name, size or -1) for reading.
struct SectionView {
  const onebit::NamedTensors* named = nullptr;       // tensors
  const onebit::ErrorState* errors = nullptr;        // errors
  const onebit::StateScalars* scalars = nullptr;     // scalars, trainer
};

SectionView Section(const onebit_state* s, int section) {
  SectionView v;
  switch (section) {
    case 0: v.named = &s->state.tensors; break;
    case 1: v.errors = &s->state.errors; break;
    case 2: v.scalars = &s->state.scalars; break;
    case 3: v.scalars = &s->state.trainer; break;
    default: break;
  }
  return v;
}

template <typename Map>
typename Map::const_iterator Nth(const Map& m, size_t i) {
  auto it = m.begin();
  std::advance(it, i);
  return it;
}

absl::Status CheckEntry(const onebit_state* s, int section, size_t i) {
  if (s == nullptr) return Null("the state");
  if (section < 0 || section > 3) {
    return absl::InvalidArgumentError(absl::StrCat("no state section ", section));
  }
  if (i >= onebit_state_count(s, section)) {
    return absl::OutOfRangeError(absl::StrCat("entry ", i, " of section ", section));
  }
  return absl::OkStatus();
}

}  // namespace

extern "C" {

int onebit_abi_version(void) { return ONEBIT_ABI_VERSION; }
const char* onebit_last_error(void) { return last_error.c_str(); }
void onebit_free(void* p) { std::free(p); }

int onebit_strict_json(const char* text, char** json) {
  return Guard([&]() -> absl::Status {
    if (text == nullptr || json == nullptr) return Null("an argument");
    absl::StatusOr<std::string> strict = onebit::StrictJson(text);
    if (!strict.ok()) return strict.status();
    *json = Copy(*strict);
    return absl::OkStatus();
  });
}

int onebit_check_config(const char* path, char** notices_json) {
  return Guard([&]() -> absl::Status {
    if (path == nullptr || notices_json == nullptr) return Null("an argument");
    absl::StatusOr<onebit::JobConfig> config = onebit::LoadJobConfig(path);
    if (!config.ok()) return config.status();
    std::string out = "[";
    for (size_t i = 0; i < config->notices.size(); ++i) {
      if (i > 0) out += ",";
      out += onebit::JsonString(config->notices[i]);
    }
    *notices_json = Copy(out + "]");
    return absl::OkStatus();
  });
}

int onebit_config_facts(const char* text, char** facts_json) {
  return Guard([&]() -> absl::Status {
    if (text == nullptr || facts_json == nullptr) return Null("an argument");
    absl::StatusOr<onebit::JobConfig> config = onebit::ParseJobConfig(text);
    if (!config.ok()) return config.status();
    auto flag = [](bool b) { return b ? "true" : "false"; };
    *facts_json = Copy(absl::StrCat(
        "{\"warmup_between_workers\": ", flag(onebit::WarmupBetweenWorkers(config->exchange)),
        ", \"scales_loss\": ", flag(onebit::ScalesLoss(*config)),
        ", \"micro_batches\": ", config->gradient_accumulation_steps,
        ", \"cycles_betas\": ", flag(onebit::SchedulerCyclesBetas(*config)), "}"));
    return absl::OkStatus();
  });
}

int onebit_default_max_restarts(void) { return onebit::FailureConfig{}.max_restarts; }
int onebit_max_mask_ranges(void) { return static_cast<int>(onebit::kMaxMaskRanges); }

// ---- States ----

onebit_state* onebit_state_new(int64_t step, int64_t freeze_step, int rank, int world_size) {
  auto* s = new onebit_state;
  s->state.step = step;
  s->state.freeze_step = freeze_step;
  s->state.rank = rank;
  s->state.world_size = world_size;
  return s;
}
void onebit_state_free(onebit_state* s) { delete s; }
int64_t onebit_state_step(const onebit_state* s) { return s == nullptr ? 0 : s->state.step; }
int64_t onebit_state_freeze_step(const onebit_state* s) {
  return s == nullptr ? -1 : s->state.freeze_step;
}

int onebit_state_put_tensor(onebit_state* s, int section, const char* name, const float* data,
                            size_t n) {
  return Guard([&]() -> absl::Status {
    if (s == nullptr || name == nullptr || (data == nullptr && n > 0)) return Null("an argument");
    std::vector<float> v(data, data + n);
    if (section == 0) {
      for (const auto& [existing, _] : s->state.tensors) {
        if (existing == name) return absl::InvalidArgumentError(absl::StrCat(name, " twice"));
      }
      s->state.tensors.emplace_back(name, std::move(v));
      return absl::OkStatus();
    }
    if (section == 1) {
      if (!s->state.errors.emplace(name, std::move(v)).second) {
        return absl::InvalidArgumentError(absl::StrCat(name, " twice"));
      }
      return absl::OkStatus();
    }
    return absl::InvalidArgumentError(absl::StrCat("section ", section, " holds no tensors"));
  });
}

int onebit_state_put_scalar(onebit_state* s, int section, const char* name, double value) {
  return Guard([&]() -> absl::Status {
    if (s == nullptr || name == nullptr) return Null("an argument");
    if (section != 2 && section != 3) {
      return absl::InvalidArgumentError(absl::StrCat("section ", section, " holds no scalars"));
    }
    auto& m = section == 2 ? s->state.scalars : s->state.trainer;
    if (!m.emplace(name, value).second) {
      return absl::InvalidArgumentError(absl::StrCat(name, " twice"));
    }
    return absl::OkStatus();
  });
}

size_t onebit_state_count(const onebit_state* s, int section) {
  if (s == nullptr) return 0;
  const SectionView v = Section(s, section);
  if (v.named != nullptr) return v.named->size();
  if (v.errors != nullptr) return v.errors->size();
  if (v.scalars != nullptr) return v.scalars->size();
  return 0;
}

const char* onebit_state_name(const onebit_state* s, int section, size_t i) {
  if (!CheckEntry(s, section, i).ok()) return "";
  const SectionView v = Section(s, section);
  if (v.named != nullptr) return (*v.named)[i].first.c_str();
  if (v.errors != nullptr) return Nth(*v.errors, i)->first.c_str();
  return Nth(*v.scalars, i)->first.c_str();
}

size_t onebit_state_tensor_size(const onebit_state* s, int section, size_t i) {
  if (!CheckEntry(s, section, i).ok()) return 0;
  const SectionView v = Section(s, section);
  if (v.named != nullptr) return (*v.named)[i].second.size();
  if (v.errors != nullptr) return Nth(*v.errors, i)->second.size();
  return 0;
}

int onebit_state_tensor_copy(const onebit_state* s, int section, size_t i, float* out) {
  return Guard([&]() -> absl::Status {
    if (absl::Status e = CheckEntry(s, section, i); !e.ok()) return e;
    const SectionView v = Section(s, section);
    const std::vector<float>* t = v.named != nullptr    ? &(*v.named)[i].second
                                  : v.errors != nullptr ? &Nth(*v.errors, i)->second
                                                        : nullptr;
    if (t == nullptr) return absl::InvalidArgumentError("not a tensor section");
    if (out == nullptr && !t->empty()) return Null("out");
    if (!t->empty()) std::memcpy(out, t->data(), t->size() * sizeof(float));
    return absl::OkStatus();
  });
}

double onebit_state_scalar(const onebit_state* s, int section, size_t i) {
  if (!CheckEntry(s, section, i).ok()) return std::nan("");
  const SectionView v = Section(s, section);
  if (v.scalars == nullptr) return std::nan("");
  return Nth(*v.scalars, i)->second;
}

// ---- Options ----

onebit_options* onebit_options_new(void) {
  auto* o = new onebit_options;
  o->options.metrics_port = 0;
  return o;
}
void onebit_options_free(onebit_options* o) { delete o; }

int onebit_options_set_string(onebit_options* o, const char* key, const char* value) {
  return Guard([&]() -> absl::Status {
    if (o == nullptr || key == nullptr || value == nullptr) return Null("an argument");
    const std::string k = key;
    onebit::WorkerProcessOptions& w = o->options;
    std::string* field = k == "config"              ? &w.config_path
                         : k == "coordinator"       ? &w.coordinator
                         : k == "host"              ? &w.host
                         : k == "summary_file"      ? &w.summary_file
                         : k == "history_csv"       ? &w.history_csv
                         : k == "member_token_file" ? &w.member_token_file
                         : k == "fault"             ? &w.fault
                         : k == "job_key"           ? &w.job_key
                                                    : nullptr;
    if (k == "param_dtype") {
      const std::string v = value;
      if (v != "fp32" && v != "bf16" && v != "fp16") {
        return absl::InvalidArgumentError(
            absl::StrCat("param_dtype is fp32, bf16 or fp16, not \"", v, "\""));
      }
      w.param_dtype = v == "bf16"   ? onebit::kernels::WireDtype::kBf16
                      : v == "fp16" ? onebit::kernels::WireDtype::kFp16
                                    : onebit::kernels::WireDtype::kFp32;
      return absl::OkStatus();
    }
    if (field == nullptr) return absl::InvalidArgumentError(absl::StrCat("no string option ", k));
    *field = value;
    return absl::OkStatus();
  });
}

int onebit_options_set_int(onebit_options* o, const char* key, int64_t value) {
  return Guard([&]() -> absl::Status {
    if (o == nullptr || key == nullptr) return Null("an argument");
    const std::string k = key;
    onebit::WorkerProcessOptions& w = o->options;
    if (k == "quiet") {
      w.quiet = value != 0;
      return absl::OkStatus();
    }
    int* field = k == "metrics_port"  ? &w.metrics_port
                 : k == "rank"        ? &w.rank
                 : k == "cuda_device" ? &w.cuda_device
                                      : nullptr;
    if (field == nullptr) return absl::InvalidArgumentError(absl::StrCat("no int option ", k));
    if (value < -1 || value > 1 << 30) {
      return absl::InvalidArgumentError(absl::StrCat(k, " ", value, " is out of range"));
    }
    *field = static_cast<int>(value);
    return absl::OkStatus();
  });
}

int onebit_options_add_hyper_group(onebit_options* o, uint64_t begin, uint64_t end,
                                   float lr_scale, float weight_decay) {
  return Guard([&]() -> absl::Status {
    if (o == nullptr) return Null("the options");
    // Checked by the optimizer: a bad group fails the worker's start, naming it.
    o->options.hyper_groups.push_back({begin, end, lr_scale, weight_decay});
    return absl::OkStatus();
  });
}

int onebit_options_add_bucket(onebit_options* o, uint64_t begin, uint64_t end) {
  return Guard([&]() -> absl::Status {
    if (o == nullptr) return Null("the options");
    o->buckets.push_back({begin, end});
    return absl::OkStatus();
  });
}

int onebit_options_add_group_boundary(onebit_options* o, uint64_t boundary) {
  return Guard([&]() -> absl::Status {
    if (o == nullptr) return Null("the options");
    o->groups.push_back(boundary);
    return absl::OkStatus();
  });
}

// ---- The worker ----

int onebit_worker_new(const onebit_options* o, const float* initial, size_t n,
                      const onebit_state* loaded, onebit_worker** out) {
  return Guard([&]() -> absl::Status {
    if (o == nullptr || out == nullptr || (initial == nullptr && n > 0)) {
      return Null("an argument");
    }
    std::optional<onebit::OptimizerState> state;
    if (loaded != nullptr) state = loaded->state;
    absl::StatusOr<std::unique_ptr<onebit::EmbeddedWorker>> w = onebit::EmbeddedWorker::Create(
        o->options, std::vector<float>(initial, initial + n), o->groups, o->buckets,
        std::move(state));
    if (!w.ok()) return w.status();
    *out = new onebit_worker{*std::move(w)};
    return absl::OkStatus();
  });
}

void onebit_worker_free(onebit_worker* w) { delete w; }

#define ONEBIT_WORKER(w)                                    \
  if ((w) == nullptr || (w)->worker == nullptr) return Null("the worker")

int onebit_worker_start(onebit_worker* w) {
  return Guard([&]() -> absl::Status {
    ONEBIT_WORKER(w);
    return w->worker->Start();
  });
}

int onebit_worker_wait_for_step(onebit_worker* w, double timeout_s, int64_t* step) {
  return Guard([&]() -> absl::Status {
    ONEBIT_WORKER(w);
    if (step == nullptr) return Null("step");
    absl::StatusOr<int64_t> s = w->worker->WaitForStep(timeout_s);
    if (!s.ok()) return s.status();
    *step = *s;
    return absl::OkStatus();
  });
}

int onebit_worker_supply_step(onebit_worker* w, int64_t step, const onebit_step_inputs* inputs) {
  return Guard([&]() -> absl::Status {
    ONEBIT_WORKER(w);
    if (inputs == nullptr) return Null("inputs");
    constexpr uint32_t kKnown = ONEBIT_STEP_LOSS | ONEBIT_STEP_LR | ONEBIT_STEP_MAX_GRAD_NORM |
                                ONEBIT_STEP_BETAS | ONEBIT_STEP_WEIGHT_DECAYS |
                                ONEBIT_STEP_GRAD_SCALE;
    if ((inputs->set & ~kKnown) != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "onebit_step_inputs.set has unknown bits 0x", absl::Hex(inputs->set & ~kKnown),
          " (this library knows 0x", absl::Hex(kKnown), ")"));
    }
    const auto has = [&](uint32_t bit) { return (inputs->set & bit) != 0; };
    onebit::StepInputs in;
    if (has(ONEBIT_STEP_LOSS)) in.loss = inputs->loss;
    if (has(ONEBIT_STEP_LR)) in.lr = inputs->lr;
    if (has(ONEBIT_STEP_MAX_GRAD_NORM)) in.max_grad_norm = inputs->max_grad_norm;
    if (has(ONEBIT_STEP_BETAS)) in.betas = std::make_pair(inputs->beta1, inputs->beta2);
    if (has(ONEBIT_STEP_WEIGHT_DECAYS)) {
      if (inputs->weight_decays == nullptr && inputs->n_weight_decays > 0) {
        return Null("weight_decays");
      }
      in.weight_decays = std::vector<double>(inputs->weight_decays,
                                             inputs->weight_decays + inputs->n_weight_decays);
    }
    if (has(ONEBIT_STEP_GRAD_SCALE)) in.grad_scale = inputs->grad_scale;
    return w->worker->Supply(step, std::move(in));
  });
}

int onebit_worker_skipped(onebit_worker* w, int64_t step, int* skipped) {
  return Guard([&]() -> absl::Status {
    ONEBIT_WORKER(w);
    if (skipped == nullptr) return Null("skipped");
    absl::StatusOr<bool> s = w->worker->Skipped(step);
    if (!s.ok()) return s.status();
    *skipped = *s ? 1 : 0;
    return absl::OkStatus();
  });
}

int onebit_worker_announce(onebit_worker* w, int64_t step, uint64_t bucket) {
  return Guard([&]() -> absl::Status {
    ONEBIT_WORKER(w);
    return w->worker->Announce(step, bucket);
  });
}

int onebit_worker_loss_scale(onebit_worker* w, float* scale) {
  return Guard([&]() -> absl::Status {
    ONEBIT_WORKER(w);
    if (scale == nullptr) return Null("scale");
    absl::StatusOr<float> s = w->worker->LossScale();
    if (!s.ok()) return s.status();
    *scale = *s;
    return absl::OkStatus();
  });
}

int onebit_worker_changed_since_announced(onebit_worker* w, int64_t* first) {
  return Guard([&]() -> absl::Status {
    ONEBIT_WORKER(w);
    if (first == nullptr) return Null("first");
    absl::StatusOr<int64_t> s = w->worker->ChangedSinceAnnounced();
    if (!s.ok()) return s.status();
    *first = *s;
    return absl::OkStatus();
  });
}

int onebit_worker_end_after(onebit_worker* w, int64_t step) {
  return Guard([&]() -> absl::Status {
    ONEBIT_WORKER(w);
    return w->worker->EndAfter(step);
  });
}

int onebit_worker_close(onebit_worker* w, const char* why) {
  return Guard([&]() -> absl::Status {
    ONEBIT_WORKER(w);
    w->worker->Close(why == nullptr ? "closed" : why);
    return absl::OkStatus();
  });
}

int onebit_worker_join(onebit_worker* w, double timeout_s, int* done, int* code,
                       char** message) {
  return Guard([&]() -> absl::Status {
    ONEBIT_WORKER(w);
    if (done == nullptr || code == nullptr || message == nullptr) return Null("an argument");
    std::optional<std::pair<int, std::string>> joined = w->worker->Join(timeout_s);
    *done = joined.has_value() ? 1 : 0;
    *code = joined.has_value() ? joined->first : 0;
    *message = Copy(joined.has_value() ? joined->second : "");
    return absl::OkStatus();
  });
}

int onebit_worker_fail_job(onebit_worker* w, const char* why, int64_t step, int* exit_code) {
  return Guard([&]() -> absl::Status {
    ONEBIT_WORKER(w);
    if (why == nullptr || exit_code == nullptr) return Null("an argument");
    *exit_code = w->worker->FailJob(why, step);
    return absl::OkStatus();
  });
}

int onebit_worker_verdict_after_failure(onebit_worker* w, int* exit_code, char** reason) {
  return Guard([&]() -> absl::Status {
    ONEBIT_WORKER(w);
    if (exit_code == nullptr || reason == nullptr) return Null("an argument");
    onebit::MemberVerdict verdict = w->worker->VerdictAfterFailure();
    *exit_code = verdict.exit_code;
    *reason = Copy(verdict.reason);
    return absl::OkStatus();
  });
}

int onebit_worker_report_restartable_exit(onebit_worker* w, const char* why, int64_t step) {
  return Guard([&]() -> absl::Status {
    ONEBIT_WORKER(w);
    if (why == nullptr) return Null("why");
    w->worker->ReportRestartableExit(why, step);
    return absl::OkStatus();
  });
}

int onebit_worker_buffers(onebit_worker* w, uintptr_t* params, uintptr_t* gradient, int* cuda) {
  return Guard([&]() -> absl::Status {
    ONEBIT_WORKER(w);
    if (params == nullptr || gradient == nullptr || cuda == nullptr) return Null("an argument");
    absl::StatusOr<std::pair<float*, float*>> b = w->worker->Buffers();
    if (!b.ok()) return b.status();
    *params = reinterpret_cast<uintptr_t>(b->first);
    *gradient = reinterpret_cast<uintptr_t>(b->second);
    *cuda = w->worker->cuda() ? 1 : 0;
    return absl::OkStatus();
  });
}

int onebit_worker_final_params(onebit_worker* w, float* out, size_t n) {
  return Guard([&]() -> absl::Status {
    ONEBIT_WORKER(w);
    if (out == nullptr && n > 0) return Null("out");
    return w->worker->FinalParams(out, n);
  });
}

int onebit_worker_state_dict(onebit_worker* w, onebit_state** out) {
  return Guard([&]() -> absl::Status {
    ONEBIT_WORKER(w);
    if (out == nullptr) return Null("out");
    absl::StatusOr<onebit::OptimizerState> s = w->worker->StateDict();
    if (!s.ok()) return s.status();
    *out = new onebit_state{*std::move(s)};
    return absl::OkStatus();
  });
}

int onebit_worker_state_slice(onebit_worker* w, int64_t begin, int64_t end, onebit_state** out) {
  return Guard([&]() -> absl::Status {
    ONEBIT_WORKER(w);
    if (out == nullptr) return Null("out");
    absl::StatusOr<onebit::OptimizerState> s = w->worker->StateSlice(begin, end);
    if (!s.ok()) return s.status();
    *out = new onebit_state{*std::move(s)};
    return absl::OkStatus();
  });
}

int onebit_worker_load_state_dict(onebit_worker* w, const onebit_state* s) {
  return Guard([&]() -> absl::Status {
    ONEBIT_WORKER(w);
    if (s == nullptr) return Null("the state");
    return w->worker->LoadStateDict(s->state);
  });
}

int onebit_worker_gathered_state_dict(onebit_worker* w, onebit_state** out) {
  return Guard([&]() -> absl::Status {
    ONEBIT_WORKER(w);
    if (out == nullptr) return Null("out");
    absl::StatusOr<onebit::OptimizerState> s = w->worker->GatheredStateDict();
    if (!s.ok()) return s.status();
    *out = new onebit_state{*std::move(s)};
    return absl::OkStatus();
  });
}

int onebit_worker_rank(onebit_worker* w) { return w == nullptr ? -1 : w->worker->rank(); }
int onebit_worker_world_size(onebit_worker* w) {
  return w == nullptr ? 0 : w->worker->world_size();
}
size_t onebit_worker_size(onebit_worker* w) { return w == nullptr ? 0 : w->worker->size(); }

int onebit_worker_param_buffer(onebit_worker* w, uintptr_t* address, int* dtype) {
  return Guard([&]() -> absl::Status {
    ONEBIT_WORKER(w);
    if (address == nullptr || dtype == nullptr) return Null("an argument");
    absl::StatusOr<std::pair<const void*, onebit::kernels::WireDtype>> b =
        w->worker->ParamBuffer();
    if (!b.ok()) return b.status();
    *address = reinterpret_cast<uintptr_t>(b->first);
    *dtype = static_cast<int>(b->second);  // WireDtype's values are the ABI's
    return absl::OkStatus();
  });
}

int onebit_worker_gradient_buffer(onebit_worker* w, uintptr_t* address, int* dtype) {
  return Guard([&]() -> absl::Status {
    ONEBIT_WORKER(w);
    if (address == nullptr || dtype == nullptr) return Null("an argument");
    absl::StatusOr<std::pair<void*, onebit::kernels::WireDtype>> b =
        w->worker->GradientBuffer();
    if (!b.ok()) return b.status();
    *address = reinterpret_cast<uintptr_t>(b->first);
    *dtype = static_cast<int>(b->second);  // WireDtype's values are the ABI's
    return absl::OkStatus();
  });
}

// ---- The coordinator ----

int onebit_coordinator_start(const char* config, const char* host, int port, int rest_port,
                             int metrics_port, const char* code_digest, const char* job_key,
                             onebit_coordinator** out) {
  return Guard([&]() -> absl::Status {
    if (config == nullptr || host == nullptr || code_digest == nullptr || job_key == nullptr ||
        out == nullptr) {
      return Null("an argument");
    }
    absl::StatusOr<std::unique_ptr<onebit::EmbeddedCoordinator>> c =
        onebit::EmbeddedCoordinator::Start(config, host, port, rest_port, metrics_port,
                                           code_digest, job_key);
    if (!c.ok()) return c.status();
    *out = new onebit_coordinator{*std::move(c)};
    return absl::OkStatus();
  });
}

void onebit_coordinator_free(onebit_coordinator* c) { delete c; }

#define ONEBIT_COORDINATOR(c) \
  if ((c) == nullptr || (c)->coordinator == nullptr) return Null("the coordinator")

int onebit_coordinator_address(onebit_coordinator* c, int which, char** address) {
  return Guard([&]() -> absl::Status {
    ONEBIT_COORDINATOR(c);
    if (address == nullptr) return Null("address");
    const onebit::EmbeddedCoordinator& e = *c->coordinator;
    if (which < 0 || which > 2) return absl::InvalidArgumentError("which is 0, 1 or 2");
    *address = Copy(which == 0 ? e.address() : which == 1 ? e.rest_address()
                                                          : e.metrics_address());
    return absl::OkStatus();
  });
}

int onebit_coordinator_poll(onebit_coordinator* c, char** state) {
  return Guard([&]() -> absl::Status {
    ONEBIT_COORDINATOR(c);
    if (state == nullptr) return Null("state");
    *state = Copy(c->coordinator->Poll());
    return absl::OkStatus();
  });
}

int onebit_coordinator_failure_reason(onebit_coordinator* c, char** reason) {
  return Guard([&]() -> absl::Status {
    ONEBIT_COORDINATOR(c);
    if (reason == nullptr) return Null("reason");
    *reason = Copy(c->coordinator->failure_reason());
    return absl::OkStatus();
  });
}

int onebit_coordinator_abandon(onebit_coordinator* c, const char* reason) {
  return Guard([&]() -> absl::Status {
    ONEBIT_COORDINATOR(c);
    c->coordinator->Abandon(reason == nullptr ? "" : reason);
    return absl::OkStatus();
  });
}

int onebit_coordinator_recover(onebit_coordinator* c, const char* reason) {
  return Guard([&]() -> absl::Status {
    ONEBIT_COORDINATOR(c);
    c->coordinator->Recover(reason == nullptr ? "" : reason);
    return absl::OkStatus();
  });
}

int onebit_coordinator_close(onebit_coordinator* c) {
  return Guard([&]() -> absl::Status {
    ONEBIT_COORDINATOR(c);
    c->coordinator->Close();
    return absl::OkStatus();
  });
}

}  // extern "C"
