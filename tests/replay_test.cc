// End-to-end tests of the onebit-replay binary: random inputs are written as .npy files,
// the real binary runs on them (as a child process), and its output is compared with the
// float64 model of docs/algorithms.md (worker/optim/onebit_adam_reference.h). The same
// runs over gloo must produce the same bytes as over inproc.
#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "common/npy.h"
#include "common/subprocess.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/test_paths.h"
#include "worker/optim/onebit_adam_reference.h"
#include "worker/optim/onebit_lamb_reference.h"
#include "worker/optim/zero_one_adam_reference.h"

namespace onebit {
namespace {

using ::testing::HasSubstr;

using testing_paths::Env;

std::string BinaryPath() {
  return testing_paths::Runfile("tools/onebit-replay");
}

// A fresh directory under TEST_TMPDIR.
std::string NewDir(const std::string& name) {
  static int counter = 0;
  std::string dir = absl::StrCat(Env("TEST_TMPDIR", "/tmp"), "/", name, "_", counter++);
  mkdir(dir.c_str(), 0777);
  return dir;
}

bool Exists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

std::vector<std::string> ListDir(const std::string& dir) {
  std::vector<std::string> names;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) {
      std::string name = e->d_name;
      if (name != "." && name != "..") names.push_back(name);
    }
    closedir(d);
  }
  std::sort(names.begin(), names.end());
  return names;
}

