// The script's view of an optimizer's state (state_dict, load_state_dict, state_slice) on
// 2 nodes x 2 workers as threads, sharded and not: a sharded worker saves its state range
// and says which; it loads a whole state (its range of it) or exactly its own, and refuses
// another range naming both; slices outside its range name the range it holds. The
// unsharded worker's state stays whole. The node's workers gather the whole state together.
#include "python/optimizer_state.h"

#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "kernels/kernels.h"
#include "worker/exchange/hierarchical_exchange.h"
#include "worker/optim/optimizer_factory.h"
#include "worker/transport/local_group.h"

namespace onebit {
namespace {

constexpr size_t kN = 1001;
constexpr int kNodes = 2;
constexpr int kLocal = 2;
constexpr int kWorkers = kNodes * kLocal;
constexpr int64_t kSteps = 4;  // two in the compression stage: the error buffers count

std::vector<float> Grad(int worker, int64_t step) {
  std::vector<float> g(kN);
  for (size_t i = 0; i < kN; ++i) g[i] = std::sin(0.02f * i + 0.3f * step) + 0.1f * worker;
  return g;
}

// body(worker, optimizer) on every worker, each with a fresh OnebitAdam trained `steps`.
absl::Status RunJob(bool shard, int64_t steps,
                    const std::function<void(int, Optimizer&)>& body) {
  return RunLocalNodes(
      TransportKind::kInproc, kNodes, kLocal,
      [&](Transport& intra, Transport& inter) -> absl::Status {
        const int w = inter.rank() * kLocal + intra.rank();
        auto backend = kernels::NewCpuBackend();
        HierarchicalOptions options;
        options.shard_state = shard;
        auto exchange = HierarchicalExchange::CreatePeer(backend.get(), &intra, &inter, kN,
                                                         OnebitCodec(), options);
        if (!exchange.ok()) return exchange.status();
        OptimizerSpec spec;
        spec.kind = OptimizerKind::kOneBitAdam;
        spec.freeze_step = 2;
        const std::vector<float> initial(kN, 0.25f);
        auto o = CreateOptimizer(spec, backend.get(), exchange->get(), initial.data(), kN);
        if (!o.ok()) return o.status();
        for (int64_t t = 1; t <= steps; ++t) {
          const std::vector<float> g = Grad(w, t);
          if (absl::Status s = (*o)->Step(g.data()); !s.ok()) return s;
        }
        body(w, **o);
        return absl::OkStatus();
      });
}

const std::vector<float>& Tensor(const OptimizerState& s, const std::string& name) {
  for (const auto& [n, v] : s.tensors) {
    if (n == name) return v;
  }
  static const std::vector<float> kNone;
  ADD_FAILURE() << "no " << name;
  return kNone;
}

bool Has(const absl::Status& status, const std::string& text) {
  return status.message().find(text) != std::string::npos;
}

class OptimizerStateTest : public ::testing::Test {
 protected:
  // Every worker's state after kSteps, unsharded and sharded (the same training bits).
  static void SetUpTestSuite() {
    whole_ = new std::vector<OptimizerState>(kWorkers);
    shards_ = new std::vector<OptimizerState>(kWorkers);
    for (bool shard : {false, true}) {
      std::vector<OptimizerState>& out = shard ? *shards_ : *whole_;
      absl::Mutex mu;
      const absl::Status run = RunJob(shard, kSteps, [&](int w, Optimizer& o) {
        absl::StatusOr<OptimizerState> s = SaveOptimizerState(o);
        ASSERT_TRUE(s.ok()) << s.status();
        absl::MutexLock lock(&mu);
        out[w] = *std::move(s);
      });
      ASSERT_TRUE(run.ok()) << run;
    }
  }
  static void TearDownTestSuite() {
    delete whole_;
    delete shards_;
  }
  static std::vector<OptimizerState>* whole_;
  static std::vector<OptimizerState>* shards_;
};
std::vector<OptimizerState>* OptimizerStateTest::whole_ = nullptr;
std::vector<OptimizerState>* OptimizerStateTest::shards_ = nullptr;

TEST_F(OptimizerStateTest, AShardedStateHoldsItsRangeAndSaysWhich) {
  size_t covered = 0;
  for (int w = 0; w < kWorkers; ++w) {
    SCOPED_TRACE(testing::Message() << "worker " << w);
    const OptimizerState& whole = (*whole_)[w];
    const OptimizerState& shard = (*shards_)[w];
    EXPECT_EQ(whole.scalars.count(kStateBeginScalar), 0u);
    ASSERT_EQ(shard.scalars.count(kStateBeginScalar), 1u);
    const size_t begin = static_cast<size_t>(shard.scalars.at(kStateBeginScalar));
    const size_t end = static_cast<size_t>(shard.scalars.at(kStateEndScalar));
    if (w < kLocal) covered += end - begin;
    ASSERT_EQ(whole.tensors.size(), shard.tensors.size());
    for (const auto& [name, v] : whole.tensors) {
      ASSERT_EQ(v.size(), kN) << name;
      const std::vector<float> cut(v.begin() + begin, v.begin() + end);
      EXPECT_EQ(Tensor(shard, name), cut) << name;
    }
    EXPECT_EQ(shard.errors, whole.errors);
  }
  EXPECT_EQ(covered, kN);
}

TEST_F(OptimizerStateTest, ShardedWorkersLoadWholeStatesAndTheirOwn) {
  const absl::Status run = RunJob(true, 0, [&](int w, Optimizer& o) {
    const OptimizerState& own = (*shards_)[w];
    const size_t begin = o.state_begin(), end = begin + o.state_count();
    auto expect_saved = [&](const char* what) {
      absl::StatusOr<OptimizerState> now = SaveOptimizerState(o);
      ASSERT_TRUE(now.ok()) << now.status();
      EXPECT_EQ(now->step, kSteps) << what;
      EXPECT_EQ(now->tensors, own.tensors) << what;
      EXPECT_EQ(now->errors, own.errors) << what;
    };
    // Another worker's range: refused, naming both.
    const OptimizerState& other = (*shards_)[(w + 1) % kWorkers];
    absl::Status refused = RestoreOptimizerState(o, other, true);
    if (other.scalars.at(kStateBeginScalar) != static_cast<double>(begin)) {
      EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
      EXPECT_TRUE(Has(refused, absl::StrCat("this worker holds [", begin, ", ", end, ")")))
          << refused;
      EXPECT_TRUE(Has(refused, absl::StrCat("the state holds parameters [",
                                            other.scalars.at(kStateBeginScalar))))
          << refused;
    }
    EXPECT_EQ(o.step(), 0);
    // A whole state: its range (p whole, every local worker alike: the all-gather).
    ASSERT_TRUE(RestoreOptimizerState(o, (*whole_)[w], true).ok());
    expect_saved("from the whole state");
    absl::StatusOr<std::vector<float>> p = o.ParamsToHost();
    ASSERT_TRUE(p.ok());
    EXPECT_EQ(*p, Tensor((*whole_)[w], "params"));
    // Its own.
    ASSERT_TRUE(RestoreOptimizerState(o, own, true).ok());
    expect_saved("from its own");
  });
  EXPECT_TRUE(run.ok()) << run;
}

TEST_F(OptimizerStateTest, UnshardedWorkersLoadWholeStatesOnly) {
  const absl::Status run = RunJob(false, 0, [&](int w, Optimizer& o) {
    const absl::Status refused = RestoreOptimizerState(o, (*shards_)[w], true);
    EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
    EXPECT_TRUE(Has(refused, absl::StrCat("this worker holds [0, ", kN, "): load a whole state")))
        << refused;
    ASSERT_TRUE(RestoreOptimizerState(o, (*whole_)[w], true).ok());
    absl::StatusOr<OptimizerState> now = SaveOptimizerState(o);
    ASSERT_TRUE(now.ok());
    EXPECT_EQ(now->tensors, (*whole_)[w].tensors);
  });
  EXPECT_TRUE(run.ok()) << run;
}

TEST_F(OptimizerStateTest, GatheredShardsAreTheWholeState) {
  // Every worker of each node gathers at the same point: the unsharded worker's state, bit
  // for bit, without range scalars, and its own error buffers.
  for (bool shard : {false, true}) {
    SCOPED_TRACE(shard ? "sharded" : "unsharded");
    const absl::Status run = RunJob(shard, kSteps, [&](int w, Optimizer& o) {
      auto backend = kernels::NewCpuBackend();
      absl::StatusOr<OptimizerState> all = GatherOptimizerState(o, *backend);
      ASSERT_TRUE(all.ok()) << all.status();
      const OptimizerState& whole = (*whole_)[w];
      EXPECT_EQ(all->step, kSteps);
      EXPECT_EQ(all->tensors, whole.tensors);
      EXPECT_EQ(all->errors, whole.errors);
      EXPECT_EQ(all->scalars, whole.scalars);
    });
    EXPECT_TRUE(run.ok()) << run;
  }
}

TEST_F(OptimizerStateTest, SlicesOutsideTheRangeNameIt) {
  const absl::Status run = RunJob(true, kSteps, [&](int w, Optimizer& o) {
    const OptimizerState& own = (*shards_)[w];
    const size_t begin = o.state_begin(), end = begin + o.state_count();
    const size_t other = begin == 0 ? end : 0;  // an element this worker does not hold
    for (bool saved : {false, true}) {
      SCOPED_TRACE(saved ? "a saved state" : "the optimizer");
      auto slice = [&](size_t b, size_t e) {
        return saved ? StateSlice(own, kN, b, e) : StateSlice(o, b, e);
      };
      absl::StatusOr<NamedTensors> inside = slice(begin + 1, begin + 3);
      ASSERT_TRUE(inside.ok()) << inside.status();
      ASSERT_EQ(inside->size(), own.tensors.size() - 1);  // not the parameters
      for (const auto& [name, v] : *inside) {
        const std::vector<float>& all = Tensor(own, name);
        EXPECT_EQ(v, std::vector<float>(all.begin() + 1, all.begin() + 3)) << name;
      }
      const absl::StatusOr<NamedTensors> outside = slice(other, other + 1);
      EXPECT_EQ(outside.status().code(), absl::StatusCode::kInvalidArgument);
      EXPECT_TRUE(Has(outside.status(), absl::StrCat("this worker holds [", begin, ", ", end)))
          << outside.status();
      const absl::StatusOr<NamedTensors> empty = slice(other, other);
      ASSERT_TRUE(empty.ok()) << empty.status();
      for (const auto& [name, v] : *empty) EXPECT_TRUE(v.empty()) << name;
    }
  });
  EXPECT_TRUE(run.ok()) << run;
}

}  // namespace
}  // namespace onebit
