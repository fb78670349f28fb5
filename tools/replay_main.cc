// onebit-replay: replays a recorded gradient stream through the real optimizer code path.
//
//   bazel run //tools:onebit-replay -- --optimizer=onebit_adam --workers=4
//       --lr=1e-3 --freeze-step=10 --params=p.npy --grads=g.npy --out=out.npy
//   (one command line)
//
// W workers run as threads of this process, each with its own CPU backend and its own
// transport rank (--transport=inproc, or gloo over 127.0.0.1), and make the optimizer
// (1-bit Adam; 0/1 Adam with --optimizer=zero_one_adam and its --var-freeze-step,
// --var-update-scaler, --local-step-scaler, --local-step-clipper; 1-bit LAMB with
// --optimizer=onebit_lamb, its coefficients and --groups) and step it exactly as a training
// job does. See tools/replay.h for the file formats.
//
// Exit status: 0 success; 2 the command line is wrong on its face (unknown or malformed
// flag, missing flag, bad value; checked before any file is opened); 1 anything found
// while running, including input files that are missing, malformed or inconsistent with
// the flags. On any error nothing is written to --out.
#include <cstdlib>
#include <iostream>
#include <set>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/signals.h"
#include "tools/replay.h"

// Flag names use '_' (absl requires identifiers); main() rewrites '-' to '_' in flag names
// first, so the documented spellings --weight-decay and --freeze-step work, and so do
// --weight_decay and --freeze_step.
ABSL_FLAG(std::string, optimizer, "onebit_adam",
          "Optimizer to replay: onebit_adam or zero_one_adam.");
ABSL_FLAG(int, workers, 0, "Number of workers W (required, >= 1).");
ABSL_FLAG(double, lr, 1e-3, "Learning rate (>= 0; 0 leaves the parameters unchanged).");
ABSL_FLAG(double, beta1, 0.9, "Momentum coefficient, in [0, 1).");
ABSL_FLAG(double, beta2, 0.999, "Variance coefficient, in [0, 1).");
ABSL_FLAG(double, eps, 1e-8, "Added to sqrt(v) in the denominator (> 0).");
ABSL_FLAG(double, weight_decay, 0.0, "Decoupled weight decay (>= 0). Also --weight-decay.");
ABSL_FLAG(double, update_clip, 2.0,
          "The bound on each element's frozen-variance direction (>= 0; 0: none); 2 is a job "
          "config's default (optimizer.params.update_clip). Also --update-clip.");
ABSL_FLAG(int64_t, freeze_step, 100000,
          "Last warmup step; later steps compress. 0 compresses from the first step. "
          "Also --freeze-step.");
ABSL_FLAG(int64_t, var_freeze_step, 100000,
          "zero_one_adam: the last step of the variance stage (>= 0). Also --var-freeze-step.");
ABSL_FLAG(int64_t, var_update_scaler, 16,
          "zero_one_adam: variance updates between doublings of their interval (>= 1).");
ABSL_FLAG(int64_t, local_step_scaler, 32678,
          "zero_one_adam: local steps between doublings of the sync interval (>= 1).");
ABSL_FLAG(int64_t, local_step_clipper, 16,
          "zero_one_adam: the longest interval between syncs, in steps (>= 1).");
ABSL_FLAG(double, max_coeff, 10.0, "onebit_lamb: the trust ratio's upper clamp.");
ABSL_FLAG(double, min_coeff, 0.01, "onebit_lamb: the trust ratio's lower clamp.");
ABSL_FLAG(double, coeff_beta, 0.9, "onebit_lamb: the trust ratio's running-average factor.");
ABSL_FLAG(double, factor_max, 4.0, "onebit_lamb: the largest fresh-variance factor.");
ABSL_FLAG(double, factor_min, 0.5, "onebit_lamb: the smallest fresh-variance factor.");
ABSL_FLAG(double, factor_threshold, 0.1,
          "onebit_lamb: the most the factor may change from one step to the next (relative).");
ABSL_FLAG(std::vector<std::string>, groups, {},
          "onebit_lamb: parameter-group boundaries 0,b1,...,N (default: one group).");
ABSL_FLAG(bool, bias_correction, false, "Bias-corrected moments. Also --bias-correction.");
ABSL_FLAG(std::string, params, "", "Initial parameters: float32 .npy of shape (N,) (required).");
ABSL_FLAG(std::string, grads, "",
          "Gradients: float32 .npy of shape (T, W, N), [step][worker][element] (required).");
ABSL_FLAG(std::string, out, "", "Output: float32 .npy of shape (N,), written atomically "
                                "(required).");
