// Sharded optimizer state for 1-bit LAMB (docs/design.md, "Sharded state"): OnebitLamb over
// a hierarchical exchange that shards the state against OnebitLamb over the unsharded
// exchange, on the same gradient stream. After every step each worker's parameters must be
// the same bits, and so must LAMB's float64 scalars (the trust ratios' averages, the
// scaling coefficients, the factors) and the clip norm; at the end each worker's m, v and
// v_fresh are the unsharded ones over its state range. The cases cover the 1-bit, int8 and
// fp8 codecs, one node and several, local sizes 2 and 3, several tensors with one
// straddling a slice boundary (and one tensor of everything), an all-padding slice,
// clipping, weight decay on and off by group, a schedule, bias correction, both masks,
// and the switch at a fixed step or moved mid-run.
#include <algorithm>
#include <cstring>
#include <map>
#include <ostream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "gtest/gtest.h"
#include "kernels/kernels.h"
#include "worker/exchange/forwarding_exchange.h"
#include "worker/optim/onebit_lamb.h"
#include "worker/optim/sharded_test_util.h"
#include "worker/optim/test_stream.h"

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
  bool clip = false;
  bool decay = false;         // weight decay: group 0 always, group 1 every other step
  bool tensors = true;        // several tensors (else one of everything)
  bool masks = true;          // a user mask and the automatic one
  bool bias_correction = false;
  bool move_freeze = false;   // the switch is moved from "never" to step 6 during step 3
};

std::string Name(const Case& c) {
  return absl::StrCat(c.codec, "_", c.nodes, "x", c.local, "_n", c.n, c.clip ? "_clip" : "",
                      c.decay ? "_decay" : "", c.tensors ? "" : "_one_tensor",
                      c.masks ? "" : "_no_mask", c.bias_correction ? "_bias" : "",
                      c.move_freeze ? "_moved_freeze" : "");
}
std::string CaseName(const ::testing::TestParamInfo<Case>& info) { return Name(info.param); }
void PrintTo(const Case& c, std::ostream* os) { *os << Name(c); }

// Some elements never see a gradient: the automatic mask masks them.
std::vector<float> Gradient(int worker, int64_t step, size_t n) {
  return sharded_test::GradientWithZeros(worker, step, n, 3, 97);
}

// LAMB's tensors: a small one inside slice 0, a large one across the first slice boundary
// (with local 3 across both, so three pieces whose order matters), a small one, and the
// rest. The parameter groups split at 7n/10, a tensor boundary, as LAMB needs.
size_t GroupCut(size_t n) { return 7 * n / 10; }
std::vector<size_t> TensorOffsets(size_t n) {
  const size_t a = n / 7, b = GroupCut(n), c = b + std::max<size_t>(1, n / 20);
  return {0, a, b, c, n};
}

OnebitLambOptions Options(const Case& c) {
  OnebitLambOptions o;
  o.hyper.lr = 0.01f;
  o.freeze_step = c.move_freeze ? 1000000 : kFreezeStep;
  o.bias_correction = c.bias_correction;
  o.max_grad_norm = c.clip ? 5.0 : 0.0;
  if (c.tensors) o.group_offsets = TensorOffsets(c.n);
  if (c.masks) {
    o.auto_mask_zero_gradients = true;
    o.momentum_mask.assign(c.n, 1.0f);
    for (size_t i = 0; i < c.n; i += 53) o.momentum_mask[i] = 0.0f;
  }
  if (c.tensors) {
    const size_t cut = GroupCut(c.n);
    o.hyper_groups = {{0, cut, 0.5f, 0.0f}, {cut, c.n, 1.0f, 0.0f}};
  }
  return o;
}

// The step's weight decay per parameter group (one group with one tensor).
std::vector<double> Decays(const Case& c, int64_t t) {
  if (!c.tensors) return {c.decay ? 0.01 * t : 0.0};
  if (!c.decay) return {0.0, 0.0};
  return {0.01 * t, t % 2 == 0 ? 0.002 : 0.0};
}

// Counts the gathers of LAMB's norms and of the parameters.
class CountingExchange : public ForwardingExchange {
 public:
  using ForwardingExchange::ForwardingExchange;
  absl::StatusOr<std::vector<double>> GatherPartials(const std::vector<double>& mine) override {
    ++gathers;
    return ForwardingExchange::GatherPartials(mine);
  }
  absl::Status AllGatherShards(float* whole) override {
    ++param_gathers;
    return ForwardingExchange::AllGatherShards(whole);
  }
  int gathers = 0;
  int param_gathers = 0;
};

