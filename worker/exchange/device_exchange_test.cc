// GPU workers' exchanges without a GPU: every exchange a GPU worker can use (peer over
// gloo, the ps shards, hierarchical with gloo between the nodes) made with a simulated
// device (kernels/simulated_device.h: memory the host cannot touch, so any host read of a
// device tensor kills the test) against the same exchange on the CPU backend: the same
// bits for every call, and per compression step only the packed blocks cross the "bus"
// (Backend::host_transfers), never an fp32 tensor. The hierarchical exchange's
// sharded-state calls too.
#include <algorithm>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/buffer.h"
#include "kernels/kernels.h"
#include "kernels/simulated_device.h"
#include "server/in_process_shards.h"
#include "worker/exchange/hierarchical_exchange.h"
#include "worker/exchange/peer_exchange.h"
#include "worker/exchange/ps_exchange.h"
#include "worker/transport/local_group.h"
#include "worker/transport/staged_transport.h"

namespace onebit {
namespace {

using kernels::Backend;


std::vector<float> Random(size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> x(n);
  for (float& v : x) v = dist(rng);
  return x;
}

template <typename T>
std::vector<T> Read(Backend* b, const T* p, size_t count) {
  std::vector<T> host(count);
  EXPECT_TRUE(b->CopyToHost(host.data(), p, count * sizeof(T)).ok());
  return host;
}

// Bytes a call moved between the host and the device.
struct Moved {
  uint64_t down = 0, up = 0;
};

// One worker's two exchanges, `cpu` on the CPU backend (host pointers) and `dev` on the
// simulated device, called with the same inputs; the results compared bit for bit.
class Pair {
 public:
  Pair(Exchange* cpu, Exchange* dev, Backend* device, size_t n, std::string who)
      : cpu_(cpu), dev_(dev), device_(device), n_(n), who_(std::move(who)) {}

  // Warmup sum of `g`; what the device's call moved.
  Moved Sum(int64_t step, const std::vector<float>& g) {
    kernels::Buffer<float> dg = *kernels::Buffer<float>::FromHost(device_, g.data(), n_);
    auto want = cpu_->SumGradients(step, g.data());
    const Backend::HostTransfers before = device_->host_transfers();
    auto got = dev_->SumGradients(step, dg.data());
    const Moved moved = Since(before);
    EXPECT_TRUE(want.ok() && got.ok()) << who_ << ": " << want.status() << " / " << got.status();
    if (want.ok() && got.ok()) {
      EXPECT_EQ(Read(device_, *got, n_), std::vector<float>(*want, *want + n_)) << who_;
    }
    return moved;
  }

  // AverageMomentum(m, g) (or CompressedAverage(m) without g); what the device's call moved.
  Moved Compressed(int64_t step, const std::vector<float>& m, const std::vector<float>* g) {
    kernels::Buffer<float> dm = *kernels::Buffer<float>::FromHost(device_, m.data(), n_);
    kernels::Buffer<float> dg;
    if (g != nullptr) dg = *kernels::Buffer<float>::FromHost(device_, g->data(), n_);
    auto want = g ? cpu_->AverageMomentum(step, m.data(), g->data(), 0.9f)
                  : cpu_->CompressedAverage(step, m.data());
    const Backend::HostTransfers before = device_->host_transfers();
    auto got = g ? dev_->AverageMomentum(step, dm.data(), dg.data(), 0.9f)
                 : dev_->CompressedAverage(step, dm.data());
    const Moved moved = Since(before);
    EXPECT_TRUE(want.ok() && got.ok()) << who_ << ": " << want.status() << " / " << got.status();
    if (!want.ok() || !got.ok()) return moved;
    EXPECT_EQ(got->num_chunks, want->num_chunks) << who_;
    EXPECT_EQ(got->chunk, want->chunk) << who_;
    EXPECT_EQ(got->codec, want->codec) << who_;
    EXPECT_EQ(got->blocks != nullptr, want->blocks != nullptr) << who_;
    EXPECT_EQ(got->exact != nullptr, want->exact != nullptr) << who_;
    if (want->blocks != nullptr && got->blocks != nullptr) {
      const size_t bytes = want->num_chunks * want->codec->BlockBytes(want->chunk);
      EXPECT_EQ(Read(device_, got->blocks, bytes),
                std::vector<uint8_t>(want->blocks, want->blocks + bytes))
          << who_ << " step " << step;
    }
    if (want->exact != nullptr && got->exact != nullptr) {
      EXPECT_EQ(Read(device_, got->exact, n_),
                std::vector<float>(want->exact, want->exact + n_))
          << who_ << " step " << step;
    }
    return moved;
  }

