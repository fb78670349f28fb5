// Every optimizer kind the config knows has a builder, and Adam is the one that never
// freezes.
#include "worker/optim/optimizer_factory.h"

#include <limits>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/kernels.h"
#include "worker/exchange/peer_exchange.h"
#include "worker/transport/local_group.h"

namespace onebit {
namespace {

constexpr size_t kN = 64;

TEST(OptimizerFactoryTest, EveryKindBuilds) {
  auto backend = kernels::NewCpuBackend();
  const absl::Status status = RunLocalGroup(TransportKind::kInproc, 1, [&](Transport& t) -> absl::Status {
    auto exchange = PeerExchange::Create(backend.get(), &t, kN);
    if (!exchange.ok()) return exchange.status();
    const std::vector<float> params(kN, 0.5f);
    for (const OptimizerTraits& traits : AllOptimizerTraits()) {
      SCOPED_TRACE(traits.name);
      OptimizerSpec spec;
      spec.kind = traits.kind;
      spec.freeze_step = 3;
      auto o = CreateOptimizer(spec, backend.get(), exchange->get(), params.data(), kN);
      if (!o.ok()) return o.status();
      EXPECT_EQ((*o)->freeze_step(),
                traits.compresses ? 3 : std::numeric_limits<int64_t>::max());
      EXPECT_EQ((*o)->size(), kN);
    }
    return absl::OkStatus();
  });
  EXPECT_TRUE(status.ok()) << status;
}

}  // namespace
}  // namespace onebit
