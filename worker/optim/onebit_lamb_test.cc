// OnebitLamb against the float64 model over transports x world sizes x lengths, with
// several parameter groups and the switch inside the run; inproc and gloo bit for bit; the
// norms cut at the exchange's reduction_stride().
#include "worker/optim/onebit_lamb.h"

#include <cmath>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/kernels.h"
#include "worker/exchange/forwarding_exchange.h"
#include "worker/exchange/peer_exchange.h"
#include "worker/optim/onebit_lamb_reference.h"
#include "worker/optim/test_stream.h"
#include "worker/transport/local_group.h"

namespace onebit {
namespace {

using test_stream::Grad;
using test_stream::Params;

struct Case {
  int64_t steps = 16;
  int64_t freeze_step = 6;
  float weight_decay = 0.0f;
  bool mask = false;
  double max_coeff = 10.0;
  bool bias_correction = false;
  double clip = 0.0;  // gradient clipping's max norm
  size_t stride = 0;  // the exchange's reduction_stride()
};

// A flat exchange that reports a reduction stride, as a hierarchical one does.
class StrideExchange : public ForwardingExchange {
 public:
  StrideExchange(Exchange* inner, size_t stride) : ForwardingExchange(inner), stride_(stride) {}
  size_t reduction_stride() const override { return stride_; }

