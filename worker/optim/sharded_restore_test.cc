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
#include "worker/exchange/hierarchical_exchange.h"
#include "worker/optim/onebit_adam.h"
#include "worker/optim/test_stream.h"
#include "worker/transport/local_group.h"

namespace onebit {
namespace {

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
  std::vector<float> g = test_stream::Grad(worker, step, n);
  for (size_t i = 5; i < n; i += 31) g[i] = 0.0f;
  return g;
}

// What a worker saves after kSave.
struct Saved {
  StateTensors tensors;
  StateScalars scalars;
  ErrorState errors;
};

// Runs `c` sharded. restore == nullptr: from the start, saving after kSave into *saved;
// else: from (*restore)[w]. Every worker's parameters after every step past kSave.
std::vector<std::vector<std::vector<float>>> RunShards(const Case& c, std::vector<Saved>* saved,
                                                       const std::vector<Saved>* restore) {
  std::vector<std::vector<std::vector<float>>> params(c.nodes * c.local);
  const std::vector<float> p0 = test_stream::Params(c.n);
  const absl::Status status = RunLocalNodes(
      TransportKind::kInproc, c.nodes, c.local,
      [&](Transport& intra, Transport& inter) -> absl::Status {
        const int w = inter.rank() * c.local + intra.rank();
        auto backend = kernels::NewCpuBackend();
        HierarchicalOptions options;
        options.shard_state = true;
        auto exchange = HierarchicalExchange::CreatePeer(backend.get(), &intra, &inter, c.n,
                                                         OnebitCodec(), options);
        if (!exchange.ok()) return exchange.status();
        auto adam =
            OnebitAdam::Create(Options(c.n), backend.get(), exchange->get(), p0.data(), c.n);
        if (!adam.ok()) return adam.status();
        OnebitAdam& o = **adam;
        const size_t lo = o.state_begin(), hi = lo + o.state_count();
        if (restore != nullptr) {
          const Saved& s = (*restore)[w];
          // Another size: refused, nothing changed (every worker fails alike, before the
          // all-gather).
          StateTensors whole = s.tensors;
          whole["exp_avg"].push_back(1.0f);
          const absl::Status refused = o.Restore(kSave, kFreeze, whole, s.scalars);
          EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
          EXPECT_EQ(o.step(), 0);
          if (absl::Status r = o.Restore(kSave, kFreeze, s.tensors, s.scalars); !r.ok()) return r;
          if (absl::Status r = o.exchange().RestoreErrors(s.errors); !r.ok()) return r;
        }
        for (int64_t t = o.step() + 1; t <= kEnd; ++t) {
          const std::vector<float> g = Gradient(w, t, c.n);
          if (absl::Status s = o.Step(g.data()); !s.ok()) return s;
          if (t == kSave && saved != nullptr) {
            Saved& s = (*saved)[w];
            for (const StateSpec& spec : o.CheckpointStates()) {
              auto v = o.StateToHost(spec.name, lo, hi);
              if (!v.ok()) return v.status();
              s.tensors[spec.name] = *std::move(v);
            }
            s.scalars = o.CheckpointScalars();
            auto errors = o.exchange().SaveErrors();
            if (!errors.ok()) return errors.status();
            s.errors = *std::move(errors);
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
