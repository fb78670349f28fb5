// Every optimizer, checkpointed at any step and restored into a fresh optimizer and
// exchange, continues bit for bit as if never interrupted: 0/1 Adam between syncs (its
// own tensors, its accumulator and learning-rate sum, the schedule rebuilt from the step),
// 1-bit LAMB's coefficients, and the automatic momentum mask before and after it is fixed.
// And the automatic mask itself: it equals the user mask of the same zeros, bit for bit.
#include <cstring>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/kernels.h"
#include "worker/exchange/peer_exchange.h"
#include "worker/optim/optimizer_factory.h"
#include "worker/optim/test_stream.h"
#include "worker/transport/local_group.h"

namespace onebit {
namespace {

constexpr size_t kN = 1003;
constexpr int kWorkers = 2;
constexpr int64_t kSteps = 24;

// The test stream, with the gradients of every seventh parameter exactly zero on every
// worker (a parameter the model never uses).
std::vector<float> Grad(int rank, int64_t t) {
  std::vector<float> g = test_stream::Grad(rank, t, kN);
  for (size_t i = 0; i < kN; i += 7) g[i] = 0.0f;
  return g;
}

OptimizerSpec Spec(const std::string& type, bool auto_mask) {
  OptimizerSpec s;
  s.kind = ParseOptimizerKind(type).value();
  s.hyper.lr = 0.01f;
  s.hyper.weight_decay = 0.001f;
  s.freeze_step = 8;
  s.zero_one = ZeroOneScheduleParams{2, 3, 4};
  s.group_offsets = {0, 300, 301, kN};
  s.auto_mask_zero_gradients = auto_mask;
  return s;
}

struct Saved {
  int64_t step = 0;
  StateTensors states;
  StateScalars scalars;
  ErrorState errors;
};

absl::StatusOr<Saved> Save(Optimizer& o) {
  Saved s;
  s.step = o.step();
  for (const StateSpec& spec : o.CheckpointStates()) {
    auto values = o.StateToHost(spec.name, 0, o.size());
    if (!values.ok()) return values.status();
    s.states[spec.name] = *std::move(values);
  }
  s.scalars = o.CheckpointScalars();
  auto errors = o.exchange().SaveErrors();
  if (!errors.ok()) return errors.status();
  s.errors = *std::move(errors);
  return s;
}

// Every rank's parameters after kSteps; with 0 < save_at < kSteps, the optimizer and its
// exchange are rebuilt from a checkpoint taken after step save_at.
std::vector<std::vector<float>> RunSteps(const OptimizerSpec& spec, int64_t save_at) {
  std::vector<std::vector<float>> result(kWorkers);
  const std::vector<float> p0 = test_stream::Params(kN);
  const absl::Status status =
      RunLocalGroup(TransportKind::kInproc, kWorkers, [&](Transport& t) -> absl::Status {
        auto backend = kernels::NewCpuBackend();
        std::unique_ptr<PeerExchange> exchange;
        std::unique_ptr<Optimizer> o;
        auto make = [&]() -> absl::Status {
          auto e = PeerExchange::Create(backend.get(), &t, kN);
          if (!e.ok()) return e.status();
          exchange = *std::move(e);
          auto made = CreateOptimizer(spec, backend.get(), exchange.get(), p0.data(), kN);
          if (!made.ok()) return made.status();
          o = *std::move(made);
          return absl::OkStatus();
        };
        if (absl::Status s = make(); !s.ok()) return s;
        for (int64_t step = 1; step <= kSteps; ++step) {
          const std::vector<float> g = Grad(t.rank(), step);
          if (absl::Status s = o->Step(g.data()); !s.ok()) return s;
          if (step == save_at) {
            absl::StatusOr<Saved> saved = Save(*o);
            if (!saved.ok()) return saved.status();
            o.reset();
            if (absl::Status s = make(); !s.ok()) return s;  // a fresh start
            if (absl::Status s = exchange->RestoreErrors(saved->errors); !s.ok()) return s;
            if (absl::Status s = o->Restore(saved->step, spec.freeze_step, saved->states,
                                            saved->scalars);
                !s.ok()) {
              return s;
            }
          }
        }
        auto p = o->ParamsToHost();
        if (!p.ok()) return p.status();
        result[t.rank()] = *p;
        return absl::OkStatus();
      });
  EXPECT_TRUE(status.ok()) << status;
  return result;
}

using Param = std::tuple<std::string, bool>;
class OptimizerResumeTest : public ::testing::TestWithParam<Param> {};

void ExpectResumesBitForBit(const OptimizerSpec& spec, const std::string& what) {
  const auto straight = RunSteps(spec, 0);
  // In warmup, at the switch, right after it, and later (0/1 Adam: 13 is between syncs,
  // its interval being 2 there; 16 a sync).
  for (int64_t save_at : {3, 8, 9, 13, 16}) {
    const auto resumed = RunSteps(spec, save_at);
    for (int rank = 0; rank < kWorkers; ++rank) {
      ASSERT_EQ(resumed[rank].size(), kN);
      EXPECT_EQ(0, std::memcmp(resumed[rank].data(), straight[rank].data(), kN * sizeof(float)))
          << what << " resumed after step " << save_at << ", rank " << rank;
    }
  }
}

TEST_P(OptimizerResumeTest, ResumesBitForBitFromAnyStep) {
  const auto& [type, auto_mask] = GetParam();
  ExpectResumesBitForBit(Spec(type, auto_mask), type);
}

// With param groups of their own lr and decay (0/1 Adam's per-group lr sums are in the
// checkpoint's scalars).
TEST_P(OptimizerResumeTest, ResumesBitForBitWithParamGroups) {
  const auto& [type, auto_mask] = GetParam();
  OptimizerSpec spec = Spec(type, auto_mask);
  spec.hyper_groups = {{0, 301, 1.0f, 0.0f}, {301, kN, 0.5f, 0.01f}};
  ExpectResumesBitForBit(spec, type + " with param groups");
}

INSTANTIATE_TEST_SUITE_P(
    Optimizers, OptimizerResumeTest,
    ::testing::Combine(::testing::Values("OneBitAdam", "ZeroOneAdam", "OneBitLamb"),
                       ::testing::Bool()),
    [](const ::testing::TestParamInfo<Param>& info) {
      return std::get<0>(info.param) + (std::get<1>(info.param) ? "_auto_mask" : "");
    });

class AutoMaskTest : public ::testing::TestWithParam<std::string> {};

// The automatic mask finds exactly the always-zero gradients: the run equals one given
// those zeros as the user's mask, bit for bit, and it counts them. (0/1 Adam applies a
// user's mask from its first compressed step on, the automatic one only after the
// variance stage: here every step of that stage updates the variance, so none is
// compressed.)
TEST_P(AutoMaskTest, EqualsTheUserMaskOfTheSameZeros) {
  const std::string type = GetParam();
  auto Spec = [](const std::string& type, bool auto_mask) {
    OptimizerSpec s = onebit::Spec(type, auto_mask);
    s.zero_one.var_update_scaler = 1000;
    return s;
  };
  OptimizerSpec user = Spec(type, false);
  user.momentum_mask.assign(kN, 1.0f);
  for (size_t i = 0; i < kN; i += 7) user.momentum_mask[i] = 0.0f;
  const auto with_user = RunSteps(user, 0);
  const auto with_auto = RunSteps(Spec(type, true), 0);
  const auto without = RunSteps(Spec(type, false), 0);
  EXPECT_EQ(0, std::memcmp(with_user[0].data(), with_auto[0].data(), kN * sizeof(float)));
  EXPECT_NE(0, std::memcmp(without[0].data(), with_auto[0].data(), kN * sizeof(float)))
      << "the mask changed nothing: the test would prove nothing";

  auto backend = kernels::NewCpuBackend();
  const absl::Status status = RunLocalGroup(TransportKind::kInproc, 1, [&](Transport& t) {
    auto exchange = *PeerExchange::Create(backend.get(), &t, kN);
    const std::vector<float> p0 = test_stream::Params(kN);
    auto o = *CreateOptimizer(Spec(type, true), backend.get(), exchange.get(), p0.data(), kN);
    for (int64_t step = 1; step <= 10; ++step) {
      // Fixed at the start of the first step after the switch (step 9).
      EXPECT_EQ(o->masked_elements(), step <= 9 ? 0 : (kN + 6) / 7) << step;
      EXPECT_TRUE(o->Step(Grad(0, step).data()).ok());
    }
    EXPECT_EQ(o->masked_elements(), (kN + 6) / 7);
    return absl::OkStatus();
  });
  EXPECT_TRUE(status.ok()) << status;
}

INSTANTIATE_TEST_SUITE_P(Optimizers, AutoMaskTest,
                         ::testing::Values("OneBitAdam", "ZeroOneAdam", "OneBitLamb"));

}  // namespace
}  // namespace onebit
