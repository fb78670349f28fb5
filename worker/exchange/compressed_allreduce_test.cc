// CompressedAllreduce against the float64 model, over every transport, the world sizes of
// the issue and lengths around the padding boundaries. Several rounds run back to back so
// that the worker and server errors carry over.
#include "worker/exchange/compressed_allreduce.h"

#include <cmath>
#include <cstring>
#include <mutex>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/kernels.h"
#include "worker/transport/local_group.h"
#include "worker/exchange/compressed_allreduce_reference.h"

namespace onebit {
namespace {

constexpr int kRounds = 3;

std::vector<float> Input(int rank, int round, size_t n) {
  std::mt19937 rng(1000 * rank + round);
  std::normal_distribution<float> dist(0.1f * rank, 1.0f + rank);
  std::vector<float> x(n);
  for (float& v : x) v = dist(rng);
  return x;
}

double RelativeError(const std::vector<float>& got, const std::vector<double>& want) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    diff += (got[i] - want[i]) * (got[i] - want[i]);
    norm += want[i] * want[i];
  }
  return norm == 0 ? std::sqrt(diff) : std::sqrt(diff / norm);
}

using Param = std::tuple<TransportKind, int, size_t>;

class CompressedAllreduceTest : public ::testing::TestWithParam<Param> {};

TEST_P(CompressedAllreduceTest, MatchesFloat64Model) {
  const auto [kind, w, n] = GetParam();
  // outputs[round][rank]
  std::vector<std::vector<std::vector<float>>> outputs(kRounds, std::vector<std::vector<float>>(w));
  std::vector<uint64_t> sent(w);
  const absl::Status status = RunLocalGroup(kind, w, [&](Transport& transport) -> absl::Status {
    auto backend = kernels::NewCpuBackend();
    auto exchange = CompressedAllreduce::Create(backend.get(), &transport, n);
    if (!exchange.ok()) return exchange.status();
    const int rank = transport.rank();
    const uint64_t before = transport.bytes_sent();
    for (int round = 0; round < kRounds; ++round) {
      std::vector<float> buffer = Input(rank, round, n);
      if (absl::Status s = (*exchange)->Run(buffer.data(), buffer.data()); !s.ok()) return s;
      outputs[round][rank] = buffer;
    }
    sent[rank] = transport.bytes_sent() - before;
    return absl::OkStatus();
  });
  ASSERT_TRUE(status.ok()) << status;

  ReferenceCompressedAllreduce reference(w, n);
  const size_t n_pad = ReferencePaddedSize(n, w);
  ASSERT_EQ(PeerPaddedSize(n, w), n_pad);
  for (int round = 0; round < kRounds; ++round) {
    std::vector<std::vector<double>> inputs;
    for (int rank = 0; rank < w; ++rank) {
      const std::vector<float> x = Input(rank, round, n);
      inputs.emplace_back(x.begin(), x.end());
    }
    const std::vector<double> want = reference.Run(inputs);
    for (int rank = 0; rank < w; ++rank) {
      // Every worker ends with the same tensor, bit for bit.
      ASSERT_EQ(0, std::memcmp(outputs[round][rank].data(), outputs[round][0].data(),
                               n * sizeof(float)))
          << "rank " << rank << " round " << round;
    }
    EXPECT_LT(RelativeError(outputs[round][0], want), 1e-5) << "round " << round;
  }
  // Two exchanges of one block per peer each round: 2*(W-1) blocks of 4 + C/8 bytes.
  const uint64_t block = 4 + n_pad / w / 8;
  for (int rank = 0; rank < w; ++rank) {
    EXPECT_EQ(sent[rank], static_cast<uint64_t>(kRounds) * 2 * (w - 1) * block) << "rank " << rank;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Matrix, CompressedAllreduceTest,
    ::testing::Combine(::testing::Values(TransportKind::kInproc, TransportKind::kGloo),
                       ::testing::Values(1, 2, 3, 4, 5, 8),
                       ::testing::Values(size_t{1}, size_t{7}, size_t{1000}, size_t{10007})),
    [](const ::testing::TestParamInfo<Param>& info) {
      return TransportKindName(std::get<0>(info.param)) + "_W" +
             std::to_string(std::get<1>(info.param)) + "_N" +
             std::to_string(std::get<2>(info.param));
    });

}  // namespace
}  // namespace onebit
