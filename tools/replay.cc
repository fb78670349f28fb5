#include "tools/replay.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "config/optimizer_kind.h"
#include "common/status_macros.h"
#include "common/npy.h"
#include "compression/codec_registry.h"
#include "worker/exchange/peer_exchange.h"
#include "worker/transport/local_group.h"
#include "worker/exchange/peer_exchange.h"
#include "worker/optim/optimizer_factory.h"
#include "worker/optim/zero_one_adam.h"
#include "worker/transport/transport.h"

namespace onebit::tools {
namespace {

constexpr int kMaxWorkers = 1024;

absl::Status FlagError(absl::string_view flag, absl::string_view problem) {
  return absl::InvalidArgumentError(absl::StrCat("--", flag, ": ", problem));
}

std::string DirName(const std::string& path) {
  size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

// What one worker reports back.
struct WorkerResult {
  std::vector<float> params;
  uint64_t bytes_sent = 0;
  int64_t warmup_steps = 0;
  int64_t compression_steps = 0;
  int64_t zero_one_steps[4] = {0, 0, 0, 0};
  bool params_shared = true;  // the optimizer says every rank's parameters are the same
};

struct Inputs {
  std::vector<float> params;                // (N,)
  std::unique_ptr<npy::Float32Reader> grads;  // (T, W, N), read step by step
  int64_t n = 0;
  int64_t steps = 0;
};

absl::StatusOr<Inputs> OpenInputs(const ReplayConfig& config) {
  Inputs in;
  ONEBIT_ASSIGN_OR_RETURN(npy::Float32Array params, npy::ReadFloat32(config.params_path));
  if (params.shape.size() != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(config.params_path, " (--params): shape ", npy::ShapeToString(params.shape),
                     " is not one-dimensional: expected (N,)"));
  }
  in.n = params.shape[0];
  in.params = std::move(params.data);

  ONEBIT_ASSIGN_OR_RETURN(in.grads, npy::Float32Reader::Open(config.grads_path));
  const std::vector<int64_t>& g = in.grads->shape();
  const std::string where = absl::StrCat(config.grads_path, " (--grads): shape ",
                                         npy::ShapeToString(g), " ");
  if (g.size() != 3) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, "is not three-dimensional: expected (T, W, N) = (T, ",
                     config.workers, ", ", in.n, ")"));
  }
  if (g[1] != config.workers) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, "has ", g[1], " workers in its second dimension but --workers=",
                     config.workers, ": expected (T, ", config.workers, ", ", in.n, ")"));
  }
  if (g[2] != in.n) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, "has ", g[2], " elements per gradient in its third dimension but ",
        config.params_path, " (--params) has N=", in.n, ": expected (T, ", config.workers,
        ", ", in.n, ")"));
  }
  in.steps = g[0];
  return in;
}

// The output is written only at the end: find an unwritable destination before the run.
absl::Status CheckOutputPath(const std::string& path) {
  std::string dir = DirName(path);
  if (access(dir.c_str(), W_OK | X_OK) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, " (--out): cannot write into directory ", dir, ": ", std::strerror(errno)));
  }
  struct stat st;
  if (stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(path, " (--out): is a directory"));
  }
  return absl::OkStatus();
}

// The --optimizer names and the optimizers they run.
constexpr std::pair<const char*, OptimizerKind> kOptimizers[] = {
    {"onebit_adam", OptimizerKind::kOneBitAdam},
    {"zero_one_adam", OptimizerKind::kZeroOneAdam},
    {"onebit_lamb", OptimizerKind::kOneBitLamb},
};

absl::StatusOr<OptimizerKind> ParseReplayOptimizer(const std::string& name) {
  std::vector<std::string> names;
  for (const auto& [flag, kind] : kOptimizers) {
    if (name == flag) return kind;
    names.push_back(flag);
  }
  return FlagError("optimizer", absl::StrCat("unknown optimizer '", name, "' (supported: ",
                                             absl::StrJoin(names, ", "), ")"));
}

// The last warmup step the flags give: --var-freeze-step for 0/1 Adam, else --freeze-step.
int64_t ReplayFreezeStep(const ReplayConfig& c, OptimizerKind kind) {
  return kind == OptimizerKind::kZeroOneAdam ? c.var_freeze_step : c.freeze_step;
}

