// Sharded optimizer state through Optimizer's checkpoint interface: each worker's tensors
// over its state range (StateToHost), its scalars and its error buffers, put back into
// fresh optimizers of the same job (Restore, which all-gathers p inside the node), go on to
// the parameters of the uninterrupted run bit for bit. A state of another size is refused
// before anything changes. (worker/checkpointer_test.cc covers the part files, resuming
// across sharding and across local sizes.)
#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/kernels.h"
#include "worker/optim/onebit_adam.h"
#include "worker/optim/sharded_test_util.h"
#include "worker/optim/test_stream.h"

namespace onebit {
namespace {

using sharded_test::Saved;

constexpr int64_t kFreeze = 3;
constexpr int64_t kSave = 5;
constexpr int64_t kEnd = 8;

struct Case {
  int nodes;
  int local;
  size_t n;
};

OnebitAdamOptions Options(size_t n) {
  OnebitAdamOptions o;
  o.hyper.lr = 0.01f;
  o.freeze_step = kFreeze;
  o.auto_mask_zero_gradients = true;
  o.hyper_groups = {{0, n / 3 + 1, 0.5f, 0.01f}, {n / 3 + 1, n, 1.0f, 0.0f}};
  return o;
}

std::vector<float> Gradient(int worker, int64_t step, size_t n) {
  return sharded_test::GradientWithZeros(worker, step, n, 5, 31);
}

// Runs `c` sharded. restore == nullptr: from the start, saving after kSave into *saved;
// else: from (*restore)[w]. Every worker's parameters after every step past kSave.
std::vector<std::vector<std::vector<float>>> RunShards(const Case& c, std::vector<Saved>* saved,
                                                       const std::vector<Saved>* restore) {
  std::vector<std::vector<std::vector<float>>> params(c.nodes * c.local);
  const std::vector<float> p0 = test_stream::Params(c.n);
  const absl::Status status = sharded_test::RunJob(
      c.nodes, c.local, c.n, "onebit", /*shard=*/true,
      [&](int w, kernels::Backend* backend, Exchange* exchange) -> absl::Status {
        auto adam = OnebitAdam::Create(Options(c.n), backend, exchange, p0.data(), c.n);
        if (!adam.ok()) return adam.status();
        OnebitAdam& o = **adam;
        if (restore != nullptr) {
          const Saved& s = (*restore)[w];
          // Another size: refused, nothing changed (every worker fails alike, before the
          // all-gather).
          StateTensors whole = s.tensors;
          whole["exp_avg"].push_back(1.0f);
          const absl::Status refused = o.Restore(kSave, kFreeze, whole, s.scalars);
          EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
          EXPECT_EQ(o.step(), 0);
          if (absl::Status r = sharded_test::Restore(o, kSave, kFreeze, s); !r.ok()) return r;
        }
        for (int64_t t = o.step() + 1; t <= kEnd; ++t) {
          const std::vector<float> g = Gradient(w, t, c.n);
          if (absl::Status s = o.Step(g.data()); !s.ok()) return s;
          if (t == kSave && saved != nullptr) {
            auto s = sharded_test::Save(o);
            if (!s.ok()) return s.status();
            (*saved)[w] = *std::move(s);
          }
          if (t > kSave) {
            auto p = o.ParamsToHost();
            if (!p.ok()) return p.status();
            params[w].push_back(*std::move(p));
          }
        }
        return absl::OkStatus();
      });
  EXPECT_TRUE(status.ok()) << status;
  return params;
}

TEST(ShardedRestoreTest, RestoredShardsGoOnAsIfUninterrupted) {
  for (const Case& c : {Case{1, 2, 1001}, Case{2, 2, 1001}, Case{1, 4, 37}}) {
    SCOPED_TRACE(absl::StrCat(c.nodes, "x", c.local, ", n ", c.n));
    std::vector<Saved> saved(c.nodes * c.local);
    const auto straight = RunShards(c, &saved, nullptr);
    size_t held = 0;
    for (int l = 0; l < c.local; ++l) held += saved[l].tensors.at("exp_avg").size();
    EXPECT_EQ(held, c.n) << "node 0's state ranges do not cover the parameters once";
    const auto resumed = RunShards(c, nullptr, &saved);
    EXPECT_EQ(resumed, straight);
  }
}

}  // namespace
}  // namespace onebit
