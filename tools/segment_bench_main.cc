// The hierarchical exchange's intra-node reduce-scatter by segment size: one node of L
// workers as threads over gloo on loopback, SumGradientsOfShard of n parameters, the
// slowest worker's mean time per call. It sizes HierarchicalOptions::segment_elements
// (transport calls against the 2 x L x segment floats of scratch).
//
//   bazel run //tools:onebit-segment-bench -- N L REPS SEGMENT [SEGMENT...]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "absl/status/status.h"
#include "common/status_macros.h"
#include "kernels/kernels.h"
#include "worker/exchange/hierarchical_exchange.h"
#include "worker/transport/local_group.h"

namespace onebit {
namespace {

absl::Status Run(size_t n, int local, int reps, size_t segment) {
  std::vector<double> seconds(local);
  ONEBIT_RETURN_IF_ERROR(RunLocalNodes(
      TransportKind::kGloo, 1, local, [&](Transport& intra, Transport& inter) -> absl::Status {
        auto backend = kernels::NewCpuBackend();
        HierarchicalOptions options;
        options.shard_state = true;
        options.segment_elements = segment;
        auto e = HierarchicalExchange::CreatePeer(backend.get(), &intra, &inter, n,
                                                  OnebitCodec(), options);
        if (!e.ok()) return e.status();
        const std::vector<float> g(n, 1.0f);
        ONEBIT_RETURN_IF_ERROR((*e)->SumGradientsOfShard(1, g.data()).status());  // warm
        const auto start = std::chrono::steady_clock::now();
        for (int r = 0; r < reps; ++r) {
          ONEBIT_RETURN_IF_ERROR((*e)->SumGradientsOfShard(r + 2, g.data()).status());
        }
        seconds[intra.rank()] =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() /
            reps;
        return absl::OkStatus();
      }));
  std::printf("n %zu, L %d, segment %zu elements (%zu calls): %.1f ms per reduce-scatter\n", n,
              local, segment, (n / local + segment - 1) / segment,
              1e3 * *std::max_element(seconds.begin(), seconds.end()));
  return absl::OkStatus();
}

}  // namespace
}  // namespace onebit

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr, "usage: %s N L REPS SEGMENT [SEGMENT...]\n", argv[0]);
    return 2;
  }
  const size_t n = std::strtoull(argv[1], nullptr, 10);
  const int local = std::atoi(argv[2]), reps = std::atoi(argv[3]);
  for (int a = 4; a < argc; ++a) {
    const absl::Status s = onebit::Run(n, local, reps, std::strtoull(argv[a], nullptr, 10));
    if (!s.ok()) {
      std::fprintf(stderr, "segment bench: %s\n", s.ToString().c_str());
      return 1;
    }
  }
  return 0;
}