 private:
  size_t stride_;
};

// Rank 0's float64 scalars at the end of a run.
struct Scalars {
  std::vector<double> coeff_freeze, scaling_coeff, last_factor;
};

// Three groups where there is room for them (as a model's tensors), else one.
std::vector<size_t> Groups(size_t n) {
  if (n < 3) return {};
  return {0, n / 3, n / 2, n};
}

std::vector<float> Mask(size_t n) {
  std::vector<float> mask(n);
  for (size_t i = 0; i < n; ++i) mask[i] = i % 5 == 2 ? 0.0f : 1.0f;
  return mask;
}

std::vector<std::vector<float>> RunOptimizer(TransportKind kind, int w, size_t n, const Case& c,
                                             Scalars* scalars = nullptr) {
  std::vector<std::vector<float>> result(w);
  const std::vector<float> p0 = Params(n);
  const absl::Status status = RunLocalGroup(kind, w, [&](Transport& transport) -> absl::Status {
    auto backend = kernels::NewCpuBackend();
    auto exchange = PeerExchange::Create(backend.get(), &transport, n);
    if (!exchange.ok()) return exchange.status();
    StrideExchange strided(exchange->get(), c.stride);
    OnebitLambOptions options;
    options.hyper.lr = 0.01f;
    options.hyper.weight_decay = c.weight_decay;
    options.freeze_step = c.freeze_step;
    options.coeffs.max_coeff = c.max_coeff;
    options.group_offsets = Groups(n);
    if (c.mask) options.momentum_mask = Mask(n);
    options.bias_correction = c.bias_correction;
    options.max_grad_norm = c.clip;
    auto lamb = OnebitLamb::Create(options, backend.get(), &strided, p0.data(), n);
    if (!lamb.ok()) return lamb.status();
    for (int64_t t = 1; t <= c.steps; ++t) {
      const std::vector<float> g = Grad(transport.rank(), t, n);
      if (absl::Status s = (*lamb)->Step(g.data()); !s.ok()) return s;
    }
    if (scalars != nullptr && transport.rank() == 0) {
      *scalars = {(*lamb)->coeff_freeze(), (*lamb)->scaling_coeff(), (*lamb)->last_factor()};
    }
    auto p = (*lamb)->ParamsToHost();
    if (!p.ok()) return p.status();
    result[transport.rank()] = *p;
    return absl::OkStatus();
  });
  EXPECT_TRUE(status.ok()) << status;
  return result;
}

double Disagreement(TransportKind kind, int w, size_t n, const Case& c) {
  const std::vector<std::vector<float>> got = RunOptimizer(kind, w, n, c);
  for (int rank = 1; rank < w; ++rank) {
    EXPECT_EQ(0, std::memcmp(got[rank].data(), got[0].data(), n * sizeof(float)))
        << "rank " << rank << " diverged";
  }
  ReferenceLambHyper h;
  h.adam.lr = 0.01f;
  h.adam.beta1 = 0.9f;
  h.adam.beta2 = 0.999f;
  h.adam.eps = 1e-8f;
  h.adam.weight_decay = c.weight_decay;
  h.adam.freeze_step = c.freeze_step;
  h.max_coeff = c.max_coeff;
  h.adam.bias_correction = c.bias_correction;
  h.adam.max_grad_norm = c.clip;
  const std::vector<float> p0 = Params(n);
  ReferenceOnebitLamb model(h, w, p0, Groups(n), c.mask ? Mask(n) : std::vector<float>{});
  for (int64_t t = 1; t <= c.steps; ++t) {
    std::vector<std::vector<float>> grads;
    for (int rank = 0; rank < w; ++rank) grads.push_back(Grad(rank, t, n));
    model.Step(grads);
  }
  return test_stream::RelativeDistance(got[0], model.params(), p0);
}

using Param = std::tuple<TransportKind, int, size_t>;
class OnebitLambMatrixTest : public ::testing::TestWithParam<Param> {};

TEST_P(OnebitLambMatrixTest, MatchesFloat64Model) {
  const auto [kind, w, n] = GetParam();
  EXPECT_LT(Disagreement(kind, w, n, Case{}), 1e-4);
}

INSTANTIATE_TEST_SUITE_P(
    Matrix, OnebitLambMatrixTest,
    ::testing::Combine(::testing::Values(TransportKind::kInproc, TransportKind::kGloo),
                       ::testing::Values(1, 2, 3, 4),
                       ::testing::Values(size_t{1}, size_t{7}, size_t{1000}, size_t{10007})),
    [](const ::testing::TestParamInfo<Param>& info) {
      return TransportKindName(std::get<0>(info.param)) + "_W" +
             std::to_string(std::get<1>(info.param)) + "_N" +
             std::to_string(std::get<2>(info.param));
    });

TEST(OnebitLambTest, WeightDecayMaskAndAClampedTrustRatio) {
  Case c;
  c.weight_decay = 0.01f;
  c.mask = true;
  c.max_coeff = 0.3;  // the seed tutorials' value: the trust ratio is clamped
  for (int w : {1, 2, 4}) EXPECT_LT(Disagreement(TransportKind::kInproc, w, 1003, c), 1e-4) << w;
}

// The norm of a worker's gradient here is about 27: every step clips.
TEST(OnebitLambTest, GradientClipping) {
  Case c;
  c.clip = 5.0;
  for (int w : {1, 2, 4}) EXPECT_LT(Disagreement(TransportKind::kInproc, w, 1003, c), 1e-4) << w;
  Case loose = c;
  loose.clip = 1e6;  // never reached: the same bits as without clipping
  Case off = c;
  off.clip = 0.0;
  const auto a = RunOptimizer(TransportKind::kInproc, 2, 500, loose);
  const auto b = RunOptimizer(TransportKind::kInproc, 2, 500, off);
  const auto clipped = RunOptimizer(TransportKind::kInproc, 2, 500, c);
  EXPECT_EQ(0, std::memcmp(a[0].data(), b[0].data(), 500 * sizeof(float)));
  EXPECT_NE(0, std::memcmp(clipped[0].data(), b[0].data(), 500 * sizeof(float)));
}

TEST(OnebitLambTest, BiasCorrection) {  // the seed tutorials' LAMB blocks turn it on
  Case c;
  c.bias_correction = true;
  c.weight_decay = 0.01f;
  c.max_coeff = 0.3;
  for (int w : {1, 2, 4}) EXPECT_LT(Disagreement(TransportKind::kInproc, w, 1003, c), 1e-4) << w;
}

TEST(OnebitLambTest, CompressesFromTheFirstStepAndNeverFreezes) {
  Case c;
  c.freeze_step = 0;  // no warmup: the trust-ratio average is 0 and nothing moves
  const auto still = RunOptimizer(TransportKind::kInproc, 2, 100, c);
  const std::vector<float> p0 = Params(100);
  EXPECT_EQ(0, std::memcmp(still[0].data(), p0.data(), 100 * sizeof(float)));
  c.freeze_step = 16;
  EXPECT_LT(Disagreement(TransportKind::kInproc, 3, 1000, c), 1e-4);
}

TEST(OnebitLambTest, SameBitsOverInprocAndGloo) {
  const auto a = RunOptimizer(TransportKind::kInproc, 3, 999, Case{});
  const auto b = RunOptimizer(TransportKind::kGloo, 3, 999, Case{});
  EXPECT_EQ(0, std::memcmp(a[0].data(), b[0].data(), 999 * sizeof(float)));
}

// The norms (trust ratios, the switch's scaling, the factor's) are cut at the exchange's
// reduction_stride() and added in slice order. A stride past the end is one piece: the
// bits of no stride. A stride inside the tensors changes the float64 scalars' last bits
// (and so, rarely, a parameter), and the result still follows the model.
TEST(OnebitLambTest, NormsAreCutAtTheReductionStride) {
  const size_t n = 1003;
  Case c;
  c.weight_decay = 0.01f;  // the factor's norms before and after the decay
  c.clip = 5.0;            // clips every warmup step, on the exact sum's norm
  Scalars none, past, inside;
  const auto a = RunOptimizer(TransportKind::kInproc, 2, n, c, &none);
  for (size_t stride : {n, n + 1, size_t{1} << 20}) {
    Case p = c;
    p.stride = stride;
    const auto b = RunOptimizer(TransportKind::kInproc, 2, n, p, &past);
    EXPECT_EQ(0, std::memcmp(a[0].data(), b[0].data(), n * sizeof(float))) << stride;
    EXPECT_EQ(none.coeff_freeze, past.coeff_freeze) << stride;
    EXPECT_EQ(none.scaling_coeff, past.scaling_coeff) << stride;
    EXPECT_EQ(none.last_factor, past.last_factor) << stride;
  }
  Case cut = c;
  cut.stride = 104;  // a multiple of 8, as a hierarchical slice is; cuts each of the groups
  RunOptimizer(TransportKind::kInproc, 2, n, cut, &inside);
  EXPECT_NE(none.coeff_freeze, inside.coeff_freeze);
  for (int w : {1, 2, 3}) {
    EXPECT_LT(Disagreement(TransportKind::kInproc, w, n, cut), 1e-4) << w;
  }
}

TEST(OnebitLambTest, RejectsBadOptions) {
  auto backend = kernels::NewCpuBackend();
  const absl::Status status = RunLocalGroup(TransportKind::kInproc, 1, [&](Transport& t) {
    auto exchange = *PeerExchange::Create(backend.get(), &t, 10);
    const std::vector<float> p(10, 1.0f);
    auto code = [&](OnebitLambOptions o) {
      return OnebitLamb::Create(o, backend.get(), exchange.get(), p.data(), p.size())
          .status()
          .code();
    };
    OnebitLambOptions o;
    o.coeffs.min_coeff = 20.0;  // above max_coeff
    EXPECT_EQ(code(o), absl::StatusCode::kInvalidArgument);
    o = {};
    o.coeffs.factor_min = 2.0;
    EXPECT_EQ(code(o), absl::StatusCode::kInvalidArgument);
    o = {};
    o.coeffs.coeff_beta = 1.0;
    EXPECT_EQ(code(o), absl::StatusCode::kInvalidArgument);
    o = {};
    o.group_offsets = {0, 5, 5, 10};  // an empty group
    EXPECT_EQ(code(o), absl::StatusCode::kInvalidArgument);
    o.group_offsets = {0, 5, 9};  // does not reach n
    EXPECT_EQ(code(o), absl::StatusCode::kInvalidArgument);
    o = {};
    o.group_offsets = {0, 4, 10};
    EXPECT_EQ(code(o), absl::StatusCode::kOk);
    return absl::OkStatus();
  });
  EXPECT_TRUE(status.ok()) << status;
}

}  // namespace
}  // namespace onebit
