// ZeroOneAdam against the float64 model of docs/algorithms.md over transports x world sizes x
// lengths, with every boundary inside the run: variance steps and compressed ones, the
// variance interval doubling, the end of the variance stage, local and sync steps, the
// sync interval doubling up to its cap. And its schedule on its own.
#include "worker/optim/zero_one_adam.h"

#include <cmath>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/kernels.h"
#include "worker/optim/test_stream.h"
#include "worker/optim/zero_one_adam_reference.h"
#include "config/zero_one_schedule.h"
#include "worker/transport/local_group.h"

namespace onebit {
namespace {

using test_stream::Grad;
using test_stream::Params;

struct Case {
  int64_t steps = 40;
  int64_t var_freeze_step = 20;
  ZeroOneScheduleParams schedule{/*var_update_scaler=*/2, /*local_step_scaler=*/3,
                                 /*local_step_clipper=*/4};
  float lr = 0.01f;
  float weight_decay = 0.0f;
  bool mask = false;
  bool bias_correction = false;
  double clip = 0.0;  // gradient clipping's max norm
  float update_clip = 0.0f;
  // Every fifth element's gradient is zero on steps 1..silent_until (its variance stays 0).
  int64_t silent_until = 0;
};

std::vector<float> CaseGrad(const Case& c, int rank, int64_t t, size_t n) {
  std::vector<float> g = Grad(rank, t, n);
  if (t <= c.silent_until) {
    for (size_t i = 0; i < n; i += 5) g[i] = 0.0f;
  }
  return g;
}

std::vector<float> Mask(size_t n) {
  std::vector<float> mask(n);
  for (size_t i = 0; i < n; ++i) mask[i] = i % 4 == 3 ? 0.0f : 1.0f;
  return mask;
}

// Every rank's parameters after c.steps.
std::vector<std::vector<float>> RunOptimizer(TransportKind kind, int w, size_t n, const Case& c) {
  std::vector<std::vector<float>> result(w);
  const std::vector<float> p0 = Params(n);
  const absl::Status status = RunLocalGroup(kind, w, [&](Transport& transport) -> absl::Status {
    auto backend = kernels::NewCpuBackend();
    ZeroOneAdamOptions options;
    options.hyper.lr = c.lr;
    options.hyper.weight_decay = c.weight_decay;
    options.hyper.update_clip = c.update_clip;
    options.var_freeze_step = c.var_freeze_step;
    options.schedule = c.schedule;
    if (c.mask) options.momentum_mask = Mask(n);
    options.bias_correction = c.bias_correction;
    options.max_grad_norm = c.clip;
    auto adam = ZeroOneAdam::Create(options, backend.get(), &transport, p0.data(), n);
    if (!adam.ok()) return adam.status();
    for (int64_t t = 1; t <= c.steps; ++t) {
      const Stage expected = t <= c.var_freeze_step ? Stage::kWarmup : Stage::kCompression;
      if ((*adam)->stage() != expected) return absl::InternalError("wrong stage");
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

ReferenceZeroOneAdam RunModel(int w, size_t n, const Case& c) {
  ReferenceZeroOneHyper h;
  h.adam.lr = c.lr;
  h.adam.beta1 = 0.9f;
  h.adam.beta2 = 0.999f;
  h.adam.eps = 1e-8f;
  h.adam.weight_decay = c.weight_decay;
  h.var_freeze_step = c.var_freeze_step;
  h.var_update_scaler = c.schedule.var_update_scaler;
  h.local_step_scaler = c.schedule.local_step_scaler;
  h.local_step_clipper = c.schedule.local_step_clipper;
  h.adam.bias_correction = c.bias_correction;
  h.adam.max_grad_norm = c.clip;
  h.adam.update_clip = c.update_clip;
  ReferenceZeroOneAdam model(h, w, Params(n), c.mask ? Mask(n) : std::vector<float>{});
  for (int64_t t = 1; t <= c.steps; ++t) {
    std::vector<std::vector<float>> grads;
    for (int rank = 0; rank < w; ++rank) grads.push_back(CaseGrad(c, rank, t, n));
    model.Step(grads);
  }
  return model;
}

// The largest over ranks of ||p - p_ref|| / ||p_ref - p_in||.
double Disagreement(TransportKind kind, int w, size_t n, const Case& c) {
  const std::vector<std::vector<float>> got = RunOptimizer(kind, w, n, c);
  const ReferenceZeroOneAdam model = RunModel(w, n, c);
  const std::vector<float> p0 = Params(n);
  double worst = 0;
  for (int rank = 0; rank < w; ++rank) {
    worst = std::max(worst, test_stream::RelativeDistance(got[rank], model.params(rank), p0));
  }
  return worst;
}

using Param = std::tuple<TransportKind, int, size_t>;
class ZeroOneAdamMatrixTest : public ::testing::TestWithParam<Param> {};

TEST_P(ZeroOneAdamMatrixTest, MatchesFloat64Model) {
  const auto [kind, w, n] = GetParam();
  EXPECT_LT(Disagreement(kind, w, n, Case{}), 1e-4);
}

INSTANTIATE_TEST_SUITE_P(
    Matrix, ZeroOneAdamMatrixTest,
    ::testing::Combine(::testing::Values(TransportKind::kInproc, TransportKind::kGloo),
                       ::testing::Values(1, 2, 3, 4),
                       ::testing::Values(size_t{1}, size_t{7}, size_t{1000}, size_t{10007})),
    [](const ::testing::TestParamInfo<Param>& info) {
      return TransportKindName(std::get<0>(info.param)) + "_W" +
             std::to_string(std::get<1>(info.param)) + "_N" +
             std::to_string(std::get<2>(info.param));
    });

TEST(ZeroOneAdamTest, WeightDecayAndMomentumMask) {
  Case c;
  c.weight_decay = 0.01f;
  c.mask = true;
  for (int w : {1, 2, 4}) EXPECT_LT(Disagreement(TransportKind::kInproc, w, 1003, c), 1e-4) << w;
}

// The norm of a worker's gradient here is about 27: every step clips. Every step of the
// variance stage updates the variance: a compressed gradient step would compress clipped
// gradients of equal norms, whose scales then tie exactly in the float64 model, and the
// signs of the exact zeros that follow are noise (sign(0) = +1 there, float rounding here).
TEST(ZeroOneAdamTest, GradientClipping) {
  Case c;
  c.clip = 5.0;
  c.schedule.var_update_scaler = 1000;
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

// The update clip on every step but a variance step: elements whose gradient is silent
// through the first variance steps (variance 0) are the model's with the clip, and the clip
// acts (the run without it lands far away).
TEST(ZeroOneAdamTest, UpdateClipOnEveryStepButAVarianceStep) {
  Case c;
  c.silent_until = 10;
  c.update_clip = 10.0f;
  for (int w : {1, 3}) EXPECT_LT(Disagreement(TransportKind::kInproc, w, 1005, c), 1e-4) << w;
  c.bias_correction = true;
  EXPECT_LT(Disagreement(TransportKind::kInproc, 2, 1005, c), 1e-4);
  Case unclipped = c;
  unclipped.update_clip = 0.0f;
  const std::vector<float> a = RunOptimizer(TransportKind::kInproc, 2, 1005, c)[0];
  const std::vector<float> b = RunOptimizer(TransportKind::kInproc, 2, 1005, unclipped)[0];
  EXPECT_GT(test_stream::RelativeDistance(b, {a.begin(), a.end()}, Params(1005)), 0.5);
}

TEST(ZeroOneAdamTest, BiasCorrection) {
  Case c;
  c.bias_correction = true;
  c.weight_decay = 0.01f;
  for (int w : {1, 2, 4}) EXPECT_LT(Disagreement(TransportKind::kInproc, w, 1003, c), 1e-4) << w;
}

TEST(ZeroOneAdamTest, LocalFromTheFirstStepAndNeverLocal) {
  Case c;
  c.var_freeze_step = 0;  // local steps (and the error reset) from step 1
  EXPECT_LT(Disagreement(TransportKind::kInproc, 3, 1000, c), 1e-4);
  c.var_freeze_step = 40;  // the variance stage throughout
  EXPECT_LT(Disagreement(TransportKind::kInproc, 3, 1000, c), 1e-4);
}

TEST(ZeroOneAdamTest, DeepSpeedDefaultsOverALongerRun) {
  Case c;
  c.steps = 60;
  c.var_freeze_step = 45;
  c.schedule = ZeroOneScheduleParams{};  // 16, 32678, 16: intervals 1 and 2, sync every step
  EXPECT_LT(Disagreement(TransportKind::kInproc, 4, 2001, c), 1e-4);
}

TEST(ZeroOneAdamTest, ZeroLearningRateLeavesParametersAlone) {
  Case c;
  c.lr = 0.0f;
  const std::vector<std::vector<float>> got = RunOptimizer(TransportKind::kInproc, 2, 100, c);
  const std::vector<float> p0 = Params(100);
  for (const auto& p : got) EXPECT_EQ(0, std::memcmp(p.data(), p0.data(), 100 * sizeof(float)));
}

TEST(ZeroOneAdamTest, SameBitsOverInprocAndGloo) {
  const auto a = RunOptimizer(TransportKind::kInproc, 3, 999, Case{});
  const auto b = RunOptimizer(TransportKind::kGloo, 3, 999, Case{});
  for (int rank = 0; rank < 3; ++rank) {
    EXPECT_EQ(0, std::memcmp(a[rank].data(), b[rank].data(), 999 * sizeof(float))) << rank;
  }
}

// Between syncs the workers' parameters differ; a sync brings them together again.
TEST(ZeroOneAdamTest, WorkersAgreeAfterASyncAndDifferBetween) {
  Case c;
  c.schedule.local_step_scaler = 100;  // no doubling
  c.schedule.local_step_clipper = 4;
  c.var_freeze_step = 3;
  // The interval stays 1 (sync on every step) without doubling; force 4 by doubling twice.
  c.schedule.local_step_scaler = 1;  // after step 4: 2, after step 5: 4
  c.steps = 8;  // 8 % 4 == 0: a sync
  auto synced = RunOptimizer(TransportKind::kInproc, 2, 64, c);
  EXPECT_EQ(0, std::memcmp(synced[0].data(), synced[1].data(), 64 * sizeof(float)));
  c.steps = 7;  // a local step after the sync at 4
  auto apart = RunOptimizer(TransportKind::kInproc, 2, 64, c);
  EXPECT_NE(0, std::memcmp(apart[0].data(), apart[1].data(), 64 * sizeof(float)));
}

TEST(ZeroOneAdamTest, CommunicatesOnlyOnTheScheduledSteps) {
  Case c;
  const ReferenceZeroOneAdam model = RunModel(2, 100, c);
  // var_update_scaler 2: variance steps 1, 2, 4, 6, 12, 16, 20 (the interval doubles after
  // steps 2, 6, 16); compressed 3, 5, 7..11, 13..15, 17..19.
  EXPECT_EQ(model.variance_steps(), 7);
  EXPECT_EQ(model.compressed_steps(), 13);
  // local_step_scaler 3, clipper 4: intervals 1 (steps 21-23), 2 (24-26), 4 (27-40): syncs
  // at 21, 22, 23, 24, 26, 28, 32, 36, 40.
  EXPECT_EQ(model.sync_steps(), 9);
  ZeroOneSchedule s(c.schedule);
  int variance = 0, compressed = 0, sync = 0, local = 0;
  for (int64_t t = 1; t <= c.steps; ++t) {
    switch (s.Next(c.var_freeze_step)) {
      case ZeroOneStep::kVarianceUpdate: ++variance; break;
      case ZeroOneStep::kCompressedGradient: ++compressed; break;
      case ZeroOneStep::kSync: ++sync; break;
      case ZeroOneStep::kLocal: ++local; break;
    }
    s.Advance(c.var_freeze_step);
  }
  EXPECT_EQ(variance, 7);
  EXPECT_EQ(compressed, 13);
  EXPECT_EQ(sync, 9);
  EXPECT_EQ(local, 11);
  EXPECT_EQ(s.var_interval(), 8);
  EXPECT_EQ(s.local_step_interval(), 4);
  // A resumed worker rebuilds the same schedule from the step count.
  const ZeroOneSchedule resumed = ZeroOneSchedule::After(c.schedule, c.steps, c.var_freeze_step);
  EXPECT_EQ(resumed.var_interval(), s.var_interval());
  EXPECT_EQ(resumed.local_step_interval(), s.local_step_interval());
  EXPECT_EQ(resumed.Next(c.var_freeze_step), s.Next(c.var_freeze_step));
}

TEST(ZeroOneAdamTest, RejectsBadOptionsAndLateVarFreezeSteps) {
  auto backend = kernels::NewCpuBackend();
  const absl::Status status = RunLocalGroup(TransportKind::kInproc, 1, [&](Transport& t) {
    const std::vector<float> p(10, 1.0f), g(10, 0.5f);
    auto code = [&](ZeroOneAdamOptions o) {
      return ZeroOneAdam::Create(o, backend.get(), &t, p.data(), p.size()).status().code();
    };
    ZeroOneAdamOptions o;
    o.hyper.eps = 0.0f;
    EXPECT_EQ(code(o), absl::StatusCode::kInvalidArgument);
    o = {};
    o.var_freeze_step = -1;
    EXPECT_EQ(code(o), absl::StatusCode::kInvalidArgument);
    for (int which = 0; which < 3; ++which) {
      o = {};
      (which == 0 ? o.schedule.var_update_scaler
                  : which == 1 ? o.schedule.local_step_scaler : o.schedule.local_step_clipper) = 0;
      EXPECT_EQ(code(o), absl::StatusCode::kInvalidArgument) << which;
    }
    o = {};
    o.momentum_mask = std::vector<float>(10, 0.5f);
    EXPECT_EQ(code(o), absl::StatusCode::kInvalidArgument);
    o = {};
    o.var_freeze_step = 5;
    auto adam = *ZeroOneAdam::Create(o, backend.get(), &t, p.data(), p.size());
    EXPECT_TRUE(adam->Step(g.data()).ok());
    EXPECT_TRUE(adam->Step(g.data()).ok());
    EXPECT_EQ(adam->SetFreezeStep(1).code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_TRUE(adam->SetFreezeStep(2).ok());
    EXPECT_EQ(adam->stage(), Stage::kCompression);
    EXPECT_TRUE(adam->Step(g.data()).ok());
    EXPECT_EQ(adam->SetFreezeStep(9).code(), absl::StatusCode::kFailedPrecondition);
    return absl::OkStatus();
  });
  EXPECT_TRUE(status.ok()) << status;
}

}  // namespace
}  // namespace onebit
