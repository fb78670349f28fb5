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

}  // namespace onebit::test_stream

#endif  // ONEBIT_WORKER_OPTIM_TEST_STREAM_H_
