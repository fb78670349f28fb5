// CompressedAllreduce against the float64 model, over every transport, the world sizes of
// the issue and lengths around the padding boundaries. Several rounds run back to back so
// that the worker and server errors carry over.
#include "worker/exchange/compressed_allreduce.h"

#include <algorithm>
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

using Param = std::tuple<TransportKind, int, size_t, const Codec*>;

class CompressedAllreduceTest : public ::testing::TestWithParam<Param> {};

// int8 against the float64 model, element by element: a value the model puts within float
// rounding of a code boundary (k + 1/2) may get the neighbouring code, one step
// ((max - min)/255) off, and error feedback carries that into the next round (where a
// second quantisation may add a step). Those few elements (at most 0.1%, up to 2.5 steps
// off; CompareInt8) aside, every element agrees to float rounding. A wrong rounding, offset
// or scale is off by about half a step in most elements. (The L2 measure of the 1-bit test
// does not fit: one such element in 1000 is already 7e-4 of the norm.)
void ExpectInt8Near(const std::vector<float>& got, const std::vector<double>& want,
                    const std::string& what) {
  const Int8Comparison c = CompareInt8(got, want);
  EXPECT_LE(c.worst_steps, 2.5) << what;
  EXPECT_LE(c.flips, std::max<size_t>(2, want.size() / 1000)) << what;  // seen: 1 at most
}

TEST_P(CompressedAllreduceTest, MatchesFloat64Model) {
  const auto [kind, w, n, compressor] = GetParam();
  // outputs[round][rank]
  std::vector<std::vector<std::vector<float>>> outputs(kRounds, std::vector<std::vector<float>>(w));
  std::vector<uint64_t> sent(w);
  const absl::Status status = RunLocalGroup(kind, w, [&](Transport& transport) -> absl::Status {
    auto backend = kernels::NewCpuBackend();
    auto exchange = CompressedAllreduce::Create(backend.get(), &transport, n, *compressor);
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

  ReferenceCompressedAllreduce reference(w, n, compressor == &Int8Codec());
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
    if (compressor == &Int8Codec()) {
      ExpectInt8Near(outputs[round][0], want, "round " + std::to_string(round));
    } else {
      EXPECT_LT(RelativeError(outputs[round][0], want), 1e-5) << "round " << round;
    }
  }
  // Two exchanges of one block per peer each round: 2*(W-1) blocks of 4 + C/8 bytes
  // (1 bit) or 8 + C bytes (int8).
  const uint64_t block =
      compressor == &Int8Codec() ? 8 + n_pad / w : 4 + n_pad / w / 8;
  for (int rank = 0; rank < w; ++rank) {
    EXPECT_EQ(sent[rank], static_cast<uint64_t>(kRounds) * 2 * (w - 1) * block) << "rank " << rank;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Matrix, CompressedAllreduceTest,
    ::testing::Combine(::testing::Values(TransportKind::kInproc, TransportKind::kGloo),
                       ::testing::Values(1, 2, 3, 4, 5, 8),
                       ::testing::Values(size_t{1}, size_t{7}, size_t{1000}, size_t{10007}),
                       ::testing::Values(&OnebitCodec(), &Int8Codec())),
    [](const ::testing::TestParamInfo<Param>& info) {
      return TransportKindName(std::get<0>(info.param)) + "_W" +
             std::to_string(std::get<1>(info.param)) + "_N" +
             std::to_string(std::get<2>(info.param)) + "_" +
             std::string((std::get<3>(info.param))->name());
    });

// The same rounds over inproc and gloo give the same bits, for every compressor.
class CompressedAllreduceTransportsTest
    : public ::testing::TestWithParam<const Codec*> {};

TEST_P(CompressedAllreduceTransportsTest, InprocAndGlooBitIdentical) {
  const Codec* compressor = GetParam();
  constexpr int kWorkers = 4;
  constexpr size_t kN = 10007;
  auto run = [&](TransportKind kind) {
    std::vector<std::vector<float>> out(kWorkers);
    const absl::Status status = RunLocalGroup(kind, kWorkers, [&](Transport& transport) -> absl::Status {
      auto backend = kernels::NewCpuBackend();
      auto exchange = CompressedAllreduce::Create(backend.get(), &transport, kN, *compressor);
      if (!exchange.ok()) return exchange.status();
      std::vector<float>& all = out[transport.rank()];
      for (int round = 0; round < kRounds; ++round) {
        std::vector<float> buffer = Input(transport.rank(), round, kN);
        if (absl::Status s = (*exchange)->Run(buffer.data(), buffer.data()); !s.ok()) return s;
        all.insert(all.end(), buffer.begin(), buffer.end());
      }
      const std::vector<float> err = *(*exchange)->worker().error().ToHost();
      all.insert(all.end(), err.begin(), err.end());
      return absl::OkStatus();
    });
    EXPECT_TRUE(status.ok()) << status;
    return out;
  };
  const auto inproc = run(TransportKind::kInproc), gloo = run(TransportKind::kGloo);
  for (int rank = 0; rank < kWorkers; ++rank) {
    ASSERT_EQ(inproc[rank].size(), gloo[rank].size());
    EXPECT_EQ(0, std::memcmp(inproc[rank].data(), gloo[rank].data(),
                             inproc[rank].size() * sizeof(float)))
        << "rank " << rank;
  }
}

// Every registered codec: inproc is the reference, no model needed.
INSTANTIATE_TEST_SUITE_P(Compressors, CompressedAllreduceTransportsTest,
                         ::testing::ValuesIn(AllCodecs()),
                         [](const ::testing::TestParamInfo<const Codec*>& info) {
                           return std::string(info.param->name());
                         });

}  // namespace
}  // namespace onebit