ABSL_FLAG(std::string, transport, "inproc", "inproc or gloo (TCP over 127.0.0.1).");
ABSL_FLAG(std::string, compressor, "onebit",
          "Compressed exchange format: onebit (1 bit + a scale per block), int8 (a byte "
          "per element + a scale and an offset per block) or fp8 (an e4m3 byte per element "
          "+ a power-of-two scale per 32 elements).");

namespace {

constexpr int kExitRuntime = 1;
constexpr int kExitUsage = 2;

// The flags of this tool; others (--help, --flagfile, ...) are absl's and left to it.
const std::set<std::string>& OwnFlags() {
  static const auto* flags = new std::set<std::string>{
      "optimizer", "workers", "lr",     "beta1", "beta2", "eps",      "weight_decay", "update_clip",
      "freeze_step", "params", "grads", "out",   "transport", "var_freeze_step",
      "var_update_scaler", "local_step_scaler", "local_step_clipper", "max_coeff", "min_coeff",
      "coeff_beta", "factor_max", "factor_min", "factor_threshold", "groups", "bias_correction", "compressor"};
  return *flags;
}

// Flags that absl::ParseCommandLine handles itself and that FindCommandLineFlag does not
// know.
const std::set<std::string>& AbslBuiltinFlags() {
  static const auto* flags = new std::set<std::string>{
      "help",      "helpfull",   "helpshort",  "helppackage", "helpmatch", "version",
      "only_check_args", "flagfile", "fromenv", "tryfromenv", "undefok"};
  return *flags;
}

int UsageError(const std::string& message) {
  std::cerr << "onebit-replay: error: " << message << "\n"
            << "Run with --help for the flags." << std::endl;
  return kExitUsage;
}

// absl reports an unknown flag or an unparsable value by exiting with status 1; this
// finds them first so that they are usage errors (status 2). It also records which flags
// were given. Returns false and sets *error on the first problem.
// `original` is the command line as typed, for the messages.
bool PrecheckFlags(const std::vector<std::string>& args, const std::vector<std::string>& original,
                   std::set<std::string>* seen, std::string* error) {
  for (size_t i = 1; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--") break;
    size_t dashes = absl::StartsWith(arg, "--") ? 2 : absl::StartsWith(arg, "-") ? 1 : 0;
    // Positionals and values such as "-0.5" are not flags.
    if (dashes == 0 || arg.size() == dashes ||
        !absl::ascii_isalpha(static_cast<unsigned char>(arg[dashes]))) {
      continue;
    }
    const size_t eq = arg.find('=');
    const std::string name = arg.substr(dashes, eq == std::string::npos ? eq : eq - dashes);
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    if (flag == nullptr && absl::StartsWith(name, "no")) {
      absl::CommandLineFlag* negated = absl::FindCommandLineFlag(name.substr(2));
      if (negated != nullptr && negated->IsOfType<bool>()) continue;
    }
    if (flag == nullptr && AbslBuiltinFlags().count(name) != 0) continue;
    if (flag == nullptr) {
      *error = absl::StrCat("unknown flag '", original[i].substr(0, eq), "'");
      return false;
    }
    if (OwnFlags().count(name) == 0 || flag->IsOfType<bool>()) continue;
    seen->insert(name);
    std::string value;
    if (eq != std::string::npos) {
      value = arg.substr(eq + 1);
    } else if (i + 1 < args.size()) {
      value = args[++i];  // "--flag value"
    } else {
      *error = absl::StrCat("flag '", original[i], "' needs a value");
      return false;
    }
    std::string parse_error;
    if (!flag->ParseFrom(value, &parse_error)) {
      *error = absl::StrCat(original[i].substr(0, eq), "=", value, ": ", parse_error);
      return false;
    }
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  onebit::IgnoreSigpipe();
  absl::SetProgramUsageMessage(
      "Replays a gradient stream through W in-process workers running 1-bit or 0/1 Adam.\n"
      "  onebit-replay --workers=W --params=P.npy --grads=G.npy --out=OUT.npy "
      "[--lr=1e-3 --beta1=0.9 --beta2=0.999 --eps=1e-8 --weight-decay=0 "
      "--freeze-step=100000 --transport=inproc|gloo --optimizer=onebit_adam|zero_one_adam "
      "--var-freeze-step=100000 --var-update-scaler=16 --local-step-scaler=32678 "
      "--local-step-clipper=16 --optimizer=onebit_lamb --max-coeff=10 --min-coeff=0.01 "
      "--coeff-beta=0.9 --factor-max=4 --factor-min=0.5 --factor-threshold=0.1 "
      "--groups=0,B1,...,N --bias-correction]\n"
      "P.npy: float32 (N,); G.npy: float32 (T, W, N); OUT.npy: float32 (N,).\n"
      "Relative paths are taken from $BUILD_WORKING_DIRECTORY (set by bazel run) when set.\n"
      "Exit status: 0 ok, 2 bad command line, 1 bad input file or failed run.");

  const std::vector<std::string> original(argv, argv + argc);
  std::vector<std::string> args = original;
  onebit::tools::NormalizeFlagNames(&args);
  std::set<std::string> seen;
  std::string error;
  if (!PrecheckFlags(args, original, &seen, &error)) return UsageError(error);

  std::vector<char*> normalized;
  for (std::string& arg : args) normalized.push_back(arg.data());
  normalized.push_back(nullptr);
  std::vector<char*> positional =
      absl::ParseCommandLine(static_cast<int>(args.size()), normalized.data());
  if (positional.size() > 1) {
    return UsageError(absl::StrCat("unexpected argument '", positional[1],
                                   "' (flags are --name=value)"));
  }

  onebit::tools::ReplayConfig config;
  const char* wd = std::getenv("BUILD_WORKING_DIRECTORY");
  const std::string working_dir = wd != nullptr ? wd : "";
  config.optimizer = absl::GetFlag(FLAGS_optimizer);
  config.workers = absl::GetFlag(FLAGS_workers);
  config.hyper.lr = static_cast<float>(absl::GetFlag(FLAGS_lr));
  config.hyper.beta1 = static_cast<float>(absl::GetFlag(FLAGS_beta1));
  config.hyper.beta2 = static_cast<float>(absl::GetFlag(FLAGS_beta2));
  config.hyper.eps = static_cast<float>(absl::GetFlag(FLAGS_eps));
  config.hyper.weight_decay = static_cast<float>(absl::GetFlag(FLAGS_weight_decay));
  config.hyper.update_clip = static_cast<float>(absl::GetFlag(FLAGS_update_clip));
  config.freeze_step = absl::GetFlag(FLAGS_freeze_step);
  config.var_freeze_step = absl::GetFlag(FLAGS_var_freeze_step);
  config.zero_one.var_update_scaler = absl::GetFlag(FLAGS_var_update_scaler);
  config.zero_one.local_step_scaler = absl::GetFlag(FLAGS_local_step_scaler);
  config.zero_one.local_step_clipper = absl::GetFlag(FLAGS_local_step_clipper);
  config.lamb.max_coeff = absl::GetFlag(FLAGS_max_coeff);
  config.lamb.min_coeff = absl::GetFlag(FLAGS_min_coeff);
  config.lamb.coeff_beta = absl::GetFlag(FLAGS_coeff_beta);
  config.lamb.factor_max = absl::GetFlag(FLAGS_factor_max);
  config.lamb.factor_min = absl::GetFlag(FLAGS_factor_min);
  config.lamb.factor_threshold = absl::GetFlag(FLAGS_factor_threshold);
  config.bias_correction = absl::GetFlag(FLAGS_bias_correction);
  for (const std::string& g : absl::GetFlag(FLAGS_groups)) {
    uint64_t boundary = 0;
    if (!absl::SimpleAtoi(g, &boundary)) {
      return UsageError(absl::StrCat("--groups: '", g, "' is not a non-negative integer"));
    }
    config.groups.push_back(static_cast<size_t>(boundary));
  }
  config.params_path = onebit::tools::ResolvePath(absl::GetFlag(FLAGS_params), working_dir);
  config.grads_path = onebit::tools::ResolvePath(absl::GetFlag(FLAGS_grads), working_dir);
  config.out_path = onebit::tools::ResolvePath(absl::GetFlag(FLAGS_out), working_dir);
  config.transport = absl::GetFlag(FLAGS_transport);
  config.compressor = absl::GetFlag(FLAGS_compressor);

  if (config.workers == 0 && seen.count("workers") == 0) {
    return UsageError("--workers: is required (the number of workers W, >= 1)");
  }
  absl::Status status = onebit::tools::ValidateConfig(config);
  if (!status.ok()) return UsageError(std::string(status.message()));

  absl::StatusOr<onebit::tools::ReplaySummary> summary =
      onebit::tools::RunReplay(config, &std::cerr);
  if (!summary.ok()) {
    std::cerr << "onebit-replay: error: " << summary.status().message() << "\n"
              << "onebit-replay: nothing was written to " << config.out_path << std::endl;
    return kExitRuntime;
  }
  std::cout << onebit::tools::FormatSummary(*summary) << std::flush;
  return 0;
}