std::string ReadRaw(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void WriteRaw(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

struct RunResult {
  int exit_code = -1;  // 128 + signal when killed
  std::string output;  // stdout and stderr, interleaved
};

// Runs the binary with `args`, extra "NAME=value" environment entries, in `cwd`.
RunResult RunBinary(const std::vector<std::string>& args,
                    const std::vector<std::string>& extra_env = {},
                    const std::string& cwd = "") {
  ProcessOptions options;
  options.argv = {BinaryPath()};
  options.argv.insert(options.argv.end(), args.begin(), args.end());
  // Only the tests that ask for one get a BUILD_WORKING_DIRECTORY (the tool resolves
  // relative paths against it).
  options.env_unset = {"BUILD_WORKING_DIRECTORY"};
  options.env_set = extra_env;
  options.working_dir = cwd;
  options.log_path = absl::StrCat(NewDir("log"), "/output.txt");
  RunResult result;
  absl::StatusOr<std::unique_ptr<Process>> process = Process::Start(options);
  if (!process.ok()) {
    ADD_FAILURE() << process.status();
    return result;
  }
  // A hung child would otherwise hang the test until Bazel's timeout.
  absl::StatusOr<int> code = (*process)->Wait(absl::Seconds(120));
  if (!code.ok()) {
    ADD_FAILURE() << "onebit-replay did not finish within 120 s";
    (*process)->Signal(SIGKILL);
    code = (*process)->Wait(absl::Seconds(10));
  }
  result.exit_code = code.ok() ? *code : -1;
  result.output = ReadRaw(options.log_path);
  return result;
}

// Random inputs. The gradient of each element has a persistent direction plus noise and a
// slow drift, so the optimizer moves steadily and the momentum has a real signal to
// compress.
struct Problem {
  int workers;
  int64_t n, steps;
  std::vector<float> params;  // (n,)
  std::vector<float> grads;   // (steps, workers, n)

  std::vector<std::vector<float>> StepGrads(int64_t t) const {
    std::vector<std::vector<float>> g(workers);
    for (int w = 0; w < workers; ++w) {
      const float* begin = grads.data() + (t * workers + w) * n;
      g[w].assign(begin, begin + n);
    }
    return g;
  }
};

Problem MakeProblem(int workers, int64_t n, int64_t steps, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Problem p{workers, n, steps, {}, {}};
  p.params.resize(n);
  for (float& x : p.params) x = normal(rng);
  std::vector<float> direction(n);
  for (float& x : direction) x = normal(rng);
  p.grads.resize(static_cast<size_t>(steps * workers * n));
  for (int64_t t = 0; t < steps; ++t) {
    const float drift = 1.0f + 0.05f * static_cast<float>(t);
    for (int w = 0; w < workers; ++w) {
      for (int64_t i = 0; i < n; ++i) {
        p.grads[(t * workers + w) * n + i] = 0.01f * (direction[i] * drift + normal(rng));
      }
    }
  }
  return p;
}

struct Paths {
  std::string dir, params, grads, out;
};

Paths WriteProblem(const Problem& p, const std::string& name) {
  Paths paths;
  paths.dir = NewDir(name);
  paths.params = paths.dir + "/params.npy";
  paths.grads = paths.dir + "/grads.npy";
  paths.out = paths.dir + "/out.npy";
  EXPECT_TRUE(npy::WriteFloat32(paths.params, {p.n}, p.params.data()).ok());
  EXPECT_TRUE(npy::WriteFloat32(paths.grads, {p.steps, p.workers, p.n}, p.grads.data()).ok());
  return paths;
}

struct Case {
  std::string name;
  int workers;
  int64_t n;
  int64_t steps;
  int64_t freeze_step;  // < 0: leave the flag out (default 100000)
  double weight_decay;  // < 0: leave the flag out (default 0)
  double lr;            // < 0: leave the flag out (default 1e-3)
  std::string compressor = "onebit";  // --compressor (onebit: the flag left out)
};

std::vector<std::string> Flags(const Case& c, const Paths& paths, const std::string& transport) {
  std::vector<std::string> flags = {"--optimizer=onebit_adam",
                                    absl::StrCat("--workers=", c.workers),
                                    "--params=" + paths.params, "--grads=" + paths.grads,
                                    "--out=" + paths.out, "--transport=" + transport};
  if (c.lr >= 0) flags.push_back(absl::StrCat("--lr=", c.lr));
  if (c.freeze_step >= 0) flags.push_back(absl::StrCat("--freeze-step=", c.freeze_step));
  if (c.weight_decay >= 0) flags.push_back(absl::StrCat("--weight-decay=", c.weight_decay));
  if (c.compressor != "onebit") flags.push_back("--compressor=" + c.compressor);
  return flags;
}

// docs/algorithms.md's 1-bit Adam in float64 with the int8 compressor in the exchange
// (ReferenceCompressedAllreduce's int8 form): ReferenceOnebitAdam's steps, written out
// here because that model only knows the 1-bit exchange.
std::vector<double> ReferenceInt8(const ReferenceHyper& h, int workers, const Problem& p) {
  const size_t n = p.params.size();
  std::vector<double> params(p.params.begin(), p.params.end()), m(n, 0.0), v(n, 0.0);
  ReferenceCompressedAllreduce exchange(workers, n, /*int8=*/true);
  for (int64_t t = 0; t < p.steps; ++t) {
    const std::vector<std::vector<float>> grads = p.StepGrads(t);
    if (t + 1 <= h.freeze_step) {  // warmup: Adam on the exact mean gradient
      for (size_t j = 0; j < n; ++j) {
        double g = 0.0;
        for (int i = 0; i < workers; ++i) g += grads[i][j];
        g /= workers;
        m[j] = h.beta1 * m[j] + (1 - h.beta1) * g;
        v[j] = h.beta2 * v[j] + (1 - h.beta2) * g * g;
      }
    } else {  // compression: the local momenta averaged through the compressed exchange
      std::vector<std::vector<double>> local(workers, std::vector<double>(n));
      for (int i = 0; i < workers; ++i) {
        for (size_t j = 0; j < n; ++j) local[i][j] = h.beta1 * m[j] + (1 - h.beta1) * grads[i][j];
      }
      m = workers == 1 ? local[0] : exchange.Run(local);
    }
    const double clip = t + 1 > h.freeze_step ? h.update_clip : 0.0;
    for (size_t j = 0; j < n; ++j) {
      double u = ReferenceClipDirection(m[j] / (std::sqrt(v[j]) + h.eps), clip);
      if (h.weight_decay > 0) u += h.weight_decay * params[j];
      params[j] -= h.lr * u;
    }
  }
  return params;
}

// onebit-replay's default --update-clip (a job config's default): the models below apply it
// after the freeze, as the binary does.
constexpr double kReplayUpdateClip = 2.0;

// The float64 model on the same inputs, with the hyperparameters rounded to float32 as
// the binary uses them.
std::vector<double> Reference(const Case& c, const Problem& p) {
  ReferenceHyper h;
  h.lr = static_cast<float>(c.lr >= 0 ? c.lr : 1e-3);
  h.beta1 = 0.9f;
  h.beta2 = 0.999f;
  h.eps = 1e-8f;
  h.weight_decay = static_cast<float>(c.weight_decay >= 0 ? c.weight_decay : 0.0);
  h.update_clip = kReplayUpdateClip;
  h.freeze_step = c.freeze_step >= 0 ? c.freeze_step : 100000;
  if (c.compressor == "int8") return ReferenceInt8(h, c.workers, p);
  ReferenceOnebitAdam ref(h, c.workers, p.params);
  for (int64_t t = 0; t < p.steps; ++t) ref.Step(p.StepGrads(t));
  return ref.params();
}

class ReplayMatchesReferenceTest : public ::testing::TestWithParam<Case> {};

TEST_P(ReplayMatchesReferenceTest, InprocMatchesReferenceAndGlooMatchesInproc) {
  const Case& c = GetParam();
  const Problem p = MakeProblem(c.workers, c.n, c.steps, 1234 + c.workers * 7 + c.n);
  const Paths paths = WriteProblem(p, c.name);

  RunResult run = RunBinary(Flags(c, paths, "inproc"));
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const int64_t freeze = c.freeze_step >= 0 ? c.freeze_step : 100000;
  const int64_t warmup = std::min(freeze, c.steps);
  EXPECT_THAT(run.output, HasSubstr(absl::StrCat(warmup, " warmup, ", c.steps - warmup,
                                                 " compression")));
  EXPECT_THAT(run.output, HasSubstr(paths.out));
  absl::StatusOr<npy::Float32Array> out = npy::ReadFloat32(paths.out, {c.n});
  ASSERT_TRUE(out.ok()) << out.status();

  const std::vector<double> ref = Reference(c, p);
  double diff2 = 0, moved2 = 0;
  for (int64_t i = 0; i < c.n; ++i) {
    diff2 += (out->data[i] - ref[i]) * (out->data[i] - ref[i]);
    moved2 += (ref[i] - p.params[i]) * (ref[i] - p.params[i]);
  }
  ASSERT_GT(moved2, 0) << "the reference did not move; the test would prove nothing";
  const double rel = std::sqrt(diff2 / moved2);
  // int8: the same measure, 1e-3. A value that float32 and float64 put on either side of a
  // code boundary (k + 1/2) gets codes one step ((max - min)/255) apart; that moves one
  // element's update by lr * step / sqrt(v) once (error feedback takes it back the step
  // after), about 2e-5 of the measure, and a run has a few of them (largest seen: 1.8e-4,
  // int8_w2_n1001_mid_freeze_wd). The 1-bit compressor's only boundary is 0. A wrong
  // rounding, offset or scale is off by about half a step in most elements: 1e-2 and more.
  const double tolerance = c.compressor == "int8" ? 1e-3 : 1e-4;
  EXPECT_LT(rel, tolerance) << "||p_out - p_ref|| / ||p_ref - p_in|| for " << c.name;
  RecordProperty("relative_error", absl::StrCat(rel));

  // gloo: the same bytes.
  const std::string inproc_bytes = ReadRaw(paths.out);
  ASSERT_EQ(unlink(paths.out.c_str()), 0);
  RunResult gloo = RunBinary(Flags(c, paths, "gloo"));
  ASSERT_EQ(gloo.exit_code, 0) << gloo.output;
  const std::string gloo_bytes = ReadRaw(paths.out);
  if (gloo_bytes != inproc_bytes) {
    absl::StatusOr<npy::Float32Array> g = npy::ReadFloat32(paths.out, {c.n});
    ASSERT_TRUE(g.ok()) << g.status();
    int64_t differ = 0, first = -1;
    for (int64_t i = 0; i < c.n; ++i) {
      if (std::memcmp(&g->data[i], &out->data[i], 4) != 0) {
        if (differ++ == 0) first = i;
      }
    }
    ADD_FAILURE() << "gloo output differs from inproc in " << differ << " of " << c.n
                  << " elements; first at " << first << ": gloo " << g->data[first]
                  << " vs inproc " << out->data[first];
  }
  // Nothing but the inputs and the output in the directory: no temporary files left.
  EXPECT_EQ(ListDir(paths.dir), (std::vector<std::string>{"grads.npy", "out.npy", "params.npy"}));
}

// W = 1, 2, 3, 4, 5, 8; N not a multiple of 8 (37, 1001, 10007) and one that is (1000);
// freeze step 0, inside (1..T-1), equal to T, past T, and the default; with and without
// weight decay.
INSTANTIATE_TEST_SUITE_P(
    Cases, ReplayMatchesReferenceTest,
    ::testing::Values(
        Case{"w1_n1000_warmup_then_compress", 1, 1000, 20, 5, -1, -1},
        Case{"w1_n37_compress_only", 1, 37, 20, 0, 0.01, 2e-3},
        Case{"w2_n1001_compress_only", 2, 1001, 30, 0, -1, -1},
        Case{"w2_n1000_default_freeze", 2, 1000, 25, -1, -1, -1},
        Case{"w3_n37_mid_freeze_wd", 3, 37, 25, 10, 0.01, -1},
        Case{"w3_n10007_freeze1", 3, 10007, 20, 1, -1, 1e-3},
        Case{"w4_n1000_freeze_eq_T", 4, 1000, 30, 30, -1, -1},
        Case{"w4_n10007_mid_freeze_wd", 4, 10007, 20, 8, 0.1, 5e-4},
        Case{"w5_n1001_mid_freeze", 5, 1001, 24, 7, -1, -1},
        Case{"w8_n1001_mid_freeze", 8, 1001, 30, 12, -1, -1},
        Case{"w8_n37_compress_only_wd", 8, 37, 20, 0, 0.01, -1},
        Case{"w8_n1000_freeze_past_T_wd", 8, 1000, 20, 50, 0.05, -1},
        // int8 (exchange.compressor): W = 1, 2, 4, N not a multiple of 8, the freeze
        // step inside the run.
        Case{"int8_w1_n1001_mid_freeze", 1, 1001, 20, 5, -1, -1, "int8"},
        Case{"int8_w2_n1001_mid_freeze_wd", 2, 1001, 25, 8, 0.01, -1, "int8"},
        Case{"int8_w2_n37_compress_only", 2, 37, 20, 0, -1, 2e-3, "int8"},
        Case{"int8_w4_n10007_mid_freeze", 4, 10007, 20, 6, -1, 1e-3, "int8"},
        Case{"int8_w4_n1001_freeze1_wd", 4, 1001, 30, 1, 0.05, -1, "int8"}),
    [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

// ---- 0/1 Adam ----

struct ZeroOneCase {
  std::string name;
  int workers;
  int64_t n;
  int64_t steps;
  int64_t var_freeze_step;
  int64_t var_update_scaler;
  int64_t local_step_scaler;
  int64_t local_step_clipper;
  double weight_decay;
};

std::vector<std::string> ZeroOneFlags(const ZeroOneCase& c, const Paths& paths,
                                      const std::string& transport) {
  return {"--optimizer=zero_one_adam",
          absl::StrCat("--workers=", c.workers),
          "--params=" + paths.params,
          "--grads=" + paths.grads,
          "--out=" + paths.out,
          "--transport=" + transport,
          "--lr=0.002",
          absl::StrCat("--weight-decay=", c.weight_decay),
          absl::StrCat("--var-freeze-step=", c.var_freeze_step),
          absl::StrCat("--var-update-scaler=", c.var_update_scaler),
          absl::StrCat("--local-step-scaler=", c.local_step_scaler),
          absl::StrCat("--local-step-clipper=", c.local_step_clipper)};
}

class ReplayZeroOneTest : public ::testing::TestWithParam<ZeroOneCase> {};

// Rank 0's parameters (what the binary writes) against worker 0 of the float64 model, and
// gloo against inproc byte for byte.
TEST_P(ReplayZeroOneTest, MatchesTheFloat64ModelOverInprocAndGloo) {
  const ZeroOneCase& c = GetParam();
  const Problem p = MakeProblem(c.workers, c.n, c.steps, 4321 + c.workers * 7 + c.n);
  const Paths paths = WriteProblem(p, c.name);
  RunResult run = RunBinary(ZeroOneFlags(c, paths, "inproc"));
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_THAT(run.output, HasSubstr("0/1 Adam steps"));
  absl::StatusOr<npy::Float32Array> out = npy::ReadFloat32(paths.out, {c.n});
  ASSERT_TRUE(out.ok()) << out.status();

  ReferenceZeroOneHyper h;
  h.adam.lr = 0.002f;
  h.adam.beta1 = 0.9f;
  h.adam.beta2 = 0.999f;
  h.adam.eps = 1e-8f;
  h.adam.weight_decay = static_cast<float>(c.weight_decay);
  h.adam.update_clip = kReplayUpdateClip;
  h.var_freeze_step = c.var_freeze_step;
  h.var_update_scaler = c.var_update_scaler;
  h.local_step_scaler = c.local_step_scaler;
  h.local_step_clipper = c.local_step_clipper;
  ReferenceZeroOneAdam ref(h, c.workers, p.params);
  for (int64_t t = 0; t < p.steps; ++t) ref.Step(p.StepGrads(t));
  EXPECT_THAT(run.output, HasSubstr(absl::StrCat(ref.variance_steps(), " variance update, ",
                                                 ref.compressed_steps(), " compressed gradient, ",
                                                 ref.sync_steps(), " sync")));
  double diff2 = 0, moved2 = 0;
  for (int64_t i = 0; i < c.n; ++i) {
    const double want = ref.params(0)[i];
    diff2 += (out->data[i] - want) * (out->data[i] - want);
    moved2 += (want - p.params[i]) * (want - p.params[i]);
  }
  ASSERT_GT(moved2, 0) << "the reference did not move; the test would prove nothing";
  const double rel = std::sqrt(diff2 / moved2);
  EXPECT_LT(rel, 1e-4) << "||p_out - p_ref|| / ||p_ref - p_in|| for " << c.name;
  RecordProperty("relative_error", absl::StrCat(rel));

  const std::string inproc_bytes = ReadRaw(paths.out);
  ASSERT_EQ(unlink(paths.out.c_str()), 0);
  RunResult gloo = RunBinary(ZeroOneFlags(c, paths, "gloo"));
  ASSERT_EQ(gloo.exit_code, 0) << gloo.output;
  EXPECT_EQ(ReadRaw(paths.out), inproc_bytes) << "gloo and inproc differ";
}

// W in {1, 2, 4}; N not a multiple of 8; the variance interval doubling, the end of the
// variance stage, and the sync interval doubling to its cap inside the run; runs that end
// on a sync and between syncs.
INSTANTIATE_TEST_SUITE_P(
    Cases, ReplayZeroOneTest,
    ::testing::Values(ZeroOneCase{"w1_n37", 1, 37, 30, 12, 2, 3, 4, 0.0},
                      ZeroOneCase{"w2_n1001_ends_on_sync", 2, 1001, 32, 12, 2, 3, 4, 0.0},
                      ZeroOneCase{"w2_n1001_ends_between_syncs", 2, 1001, 31, 12, 2, 3, 4, 0.0},
                      ZeroOneCase{"w4_n10007_wd", 4, 10007, 30, 10, 2, 2, 8, 0.01},
                      ZeroOneCase{"w4_n37_local_from_step_1", 4, 37, 20, 0, 16, 3, 4, 0.0}),
    [](const ::testing::TestParamInfo<ZeroOneCase>& info) { return info.param.name; });

// ---- 1-bit LAMB ----

struct LambCase {
  std::string name;
  int workers;
  int64_t n;
  int64_t steps;
  int64_t freeze_step;
  bool bias_correction;
};

class ReplayLambTest : public ::testing::TestWithParam<LambCase> {};

// Three parameter groups; the seed tutorials' max_coeff; rank 0's parameters against the
// float64 model, gloo against inproc byte for byte.
TEST_P(ReplayLambTest, MatchesTheFloat64ModelOverInprocAndGloo) {
  const LambCase& c = GetParam();
  const Problem p = MakeProblem(c.workers, c.n, c.steps, 777 + c.workers * 7 + c.n);
  const Paths paths = WriteProblem(p, c.name);
  const std::vector<size_t> groups = {0, static_cast<size_t>(c.n / 3), static_cast<size_t>(c.n / 2),
                                      static_cast<size_t>(c.n)};
  auto flags = [&](const std::string& transport) {
    std::vector<std::string> f = {"--optimizer=onebit_lamb",
                                  absl::StrCat("--workers=", c.workers),
                                  "--params=" + paths.params,
                                  "--grads=" + paths.grads,
                                  "--out=" + paths.out,
                                  "--transport=" + transport,
                                  "--lr=0.002",
                                  "--weight-decay=0.01",
                                  "--max-coeff=0.3",
                                  absl::StrCat("--freeze-step=", c.freeze_step),
                                  absl::StrCat("--groups=", absl::StrJoin(groups, ","))};
    if (c.bias_correction) f.push_back("--bias-correction");
    return f;
  };
  RunResult run = RunBinary(flags("inproc"));
  ASSERT_EQ(run.exit_code, 0) << run.output;
  absl::StatusOr<npy::Float32Array> out = npy::ReadFloat32(paths.out, {c.n});
  ASSERT_TRUE(out.ok()) << out.status();

  ReferenceLambHyper h;
  h.adam.lr = 0.002f;
  h.adam.beta1 = 0.9f;
  h.adam.beta2 = 0.999f;
  h.adam.eps = 1e-8f;
  h.adam.weight_decay = 0.01f;
  h.adam.freeze_step = c.freeze_step;
  h.adam.bias_correction = c.bias_correction;
  h.max_coeff = 0.3;
  ReferenceOnebitLamb ref(h, c.workers, p.params, groups);
  for (int64_t t = 0; t < p.steps; ++t) ref.Step(p.StepGrads(t));
  double diff2 = 0, moved2 = 0;
  for (int64_t i = 0; i < c.n; ++i) {
    const double want = ref.params()[i];
    diff2 += (out->data[i] - want) * (out->data[i] - want);
    moved2 += (want - p.params[i]) * (want - p.params[i]);
  }
  ASSERT_GT(moved2, 0) << "the reference did not move; the test would prove nothing";
  const double rel = std::sqrt(diff2 / moved2);
  EXPECT_LT(rel, 1e-4) << "||p_out - p_ref|| / ||p_ref - p_in|| for " << c.name;
  RecordProperty("relative_error", absl::StrCat(rel));

  const std::string inproc_bytes = ReadRaw(paths.out);
  ASSERT_EQ(unlink(paths.out.c_str()), 0);
  RunResult gloo = RunBinary(flags("gloo"));
  ASSERT_EQ(gloo.exit_code, 0) << gloo.output;
  EXPECT_EQ(ReadRaw(paths.out), inproc_bytes) << "gloo and inproc differ";
}

INSTANTIATE_TEST_SUITE_P(Cases, ReplayLambTest,
                         ::testing::Values(LambCase{"w1_n37", 1, 37, 20, 8, false},
                                           LambCase{"w2_n1001", 2, 1001, 24, 10, false},
                                           LambCase{"w4_n10007_bias_correction", 4, 10007, 20, 7,
                                                    true}),
                         [](const ::testing::TestParamInfo<LambCase>& info) {
                           return info.param.name;
                         });

// ---- Flags and paths ----

class ReplayFlagsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    problem_ = MakeProblem(2, 101, 6, 99);
    paths_ = WriteProblem(problem_, "flags");
  }
  std::vector<std::string> Base() const {
    return {"--workers=2", "--params=" + paths_.params, "--grads=" + paths_.grads,
            "--out=" + paths_.out, "--lr=0.01", "--freeze-step=3"};
  }
  Problem problem_;
  Paths paths_;
};

TEST_F(ReplayFlagsTest, UnderscoreAndSeparateValueSpellingsAgree) {
  std::vector<std::string> dashed = Base();
  dashed.push_back("--weight-decay=0.02");
  RunResult a = RunBinary(dashed);
  ASSERT_EQ(a.exit_code, 0) << a.output;
  const std::string bytes = ReadRaw(paths_.out);

  RunResult b = RunBinary({"--workers", "2", "--params", paths_.params, "--grads",
                           paths_.grads, "--out", paths_.out, "--lr", "0.01", "--freeze_step",
                           "3", "--weight_decay=0.02"});
  ASSERT_EQ(b.exit_code, 0) << b.output;
  EXPECT_EQ(ReadRaw(paths_.out), bytes);

  // Without weight decay the result differs: the flag was really applied.
  RunResult c = RunBinary(Base());
  ASSERT_EQ(c.exit_code, 0) << c.output;
  EXPECT_NE(ReadRaw(paths_.out), bytes);
}

TEST_F(ReplayFlagsTest, RelativePathsUseBuildWorkingDirectory) {
  RunResult r = RunBinary({"--workers=2", "--params=params.npy", "--grads=grads.npy",
                           "--out=relative_out.npy", "--freeze-step=3"},
                          {"BUILD_WORKING_DIRECTORY=" + paths_.dir}, "/");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(Exists(paths_.dir + "/relative_out.npy")) << r.output;
  EXPECT_FALSE(Exists("/relative_out.npy"));
}

TEST_F(ReplayFlagsTest, RelativePathsWithoutBuildWorkingDirectoryUseCwd) {
  RunResult r = RunBinary({"--workers=2", "--params=params.npy", "--grads=grads.npy",
                           "--out=cwd_out.npy"},
                          {}, paths_.dir);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(Exists(paths_.dir + "/cwd_out.npy")) << r.output;
}

// Exit status 2, a message naming the flag, no output.
void ExpectUsageError(const std::vector<std::string>& args, const std::string& out,
                      const std::vector<std::string>& parts) {
  SCOPED_TRACE(::testing::PrintToString(args));
  RunResult r = RunBinary(args);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  for (const std::string& part : parts) EXPECT_THAT(r.output, HasSubstr(part));
  EXPECT_FALSE(Exists(out));
}

TEST_F(ReplayFlagsTest, UsageErrors) {
  const std::string p = "--params=" + paths_.params, g = "--grads=" + paths_.grads,
                    o = "--out=" + paths_.out;
  const std::string& out = paths_.out;
  ExpectUsageError({p, g, o}, out, {"--workers", "required"});
  ExpectUsageError({"--workers=2", g, o}, out, {"--params", "required"});
  ExpectUsageError({"--workers=2", p, o}, out, {"--grads", "required"});
  ExpectUsageError({"--workers=2", p, g}, out, {"--out", "required"});
  ExpectUsageError({"--workers=0", p, g, o}, out, {"--workers", "got 0"});
  ExpectUsageError({"--workers=-3", p, g, o}, out, {"--workers"});
  ExpectUsageError({"--workers=two", p, g, o}, out, {"--workers", "two"});
  ExpectUsageError({"--workers=2", p, g, o, "--optimizer=adam"}, out,
                   {"--optimizer", "'adam'", "onebit_adam"});
  ExpectUsageError({"--workers=2", p, g, o, "--transport=nccl"}, out, {"--transport", "nccl"});
  ExpectUsageError({"--workers=2", p, g, o, "--lr=-0.1"}, out, {"--lr"});
  ExpectUsageError({"--workers=2", p, g, o, "--lr=nan"}, out, {"--lr"});
  ExpectUsageError({"--workers=2", p, g, o, "--beta1=1"}, out, {"--beta1"});
  ExpectUsageError({"--workers=2", p, g, o, "--beta1=-0.1"}, out, {"--beta1"});
  ExpectUsageError({"--workers=2", p, g, o, "--beta2=0.999999999"}, out, {"--beta2"});
  ExpectUsageError({"--workers=2", p, g, o, "--eps=0"}, out, {"--eps"});
  ExpectUsageError({"--workers=2", p, g, o, "--weight-decay=-1"}, out, {"--weight-decay"});
  ExpectUsageError({"--workers=2", p, g, o, "--update-clip=-1"}, out, {"--update-clip"});
  ExpectUsageError({"--workers=2", p, g, o, "--update-clip=inf"}, out, {"--update-clip"});
  ExpectUsageError({"--workers=2", p, g, o, "--freeze-step=-1"}, out, {"--freeze-step"});
  ExpectUsageError({"--workers=2", p, g, o, "--no-such-flag=1"}, out, {"unknown flag", "--no-such-flag"});
  ExpectUsageError({"--workers=2", p, g, o, "stray"}, out, {"stray"});
  ExpectUsageError({"--workers=2", p, g, "--out"}, out, {"--out", "needs a value"});
}

TEST_F(ReplayFlagsTest, ZeroLearningRateLeavesParamsUnchanged) {
  std::vector<std::string> args = Base();
  args.push_back("--lr=0");
  RunResult r = RunBinary(args);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  absl::StatusOr<npy::Float32Array> out = npy::ReadFloat32(paths_.out);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->data, problem_.params);
}

TEST_F(ReplayFlagsTest, ZeroStepsCopiesParams) {
  const std::string grads = paths_.dir + "/no_steps.npy";
  ASSERT_TRUE(npy::WriteFloat32(grads, {0, 2, problem_.n}, nullptr).ok());
  RunResult r = RunBinary({"--workers=2", "--params=" + paths_.params, "--grads=" + grads,
                           "--out=" + paths_.out});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  absl::StatusOr<npy::Float32Array> out = npy::ReadFloat32(paths_.out);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->data, problem_.params);
}

