// The logic of onebit-replay: W workers in one process, one thread each with its own CPU
// backend and its own Transport rank, driven through OnebitAdam::Create + Step over a
// gradient stream read from .npy files. Kept out of the binary's main() so that it can be
// tested and reused.
//
// Inputs: params (N,) float32; grads (T, W, N) float32, grads[t][i] is worker i's local
// gradient at step t+1. Output: (N,) float32, the parameters after T steps (rank 0's, after
// checking that every rank's are bit-identical).
#ifndef ONEBIT_TOOLS_REPLAY_H_
#define ONEBIT_TOOLS_REPLAY_H_

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "config/optimizer_kind.h"
#include "kernels/kernels.h"
#include "worker/optim/onebit_lamb.h"
#include "config/zero_one_schedule.h"

namespace onebit::tools {

struct ReplayConfig {
  std::string optimizer = "onebit_adam";  // or "zero_one_adam", "onebit_lamb"
  int workers = 0;
  kernels::AdamHyper hyper;
  // onebit_adam: DeepSpeed's OnebitAdam default, and OnebitAdamOptions'.
  int64_t freeze_step = 100000;
  // zero_one_adam (DeepSpeed's ZeroOneAdam defaults).
  int64_t var_freeze_step = 100000;
  ZeroOneScheduleParams zero_one;
  // onebit_lamb: its coefficients, and the parameter groups' boundaries {0, ..., N}
  // (empty: one group).
  LambCoeffs lamb;
  std::vector<size_t> groups;
  bool bias_correction = false;
  std::string params_path;
  std::string grads_path;
  std::string out_path;
  std::string transport = "inproc";  // "inproc" or "gloo" (TCP over 127.0.0.1)
  // The compressed exchange's format (job config exchange.compressor): "onebit", "int8" or
  // "fp8".
  std::string compressor = "onebit";
  // How often rank 0 reports progress; zero or negative: never.
  absl::Duration progress_interval = absl::Seconds(5);
};

// Checks the configuration on its face, without opening any file: the optimizer,
// transport and compressor names, W >= 1, the hyperparameters (lr >= 0 and finite: lr = 0 is accepted
// and leaves the parameters unchanged, which still measures the communication; beta1 and
// beta2 in [0, 1) as float32; eps > 0; weight decay >= 0; freeze_step and
// var_freeze_step >= 0; the 0/1 Adam scalers and clipper >= 1) and that the three paths
// are given. An InvalidArgument error names the flag (--lr, ...).
absl::Status ValidateConfig(const ReplayConfig& config);

// `path` made absolute against `working_dir` when it is relative and working_dir is
// non-empty (bazel run sets BUILD_WORKING_DIRECTORY to where the user ran it).
std::string ResolvePath(const std::string& path, const std::string& working_dir);

// Rewrites '-' to '_' in the names of "--long-flag[=value]" arguments (absl flag names
// cannot contain '-'), up to a bare "--". Values and other arguments are left alone.
void NormalizeFlagNames(std::vector<std::string>* args);

struct ReplaySummary {
  std::string optimizer;  // the --optimizer name
  OptimizerKind kind = OptimizerKind::kOneBitAdam;  // what it runs
  std::string transport;
  std::string compressor;
  int workers = 0;
  int64_t n = 0;                  // parameters
  int64_t steps = 0;              // T
  int64_t freeze_step = 0;
  int64_t warmup_steps = 0;       // steps the optimizer ran in each stage
  int64_t compression_steps = 0;
  // zero_one_adam: rank 0's steps of each kind (ZeroOneStep order: variance update,
  // compressed gradient, local, sync).
  int64_t zero_one_steps[4] = {0, 0, 0, 0};
  // False when the run ended between syncs of 0/1 Adam: each rank's parameters are its
  // own, and rank 0's were written.
  bool replicas_agree = true;
  std::vector<uint64_t> bytes_sent;  // Transport::bytes_sent() of each rank at the end
  std::string out_path;
  double seconds = 0;             // wall time of the steps
};

// Validates the inputs against each other (shapes, W, N) before any step, runs the
// workers, checks that every rank ended with bit-identical parameters and only then writes
// out_path (atomically). On any error nothing is written. Progress lines go to `progress`
// (may be null).
absl::StatusOr<ReplaySummary> RunReplay(const ReplayConfig& config, std::ostream* progress);

// A few human-readable lines.
std::string FormatSummary(const ReplaySummary& summary);

}  // namespace onebit::tools

#endif  // ONEBIT_TOOLS_REPLAY_H_