  // The errors (checkpoints), the overflow vote, ResetErrors.
  void SameState(int64_t step, bool overflow) {
    auto want = cpu_->SaveErrors();
    auto got = dev_->SaveErrors();
    ASSERT_TRUE(want.ok() && got.ok()) << who_;
    EXPECT_EQ(*got, *want) << who_;
    auto want_vote = cpu_->AnyOverflow(step, overflow);
    auto got_vote = dev_->AnyOverflow(step, overflow);
    ASSERT_TRUE(want_vote.ok() && got_vote.ok()) << who_;
    EXPECT_EQ(*got_vote, *want_vote) << who_;
    ASSERT_TRUE(dev_->ResetErrors(step + 1).ok());
    ASSERT_TRUE(cpu_->ResetErrors(step + 1).ok());
    auto reset = dev_->SaveErrors();
    ASSERT_TRUE(reset.ok());
    for (const auto& [name, values] : *reset) {
      EXPECT_EQ(values, std::vector<float>(values.size(), 0.0f)) << who_ << " " << name;
    }
    // And back: a checkpoint's errors restore into device memory.
    ASSERT_TRUE(dev_->RestoreErrors(*got).ok()) << who_;
    ASSERT_TRUE(cpu_->RestoreErrors(*want).ok()) << who_;
  }

 private:
  Moved Since(const Backend::HostTransfers& before) const {
    const Backend::HostTransfers now = device_->host_transfers();
    return {now.to_host - before.to_host, now.from_host - before.from_host};
  }