// ---- Bad input files: exit status 1, the file named, nothing written ----

class ReplayInputErrorTest : public ReplayFlagsTest {
 protected:
  // Runs with params/grads replaced by the given paths.
  void ExpectInputError(const std::string& params, const std::string& grads,
                        const std::vector<std::string>& parts, int workers = 2) {
    const std::vector<std::string> before = ListDir(paths_.dir);
    RunResult r = RunBinary({absl::StrCat("--workers=", workers), "--params=" + params,
                             "--grads=" + grads, "--out=" + paths_.out, "--freeze-step=2"});
    EXPECT_EQ(r.exit_code, 1) << r.output;
    for (const std::string& part : parts) EXPECT_THAT(r.output, HasSubstr(part));
    EXPECT_FALSE(Exists(paths_.out)) << r.output;
    EXPECT_EQ(ListDir(paths_.dir), before) << "something was written";
  }
};

TEST_F(ReplayInputErrorTest, MissingFiles) {
  const std::string missing = paths_.dir + "/missing.npy";
  ExpectInputError(missing, paths_.grads, {missing, "No such file"});
  ExpectInputError(paths_.params, missing, {missing, "No such file"});
}

TEST_F(ReplayInputErrorTest, WrongDtype) {
  // A float64 params file, written by hand the way numpy would.
  const std::string f8 = paths_.dir + "/params_f8.npy";
  std::string dict = "{'descr': '<f8', 'fortran_order': False, 'shape': (101,), }";
  std::string header("\x93NUMPY\x01\x00", 8);
  const size_t len = 128 - 10;
  header.push_back(static_cast<char>(len));
  header.push_back(0);
  header += dict + std::string(len - dict.size() - 1, ' ') + "\n";
  WriteRaw(f8, header + std::string(101 * 8, '\0'));
  ExpectInputError(f8, paths_.grads, {f8, "wrong dtype", "'<f8' (float64)"});
}

