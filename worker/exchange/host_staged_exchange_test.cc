// HostStagedExchange against the same exchange called on host memory directly: the same
// bits for every call, with the tensors in a "device" whose bytes the host cannot read as
// floats (ScrambledBackend), so a device pointer that reached the host exchange unstaged
// would give other results.
#include "worker/exchange/host_staged_exchange.h"

#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/kernels.h"
#include "worker/exchange/peer_exchange.h"
#include "worker/transport/local_group.h"

namespace onebit {
namespace {

using ::testing::HasSubstr;
using kernels::Compressor;

// Device memory as far as the exchange can tell: its bytes are the host's XOR 0xA5, and
// only copies and zeroing work (every kernel is UNIMPLEMENTED: staging must not run any).
class ScrambledBackend final : public kernels::Backend {
 public:
  static constexpr uint8_t kKey = 0xA5;
  std::string name() const override { return "scrambled"; }
  kernels::MemorySpace memory_space() const override { return kernels::MemorySpace::kCuda; }
  absl::StatusOr<void*> Allocate(size_t bytes) override { return new uint8_t[bytes + 1]; }
  void Free(void* ptr) override { delete[] static_cast<uint8_t*>(ptr); }
  absl::Status Zero(void* ptr, size_t bytes) override {
    std::memset(ptr, kKey, bytes);
    return absl::OkStatus();
  }
  absl::Status CopyFromHost(void* dst, const void* src, size_t bytes) override {
    ++copies_from_host;
    for (size_t i = 0; i < bytes; ++i) {
      static_cast<uint8_t*>(dst)[i] = static_cast<const uint8_t*>(src)[i] ^ kKey;
    }
    return absl::OkStatus();
  }
  absl::Status CopyToHost(void* dst, const void* src, size_t bytes) override {
    ++copies_to_host;
    for (size_t i = 0; i < bytes; ++i) {
      static_cast<uint8_t*>(dst)[i] = static_cast<const uint8_t*>(src)[i] ^ kKey;
    }
    return absl::OkStatus();
  }
  absl::Status Copy(void* dst, const void* src, size_t bytes) override {
    std::memmove(dst, src, bytes);
    return absl::OkStatus();
  }
  absl::Status Synchronize() override { return absl::OkStatus(); }

#define ONEBIT_NO_KERNEL(signature) \
  absl::Status signature override { return absl::UnimplementedError("no kernels here"); }
  ONEBIT_NO_KERNEL(MomentumUpdate(float, const float*, float*, size_t))
  ONEBIT_NO_KERNEL(CompressWorker(const float*, const float*, float, size_t, size_t, size_t,
                                  float*, uint8_t*))
  ONEBIT_NO_KERNEL(ServerAggregate(const uint8_t*, int, size_t, float*, uint8_t*))
  ONEBIT_NO_KERNEL(Decompress(const uint8_t*, size_t, size_t, size_t, float*))
  ONEBIT_NO_KERNEL(CompressWorkerInt8(const float*, const float*, float, size_t, size_t, size_t,
                                      float*, uint8_t*))
  ONEBIT_NO_KERNEL(ServerAggregateInt8(const uint8_t*, int, size_t, float*, uint8_t*))
  ONEBIT_NO_KERNEL(DecompressInt8(const uint8_t*, size_t, size_t, size_t, float*))
  ONEBIT_NO_KERNEL(SumRows(const float*, int, size_t, float*))
  ONEBIT_NO_KERNEL(AverageRows(const float*, int, size_t, float*))
  ONEBIT_NO_KERNEL(AdamWarmupUpdate(const kernels::AdamHyper&, const float*, float, float*,
                                    float*, float*, size_t))
  ONEBIT_NO_KERNEL(FrozenAdamUpdate(const kernels::AdamHyper&, const float*, const float*,
                                    float*, float*, size_t))
  ONEBIT_NO_KERNEL(DecompressFrozenAdamUpdate(const uint8_t*, size_t, size_t,
                                              const kernels::AdamHyper&, const float*,
                                              const float*, float*, float*, size_t))
  ONEBIT_NO_KERNEL(ToWire(kernels::WireDtype, const float*, size_t, void*))
  ONEBIT_NO_KERNEL(SumWireRows(kernels::WireDtype, const void*, int, size_t, float*))
  ONEBIT_NO_KERNEL(WireToFloat(kernels::WireDtype, const void*, size_t, float*))
  ONEBIT_NO_KERNEL(SumSquares(const float*, size_t, double*))
  ONEBIT_NO_KERNEL(ZeroOneLocalUpdate(const kernels::AdamHyper&, const float*, const float*,
                                      float*, float*, float*, size_t))
  ONEBIT_NO_KERNEL(ZeroOneSyncPrepare(float, const float*, float*, size_t))
  ONEBIT_NO_KERNEL(ZeroOneSyncApply(float, float, const float*, const float*, const float*,
                                    float*, float*, float*, size_t))
  ONEBIT_NO_KERNEL(AdamMomentsUpdate(const kernels::AdamHyper&, const float*, float, float*,
                                     float*, size_t))
  ONEBIT_NO_KERNEL(AdamDirectionInto(const kernels::AdamHyper&, const float*, const float*,
                                     const float*, float*, size_t))
  ONEBIT_NO_KERNEL(Axpy(float, const float*, float*, size_t))
  ONEBIT_NO_KERNEL(Scale(float, float*, size_t))
  ONEBIT_NO_KERNEL(ApplyMask(const float*, float*, size_t))
  ONEBIT_NO_KERNEL(MarkNonzero(const float*, float*, size_t))
  ONEBIT_NO_KERNEL(FreshVarianceUpdate(float, float, const float*, const float*, float*, size_t))
  ONEBIT_NO_KERNEL(MaxDenomRatio(float, const float*, const float*, size_t, float*))
#undef ONEBIT_NO_KERNEL