  Exchange* cpu_;
  Exchange* dev_;
  Backend* device_;
  size_t n_;
  std::string who_;
};

// Steps 1-2 warmup, 3-5 momentum, 6 0/1 Adam's average; `check` sees each compression
// step's bytes.
void RunSteps(Pair& pair, int rank, size_t n, const std::function<void(const Moved&)>& check) {
  for (int64_t step = 1; step <= 6; ++step) {
    const std::vector<float> g = Random(n, rank * 100 + step);
    const std::vector<float> m = Random(n, rank * 100 + step + 50);
    if (step <= 2) {
      pair.Sum(step, g);
    } else {
      check(pair.Compressed(step, m, step == 6 ? nullptr : &g));
    }
  }
}

class DeviceExchangeTest : public ::testing::TestWithParam<const Codec*> {};

// Peer mode over gloo's stand-in: PeerExchange on the device over a StagedTransport.
TEST_P(DeviceExchangeTest, PeerOverAStagedTransport) {
  const Codec* c = GetParam();
  for (const int w : {1, 3}) {
    for (const size_t n : {size_t{5}, size_t{40000}}) {
      const absl::Status status = RunLocalGroup(TransportKind::kInproc, w, [&](Transport& t) {
        auto cpu = kernels::NewCpuBackend();
        auto device = kernels::NewSimulatedDeviceBackend();
        if (!device.ok()) return device.status();
        auto staged = StagedTransport::Create(device->get(), &t);
        if (!staged.ok()) return staged.status();
        auto plain = PeerExchange::Create(cpu.get(), &t, n, ExactAllreduceOptions(), *c);
        auto dev = PeerExchange::Create(device->get(), staged->get(), n, ExactAllreduceOptions(), *c);
        if (!plain.ok()) return plain.status();
        if (!dev.ok()) return dev.status();
        const std::string who = absl::StrCat("peer, rank ", t.rank(), " of ", w, ", n ", n, ", ",
                                             std::string(c->name()));
        Pair pair(plain->get(), dev->get(), device->get(), n, who);
        const size_t block = c->BlockBytes((*dev)->compressed().chunk());
        RunSteps(pair, t.rank(), n, [&](const Moved& moved) {
          // Down: the W blocks of the all-to-all and this rank's server block; up: the W
          // blocks of its chunk and the W gathered ones. Nothing else, no fp32.
          EXPECT_EQ(moved.down, (w + 1) * block) << who;
          EXPECT_EQ(moved.up, 2 * w * block) << who;
          if (c == &OnebitCodec() && n > 1000) {
            EXPECT_LT(moved.down + moved.up, n * sizeof(float) / 2) << who;
          }
        });
        pair.SameState(7, t.rank() == 0);
        return absl::OkStatus();
      });
      EXPECT_TRUE(status.ok()) << status;
    }
  }
}

// ps mode: PsExchange on the device against real shard services.
TEST_P(DeviceExchangeTest, PsShards) {
  const Codec* c = GetParam();
  const int w = 2, s = 3;
  const size_t n = 30001;
  server::InProcessShards for_cpu(s, w, n, *c), for_device(s, w, n, *c);
  PsExchangeOptions options;
  options.codec = c;
  std::vector<std::thread> threads;
  for (int rank = 0; rank < w; ++rank) {
    threads.emplace_back([&, rank] {
      auto cpu = kernels::NewCpuBackend();
      auto device = kernels::NewSimulatedDeviceBackend();
      ASSERT_TRUE(device.ok()) << device.status();
      auto plain = PsExchange::Create(cpu.get(), rank, w, n, for_cpu.addresses, options);
      auto dev = PsExchange::Create(device->get(), rank, w, n, for_device.addresses, options);
      ASSERT_TRUE(plain.ok()) << plain.status();
      ASSERT_TRUE(dev.ok()) << dev.status();
      const std::string who = absl::StrCat("ps, rank ", rank, ", ", std::string(c->name()));
      Pair pair(plain->get(), dev->get(), device->get(), n, who);
      const size_t blocks = s * (*dev)->layout().block_bytes();
      RunSteps(pair, rank, n, [&](const Moved& moved) {
        EXPECT_EQ(moved.down, blocks) << who;  // the S pushes
        EXPECT_EQ(moved.up, blocks) << who;    // the S results
      });
      // The warmup moves the fp32 runs themselves: that is what goes on the wire.
      const std::vector<float> g = Random(n, 99);
      const Moved warm = pair.Sum(7, g);
      EXPECT_EQ(warm.down, n * sizeof(float)) << who;
      EXPECT_EQ(warm.up, n * sizeof(float)) << who;
      auto want = (*plain)->SaveErrors();
      auto got = (*dev)->SaveErrors();
      ASSERT_TRUE(want.ok() && got.ok());
      EXPECT_EQ(*got, *want) << who;
    });
  }
  for (auto& t : threads) t.join();
}

// Hierarchical with gloo between the nodes: NCCL's stand-in inside the node (a
// StagedTransport too), the inter-node CompressedAllreduce on the device.
TEST_P(DeviceExchangeTest, HierarchicalWithAStagedTransportBetweenNodes) {
  const Codec* c = GetParam();
  const size_t n = 10007;
  const absl::Status status = RunLocalNodes(
      TransportKind::kInproc, 2, 2, [&](Transport& intra, Transport& inter) -> absl::Status {
        auto cpu = kernels::NewCpuBackend();
        auto device = kernels::NewSimulatedDeviceBackend();
        if (!device.ok()) return device.status();
        auto staged_intra = StagedTransport::Create(device->get(), &intra);
        auto staged_inter = StagedTransport::Create(device->get(), &inter);
        if (!staged_intra.ok()) return staged_intra.status();
        if (!staged_inter.ok()) return staged_inter.status();
        auto plain = HierarchicalExchange::CreatePeer(cpu.get(), &intra, &inter, n, *c);
        auto dev = HierarchicalExchange::CreatePeer(device->get(), staged_intra->get(),
                                                    staged_inter->get(), n, *c);
        if (!plain.ok()) return plain.status();
        if (!dev.ok()) return dev.status();
        Pair pair(plain->get(), dev->get(), device->get(), n,
                  absl::StrCat("hierarchical, node ", inter.rank(), " local ", intra.rank()));
        RunSteps(pair, inter.rank() * 2 + intra.rank(), n, [](const Moved&) {});
        pair.SameState(7, false);
        return absl::OkStatus();
      });
  EXPECT_TRUE(status.ok()) << status;
}

// A sharded call's result on the device (`got`) against the CPU's (`want`): the same form
// and bits (exact: the slice's `slice` floats).
void ExpectSameResult(Backend* device, const CompressedResult& want, const CompressedResult& got,
                      size_t slice, const std::string& who) {
  EXPECT_EQ(got.num_chunks, want.num_chunks) << who;
  EXPECT_EQ(got.chunk, want.chunk) << who;
  EXPECT_EQ(got.codec, want.codec) << who;
  ASSERT_EQ(got.blocks != nullptr, want.blocks != nullptr) << who;
  ASSERT_EQ(got.exact != nullptr, want.exact != nullptr) << who;
  if (want.blocks != nullptr) {
    const size_t bytes = want.num_chunks * want.codec->BlockBytes(want.chunk);
    EXPECT_EQ(Read(device, got.blocks, bytes),
              std::vector<uint8_t>(want.blocks, want.blocks + bytes))
        << who;
  }
  if (want.exact != nullptr) {
    EXPECT_EQ(Read(device, got.exact, slice), std::vector<float>(want.exact, want.exact + slice))
        << who;
  }
}

// Sharded state on the device: every shard call (the slice's sums and results, the LAMB
// rows written by the caller, the parameters' all-gather, the partials) against the CPU's,
// bit for bit, with staged transports inside and between the nodes. The simulated device
// kills the test if the exchange reads device memory on the host.
TEST_P(DeviceExchangeTest, ShardedHierarchicalWithStagedTransports) {
  const Codec* c = GetParam();
  const size_t n = 10007;
  for (const int nodes : {1, 2}) {
    const absl::Status status = RunLocalNodes(
        TransportKind::kInproc, nodes, 2, [&](Transport& intra, Transport& inter) -> absl::Status {
          auto cpu = kernels::NewCpuBackend();
          auto device = kernels::NewSimulatedDeviceBackend();
          if (!device.ok()) return device.status();
          Backend* d = device->get();
          auto staged_intra = StagedTransport::Create(d, &intra);
          auto staged_inter = StagedTransport::Create(d, &inter);
          if (!staged_intra.ok()) return staged_intra.status();
          if (!staged_inter.ok()) return staged_inter.status();
          HierarchicalOptions sharded;
          sharded.shard_state = true;
          sharded.segment_elements = 1000;  // a slice of 5008: six segments, the last short
          auto plain =
              HierarchicalExchange::CreatePeer(cpu.get(), &intra, &inter, n, *c, sharded);
          auto dev = HierarchicalExchange::CreatePeer(d, staged_intra->get(),
                                                      staged_inter->get(), n, *c, sharded);
          if (!plain.ok()) return plain.status();
          if (!dev.ok()) return dev.status();
          const int l = intra.rank(), w = inter.rank() * 2 + l;
          const std::string who = absl::StrCat("sharded, ", nodes, " nodes, node ", inter.rank(),
                                               " local ", l, ", ", std::string(c->name()));
          const HierarchicalLayout& layout = (*dev)->layout();
          const size_t slice = layout.slice(), count = layout.slice_count(l);
          for (int64_t step = 1; step <= 4; ++step) {
            const std::vector<float> g = Random(n, w * 100 + step);
            const std::vector<float> x = Random(n, w * 100 + step + 50);
            std::vector<float> m = Random(slice, step + 70);
            std::fill(m.begin() + count, m.end(), 0.0f);
            auto dg = kernels::Buffer<float>::FromHost(d, g.data(), n);
            auto dx = kernels::Buffer<float>::FromHost(d, x.data(), n);
            auto dm = kernels::Buffer<float>::FromHost(d, m.data(), slice);
            if (!dg.ok() || !dx.ok() || !dm.ok()) return absl::InternalError("device buffers");

            auto want_sum = (*plain)->SumGradientsOfShard(step, g.data());
            auto got_sum = (*dev)->SumGradientsOfShard(step, dg->data());
            if (!want_sum.ok()) return want_sum.status();
            if (!got_sum.ok()) return got_sum.status();
            EXPECT_EQ(Read(d, *got_sum, slice), std::vector<float>(*want_sum, *want_sum + slice))
                << who << " step " << step;

            const float g_scale = step % 2 == 0 ? 0.75f : 1.0f;  // a clipping step, or not
            auto want_avg =
                (*plain)->AverageMomentumOfShard(step, m.data(), g.data(), 0.9f, g_scale);
            auto got_avg =
                (*dev)->AverageMomentumOfShard(step, dm->data(), dg->data(), 0.9f, g_scale);
            if (!want_avg.ok()) return want_avg.status();
            if (!got_avg.ok()) return got_avg.status();
            ExpectSameResult(d, *want_avg, *got_avg, slice, absl::StrCat(who, " step ", step));

            auto want_rows = (*plain)->ShardRows(step, x.data());
            auto got_rows = (*dev)->ShardRows(step, dx->data());
            if (!want_rows.ok()) return want_rows.status();
            if (!got_rows.ok()) return got_rows.status();
            std::vector<float> rows(*want_rows, *want_rows + 2 * slice);
            EXPECT_EQ(Read(d, *got_rows, 2 * slice), rows) << who << " step " << step;
            for (float& v : rows) v *= 0.5f;  // the caller's edit, on both
            std::copy(rows.begin(), rows.end(), *want_rows);
            if (absl::Status s = d->CopyFromHost(*got_rows, rows.data(), rows.size() * 4);
                !s.ok()) {
              return s;
            }
            auto want_rows_avg = (*plain)->CompressedAverageOfRows(step);
            auto got_rows_avg = (*dev)->CompressedAverageOfRows(step);
            if (!want_rows_avg.ok()) return want_rows_avg.status();
            if (!got_rows_avg.ok()) return got_rows_avg.status();
            ExpectSameResult(d, *want_rows_avg, *got_rows_avg, slice,
                             absl::StrCat(who, " step ", step, " rows"));

            std::vector<float> p = Random(layout.padded_size(), w * 100 + step + 90);
            auto dp = kernels::Buffer<float>::FromHost(d, p.data(), p.size());
            if (!dp.ok()) return dp.status();
            if (absl::Status s = (*plain)->AllGatherShards(p.data()); !s.ok()) return s;
            if (absl::Status s = (*dev)->AllGatherShards(dp->data()); !s.ok()) return s;
            EXPECT_EQ(Read(d, dp->data(), p.size()), p) << who << " step " << step;

            const std::vector<double> mine = {w + 0.25, -1.0 / step};
            auto want_partials = (*plain)->GatherPartials(mine);
            auto got_partials = (*dev)->GatherPartials(mine);
            if (!want_partials.ok()) return want_partials.status();
            if (!got_partials.ok()) return got_partials.status();
            EXPECT_EQ(*got_partials, *want_partials) << who << " step " << step;
          }
          return absl::OkStatus();
        });
    EXPECT_TRUE(status.ok()) << status;
  }
}

// Every registered codec: the CPU backend is the reference, no model needed.
INSTANTIATE_TEST_SUITE_P(Compressors, DeviceExchangeTest, ::testing::ValuesIn(AllCodecs()),
                         [](const auto& info) { return std::string(info.param->name()); });

}  // namespace
}  // namespace onebit
