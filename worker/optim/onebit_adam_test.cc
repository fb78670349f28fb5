// OnebitAdam against the float64 model of docs/algorithms.md: transports x world sizes x
// lengths, across the switch from warmup to compression.
#include "worker/optim/onebit_adam.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/kernels.h"
#include "worker/transport/local_group.h"
#include "worker/optim/onebit_adam_reference.h"
#include "worker/optim/test_stream.h"

namespace onebit {
namespace {

struct Case {
  int64_t steps = 12;
  int64_t freeze_step = 5;
  float weight_decay = 0.0f;
  bool mask = false;
  bool bias_correction = false;
  double clip = 0.0;  // gradient clipping's max norm
  // A weight-decay schedule: from step decay_from on (0: never), later_weight_decay.
  int64_t decay_from = 0;
  float later_weight_decay = 0.0f;
  float update_clip = 0.0f;
  // Every fifth element's gradient is zero through warmup, so its variance freezes at 0.
  bool silent_warmup = false;
};

// Rank `rank`'s gradient of step t under `c`.
std::vector<float> CaseGrad(const Case& c, int rank, int64_t t, size_t n) {
  std::vector<float> g = test_stream::Grad(rank, t, n);
  if (c.silent_warmup && t <= c.freeze_step) {
    for (size_t i = 0; i < n; i += 5) g[i] = 0.0f;
  }
  return g;
}

bool DecayMoves(const Case& c, int64_t t) { return c.decay_from > 0 && t == c.decay_from; }

using test_stream::Grad;
using test_stream::Params;

std::vector<float> Mask(size_t n) {
  std::vector<float> mask(n);
  for (size_t i = 0; i < n; ++i) mask[i] = i % 4 == 3 ? 0.0f : 1.0f;
  return mask;
}

// Runs `c` on `w` ranks and returns every rank's final parameters.
std::vector<std::vector<float>> RunOptimizer(TransportKind kind, int w, size_t n, const Case& c) {
  std::vector<std::vector<float>> result(w);
  const std::vector<float> p0 = Params(n);
  const absl::Status status = RunLocalGroup(kind, w, [&](Transport& transport) -> absl::Status {
    auto backend = kernels::NewCpuBackend();
    OnebitAdamOptions options;
    options.hyper.lr = 0.01f;
    options.hyper.weight_decay = c.weight_decay;
    options.hyper.update_clip = c.update_clip;
    options.freeze_step = c.freeze_step;
    if (c.mask) options.momentum_mask = Mask(n);
    options.bias_correction = c.bias_correction;
    options.max_grad_norm = c.clip;
    auto adam = OnebitAdam::Create(options, backend.get(), &transport, p0.data(), n);
    if (!adam.ok()) return adam.status();
    for (int64_t t = 1; t <= c.steps; ++t) {
      const Stage expected = t <= c.freeze_step ? Stage::kWarmup : Stage::kCompression;
      if ((*adam)->stage() != expected) return absl::InternalError("wrong stage");
      if (DecayMoves(c, t)) {
        ONEBIT_RETURN_IF_ERROR((*adam)->set_weight_decays({c.later_weight_decay}));
      }
      const std::vector<float> g = CaseGrad(c, transport.rank(), t, n);
      if (absl::Status s = (*adam)->Step(g.data()); !s.ok()) return s;
    }
    auto p = (*adam)->ParamsToHost();
    if (!p.ok()) return p.status();
    result[transport.rank()] = *p;
    return absl::OkStatus();
  });
  EXPECT_TRUE(status.ok()) << status;
  return result;
}

// ||p - p_ref|| / ||p_ref - p_in||: the measure of the issue.
double Disagreement(TransportKind kind, int w, size_t n, const Case& c) {
  const std::vector<std::vector<float>> got = RunOptimizer(kind, w, n, c);
  for (int rank = 1; rank < w; ++rank) {
    EXPECT_EQ(0, std::memcmp(got[rank].data(), got[0].data(), n * sizeof(float)))
        << "rank " << rank << " diverged";
  }
  ReferenceHyper h;
  h.lr = 0.01f;
  h.beta1 = 0.9f;
  h.beta2 = 0.999f;
  h.eps = 1e-8f;
  h.weight_decay = c.weight_decay;
  h.freeze_step = c.freeze_step;
  h.bias_correction = c.bias_correction;
  h.max_grad_norm = c.clip;
  h.update_clip = c.update_clip;
  const std::vector<float> p0 = Params(n);
  ReferenceOnebitAdam reference(h, w, p0, c.mask ? Mask(n) : std::vector<float>{});
  for (int64_t t = 1; t <= c.steps; ++t) {
    std::vector<std::vector<float>> grads;
    for (int rank = 0; rank < w; ++rank) grads.push_back(CaseGrad(c, rank, t, n));
    if (DecayMoves(c, t)) reference.set_weight_decay(c.later_weight_decay);
    reference.Step(grads);
  }
  return test_stream::RelativeDistance(got[0], reference.params(), p0);
}

using Param = std::tuple<TransportKind, int, size_t>;
class OnebitAdamMatrixTest : public ::testing::TestWithParam<Param> {};

TEST_P(OnebitAdamMatrixTest, MatchesFloat64Model) {
  const auto [kind, w, n] = GetParam();
  EXPECT_LT(Disagreement(kind, w, n, Case{}), 1e-4);
}

INSTANTIATE_TEST_SUITE_P(
    Matrix, OnebitAdamMatrixTest,
    ::testing::Combine(::testing::Values(TransportKind::kInproc, TransportKind::kGloo),
                       ::testing::Values(1, 2, 3, 4, 5, 8),
                       ::testing::Values(size_t{1}, size_t{7}, size_t{1000}, size_t{10007})),
    [](const ::testing::TestParamInfo<Param>& info) {
      return TransportKindName(std::get<0>(info.param)) + "_W" +
             std::to_string(std::get<1>(info.param)) + "_N" +
             std::to_string(std::get<2>(info.param));
    });

TEST(OnebitAdamTest, CompressesFromTheFirstStep) {
  Case c;
  c.freeze_step = 0;
  EXPECT_LT(Disagreement(TransportKind::kInproc, 3, 1000, c), 1e-4);
}

TEST(OnebitAdamTest, NeverFreezesWhenFreezeStepIsPastTheEnd) {
  Case c;
  c.freeze_step = 12;
  EXPECT_LT(Disagreement(TransportKind::kInproc, 4, 1001, c), 1e-4);
}

TEST(OnebitAdamTest, WeightDecayAndMomentumMask) {
  Case c;
  c.weight_decay = 0.01f;
  c.mask = true;
  for (int w : {1, 2, 4}) EXPECT_LT(Disagreement(TransportKind::kInproc, w, 1003, c), 1e-4) << w;
}

// Elements whose variance froze at 0 get +-scale from the 1-bit momentum: the clip bounds
// their direction (the model's, bit for bit in float64's tolerance), and the steps after
// the freeze then move them by at most lr * clip each; without the clip they move by
// about lr * scale / eps.
TEST(OnebitAdamTest, UpdateClipBoundsElementsWhoseVarianceFrozeAtZero) {
  Case c;
  c.silent_warmup = true;
  c.update_clip = 10.0f;
  for (int w : {1, 2, 4}) EXPECT_LT(Disagreement(TransportKind::kInproc, w, 1005, c), 1e-4) << w;
  c.bias_correction = true;
  c.weight_decay = 0.01f;
  EXPECT_LT(Disagreement(TransportKind::kInproc, 3, 1005, c), 1e-4);

  const size_t n = 1005;
  const std::vector<float> p0 = Params(n);
  auto largest_move = [&](const Case& run) {
    const std::vector<float> p = RunOptimizer(TransportKind::kInproc, 3, n, run)[0];
    double most = 0.0;
    for (size_t i = 0; i < n; i += 5) most = std::max(most, std::fabs(double{p[i]} - p0[i]));
    return most;
  };
  Case clipped;
  clipped.silent_warmup = true;
  clipped.update_clip = 10.0f;
  const double bound = 0.01 * 10.0 * (clipped.steps - clipped.freeze_step);  // lr * clip * steps
  EXPECT_LE(largest_move(clipped), bound * (1 + 1e-5));
  Case unclipped = clipped;
  unclipped.update_clip = 0.0f;
  EXPECT_GT(largest_move(unclipped), 1000 * bound);
}

// A weight-decay schedule (a script's, set_weight_decays before step 8, after the freeze at
// 5) is the model's with the same schedule; and it acts: the run without it lands elsewhere.
TEST(OnebitAdamTest, WeightDecaySchedule) {
  Case c;
  c.weight_decay = 0.01f;
  c.decay_from = 8;
  c.later_weight_decay = 0.5f;
  for (int w : {1, 2, 4}) EXPECT_LT(Disagreement(TransportKind::kInproc, w, 1003, c), 1e-4) << w;
  Case fixed = c;
  fixed.decay_from = 0;
  const std::vector<float> p0 = Params(1003);
  const std::vector<float> scheduled = RunOptimizer(TransportKind::kInproc, 2, 1003, c)[0];
  const std::vector<float> unscheduled = RunOptimizer(TransportKind::kInproc, 2, 1003, fixed)[0];
  std::vector<double> unscheduled_d(unscheduled.begin(), unscheduled.end());
  EXPECT_GT(test_stream::RelativeDistance(scheduled, unscheduled_d, p0), 1e-3);
  // Refused, and nothing changed: a count other than the groups', a negative or NaN decay.
  const absl::Status status = RunLocalGroup(TransportKind::kInproc, 1, [&](Transport& t) {
    auto backend = kernels::NewCpuBackend();
    OnebitAdamOptions options;
    options.hyper.weight_decay = 0.25f;
    auto adam = OnebitAdam::Create(options, backend.get(), &t, p0.data(), p0.size());
    if (!adam.ok()) return adam.status();
    for (const std::vector<double>& bad :
         {std::vector<double>{}, {0.1, 0.1}, {-0.1}, {std::nan("")}, {1e300}}) {
      EXPECT_EQ((*adam)->set_weight_decays(bad).code(), absl::StatusCode::kInvalidArgument);
      EXPECT_EQ((*adam)->weight_decays(), std::vector<double>{0.25});
    }
    EXPECT_TRUE((*adam)->set_weight_decays({0.5}).ok());
    EXPECT_EQ((*adam)->weight_decays(), std::vector<double>{0.5});
    return absl::OkStatus();
  });
  EXPECT_TRUE(status.ok()) << status;
}

// The norm of a worker's gradient here is about 27: every step clips.
TEST(OnebitAdamTest, GradientClipping) {
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

TEST(OnebitAdamTest, BiasCorrection) {
  Case c;
  c.bias_correction = true;
  c.weight_decay = 0.01f;
  for (int w : {1, 2, 4}) EXPECT_LT(Disagreement(TransportKind::kInproc, w, 1003, c), 1e-4) << w;
  // It changes the run: early steps move by about lr whatever the gradient's size.
  Case plain = c;
  plain.bias_correction = false;
  const auto with = RunOptimizer(TransportKind::kInproc, 2, 100, c);
  const auto without = RunOptimizer(TransportKind::kInproc, 2, 100, plain);
  EXPECT_NE(0, std::memcmp(with[0].data(), without[0].data(), 100 * sizeof(float)));
}

TEST(OnebitAdamTest, SameResultOverInprocAndGloo) {
  const std::vector<std::vector<float>> a = RunOptimizer(TransportKind::kInproc, 3, 999, Case{});
  const std::vector<std::vector<float>> b = RunOptimizer(TransportKind::kGloo, 3, 999, Case{});
  EXPECT_EQ(0, std::memcmp(a[0].data(), b[0].data(), 999 * sizeof(float)));
}

TEST(OnebitAdamTest, RejectsBadOptions) {
  auto backend = kernels::NewCpuBackend();
  const absl::Status status = RunLocalGroup(TransportKind::kInproc, 1, [&](Transport& t) {
    const std::vector<float> p(10, 1.0f);
    auto bad = [&](OnebitAdamOptions o) {
      return OnebitAdam::Create(o, backend.get(), &t, p.data(), p.size()).status().code();
    };
    OnebitAdamOptions o;
    o.hyper.beta1 = 1.0f;
    EXPECT_EQ(bad(o), absl::StatusCode::kInvalidArgument);
    o = {};
    o.hyper.eps = 0.0f;
    EXPECT_EQ(bad(o), absl::StatusCode::kInvalidArgument);
    o = {};
    o.hyper.weight_decay = -1.0f;
    EXPECT_EQ(bad(o), absl::StatusCode::kInvalidArgument);
    o = {};
    o.freeze_step = -1;
    EXPECT_EQ(bad(o), absl::StatusCode::kInvalidArgument);
    o = {};
    o.momentum_mask = std::vector<float>(9, 1.0f);
    EXPECT_EQ(bad(o), absl::StatusCode::kInvalidArgument);
    o.momentum_mask = std::vector<float>(10, 0.5f);
    EXPECT_EQ(bad(o), absl::StatusCode::kInvalidArgument);
    return absl::OkStatus();
  });
  EXPECT_TRUE(status.ok()) << status;
}

TEST(OnebitAdamTest, FreezeStepCanMoveOnlyWhileInWarmup) {
  auto backend = kernels::NewCpuBackend();
  const absl::Status status = RunLocalGroup(TransportKind::kInproc, 1, [&](Transport& t) {
    const std::vector<float> p(16, 1.0f), g(16, 0.5f);
    OnebitAdamOptions o;
    o.freeze_step = 10;
    auto adam = *OnebitAdam::Create(o, backend.get(), &t, p.data(), p.size());
    EXPECT_TRUE(adam->Step(g.data()).ok());
    EXPECT_TRUE(adam->Step(g.data()).ok());
    EXPECT_EQ(adam->SetFreezeStep(1).code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_TRUE(adam->SetFreezeStep(2).ok());  // freeze now: the next step compresses
    EXPECT_EQ(adam->stage(), Stage::kCompression);
    EXPECT_TRUE(adam->Step(g.data()).ok());
    EXPECT_EQ(adam->SetFreezeStep(5).code(), absl::StatusCode::kFailedPrecondition);
    return absl::OkStatus();
  });
  EXPECT_TRUE(status.ok()) << status;
}

}  // namespace
}  // namespace onebit