struct Scalars {
  std::vector<double> coeff_freeze, scaling, last_factor;
  double clip_norm = 0.0;
  StateScalars checkpoint;
};

struct WorkerEnd {
  std::vector<std::vector<float>> params;  // after every step
  std::vector<Scalars> scalars;            // after every step
  std::vector<int> gathers, param_gathers;  // per step (sharded runs)
  std::map<std::string, std::vector<float>> state;  // the state range's, at the end
  size_t state_begin = 0;
};

std::vector<WorkerEnd> RunCase(const Case& c, bool shard) {
  std::vector<WorkerEnd> ends(static_cast<size_t>(c.nodes * c.local));
  const std::vector<float> p0 = test_stream::Params(c.n);
  const absl::Status status = sharded_test::RunJob(
      c.nodes, c.local, c.n, c.codec, shard,
      [&](int w, kernels::Backend* backend, Exchange* exchange) -> absl::Status {
        CountingExchange counting(exchange);
        auto lamb = OnebitLamb::Create(Options(c), backend, &counting, p0.data(), c.n);
        if (!lamb.ok()) return lamb.status();
        WorkerEnd& end = ends[static_cast<size_t>(w)];
        for (int64_t t = 1; t <= kSteps; ++t) {
          (*lamb)->set_lr(0.01f / static_cast<float>(t));
          if (absl::Status s = (*lamb)->set_weight_decays(Decays(c, t)); !s.ok()) return s;
          if (c.move_freeze && t == 3) {
            if (absl::Status s = (*lamb)->SetFreezeStep(6); !s.ok()) return s;
          }
          const int before = counting.gathers, params_before = counting.param_gathers;
          const std::vector<float> g = Gradient(w, t, c.n);
          if (absl::Status s = (*lamb)->Step(g.data()); !s.ok()) return s;
          end.gathers.push_back(counting.gathers - before);
          end.param_gathers.push_back(counting.param_gathers - params_before);
          auto p = (*lamb)->ParamsToHost();
          if (!p.ok()) return p.status();
          end.params.push_back(*std::move(p));
          end.scalars.push_back({(*lamb)->coeff_freeze(), (*lamb)->scaling_coeff(),
                                 (*lamb)->last_factor(), (*lamb)->last_clip_norm(),
                                 (*lamb)->CheckpointScalars()});
        }
        end.state_begin = (*lamb)->state_begin();
        const size_t to = end.state_begin + (*lamb)->state_count();
        for (const char* name : {"exp_avg", "exp_avg_sq", "exp_avg_sq_fresh"}) {
          auto x = (*lamb)->StateToHost(name, end.state_begin, to);
          if (!x.ok()) return x.status();
          end.state[name] = *std::move(x);
        }
        return absl::OkStatus();
      });
  EXPECT_TRUE(status.ok()) << status;
  return ends;
}

// Bit for bit: == would let -0.0 pass for 0.0, and fail a NaN against itself.
bool SameBits(const std::vector<double>& a, const std::vector<double>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0);
}
bool SameBits(const StateScalars& a, const StateScalars& b) {
  if (a.size() != b.size()) return false;
  for (const auto& [key, value] : a) {
    const auto it = b.find(key);
    if (it == b.end() || std::memcmp(&value, &it->second, sizeof(double)) != 0) return false;
  }
  return true;
}

std::string Show(const std::vector<double>& x) {
  std::string out;
  for (double d : x) absl::StrAppend(&out, out.empty() ? "" : " ", absl::StrFormat("%.17g", d));
  return out;
}

class ShardedLambTest : public ::testing::TestWithParam<Case> {};