// One worker's whole run, in its own thread.
absl::Status RunWorker(const ReplayConfig& config, OptimizerKind optimizer_kind, const Inputs& in,
                       Transport& transport,
                       WorkerResult* result, std::ostream* progress) {
  const int rank = transport.rank();
  const size_t n = static_cast<size_t>(in.n);
  // Declared before what borrows it, so destroyed after.
  std::unique_ptr<kernels::Backend> backend = kernels::NewCpuBackend();
  if (backend == nullptr) return absl::InternalError("NewCpuBackend() returned null");
  ONEBIT_ASSIGN_OR_RETURN(void* grad_memory, backend->Allocate(n * sizeof(float)));
  std::unique_ptr<float, std::function<void(float*)>> grad(
      static_cast<float*>(grad_memory), [&backend](float* p) { backend->Free(p); });

  OptimizerSpec spec;
  spec.kind = optimizer_kind;
  spec.hyper = config.hyper;
  spec.freeze_step = ReplayFreezeStep(config, optimizer_kind);
  spec.zero_one = config.zero_one;
  spec.lamb = config.lamb;
  if (optimizer_kind == OptimizerKind::kOneBitLamb) spec.group_offsets = config.groups;
  spec.bias_correction = config.bias_correction;
  ONEBIT_ASSIGN_OR_RETURN(const Codec* codec, FindCodec(config.compressor));
  ONEBIT_ASSIGN_OR_RETURN(std::unique_ptr<PeerExchange> exchange,
                          PeerExchange::Create(backend.get(), &transport, n,
                                               ExactAllreduceOptions(), *codec));
  ONEBIT_ASSIGN_OR_RETURN(
      std::unique_ptr<Optimizer> optimizer,
      CreateOptimizer(spec, backend.get(), exchange.get(), in.params.data(), n));
  const auto* zero_one = dynamic_cast<const ZeroOneAdam*>(optimizer.get());

  std::vector<float> host_grad(n);
  const absl::Time start = absl::Now();
  absl::Time last_report = start;
  for (int64_t t = 0; t < in.steps; ++t) {
    ONEBIT_RETURN_IF_ERROR(in.grads->ReadElements((t * config.workers + rank) * in.n, in.n,
                                                  host_grad.data()));
    ONEBIT_RETURN_IF_ERROR(backend->CopyFromHost(grad.get(), host_grad.data(), n * 4));
    const Stage stage = optimizer->stage();
    (stage == Stage::kWarmup ? result->warmup_steps : result->compression_steps)++;
    if (zero_one != nullptr) ++result->zero_one_steps[static_cast<int>(zero_one->next_step_kind())];
    absl::Status status = optimizer->Step(grad.get());
    if (!status.ok()) {
      return absl::Status(status.code(), absl::StrCat("step ", t + 1, " (", StageName(stage),
                                                      "): ", status.message()));
    }
    if (rank == 0 && progress != nullptr && config.progress_interval > absl::ZeroDuration()) {
      const absl::Time now = absl::Now();
      if (now - last_report >= config.progress_interval && t + 1 < in.steps) {
        last_report = now;
        const double elapsed = absl::ToDoubleSeconds(now - start);
        const double left = elapsed / static_cast<double>(t + 1) *
                            static_cast<double>(in.steps - t - 1);
        *progress << absl::StrFormat(
                         "onebit-replay: step %d/%d (%s next), %.1f s elapsed, ~%.0f s left, "
                         "%d bytes sent by rank 0",
                         t + 1, in.steps, StageName(optimizer->stage()), elapsed, left,
                         transport.bytes_sent())
                  << std::endl;
      }
    }
  }
  ONEBIT_ASSIGN_OR_RETURN(result->params, optimizer->ParamsToHost());
  for (const StateSpec& state : optimizer->CheckpointStates()) {
    if (state.name == "params") result->params_shared = state.shared;
  }
  result->bytes_sent = transport.bytes_sent();
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateConfig(const ReplayConfig& c) {
  ONEBIT_RETURN_IF_ERROR(ParseReplayOptimizer(c.optimizer).status());
  if (absl::Status s = ValidateLambCoeffs(c.lamb); !s.ok()) {
    // The message starts with, or names first, the coefficient at fault: its flag.
    std::string flag;
    for (const char* name : {"max_coeff", "min_coeff", "coeff_beta", "factor_max", "factor_min",
                             "factor_threshold"}) {
      const size_t at = s.message().find(name);
      if (at != absl::string_view::npos && (flag.empty() || at < s.message().find(flag))) {
        flag = name;
      }
    }
    std::replace(flag.begin(), flag.end(), '_', '-');
    return FlagError(flag, s.message());
  }
  for (size_t i = 1; i < c.groups.size(); ++i) {
    if (c.groups[i] <= c.groups[i - 1]) {
      return FlagError("groups", "boundaries must increase");
    }
  }
  if (!c.groups.empty() && (c.groups.size() < 2 || c.groups[0] != 0)) {
    return FlagError("groups", "boundaries run from 0 to N: 0,b1,...,N");
  }
  if (c.transport != "inproc" && c.transport != "gloo") {
    return FlagError("transport", absl::StrCat("unknown transport '", c.transport,
                                               "' (supported: inproc, gloo)"));
  }
  if (!FindCodec(c.compressor).ok()) {
    return FlagError("compressor", absl::StrCat("unknown compressor '", c.compressor,
                                                "' (supported: onebit, int8)"));
  }
  if (c.workers < 1 || c.workers > kMaxWorkers) {
    return FlagError("workers", absl::StrCat("must be in [1, ", kMaxWorkers, "], got ",
                                             c.workers));
  }
  const kernels::AdamHyper& h = c.hyper;
  if (!std::isfinite(h.lr) || h.lr < 0) {
    return FlagError("lr", absl::StrCat("must be finite and >= 0, got ", h.lr));
  }
  // Checked as float32, the precision the optimizer runs in: 0.99999999 rounds to 1.
  if (!(h.beta1 >= 0 && h.beta1 < 1)) {
    return FlagError("beta1", absl::StrCat("must be in [0, 1) as float32, got ", h.beta1));
  }
  if (!(h.beta2 >= 0 && h.beta2 < 1)) {
    return FlagError("beta2", absl::StrCat("must be in [0, 1) as float32, got ", h.beta2));
  }
  if (!std::isfinite(h.eps) || h.eps <= 0) {
    return FlagError("eps", absl::StrCat("must be finite and > 0 as float32, got ", h.eps));
  }
  if (!std::isfinite(h.weight_decay) || h.weight_decay < 0) {
    return FlagError("weight-decay",
                     absl::StrCat("must be finite and >= 0, got ", h.weight_decay));
  }
  if (!std::isfinite(h.update_clip) || h.update_clip < 0) {
    return FlagError("update-clip", absl::StrCat("must be finite and >= 0, got ", h.update_clip));
  }
  if (c.freeze_step < 0) {
    return FlagError("freeze-step", absl::StrCat("must be >= 0, got ", c.freeze_step));
  }
  if (c.var_freeze_step < 0) {
    return FlagError("var-freeze-step", absl::StrCat("must be >= 0, got ", c.var_freeze_step));
  }
  const std::pair<const char*, int64_t> zero_one[] = {
      {"var-update-scaler", c.zero_one.var_update_scaler},
      {"local-step-scaler", c.zero_one.local_step_scaler},
      {"local-step-clipper", c.zero_one.local_step_clipper}};
  for (const auto& [flag, value] : zero_one) {
    if (value < 1) return FlagError(flag, absl::StrCat("must be >= 1, got ", value));
  }
  if (c.params_path.empty()) return FlagError("params", "is required (an (N,) float32 .npy)");
  if (c.grads_path.empty()) {
    return FlagError("grads", "is required (a (T, W, N) float32 .npy)");
  }
  if (c.out_path.empty()) return FlagError("out", "is required (the output .npy)");
  return absl::OkStatus();
}

std::string ResolvePath(const std::string& path, const std::string& working_dir) {
  if (path.empty() || path[0] == '/' || working_dir.empty()) return path;
  if (working_dir.back() == '/') return working_dir + path;
  return absl::StrCat(working_dir, "/", path);
}

void NormalizeFlagNames(std::vector<std::string>* args) {
  for (std::string& arg : *args) {
    if (arg == "--") break;
    if (arg.size() <= 2 || arg[0] != '-' || arg[1] != '-') continue;
    const size_t end = std::min(arg.find('='), arg.size());
    for (size_t i = 2; i < end; ++i) {
      if (arg[i] == '-') arg[i] = '_';
    }
  }
}

absl::StatusOr<ReplaySummary> RunReplay(const ReplayConfig& config, std::ostream* progress) {
  ONEBIT_RETURN_IF_ERROR(ValidateConfig(config));
  ONEBIT_ASSIGN_OR_RETURN(const OptimizerKind optimizer_kind,
                          ParseReplayOptimizer(config.optimizer));
  ONEBIT_ASSIGN_OR_RETURN(Inputs in, OpenInputs(config));
  if (!config.groups.empty() && config.groups.back() != static_cast<size_t>(in.n)) {
    return FlagError("groups", absl::StrCat("the last boundary is ", config.groups.back(),
                                            ", the parameters ", in.n));
  }
  ONEBIT_RETURN_IF_ERROR(CheckOutputPath(config.out_path));

  ONEBIT_ASSIGN_OR_RETURN(TransportKind kind, ParseTransportKind(config.transport));

  std::vector<WorkerResult> workers(static_cast<size_t>(config.workers));
  const absl::Time start = absl::Now();
  // RunLocalGroup tears the group down when a rank fails, so the others stop too, and
  // returns the root cause prefixed with its rank.
  ONEBIT_RETURN_IF_ERROR(RunLocalGroup(kind, config.workers, [&](Transport& transport) {
    return RunWorker(config, optimizer_kind, in, transport,
                     &workers[static_cast<size_t>(transport.rank())], progress);
  }));
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);

  // Every rank applies the same averaged update, so the replicas must agree bit for bit;
  // but for 0/1 Adam between syncs, where each rank's are its own.
  const std::vector<float>& p0 = workers[0].params;
  const bool shared = workers[0].params_shared;
  for (size_t r = 1; r < workers.size() && shared; ++r) {
    const std::vector<float>& pr = workers[r].params;
    if (pr.size() != p0.size() || std::memcmp(pr.data(), p0.data(), p0.size() * 4) != 0) {
      size_t first = 0, count = 0;
      for (size_t i = 0; i < std::min(pr.size(), p0.size()); ++i) {
        if (std::memcmp(&pr[i], &p0[i], 4) != 0) {
          if (count++ == 0) first = i;
        }
      }
      return absl::InternalError(absl::StrFormat(
          "rank %d ended with parameters that differ from rank 0's in %d of %d elements "
          "(first at index %d: %.9g vs %.9g); the replicas diverged",
          r, count, p0.size(), first, first < pr.size() ? pr[first] : 0.0f,
          first < p0.size() ? p0[first] : 0.0f));
    }
  }
  size_t non_finite = 0;
  for (float x : p0) non_finite += std::isfinite(x) ? 0 : 1;
  if (non_finite > 0 && progress != nullptr) {
    *progress << "onebit-replay: warning: " << non_finite << " of " << p0.size()
              << " output parameters are not finite" << std::endl;
  }
  ONEBIT_RETURN_IF_ERROR(npy::WriteFloat32(config.out_path, {in.n}, p0.data()));

  ReplaySummary s;
  s.optimizer = config.optimizer;
  s.kind = optimizer_kind;
  s.transport = config.transport;
  s.compressor = config.compressor;
  s.workers = config.workers;
  s.n = in.n;
  s.steps = in.steps;
  s.freeze_step = ReplayFreezeStep(config, optimizer_kind);
  s.warmup_steps = workers[0].warmup_steps;
  s.compression_steps = workers[0].compression_steps;
  std::copy(std::begin(workers[0].zero_one_steps), std::end(workers[0].zero_one_steps),
            std::begin(s.zero_one_steps));
  s.replicas_agree = shared;
  for (const WorkerResult& w : workers) s.bytes_sent.push_back(w.bytes_sent);
  s.out_path = config.out_path;
  s.seconds = seconds;
  return s;
}

