// Writes a synthetic gradient stream for onebit-replay: params.npy of shape (N,) and
// grads.npy of shape (T, W, N). Each worker's gradient is a shared, slowly turning signal
// (what all workers agree on) plus its own noise (what the averaging removes), so the
// stream exercises both stages the way data-parallel training does.
//
//   bazel run //tools:onebit-gradient-stream -- --workers=4 --steps=200 --n=100000 --out_dir=/tmp/s
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "common/npy.h"
#include "common/signals.h"

ABSL_FLAG(int, workers, 4, "Workers W.");
ABSL_FLAG(int, steps, 200, "Steps T.");
ABSL_FLAG(int64_t, n, 100000, "Parameters N.");
ABSL_FLAG(double, noise, 1.0, "Per-worker noise relative to the shared signal.");
ABSL_FLAG(int, seed, 1, "Random seed.");
ABSL_FLAG(std::string, out_dir, ".", "Directory for params.npy and grads.npy.");

int main(int argc, char** argv) {
  onebit::IgnoreSigpipe();
  absl::ParseCommandLine(argc, argv);
  const int w = absl::GetFlag(FLAGS_workers), t_steps = absl::GetFlag(FLAGS_steps);
  const int64_t n = absl::GetFlag(FLAGS_n);
  const float noise = static_cast<float>(absl::GetFlag(FLAGS_noise));
  if (w < 1 || t_steps < 0 || n < 0) {
    std::fprintf(stderr, "error: need --workers >= 1, --steps >= 0, --n >= 0\n");
    return 2;
  }
  std::string dir = absl::GetFlag(FLAGS_out_dir);
  if (const char* wd = std::getenv("BUILD_WORKING_DIRECTORY"); wd && !dir.empty() && dir[0] != '/') {
    dir = std::string(wd) + "/" + dir;
  }
  std::mt19937 rng(absl::GetFlag(FLAGS_seed));
  std::normal_distribution<float> normal(0.0f, 1.0f);

  std::vector<float> params(n), phase(n), grads(static_cast<size_t>(t_steps) * w * n);
  for (int64_t i = 0; i < n; ++i) {
    params[i] = 0.1f * normal(rng);
    phase[i] = 6.2831853f * static_cast<float>(i) / static_cast<float>(n > 0 ? n : 1);
  }
  for (int t = 0; t < t_steps; ++t) {
    for (int r = 0; r < w; ++r) {
      float* g = grads.data() + (static_cast<size_t>(t) * w + r) * n;
      for (int64_t i = 0; i < n; ++i) {
        g[i] = std::sin(phase[i] + 0.02f * t) + noise * normal(rng);
      }
    }
  }
  for (absl::Status s :
       {onebit::npy::WriteFloat32(dir + "/params.npy", {n}, params.data()),
        onebit::npy::WriteFloat32(dir + "/grads.npy", {t_steps, w, n}, grads.data())}) {
    if (!s.ok()) {
      std::fprintf(stderr, "error: %s\n", std::string(s.message()).c_str());
      return 1;
    }
  }
  std::printf("wrote %s/params.npy (N=%lld) and %s/grads.npy (T=%d, W=%d, N=%lld)\n", dir.c_str(),
              static_cast<long long>(n), dir.c_str(), t_steps, w, static_cast<long long>(n));
  return 0;
}
