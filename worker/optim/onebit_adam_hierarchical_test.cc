// OnebitAdam over the hierarchical exchange against its float64 model
// (ReferenceHierarchicalOnebitAdam) over nodes x local_size workers as threads, on both
// transports, across the switch; plus the properties that pin it down exactly: inproc and
// gloo give the same bits, 4 nodes of one worker are flat peer mode bit for bit, and the
// inter-node bytes per compression step are those of one node-sized worker.
#include "worker/exchange/hierarchical_exchange.h"

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "kernels/kernels.h"
#include "worker/optim/onebit_adam.h"
#include "worker/optim/onebit_adam_reference.h"
#include "worker/optim/test_stream.h"
#include "worker/transport/local_group.h"

namespace onebit {
namespace {

constexpr int64_t kSteps = 12;
constexpr int64_t kFreezeStep = 5;
constexpr float kLr = 0.01f;

using test_stream::Grad;
using test_stream::Params;

struct Outcome {
  std::vector<std::vector<float>> params;  // per worker
  // Per worker, summed over the compression steps.
  std::vector<LinkBytes> intra, inter;
};

OnebitAdamOptions Options() {
  OnebitAdamOptions options;
  options.hyper.lr = kLr;
  options.freeze_step = kFreezeStep;
  return options;
}

// Runs OnebitAdam over a HierarchicalExchange on nodes x local workers.
Outcome RunHierarchical(TransportKind kind, int nodes, int local, size_t n) {
  const int w_total = nodes * local;
  Outcome run;
  run.params.resize(w_total);
  run.intra.resize(w_total);
  run.inter.resize(w_total);
  const std::vector<float> p0 = Params(n);
  const absl::Status status =
      RunLocalNodes(kind, nodes, local, [&](Transport& intra, Transport& inter) -> absl::Status {
        const int w = inter.rank() * local + intra.rank();
        auto backend = kernels::NewCpuBackend();
        auto exchange = HierarchicalExchange::CreatePeer(backend.get(), &intra, &inter, n);
        if (!exchange.ok()) return exchange.status();
        auto adam = OnebitAdam::Create(Options(), backend.get(), exchange->get(), p0.data(), n);
        if (!adam.ok()) return adam.status();
        for (int64_t t = 1; t <= kSteps; ++t) {
          const LinkBytes intra_before = (*exchange)->intra_node_bytes();
          const LinkBytes inter_before = (*exchange)->inter_node_bytes();
          const std::vector<float> g = Grad(w, t, n);
          if (absl::Status s = (*adam)->Step(g.data()); !s.ok()) return s;
          if (t > kFreezeStep) {
            run.intra[w].sent += (*exchange)->intra_node_bytes().sent - intra_before.sent;
            run.intra[w].received +=
                (*exchange)->intra_node_bytes().received - intra_before.received;
            run.inter[w].sent += (*exchange)->inter_node_bytes().sent - inter_before.sent;
            run.inter[w].received +=
                (*exchange)->inter_node_bytes().received - inter_before.received;
          }
        }
        auto p = (*adam)->ParamsToHost();
        if (!p.ok()) return p.status();
        run.params[w] = *p;
        return absl::OkStatus();
      });
  EXPECT_TRUE(status.ok()) << status;
  return run;
}

// Flat peer mode on w workers, for comparison.
std::vector<std::vector<float>> RunFlat(TransportKind kind, int w, size_t n) {
  std::vector<std::vector<float>> params(w);
  const std::vector<float> p0 = Params(n);
  const absl::Status status = RunLocalGroup(kind, w, [&](Transport& transport) -> absl::Status {
    auto backend = kernels::NewCpuBackend();
    auto adam = OnebitAdam::Create(Options(), backend.get(), &transport, p0.data(), n);
    if (!adam.ok()) return adam.status();
    for (int64_t t = 1; t <= kSteps; ++t) {
      const std::vector<float> g = Grad(transport.rank(), t, n);
      if (absl::Status s = (*adam)->Step(g.data()); !s.ok()) return s;
    }
    auto p = (*adam)->ParamsToHost();
    if (!p.ok()) return p.status();
    params[transport.rank()] = *p;
    return absl::OkStatus();
  });
  EXPECT_TRUE(status.ok()) << status;
  return params;
}

bool BitEqual(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// ||p - p_ref|| / ||p_ref - p_in||, after checking that every worker ends the same.
double Disagreement(const Outcome& run, int nodes, int local, size_t n) {
  for (size_t w = 1; w < run.params.size(); ++w) {
    EXPECT_TRUE(BitEqual(run.params[w], run.params[0])) << "worker " << w << " diverged";
  }
  ReferenceHyper h;
  h.lr = kLr;
  h.beta1 = 0.9f;
  h.beta2 = 0.999f;
  h.eps = 1e-8f;
  h.freeze_step = kFreezeStep;
  const std::vector<float> p0 = Params(n);
  ReferenceHierarchicalOnebitAdam reference(h, nodes, local, p0);
  for (int64_t t = 1; t <= kSteps; ++t) {
    std::vector<std::vector<float>> grads;
    for (int w = 0; w < nodes * local; ++w) grads.push_back(Grad(w, t, n));
    reference.Step(grads);
  }
  double diff = 0, moved = 0;
  for (size_t i = 0; i < n; ++i) {
    const double ref = reference.params()[i];
    diff += (run.params[0][i] - ref) * (run.params[0][i] - ref);
    moved += (ref - p0[i]) * (ref - p0[i]);
  }
  return std::sqrt(diff / moved);
}

using Topology = std::pair<int, int>;  // nodes x local size
using Param = std::tuple<TransportKind, Topology, size_t>;
class HierarchicalMatrixTest : public ::testing::TestWithParam<Param> {};

TEST_P(HierarchicalMatrixTest, MatchesFloat64Model) {
  const auto [kind, topology, n] = GetParam();
  const auto [nodes, local] = topology;
  const Outcome run = RunHierarchical(kind, nodes, local, n);
  EXPECT_LT(Disagreement(run, nodes, local, n), 1e-4);
}

std::string MatrixName(const ::testing::TestParamInfo<Param>& info) {
  const Topology topology = std::get<1>(info.param);
  return TransportKindName(std::get<0>(info.param)) + "_" + std::to_string(topology.first) + "x" +
         std::to_string(topology.second) + "_N" + std::to_string(std::get<2>(info.param));
}

INSTANTIATE_TEST_SUITE_P(
    Matrix, HierarchicalMatrixTest,
    ::testing::Combine(::testing::Values(TransportKind::kInproc, TransportKind::kGloo),
                       ::testing::Values(Topology{1, 1}, Topology{1, 4}, Topology{2, 2},
                                         Topology{4, 1}, Topology{2, 3}, Topology{3, 2}),
                       ::testing::Values(size_t{1}, size_t{7}, size_t{1001}, size_t{10007})),
    MatrixName);

TEST(OnebitAdamHierarchicalTest, InprocAndGlooGiveTheSameBits) {
  for (auto [nodes, local] : {std::pair{2, 3}, std::pair{3, 2}, std::pair{1, 4}}) {
    const Outcome a = RunHierarchical(TransportKind::kInproc, nodes, local, 1001);
    const Outcome b = RunHierarchical(TransportKind::kGloo, nodes, local, 1001);
    EXPECT_TRUE(BitEqual(a.params[0], b.params[0])) << nodes << "x" << local;
  }
}

TEST(OnebitAdamHierarchicalTest, NodesOfOneWorkerAreFlatPeerMode) {
  for (size_t n : {size_t{7}, size_t{10007}}) {
    const Outcome hierarchical = RunHierarchical(TransportKind::kInproc, 4, 1, n);
    const std::vector<std::vector<float>> flat = RunFlat(TransportKind::kInproc, 4, n);
    EXPECT_TRUE(BitEqual(hierarchical.params[0], flat[0])) << "n = " << n;
  }
}

TEST(OnebitAdamHierarchicalTest, OneNodeAveragesExactlyLikeFlatWarmup) {
  // With one node nothing is compressed: the compression stage is Adam with frozen variance
  // on the exact average, and no byte leaves the node.
  const Outcome run = RunHierarchical(TransportKind::kInproc, 1, 4, 1001);
  EXPECT_LT(Disagreement(run, 1, 4, 1001), 1e-5);
  for (const LinkBytes& b : run.inter) EXPECT_EQ(b.sent + b.received, 0u);
  for (const LinkBytes& b : run.intra) EXPECT_GT(b.sent, 0u);
}

TEST(OnebitAdamHierarchicalTest, InterNodeBytesAreThoseOfOneNodeSizedWorker) {
  constexpr size_t kN = 100000;
  constexpr int kNodes = 2, kLocal = 2;
  constexpr int64_t kCompressionSteps = kSteps - kFreezeStep;
  const Outcome run = RunHierarchical(TransportKind::kInproc, kNodes, kLocal, kN);
  const HierarchicalLayout layout = *HierarchicalLayout::Create(kN, kLocal, kNodes);
  // Each worker: its slice's compressed all-to-all and all-gather with the other node.
  const uint64_t per_worker_step =
      2 * (kNodes - 1) * kernels::CompressedBlockBytes(layout.chunk());
  uint64_t node0 = 0;
  for (int l = 0; l < kLocal; ++l) {
    EXPECT_EQ(run.inter[l].sent, per_worker_step * kCompressionSteps);
    EXPECT_EQ(run.inter[l].received, per_worker_step * kCompressionSteps);
    node0 += run.inter[l].sent;
  }
  // One worker of flat peer mode over the 2 nodes sends its whole padded tensor's blocks:
  // the node's workers together send the same, give or take one scale per slice.
  const size_t flat_chunk = PeerPaddedSize(kN, kNodes) / kNodes;
  const uint64_t flat_worker_step = 2 * (kNodes - 1) * kernels::CompressedBlockBytes(flat_chunk);
  EXPECT_LE(node0, flat_worker_step * kCompressionSteps * 1001 / 1000);
  EXPECT_GE(node0, flat_worker_step * kCompressionSteps);
  // Inside the node: the fp32 reduce-scatter of the gradient and the all-gather of the
  // slice's result blocks (one per node).
  const uint64_t intra_step = (kLocal - 1) * layout.slice() * sizeof(float) +
                              (kLocal - 1) * kNodes * kernels::CompressedBlockBytes(layout.chunk());
  EXPECT_EQ(run.intra[0].sent, intra_step * kCompressionSteps);
}

}  // namespace
}  // namespace onebit
