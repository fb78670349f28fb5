#include "worker/exchange/exact_allreduce.h"

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/kernels.h"
#include "worker/transport/local_group.h"

namespace onebit {
namespace {

std::vector<float> Input(int rank, size_t n) {
  std::mt19937 rng(rank + 1);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> x(n);
  for (float& v : x) v = dist(rng);
  return x;
}

// Every rank's result, for `w` ranks over `kind`.
std::vector<std::vector<float>> Sum(TransportKind kind, int w, size_t n) {
  std::vector<std::vector<float>> out(w);
  const absl::Status status = RunLocalGroup(kind, w, [&](Transport& t) -> absl::Status {
    auto backend = kernels::NewCpuBackend();
    auto a = ExactAllreduce::Create(backend.get(), &t, n);
    if (!a.ok()) return a.status();
    const std::vector<float> in = Input(t.rank(), n);
    if (absl::Status s = (*a)->Run(in.data()); !s.ok()) return s;
    out[t.rank()].assign((*a)->result(), (*a)->result() + n);
    return absl::OkStatus();
  });
  EXPECT_TRUE(status.ok()) << status;
  return out;
}

TEST(ExactAllreduceTest, SumsInRankOrderOverEveryTransport) {
  for (int w : {1, 2, 3, 5, 8}) {
    for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{1000}, size_t{10007}}) {
      const auto inproc = Sum(TransportKind::kInproc, w, n);
      const auto gloo = Sum(TransportKind::kGloo, w, n);
      std::vector<float> want(n, 0.0f);
      for (int r = 0; r < w; ++r) {
        const std::vector<float> x = Input(r, n);
        for (size_t i = 0; i < n; ++i) want[i] += x[i];  // rank order, float
      }
      for (int r = 0; r < w; ++r) {
        const std::string where = "W=" + std::to_string(w) + " n=" + std::to_string(n);
        // Bitwise: memcmp, skipped for n = 0 (an empty vector's data() may be null).
        if (n == 0) continue;
        ASSERT_EQ(0, std::memcmp(inproc[r].data(), want.data(), n * sizeof(float))) << where;
        ASSERT_EQ(0, std::memcmp(gloo[r].data(), want.data(), n * sizeof(float))) << where;
      }
    }
  }
}

}  // namespace
}  // namespace onebit