  int copies_from_host = 0;
  int copies_to_host = 0;
};

// n floats in the scrambled backend's memory, and back.
class DeviceTensor {
 public:
  DeviceTensor(ScrambledBackend* b, const std::vector<float>& host) : b_(b), n_(host.size()) {
    ptr_ = static_cast<float*>(*b->Allocate(n_ * sizeof(float)));
    EXPECT_TRUE(b->CopyFromHost(ptr_, host.data(), n_ * sizeof(float)).ok());
  }
  ~DeviceTensor() { b_->Free(ptr_); }
  const float* get() const { return ptr_; }

 private:
  ScrambledBackend* b_;
  size_t n_;
  float* ptr_;
};

template <typename T>
std::vector<T> ToHost(ScrambledBackend& b, const void* device, size_t count) {
  std::vector<T> host(count);
  EXPECT_TRUE(b.CopyToHost(host.data(), device, count * sizeof(T)).ok());
  return host;
}

std::vector<float> Random(size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> x(n);
  for (float& v : x) v = dist(rng);
  return x;
}

std::vector<uint8_t> HostBlocks(const CompressedResult& r) {
  const size_t bytes = r.num_chunks * kernels::BlockBytes(r.compressor, r.chunk);
  return std::vector<uint8_t>(r.blocks, r.blocks + bytes);
}

// Every call of a staged PeerExchange against a plain one on the same transport, W ranks
// as threads, `steps` of warmup sums, momentum averages and 0/1 Adam's averages.
void ExpectSameBits(int w, size_t n, Compressor compressor) {
  const absl::Status status = RunLocalGroup(TransportKind::kInproc, w, [&](Transport& t) {
    auto host_backend = kernels::NewCpuBackend();
    auto plain = PeerExchange::Create(host_backend.get(), &t, n, ExactAllreduceOptions(),
                                      compressor);
    if (!plain.ok()) return plain.status();
    ScrambledBackend device;
    auto staged_host = kernels::NewCpuBackend();
    auto inner = PeerExchange::Create(staged_host.get(), &t, n, ExactAllreduceOptions(),
                                      compressor);
    if (!inner.ok()) return inner.status();
    auto staged = HostStagedExchange::Create(&device, std::move(staged_host), *std::move(inner), n);
    if (!staged.ok()) return staged.status();
    EXPECT_EQ((*staged)->world_size(), w);
    const std::string who = absl::StrCat("rank ", t.rank(), " of ", w, ", n ", n, ", ",
                                         kernels::CompressorName(compressor));
    for (int64_t step = 1; step <= 6; ++step) {
      const std::vector<float> g = Random(n, t.rank() * 100 + step);
      const std::vector<float> m = Random(n, t.rank() * 100 + step + 50);
      const DeviceTensor dg(&device, g), dm(&device, m);
      if (step <= 2) {  // warmup
        auto want = (*plain)->SumGradients(step, g.data());
        auto got = (*staged)->SumGradients(step, dg.get());
        if (!want.ok()) return want.status();
        if (!got.ok()) return got.status();
        EXPECT_EQ(ToHost<float>(device, *got, n), std::vector<float>(*want, *want + n)) << who;
        continue;
      }
      auto want = step == 6 ? (*plain)->CompressedAverage(step, m.data())
                            : (*plain)->AverageMomentum(step, m.data(), g.data(), 0.9f);
      auto got = step == 6 ? (*staged)->CompressedAverage(step, dm.get())
                           : (*staged)->AverageMomentum(step, dm.get(), dg.get(), 0.9f);
      if (!want.ok()) return want.status();
      if (!got.ok()) return got.status();
      EXPECT_EQ(got->num_chunks, want->num_chunks) << who;
      EXPECT_EQ(got->chunk, want->chunk) << who;
      EXPECT_EQ(got->compressor, want->compressor) << who;
      EXPECT_EQ(got->blocks != nullptr, want->blocks != nullptr) << who;
      EXPECT_EQ(got->momentum != nullptr, want->momentum != nullptr) << who;
      if (want->blocks != nullptr && got->blocks != nullptr) {
        const std::vector<uint8_t> expected = HostBlocks(*want);
        EXPECT_EQ(ToHost<uint8_t>(device, got->blocks, expected.size()), expected)
            << who << " step " << step;
      }
      if (want->momentum != nullptr && got->momentum != nullptr) {
        EXPECT_EQ(ToHost<float>(device, got->momentum, n),
                  std::vector<float>(want->momentum, want->momentum + n))
            << who << " step " << step;
      }
    }
    // The worker errors, the overflow vote and the byte counters are the host exchange's.
    auto want_errors = (*plain)->SaveErrors();
    auto got_errors = (*staged)->SaveErrors();
    if (!want_errors.ok()) return want_errors.status();
    if (!got_errors.ok()) return got_errors.status();
    EXPECT_EQ(*got_errors, *want_errors) << who;
    auto want_vote = (*plain)->AnyOverflow(7, t.rank() == 0);
    auto got_vote = (*staged)->AnyOverflow(7, t.rank() == 0);
    if (!want_vote.ok()) return want_vote.status();
    if (!got_vote.ok()) return got_vote.status();
    EXPECT_EQ(*got_vote, *want_vote) << who;
    EXPECT_EQ((*staged)->bytes_sent(), (*plain)->bytes_sent()) << who;
    EXPECT_EQ((*staged)->bytes_received(), (*plain)->bytes_received()) << who;
    // ResetErrors reaches the host exchange's error buffers.
    if (absl::Status s = (*staged)->ResetErrors(8); !s.ok()) return s;
    auto reset = (*staged)->SaveErrors();
    if (!reset.ok()) return reset.status();
    for (const auto& [name, values] : *reset) {
      EXPECT_EQ(values, std::vector<float>(values.size(), 0.0f)) << who << " " << name;
    }
    return absl::OkStatus();
  });
  EXPECT_TRUE(status.ok()) << status;
}

TEST(HostStagedExchangeTest, SameBitsAsTheHostExchange) {
  for (const Compressor c : {Compressor::kOnebit, Compressor::kInt8}) {
    for (const int w : {1, 2, 3}) {
      for (const size_t n : {size_t{1}, size_t{1003}}) ExpectSameBits(w, n, c);
    }
  }
}

TEST(HostStagedExchangeTest, CopiesEachInputDownAndEachResultUpOnce) {
  const absl::Status status = RunLocalGroup(TransportKind::kInproc, 2, [](Transport& t) {
    ScrambledBackend device;
    auto host = kernels::NewCpuBackend();
    auto inner = PeerExchange::Create(host.get(), &t, 64);
    if (!inner.ok()) return inner.status();
    auto staged = HostStagedExchange::Create(&device, std::move(host), *std::move(inner), 64);
    if (!staged.ok()) return staged.status();
    const std::vector<float> x = Random(64, t.rank());
    const DeviceTensor dx(&device, x);
    const int down = device.copies_to_host, up = device.copies_from_host;
    if (auto r = (*staged)->AverageMomentum(1, dx.get(), dx.get(), 0.9f); !r.ok()) return r.status();
    EXPECT_EQ(device.copies_to_host - down, 2);  // m and g
    EXPECT_EQ(device.copies_from_host - up, 1);  // the blocks
    return absl::OkStatus();
  });
  EXPECT_TRUE(status.ok()) << status;
}

TEST(HostStagedExchangeTest, TheHostBackendMustUseHostMemory) {
  const absl::Status status = RunLocalGroup(TransportKind::kInproc, 1, [](Transport& t) {
    ScrambledBackend device;
    auto host = kernels::NewCpuBackend();
    auto inner = PeerExchange::Create(host.get(), &t, 8);
    if (!inner.ok()) return inner.status();
    auto staged = HostStagedExchange::Create(&device, std::make_unique<ScrambledBackend>(),
                                             *std::move(inner), 8);
    EXPECT_EQ(staged.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(staged.status().message()), HasSubstr("does not use host memory"));
    return absl::OkStatus();
  });
  EXPECT_TRUE(status.ok()) << status;
}

}  // namespace
}  // namespace onebit