TEST_F(ReplayInputErrorTest, WrongShapes) {
  // params not 1-D.
  const std::string params_2d = paths_.dir + "/params_2d.npy";
  ASSERT_TRUE(npy::WriteFloat32(params_2d, {101, 1}, problem_.params.data()).ok());
  ExpectInputError(params_2d, paths_.grads, {params_2d, "(101, 1)", "(N,)"});
  // grads with the wrong W.
  ExpectInputError(paths_.params, paths_.grads, {paths_.grads, "(6, 2, 101)", "--workers=3"},
                   /*workers=*/3);
  // grads whose N differs from params'.
  const std::string params_short = paths_.dir + "/params_short.npy";
  ASSERT_TRUE(npy::WriteFloat32(params_short, {100}, problem_.params.data()).ok());
  ExpectInputError(params_short, paths_.grads, {paths_.grads, "101", "N=100"});
  // grads not 3-D.
  const std::string grads_2d = paths_.dir + "/grads_2d.npy";
  ASSERT_TRUE(npy::WriteFloat32(grads_2d, {12, 101}, problem_.grads.data()).ok());
  ExpectInputError(paths_.params, grads_2d, {grads_2d, "(12, 101)", "(T, W, N)"});
}

TEST_F(ReplayInputErrorTest, TruncatedAndCorruptFiles) {
  const std::string raw = ReadRaw(paths_.grads);
  const std::string truncated = paths_.dir + "/grads_truncated.npy";
  WriteRaw(truncated, raw.substr(0, raw.size() - 10));
  ExpectInputError(paths_.params, truncated, {truncated, "truncated data", "found"});

  const std::string garbage = paths_.dir + "/grads_garbage.npy";
  WriteRaw(garbage, raw + "junk");
  ExpectInputError(paths_.params, garbage, {garbage, "trailing garbage"});

  const std::string not_npy = paths_.dir + "/not_npy.npy";
  WriteRaw(not_npy, "x,y\n1,2\n");
  ExpectInputError(not_npy, paths_.grads, {not_npy, "bad magic"});
}

TEST_F(ReplayInputErrorTest, UnwritableOutputDirectory) {
  const std::string out = paths_.dir + "/no_such_dir/out.npy";
  RunResult r = RunBinary({"--workers=2", "--params=" + paths_.params,
                           "--grads=" + paths_.grads, "--out=" + out});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr(out));
  EXPECT_FALSE(Exists(out));
}

}  // namespace
}  // namespace onebit
