// Sharded optimizer state (docs/design.md, "Sharded state"): OnebitAdam and Adam over a
// hierarchical exchange that shards the state against the same optimizer over the
// unsharded exchange, on the same gradient stream. Every worker's parameters must be the
// same bits after every step, and each worker's moments the unsharded ones' over its state
// range: for every codec, with two parameter groups, weight decay, a user mask and the
// automatic one, bias correction, clipping, and a learning-rate and weight-decay schedule,
// on one node and on several.
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/kernels.h"
#include "worker/optim/onebit_adam.h"
#include "worker/optim/sharded_test_util.h"
#include "worker/optim/test_stream.h"
#include "worker/optim/zero_one_adam.h"

namespace onebit {
namespace {

using sharded_test::SameOverRange;
using sharded_test::SameParamsEveryStep;

constexpr int64_t kSteps = 10;
constexpr int64_t kFreezeStep = 4;

struct Case {
  std::string codec;
  int nodes;
  int local;
  size_t n;
  bool clip;
  bool bias_correction;
  bool adam;  // never freezes
};

std::string CaseName(const ::testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  return absl::StrCat(c.codec, "_", c.nodes, "x", c.local, "_n", c.n, c.clip ? "_clip" : "",
                      c.bias_correction ? "_bias" : "", c.adam ? "_adam" : "");
}

// Some elements never see a gradient: the automatic mask masks them.
std::vector<float> Gradient(int worker, int64_t step, size_t n) {
  return sharded_test::GradientWithZeros(worker, step, n, 3, 97);
}

OnebitAdamOptions Options(const Case& c) {
  OnebitAdamOptions o;
  o.hyper.lr = 0.01f;
  o.freeze_step = c.adam ? 1000000 : kFreezeStep;
  o.bias_correction = c.bias_correction;
  o.max_grad_norm = c.clip ? 5.0 : 0.0;
  o.auto_mask_zero_gradients = true;
  o.momentum_mask.assign(c.n, 1.0f);
  for (size_t i = 0; i < c.n; i += 53) o.momentum_mask[i] = 0.0f;
  // Two groups, the boundary inside a slice.
  const size_t cut = c.n / 3 + 7;
  o.hyper_groups = {{0, cut, 0.5f, 0.01f}, {cut, c.n, 1.0f, 0.0f}};
  return o;
}

struct WorkerEnd {
  std::vector<std::vector<float>> params;  // after every step
  std::vector<double> clip_norms;          // the clipper's float64 norm after every step
  std::vector<float> m, v;                 // the state range's, at the end
  size_t state_begin = 0;
};

std::vector<WorkerEnd> RunCase(const Case& c, bool shard) {
  std::vector<WorkerEnd> ends(static_cast<size_t>(c.nodes * c.local));
  const std::vector<float> p0 = test_stream::Params(c.n);
  const absl::Status status = sharded_test::RunJob(
      c.nodes, c.local, c.n, c.codec, shard,
      [&](int w, kernels::Backend* backend, Exchange* exchange) -> absl::Status {
        auto adam = OnebitAdam::Create(Options(c), backend, exchange, p0.data(), c.n);
        if (!adam.ok()) return adam.status();
        WorkerEnd& end = ends[static_cast<size_t>(w)];
        for (int64_t t = 1; t <= kSteps; ++t) {
          (*adam)->set_lr(0.01f / static_cast<float>(t));
          if (absl::Status s = (*adam)->set_weight_decays({0.01 * t, 0.001}); !s.ok()) return s;
          const std::vector<float> g = Gradient(w, t, c.n);
          if (absl::Status s = (*adam)->Step(g.data()); !s.ok()) return s;
          auto p = (*adam)->ParamsToHost();
          if (!p.ok()) return p.status();
          end.params.push_back(*std::move(p));
          end.clip_norms.push_back((*adam)->last_clip_norm());
        }
        auto m = (*adam)->MomentumToHost();
        if (!m.ok()) return m.status();
        auto v = (*adam)->VarianceToHost();
        if (!v.ok()) return v.status();
        end.m = *std::move(m);
        end.v = *std::move(v);
        end.state_begin = (*adam)->state_begin();
        return absl::OkStatus();
      });
  EXPECT_TRUE(status.ok()) << status;
  return ends;
}

class ShardedStateTest : public ::testing::TestWithParam<Case> {};

TEST_P(ShardedStateTest, SameBitsAsUnsharded) {
  const Case& c = GetParam();
  const std::vector<WorkerEnd> whole = RunCase(c, /*shard=*/false);
  const std::vector<WorkerEnd> sharded = RunCase(c, /*shard=*/true);
  ASSERT_EQ(whole.size(), sharded.size());
  size_t covered = 0;
  for (size_t w = 0; w < whole.size(); ++w) {
    ASSERT_TRUE(SameParamsEveryStep(sharded[w].params, whole[w].params, c.n, kSteps))
        << "worker " << w;
    for (int64_t t = 0; t < kSteps; ++t) {
      // The norm is a float64 in slice order: a wrong order rarely shows in float32 bits.
      ASSERT_EQ(std::memcmp(&sharded[w].clip_norms[t], &whole[w].clip_norms[t], sizeof(double)),
                0)
          << "worker " << w << ", step " << t + 1 << ": clip norm " << sharded[w].clip_norms[t]
          << " against " << whole[w].clip_norms[t];
    }
    // The moments of the state range are the unsharded worker's there.
    const WorkerEnd& s = sharded[w];
    ASSERT_EQ(s.m.size(), s.v.size());
    EXPECT_TRUE(SameOverRange(s.m, s.state_begin, whole[w].m, c.n))
        << "worker " << w << "'s momentum";
    EXPECT_TRUE(SameOverRange(s.v, s.state_begin, whole[w].v, c.n))
        << "worker " << w << "'s variance";
    if (w < static_cast<size_t>(c.local)) covered += s.m.size();  // node 0's workers
  }
  EXPECT_EQ(covered, c.n) << "node 0's shards do not cover the parameters once";
}

INSTANTIATE_TEST_SUITE_P(
    Codecs, ShardedStateTest,
    ::testing::Values(Case{"onebit", 2, 2, 1001, false, false, false},
                      Case{"onebit", 2, 3, 70001, true, false, false},
                      Case{"int8", 2, 2, 1001, false, true, false},
                      Case{"fp8", 2, 2, 1001, true, false, false},
                      Case{"onebit", 3, 2, 4099, false, false, false},
                      Case{"onebit", 1, 2, 1001, true, true, false},
                      Case{"onebit", 1, 4, 1001, false, false, false},
                      Case{"onebit", 2, 2, 1001, true, true, true}),
    CaseName);

// 0/1 Adam keeps each worker's own parameters in its local steps: it refuses.
TEST(ShardedStateTest, ZeroOneAdamRefusesASharedState) {
  const absl::Status status = sharded_test::RunJob(
      1, 2, 100, "onebit", /*shard=*/true,
      [&](int, kernels::Backend* backend, Exchange* exchange) -> absl::Status {
        const std::vector<float> p0(100, 1.0f);
        auto zero_one =
            ZeroOneAdam::Create(ZeroOneAdamOptions(), backend, exchange, p0.data(), 100);
        EXPECT_EQ(zero_one.status().code(), absl::StatusCode::kInvalidArgument);
        EXPECT_NE(zero_one.status().message().find("local steps"), std::string::npos)
            << zero_one.status();
        return absl::OkStatus();
      });
  EXPECT_TRUE(status.ok()) << status;
}

}  // namespace
}  // namespace onebit
