// A deterministic training stream for optimizer tests: initial parameters and each worker's
// gradient at each step (a drift shared by all workers plus worker noise), so that an
// implementation and its float64 model see the same numbers.
#ifndef ONEBIT_WORKER_OPTIM_TEST_STREAM_H_
#define ONEBIT_WORKER_OPTIM_TEST_STREAM_H_

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

namespace onebit::test_stream {

inline std::vector<float> Params(size_t n) {
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> p(n);
  for (float& v : p) v = dist(rng);
  return p;
}

// Worker `worker`'s gradient at `step`.
inline std::vector<float> Grad(int worker, int64_t step, size_t n) {
  std::mt19937 rng(100 * worker + step);
  std::normal_distribution<float> noise(0.0f, 0.5f);
  std::vector<float> g(n);
  for (size_t i = 0; i < n; ++i) g[i] = std::sin(0.01f * i + 0.1f * step) + noise(rng);
  return g;
}

// ||got - ref|| / ||ref - initial||: how far an implementation's parameters are from its
// float64 model's, relative to how far the model moved (the foundation issue's measure).
// A size mismatch counts as infinitely far.
inline double RelativeDistance(const std::vector<float>& got, const std::vector<double>& ref,
                               const std::vector<float>& initial) {
  if (got.size() != ref.size() || ref.size() != initial.size()) return 1e9;
  double diff = 0, moved = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    diff += (got[i] - ref[i]) * (got[i] - ref[i]);
    moved += (ref[i] - initial[i]) * (ref[i] - initial[i]);
  }
  return std::sqrt(diff / moved);
}

}  // namespace onebit::test_stream

#endif  // ONEBIT_WORKER_OPTIM_TEST_STREAM_H_
