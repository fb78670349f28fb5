// Low-precision parameters with sharded state (optimizer_base.h, LOW-PRECISION
// PARAMETERS): OnebitAdam, Adam and OnebitLamb over a sharding hierarchical exchange with a bf16 or
// fp16 param_dtype against the same optimizer unsharded, whose fp32 parameters the model
// casts itself after each step (the Python package's unsharded path: torch's copy_). After
// every step each worker's low-precision parameters must be the cast of the unsharded
// parameters bit for bit, and its master over its state range the unsharded parameters
// there. A checkpoint of the state range, restored into fresh optimizers, goes on to the
// same bits. With bf16_grads the gradients are bf16 values: the sharded workers read them
// from a bf16 buffer in place (gradient.h), the unsharded ones widened to float32.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/kernels.h"
#include "kernels/wire_dtype.h"
#include "worker/optim/onebit_adam.h"
#include "worker/optim/onebit_lamb.h"
#include "worker/optim/sharded_test_util.h"
#include "worker/optim/test_stream.h"

namespace onebit {
namespace {

using sharded_test::Saved;

using kernels::WireDtype;

constexpr int64_t kFreeze = 4;
constexpr int64_t kSave = 6;
constexpr int64_t kSteps = 10;

struct Case {
  WireDtype dtype;
  std::string codec;
  int nodes;
  int local;
  size_t n;
  bool adam;  // never freezes
  bool lamb = false;  // OnebitLamb (with adam: never freezes)
  bool bf16_grads = false;
};

std::string CaseName(const ::testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  return absl::StrCat(kernels::WireDtypeName(c.dtype), "_", c.codec, "_", c.nodes, "x", c.local,
                      "_n", c.n, c.adam ? "_adam" : "", c.lamb ? "_lamb" : "",
                      c.bf16_grads ? "_bf16_grads" : "");
}

// The model's initial parameters: low-precision values (the package hands the worker its
// parameters widened), and for fp16 a few masters that are not: a subnormal, the largest
// finite value, one past it (inf in fp16, finite in the master) and -0 after rounding.
std::vector<float> InitialParams(const Case& c) {
  std::vector<float> p = test_stream::Params(c.n);
  for (float& x : p) x = kernels::WidenParam(c.dtype, kernels::NarrowParam(c.dtype, x));
  if (c.dtype == WireDtype::kFp16 && c.n > 8) {
    p[1] = 3e-6f;     // subnormal in fp16
    p[2] = 65504.0f;  // fp16's largest
    p[3] = 70000.0f;  // inf in fp16
    p[4] = -1e-8f;    // -0 in fp16
  }
  return p;
}

// Worker `worker`'s gradient of `step`: bf16 values with bf16_grads (in `g16` too).
std::vector<float> GradientOf(const Case& c, int worker, int64_t step,
                              std::vector<uint16_t>* g16) {
  std::vector<float> g = sharded_test::GradientWithZeros(worker, step, c.n, 3, 97);
  if (!c.bf16_grads) return g;
  g16->resize(c.n);
  for (size_t i = 0; i < c.n; ++i) {
    (*g16)[i] = kernels::FloatToBf16(g[i] * 40.0f);  // a few over the clip norm
    g[i] = kernels::Bf16ToFloat((*g16)[i]);
  }
  return g;
}

template <typename Options>
Options OptionsOf(const Case& c, bool low) {
  Options o;
  o.hyper.lr = 0.01f;
  o.max_grad_norm = 5.0;
  o.auto_mask_zero_gradients = true;
  // LAMB's groups end where its tensors do; one tensor crosses the slice boundaries.
  const size_t cut = c.lamb ? 7 * c.n / 10 : c.n / 3 + 7;
  o.hyper_groups = {{0, cut, 0.5f, 0.01f}, {cut, c.n, 1.0f, 0.0f}};
  if (low) o.param_dtype = c.dtype;
  return o;
}

absl::StatusOr<std::unique_ptr<Optimizer>> Make(const Case& c, bool low,
                                                kernels::Backend* backend, Exchange* exchange,
                                                const std::vector<float>& p0) {
  if (c.lamb) {
    auto o = OptionsOf<OnebitLambOptions>(c, low);
    o.freeze_step = c.adam ? 1000000 : kFreeze;
    o.group_offsets = {0, c.n / 7, 7 * c.n / 10, c.n};
    return OnebitLamb::Create(o, backend, exchange, p0.data(), c.n);
  }
  auto o = OptionsOf<OnebitAdamOptions>(c, low);
  o.freeze_step = c.adam ? 1000000 : kFreeze;
  return OnebitAdam::Create(o, backend, exchange, p0.data(), c.n);
}

struct WorkerRun {
  std::vector<std::vector<uint16_t>> low;      // sharded: low_params()'s n elements, each step
  std::vector<std::vector<float>> widened;     // ParamsToHost, each step
  std::vector<std::vector<float>> master;      // sharded: the master over the state range
  size_t state_begin = 0;
};

// Unsharded with fp32 parameters (shard false), or sharded with c.dtype. `saved`: filled
// after kSave; `restore`: start from it (steps from kSave + 1 only).
std::vector<WorkerRun> RunJob(const Case& c, bool shard, std::vector<Saved>* saved,
                           const std::vector<Saved>* restore) {
  std::vector<WorkerRun> runs(static_cast<size_t>(c.nodes * c.local));
  const std::vector<float> p0 = InitialParams(c);
  const absl::Status status = sharded_test::RunJob(
      c.nodes, c.local, c.n, c.codec, shard,
      [&](int w, kernels::Backend* backend, Exchange* exchange) -> absl::Status {
        auto made = Make(c, shard, backend, exchange, p0);
        if (!made.ok()) return made.status();
        Optimizer& o = **made;
        WorkerRun& run = runs[static_cast<size_t>(w)];
        run.state_begin = o.state_begin();
        const size_t lo = o.state_begin(), hi = lo + o.state_count();
        if (shard) {
          // The padded 2-byte parameters, and slices of floats: the master, m and v (LAMB:
          // 3 more), besides the masks.
          const std::optional<StateShard> cut = o.exchange().state_shard();
          const size_t slices = c.lamb ? 6 : 3;
          EXPECT_GE(o.state_bytes(), cut->stride * (slices * sizeof(float) +
                                                    cut->pieces * sizeof(uint16_t)));
          EXPECT_EQ(o.params(), nullptr);
          EXPECT_NE(o.low_params(), nullptr);
          EXPECT_EQ(o.low_params_dtype(), c.dtype);
        }
        if (restore != nullptr) {
          const Saved& s = (*restore)[static_cast<size_t>(w)];
          if (absl::Status r = sharded_test::Restore(o, kSave, o.freeze_step(), s); !r.ok()) {
            return r;
          }
        }
        for (int64_t t = o.step() + 1; t <= kSteps; ++t) {
          o.set_lr(0.01f / static_cast<float>(t));
          if (absl::Status s = o.set_weight_decays({0.01 * t, 0.001}); !s.ok()) return s;
          std::vector<uint16_t> g16;
          const std::vector<float> g = GradientOf(c, w, t, &g16);
          const onebit::Gradient step_grad =
              shard && c.bf16_grads ? onebit::Gradient(g16.data(), WireDtype::kBf16)
                                    : onebit::Gradient(g.data());
          if (c.bf16_grads) {  // over the clip norm (5): the clip's scale reaches the bits
            double sumsq = 0.0;
            for (float x : g) sumsq += static_cast<double>(x) * x;
            EXPECT_GT(std::sqrt(sumsq), 5.0) << "step " << t;
          }
          if (absl::Status s = o.Step(step_grad); !s.ok()) return s;
          auto p = o.ParamsToHost();
          if (!p.ok()) return p.status();
          run.widened.push_back(*std::move(p));
          if (shard) {
            std::vector<uint16_t> low(c.n);
            std::memcpy(low.data(), o.low_params(), c.n * sizeof(uint16_t));  // CPU memory
            run.low.push_back(std::move(low));
            auto master = o.StateToHost("params", lo, hi);
            if (!master.ok()) return master.status();
            run.master.push_back(*std::move(master));
          }
          if (t == kSave && saved != nullptr) {
            auto s = sharded_test::Save(o);
            if (!s.ok()) return s.status();
            (*saved)[static_cast<size_t>(w)] = *std::move(s);
          }
        }
        return absl::OkStatus();
      });
  EXPECT_TRUE(status.ok()) << status;
  return runs;
}

class ShardedLowPrecisionTest : public ::testing::TestWithParam<Case> {};

TEST_P(ShardedLowPrecisionTest, CastOfTheUnshardedParameters) {
  const Case& c = GetParam();
  const std::vector<WorkerRun> whole = RunJob(c, /*shard=*/false, nullptr, nullptr);
  std::vector<Saved> saved(static_cast<size_t>(c.nodes * c.local));
  const std::vector<WorkerRun> sharded = RunJob(c, /*shard=*/true, &saved, nullptr);
  ASSERT_EQ(whole.size(), sharded.size());
  for (size_t w = 0; w < whole.size(); ++w) {
    ASSERT_EQ(whole[w].widened.size(), static_cast<size_t>(kSteps));
    ASSERT_EQ(sharded[w].low.size(), static_cast<size_t>(kSteps));
    for (int64_t t = 0; t < kSteps; ++t) {
      const std::vector<float>& p = whole[w].widened[static_cast<size_t>(t)];
      const std::vector<uint16_t>& low = sharded[w].low[static_cast<size_t>(t)];
      const std::vector<float>& widened = sharded[w].widened[static_cast<size_t>(t)];
      ASSERT_EQ(widened.size(), c.n);
      for (size_t i = 0; i < c.n; ++i) {
        const uint16_t want = kernels::NarrowParam(c.dtype, p[i]);
        ASSERT_EQ(low[i], want) << "worker " << w << ", step " << t + 1 << ", element " << i;
        const float back = kernels::WidenParam(c.dtype, want);
        ASSERT_EQ(std::memcmp(&widened[i], &back, sizeof(float)), 0)
            << "worker " << w << ", step " << t + 1 << ", element " << i;
      }
      const std::vector<float>& master = sharded[w].master[static_cast<size_t>(t)];
      ASSERT_TRUE(sharded_test::SameOverRange(master, sharded[w].state_begin, p, c.n))
          << "worker " << w << "'s master, step " << t + 1;
    }
  }
  if (c.dtype == WireDtype::kFp16 && c.n > 8) {  // the edge cases made it to the model
    EXPECT_EQ(sharded[0].low[0][3] & 0x7fffu, 0x7c00u) << "70000 is inf in fp16";
  }

  // Restored from the state range after kSave: the same bits to the end.
  const std::vector<WorkerRun> resumed = RunJob(c, /*shard=*/true, nullptr, &saved);
  for (size_t w = 0; w < whole.size(); ++w) {
    ASSERT_EQ(resumed[w].low.size(), static_cast<size_t>(kSteps - kSave));
    for (int64_t t = kSave; t < kSteps; ++t) {
      EXPECT_EQ(resumed[w].low[static_cast<size_t>(t - kSave)],
                sharded[w].low[static_cast<size_t>(t)])
          << "worker " << w << ", step " << t + 1 << " after the restore";
      EXPECT_EQ(resumed[w].master[static_cast<size_t>(t - kSave)],
                sharded[w].master[static_cast<size_t>(t)]);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Dtypes, ShardedLowPrecisionTest,
    ::testing::Values(Case{WireDtype::kBf16, "onebit", 2, 2, 1001, false},
                      Case{WireDtype::kFp16, "onebit", 2, 2, 1001, false},
                      Case{WireDtype::kBf16, "int8", 2, 3, 70001, false},
                      Case{WireDtype::kFp16, "onebit", 1, 4, 37, false},
                      Case{WireDtype::kBf16, "onebit", 1, 2, 1001, true},
                      Case{WireDtype::kFp16, "fp8", 3, 2, 4099, true},
                      Case{WireDtype::kBf16, "onebit", 2, 3, 1001, false, true},
                      Case{WireDtype::kFp16, "int8", 1, 2, 1001, false, true},
                      // bf16 gradients read in place; 70001 crosses a SumSquares piece.
                      Case{WireDtype::kBf16, "onebit", 2, 2, 1001, false, false, true},
                      Case{WireDtype::kBf16, "int8", 2, 3, 70001, false, false, true},
                      Case{WireDtype::kBf16, "onebit", 1, 2, 1001, true, false, true},
                      Case{WireDtype::kBf16, "onebit", 2, 3, 1001, false, true, true},
                      Case{WireDtype::kBf16, "fp8", 3, 2, 4099, true, true, true}),
    CaseName);

// Unsharded, param_dtype changes nothing: the whole fp32 parameters, no low buffer.
TEST(ShardedLowPrecisionTest, UnshardedKeepsTheWholeMaster) {
  const Case c{WireDtype::kBf16, "onebit", 1, 2, 101, false};
  const std::vector<float> p0 = InitialParams(c);
  const absl::Status status = sharded_test::RunJob(
      1, 2, c.n, "onebit", /*shard=*/false,
      [&](int, kernels::Backend* backend, Exchange* exchange) -> absl::Status {
        auto made = Make(c, /*low=*/true, backend, exchange, p0);
        if (!made.ok()) return made.status();
        EXPECT_NE((*made)->params(), nullptr);
        EXPECT_EQ((*made)->low_params(), nullptr);
        EXPECT_EQ((*made)->low_params_dtype(), WireDtype::kFp32);
        // A bf16 gradient needs the sharded path: refused before any exchange.
        const std::vector<uint16_t> g16(c.n, 0x3f80);
        const absl::Status step = (*made)->Step(onebit::Gradient(g16.data(), WireDtype::kBf16));
        EXPECT_EQ(step.code(), absl::StatusCode::kFailedPrecondition) << step;
        EXPECT_NE(step.message().find("shard_state"), std::string::npos) << step;
        EXPECT_EQ((*made)->step(), 0);
        return absl::OkStatus();
      });
  EXPECT_TRUE(status.ok()) << status;
}

// Sharded, a node whose workers keep different parameter dtypes fails at creation, on every
// worker, before any all-gather of mismatched sizes.
TEST(ShardedLowPrecisionTest, ANodeOfMixedDtypesIsRefused) {
  const Case c{WireDtype::kBf16, "onebit", 1, 2, 101, false};
  const std::vector<float> p0 = InitialParams(c);
  const absl::Status status = sharded_test::RunJob(
      1, 2, c.n, "onebit", /*shard=*/true,
      [&](int w, kernels::Backend* backend, Exchange* exchange) -> absl::Status {
        // Local rank 1 trains fp32 parameters, local rank 0 bf16 (one node: w is the rank).
        auto made = Make(c, /*low=*/w == 0, backend, exchange, p0);
        EXPECT_EQ(made.status().code(), absl::StatusCode::kFailedPrecondition) << made.status();
        EXPECT_NE(made.status().message().find("same parameter dtype"), std::string::npos)
            << made.status();
        return absl::OkStatus();
      });
  EXPECT_TRUE(status.ok()) << status;
}

}  // namespace
}  // namespace onebit