std::string FormatSummary(const ReplaySummary& s) {
  std::string bytes;
  bool all_equal = true;
  for (uint64_t b : s.bytes_sent) all_equal = all_equal && b == s.bytes_sent[0];
  if (s.bytes_sent.empty()) {
    bytes = "none";
  } else if (all_equal) {
    bytes = absl::StrCat(s.bytes_sent[0], " (every rank)");
  } else {
    bytes = absl::StrCat("[", absl::StrJoin(s.bytes_sent, ", "), "] (rank 0..", s.workers - 1,
                         ")");
  }
  std::string out;
  absl::StrAppend(&out, "onebit-replay: ", s.optimizer, " over ", s.transport, "\n");
  absl::StrAppend(&out, "  N (parameters)      ", s.n, "\n");
  absl::StrAppend(&out, "  T (steps)           ", s.steps, "\n");
  absl::StrAppend(&out, "  W (workers)         ", s.workers, "\n");
  absl::StrAppend(&out, "  compressor          ", s.compressor, "\n");
  absl::StrAppend(&out, "  stages              ", s.warmup_steps, " warmup, ",
                  s.compression_steps, " compression (freeze step ", s.freeze_step, ")\n");
  if (s.kind == OptimizerKind::kZeroOneAdam) {
    absl::StrAppend(&out, "  0/1 Adam steps      ", s.zero_one_steps[0], " variance update, ",
                    s.zero_one_steps[1], " compressed gradient, ", s.zero_one_steps[3],
                    " sync, ", s.zero_one_steps[2], " local (no exchange)\n");
  }
  if (!s.replicas_agree) {
    absl::StrAppend(&out, "  replicas            the run ended between syncs: each rank's "
                          "parameters are its own; rank 0's were written\n");
  }
  absl::StrAppend(&out, "  bytes sent/worker   ", bytes, "\n");
  absl::StrAppend(&out, absl::StrFormat("  wall time           %.3f s\n", s.seconds));
  absl::StrAppend(&out, "  output              ", s.out_path, "\n");
  return out;
}

}  // namespace onebit::tools
