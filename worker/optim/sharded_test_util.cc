#include "worker/optim/sharded_test_util.h"

#include <cstring>
#include <utility>

#include "compression/codec_registry.h"
#include "worker/exchange/hierarchical_exchange.h"
#include "worker/optim/test_stream.h"
#include "worker/transport/local_group.h"

namespace onebit::sharded_test {
namespace {

bool SameBits(const float* a, const float* b, size_t count) {
  return count == 0 || std::memcmp(a, b, count * sizeof(float)) == 0;
}

}  // namespace

absl::Status RunJob(int nodes, int local, size_t n, const std::string& codec, bool shard,
                    const std::function<absl::Status(int worker, kernels::Backend* backend,
                                                     Exchange* exchange)>& body) {
  const absl::StatusOr<const Codec*> found = FindCodec(codec);
  if (!found.ok()) return found.status();
  return RunLocalNodes(
      TransportKind::kInproc, nodes, local,
      [&](Transport& intra, Transport& inter) -> absl::Status {
        auto backend = kernels::NewCpuBackend();
        HierarchicalOptions options;
        options.shard_state = shard;
        auto exchange = HierarchicalExchange::CreatePeer(backend.get(), &intra, &inter, n,
                                                         **found, options);
        if (!exchange.ok()) return exchange.status();
        return body(inter.rank() * local + intra.rank(), backend.get(), exchange->get());
      });
}

std::vector<float> GradientWithZeros(int worker, int64_t step, size_t n, size_t first,
                                     size_t every) {
  std::vector<float> g = test_stream::Grad(worker, step, n);
  for (size_t i = first; i < n; i += every) g[i] = 0.0f;
  return g;
}

::testing::AssertionResult SameParamsEveryStep(const std::vector<std::vector<float>>& sharded,
                                               const std::vector<std::vector<float>>& whole,
                                               size_t n, int64_t steps) {
  const size_t count = static_cast<size_t>(steps);
  if (sharded.size() != count || whole.size() != count) {
    return ::testing::AssertionFailure() << sharded.size() << " and " << whole.size()
                                         << " steps' parameters, not " << steps;
  }
  for (size_t t = 0; t < count; ++t) {
    if (sharded[t].size() != n || whole[t].size() != n) {
      return ::testing::AssertionFailure()
             << "step " << t + 1 << ": " << sharded[t].size() << " and " << whole[t].size()
             << " parameters, not " << n;
    }
    if (!SameBits(sharded[t].data(), whole[t].data(), n)) {
      return ::testing::AssertionFailure() << "step " << t + 1 << ": other parameter bits";
    }
  }
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult SameOverRange(const std::vector<float>& range, size_t begin,
                                         const std::vector<float>& whole, size_t n) {
  if (whole.size() != n) {
    return ::testing::AssertionFailure() << "the unsharded tensor has " << whole.size()
                                         << " elements, not " << n;
  }
  if (begin + range.size() > n) {
    return ::testing::AssertionFailure() << "the state range [" << begin << ", "
                                         << begin + range.size() << ") is past " << n;
  }
  if (!SameBits(range.data(), whole.data() + begin, range.size())) {
    return ::testing::AssertionFailure() << "other bits over the state range";
  }
  return ::testing::AssertionSuccess();
}

absl::StatusOr<Saved> Save(Optimizer& o) {
  Saved s;
  const size_t lo = o.state_begin(), hi = lo + o.state_count();
  for (const StateSpec& spec : o.CheckpointStates()) {
    auto v = o.StateToHost(spec.name, lo, hi);
    if (!v.ok()) return v.status();
    s.tensors[spec.name] = *std::move(v);
  }
  s.scalars = o.CheckpointScalars();
  auto errors = o.exchange().SaveErrors();
  if (!errors.ok()) return errors.status();
  s.errors = *std::move(errors);
  return s;
}

absl::Status Restore(Optimizer& o, int64_t step, int64_t freeze_step, const Saved& saved) {
  if (absl::Status r = o.Restore(step, freeze_step, saved.tensors, saved.scalars); !r.ok()) {
    return r;
  }
  return o.exchange().RestoreErrors(saved.errors);
}

}  // namespace onebit::sharded_test