TEST_P(ShardedLambTest, SameBitsAsUnsharded) {
  const Case& c = GetParam();
  const std::vector<WorkerEnd> whole = RunCase(c, /*shard=*/false);
  const std::vector<WorkerEnd> sharded = RunCase(c, /*shard=*/true);
  ASSERT_EQ(whole.size(), sharded.size());
  size_t covered = 0;
  for (size_t w = 0; w < whole.size(); ++w) {
    ASSERT_TRUE(SameParamsEveryStep(sharded[w].params, whole[w].params, c.n, kSteps))
        << "worker " << w;
    for (int64_t t = 0; t < kSteps; ++t) {
      const std::string at = absl::StrCat("worker ", w, ", step ", t + 1);
      // The float64 scalars: a wrong order of the pieces rarely shows in float32 bits.
      const Scalars& s = sharded[w].scalars[t];
      const Scalars& u = whole[w].scalars[t];
      ASSERT_TRUE(SameBits(s.coeff_freeze, u.coeff_freeze))
          << at << ": coeff_freeze " << Show(s.coeff_freeze) << " against " << Show(u.coeff_freeze);
      ASSERT_TRUE(SameBits(s.scaling, u.scaling))
          << at << ": scaling " << Show(s.scaling) << " against " << Show(u.scaling);
      ASSERT_TRUE(SameBits(s.last_factor, u.last_factor))
          << at << ": last_factor " << Show(s.last_factor) << " against " << Show(u.last_factor);
      ASSERT_TRUE(SameBits({s.clip_norm}, {u.clip_norm}))
          << at << ": clip norm " << s.clip_norm << " against " << u.clip_norm;
      // A checkpoint's scalars are the same on every worker (any one may save them).
      ASSERT_TRUE(SameBits(s.checkpoint, u.checkpoint)) << at << ": checkpoint scalars";
      ASSERT_TRUE(SameBits(s.checkpoint, sharded[0].scalars[t].checkpoint))
          << at << ": checkpoint scalars against worker 0's";
    }
    // The state range's tensors are the unsharded worker's there.
    const WorkerEnd& s = sharded[w];
    for (const auto& [name, x] : s.state) {
      EXPECT_TRUE(SameOverRange(x, s.state_begin, whole[w].state.at(name), c.n))
          << "worker " << w << "'s " << name;
    }
    if (w < static_cast<size_t>(c.local)) covered += s.state.at("exp_avg").size();  // node 0
  }
  EXPECT_EQ(covered, c.n) << "node 0's shards do not cover the parameters once";
}

// One gather of norm pieces per phase: the warmup's clip norm (when clipping) and its
// ||p_k||, ||u_k||; the switch's ||m_k||; the compression step's ratios and ||u_k||
// before and after the decay. And one all-gather of the parameters per step.
TEST_P(ShardedLambTest, OneGatherPerPhase) {
  const Case& c = GetParam();
  const std::vector<WorkerEnd> sharded = RunCase(c, /*shard=*/true);
  const int64_t freeze = c.move_freeze ? 6 : kFreezeStep;
  for (size_t w = 0; w < sharded.size(); ++w) {
    ASSERT_EQ(sharded[w].gathers.size(), static_cast<size_t>(kSteps));
    for (int64_t t = 1; t <= kSteps; ++t) {
      const int want = t <= freeze ? 1 + (c.clip ? 1 : 0) : 1 + (t == freeze + 1 ? 1 : 0);
      EXPECT_EQ(sharded[w].gathers[t - 1], want) << "worker " << w << ", step " << t;
      EXPECT_EQ(sharded[w].param_gathers[t - 1], 1) << "worker " << w << ", step " << t;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cases, ShardedLambTest,
    ::testing::Values(
        Case{"onebit", 2, 2, 1001, /*clip=*/true, /*decay=*/true},
        Case{"int8", 2, 2, 1001, /*clip=*/false, /*decay=*/true},
        Case{"int8", 2, 3, 1001, /*clip=*/true, /*decay=*/false},
        Case{"fp8", 2, 2, 1001, /*clip=*/true, /*decay=*/true},
        Case{"onebit", 1, 2, 1001, /*clip=*/true, /*decay=*/true, true, true, /*bias=*/true},
        Case{"onebit", 1, 3, 1001, /*clip=*/false, /*decay=*/true},
        Case{"onebit", 3, 2, 4099, /*clip=*/true, /*decay=*/true, /*tensors=*/false},
        Case{"onebit", 2, 3, 1001, /*clip=*/true, /*decay=*/true, true, /*masks=*/false, false,
             /*move_freeze=*/true},
        // Slices above 65536: the CPU kernels' own pieces inside a slice.
        Case{"onebit", 2, 2, 140001, /*clip=*/true, /*decay=*/true},
        // S = 16: slice 2 holds no parameter (state range [n, n)).
        Case{"onebit", 2, 3, 17, /*clip=*/true, /*decay=*/true},
        Case{"int8", 1, 3, 17, /*clip=*/false, /*decay=*/true, true, true, /*bias=*/true}),
    CaseName);

}  // namespace
}  // namespace onebit
