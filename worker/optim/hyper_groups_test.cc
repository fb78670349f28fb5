// Parameter groups with their own lr and weight decay (optim_checks.h's HyperGroup).
//
// 1-bit Adam and 1-bit LAMB exchange only the momentum (gradient-driven, the same whatever
// the lr and the decay), and every update is elementwise (per tensor for LAMB), so a
// group's parameters must get exactly the bits of a run of the whole job with that group's
// lr and decay; checked over W = 1 and 3 workers. 0/1 Adam's syncs exchange the workers'
// lr-weighted accumulators in one compressed buffer, so with several workers a group's lr
// and decay change what the others receive too: there the property holds for one worker,
// and with three the workers must agree bit for bit. For every optimizer, groups that all
// carry the job's lr and decay give the bits of no groups at all. Every stage boundary is
// inside the run, with bias correction, a momentum mask and a learning-rate schedule.
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/kernels.h"
#include "worker/exchange/peer_exchange.h"
#include "worker/optim/optim_checks.h"
#include "worker/optim/optimizer_factory.h"
#include "worker/optim/test_stream.h"
#include "worker/transport/local_group.h"

namespace onebit {
namespace {

using ::testing::HasSubstr;
using test_stream::Grad;
using test_stream::Params;

constexpr size_t kN = 1003;
constexpr int64_t kSteps = 24;
constexpr float kLr = 0.01f;
// Three groups on tensor boundaries (1-bit LAMB's tensors below): no decay and the job's lr;
// decay 0.1 at twice the lr; decay 0.01 at a quarter of it.
const std::vector<HyperGroup> kGroups = {
    {0, 300, 1.0f, 0.0f}, {300, 700, 2.0f, 0.1f}, {700, kN, 0.25f, 0.01f}};
const std::vector<size_t> kTensors = {0, 100, 300, 500, 700, kN};

struct Variant {
  std::string type;
  bool bias_correction = false;
  bool mask = false;
};

OptimizerSpec Spec(const Variant& v) {
  OptimizerSpec spec;
  spec.kind = ParseOptimizerKind(v.type).value();
  spec.hyper.lr = kLr;
  spec.freeze_step = 8;
  // 0/1 Adam: variance updates doubling early, syncs every 1, 2, 4 local steps.
  spec.zero_one.var_update_scaler = 2;
  spec.zero_one.local_step_scaler = 4;
  spec.zero_one.local_step_clipper = 4;
  spec.bias_correction = v.bias_correction;
  if (v.type == "OneBitLamb") spec.group_offsets = kTensors;
  if (v.mask) {
    spec.momentum_mask.assign(kN, 1.0f);
    for (size_t i = 0; i < kN; i += 7) spec.momentum_mask[i] = 0.0f;
  }
  return spec;
}

// The groups' weight decays for a step (empty: unchanged).
using DecaySchedule = std::function<std::vector<double>(int64_t step)>;

// Every worker's parameters after kSteps steps of `spec` on the test stream; the lr follows
// a schedule (set_lr before each step), as the trainer's does, and so do the weight decays
// when `decays` is given (set_weight_decays).
std::vector<std::vector<float>> RunJob(const OptimizerSpec& spec, int w,
                                       const DecaySchedule& decays = nullptr) {
  std::vector<std::vector<float>> result(w);
  const std::vector<float> p0 = Params(kN);
  const absl::Status status = RunLocalGroup(TransportKind::kInproc, w, [&](Transport& t) {
    auto backend = kernels::NewCpuBackend();
    auto exchange = PeerExchange::Create(backend.get(), &t, kN);
    if (!exchange.ok()) return exchange.status();
    auto opt = CreateOptimizer(spec, backend.get(), exchange->get(), p0.data(), kN);
    if (!opt.ok()) return opt.status();
    for (int64_t step = 1; step <= kSteps; ++step) {
      (*opt)->set_lr(spec.hyper.lr * (1.0f - 0.02f * static_cast<float>(step)));
      if (decays && !decays(step).empty()) {
        if (absl::Status s = (*opt)->set_weight_decays(decays(step)); !s.ok()) return s;
      }
      const std::vector<float> g = Grad(t.rank(), step, kN);
      if (absl::Status s = (*opt)->Step(g.data()); !s.ok()) return s;
    }
    auto p = (*opt)->ParamsToHost();
    if (!p.ok()) return p.status();
    result[t.rank()] = *p;
    return absl::OkStatus();
  });
  EXPECT_TRUE(status.ok()) << status;
  return result;
}

void ExpectRanksAgree(const std::vector<std::vector<float>>& got, const std::string& what) {
  for (size_t rank = 1; rank < got.size(); ++rank) {
    EXPECT_EQ(got[rank], got[0]) << what << ": rank " << rank << " differs from rank 0";
  }
}

void ExpectGroupsMatchWholeRuns(const Variant& v, int w) {
  const std::string what = absl::StrCat(v.type, " W=", w, v.bias_correction ? " bias_correction" : "",
                                        v.mask ? " mask" : "");
  OptimizerSpec grouped = Spec(v);
  grouped.hyper_groups = kGroups;
  const std::vector<std::vector<float>> got = RunJob(grouped, w);
  ExpectRanksAgree(got, what);
  const bool whole_runs_apply = v.type != "ZeroOneAdam" || w == 1;
  for (const HyperGroup& g : kGroups) {
    if (!whole_runs_apply) break;
    OptimizerSpec whole = Spec(v);
    whole.hyper.lr = kLr * g.lr_scale;  // the scale applies to the scheduled lr: exact for
    whole.hyper.weight_decay = g.weight_decay;  // powers of two, as these
    const std::vector<std::vector<float>> want = RunJob(whole, w);
    for (int rank = 0; rank < w; ++rank) {
      ASSERT_EQ(got[rank].size(), kN);
      ASSERT_EQ(want[rank].size(), kN);
      EXPECT_EQ(0, std::memcmp(got[rank].data() + g.begin, want[rank].data() + g.begin,
                               g.size() * sizeof(float)))
          << what << ": group [" << g.begin << ", " << g.end << ") on rank " << rank;
    }
  }
  // And the groups' lr and decay did change something: group 1 differs from a run with the
  // job's.
  const std::vector<std::vector<float>> plain = RunJob(Spec(v), w);
  EXPECT_NE(0, std::memcmp(got[0].data() + 300, plain[0].data() + 300, 400 * sizeof(float)))
      << what;
}

TEST(HyperGroupsTest, GroupsWithTheJobsHyperParametersChangeNoBit) {
  for (const char* type : {"OneBitAdam", "Adam", "ZeroOneAdam", "OneBitLamb"}) {
    for (const bool bias_correction : {false, true}) {
      const Variant v{type, bias_correction, /*mask=*/true};
      OptimizerSpec spec = Spec(v);
      spec.hyper.weight_decay = 0.01f;
      OptimizerSpec grouped = spec;
      grouped.hyper_groups = kGroups;
      for (HyperGroup& g : grouped.hyper_groups) g = {g.begin, g.end, 1.0f, 0.01f};
      EXPECT_EQ(RunJob(grouped, 3), RunJob(spec, 3)) << type << (bias_correction ? " bias_correction" : "");
    }
  }
}

TEST(HyperGroupsTest, EachGroupGetsTheBitsOfAWholeRunWithItsHyperParameters) {
  for (const char* type : {"OneBitAdam", "Adam", "ZeroOneAdam", "OneBitLamb"}) {
    for (const int w : {1, 3}) {
      ExpectGroupsMatchWholeRuns({type}, w);
      ExpectGroupsMatchWholeRuns({type, /*bias_correction=*/true, /*mask=*/true}, w);
    }
  }
}

// A weight-decay schedule that moves group 1 alone (0.1, then 0.3 from step 12, inside the
// compression stage): groups 0 and 2 keep the bits of the run without it, and group 1 gets
// those of a whole run at its lr whose decay follows the same schedule.
TEST(HyperGroupsTest, AWeightDecayScheduleMovesItsGroupAlone) {
  for (const char* type : {"OneBitAdam", "Adam", "ZeroOneAdam", "OneBitLamb"}) {
    const Variant v{type, /*bias_correction=*/true, /*mask=*/true};
    OptimizerSpec grouped = Spec(v);
    grouped.hyper_groups = kGroups;
    const std::vector<std::vector<float>> unscheduled = RunJob(grouped, 1);
    const std::vector<std::vector<float>> got =
        RunJob(grouped, 1, [](int64_t step) {
          return step >= 12 ? std::vector<double>{0.0, 0.3, 0.01} : std::vector<double>{};
        });
    OptimizerSpec whole = Spec(v);
    whole.hyper.lr = kLr * 2.0f;
    whole.hyper.weight_decay = 0.1f;
    const std::vector<std::vector<float>> want = RunJob(whole, 1, [](int64_t step) {
      return step >= 12 ? std::vector<double>{0.3} : std::vector<double>{};
    });
    const auto same = [&](const std::vector<std::vector<float>>& a, size_t begin, size_t end) {
      return std::memcmp(got[0].data() + begin, a[0].data() + begin,
                         (end - begin) * sizeof(float)) == 0;
    };
    EXPECT_TRUE(same(unscheduled, 0, 300)) << type;
    EXPECT_TRUE(same(unscheduled, 700, kN)) << type;
    EXPECT_TRUE(same(want, 300, 700)) << type;
    EXPECT_FALSE(same(unscheduled, 300, 700)) << type;  // the schedule acted
  }
}

TEST(HyperGroupsTest, BadGroupsAreRefusedNamingTheGroup) {
  const auto refused = [](std::vector<HyperGroup> groups, const std::string& text) {
    auto r = ResolveHyperGroups(groups, 10, 0.0f);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_THAT(std::string(r.status().message()), HasSubstr(text));
  };
  refused({{0, 4}, {5, 10}}, "parameter group 1 is [5, 10)");
  refused({{0, 4}, {4, 4}, {4, 10}}, "parameter group 1 is [4, 4)");
  refused({{0, 4}}, "cover [0, 4), not all 10");
  refused({{0, 11}}, "parameter group 0 is [0, 11)");
  refused({{0, 10, -1.0f}}, "parameter group 0: lr scale must be >= 0");
  refused({{0, 10, 1.0f, -0.1f}}, "parameter group 0: weight_decay must be >= 0");
  // A schedule's decays: one per group, each >= 0 and finite; a refusal changes nothing.
  std::vector<HyperGroup> groups = {{0, 4, 1.0f, 0.1f}, {4, 10, 1.0f, 0.2f}};
  const auto refused_decays = [&](const std::vector<double>& decays, const std::string& text) {
    const absl::Status s = SetGroupWeightDecays(decays, &groups);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_THAT(std::string(s.message()), HasSubstr(text));
    EXPECT_EQ(GroupWeightDecays(groups), (std::vector<double>{0.1f, 0.2f}));
  };
  refused_decays({0.3}, "1 weight decays for 2 parameter group(s)");
  refused_decays({0.3, -1.0}, "parameter group 1: weight_decay must be >= 0 and finite, got -1");
  refused_decays({1e39, 0.3}, "parameter group 0: weight_decay must be >= 0 and finite");
  ASSERT_TRUE(SetGroupWeightDecays({0.3, 0.0}, &groups).ok());
  EXPECT_EQ(GroupWeightDecays(groups), (std::vector<double>{0.3f, 0.0f}));
  // Alike (one fused update serves them) only with the same lr scale and decay.
  EXPECT_FALSE(GroupsAlike(groups));
  ASSERT_TRUE(SetGroupWeightDecays({0.3, 0.3}, &groups).ok());
  EXPECT_TRUE(GroupsAlike(groups));
  groups[1].lr_scale = 2.0f;
  EXPECT_FALSE(GroupsAlike(groups));
  auto none = ResolveHyperGroups({}, 10, 0.5f);
  ASSERT_TRUE(none.ok());
  ASSERT_EQ(none->size(), 1u);
  EXPECT_EQ((*none)[0].end, 10u);
  EXPECT_EQ((*none)[0].weight_decay, 0.5f);
  // 1-bit LAMB: a tensor may not straddle two groups.
  OptimizerSpec spec = Spec({"OneBitLamb"});
  spec.hyper_groups = {{0, 250, 1.0f, 0.0f}, {250, kN, 1.0f, 0.0f}};
  const std::vector<float> p0 = Params(kN);
  auto backend = kernels::NewCpuBackend();
  const absl::Status status = RunLocalGroup(TransportKind::kInproc, 1, [&](Transport& t) {
    auto exchange = PeerExchange::Create(backend.get(), &t, kN);
    if (!exchange.ok()) return exchange.status();
    auto opt = CreateOptimizer(spec, backend.get(), exchange->get(), p0.data(), kN);
    EXPECT_EQ(opt.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(opt.status().message()), HasSubstr("tensor [100, 300) straddles"));
    return absl::OkStatus();
  });
  EXPECT_TRUE(status.ok()) << status;
}

}  // namespace
}  // namespace onebit
