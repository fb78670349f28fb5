// The CUDA backend against the CPU backend's scalar kernels, which define the arithmetic
// (kernels.h). Element values and sign bits must agree bit for bit; the only allowed
// difference is the summation order of sums of squares, so scales agree to within
// rounding, and values computed from a scale agree bit for bit when the two scales do.
//
// Lengths sweep the packing edge cases (not multiples of 8, of 32, of num_chunks * 8), and
// compressed blocks sit at odd addresses, as they do inside a buffer of several blocks.
// Without a GPU every test that needs one skips.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/permanent_error.h"
#include "gtest/gtest.h"
#include "kernels/cuda_backend.h"
#include "kernels/kernels.h"

namespace onebit::kernels {
namespace {

constexpr size_t kLengths[] = {0, 1, 7, 8, 9, 31, 32, 33, 1000, 10007};
constexpr size_t kNumChunks[] = {1, 3, 4};
constexpr int kNumWorkers[] = {1, 2, 3, 8};
// Scales differ only by the order of a float64 sum of squares: far below this.
constexpr double kScaleTolerance = 1e-6;

#define ASSERT_OK(expr)                                                  \
  do {                                                                   \
    const absl::Status assert_ok_status_ = (expr);                       \
    ASSERT_TRUE(assert_ok_status_.ok()) << #expr << ": " << assert_ok_status_; \
  } while (0)

size_t CeilDiv(size_t a, size_t b) { return (a + b - 1) / b; }

uint32_t Bits(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  return bits;
}

float BlockScale(const std::vector<uint8_t>& blocks, size_t offset) {
  float s;
  std::memcpy(&s, blocks.data() + offset, sizeof(s));
  return s;
}

// An array in the CUDA backend's memory, filled from the host, that starts `misalign`
// elements into its allocation (misalign = 1 on bytes gives an odd address).
template <typename T>
class DeviceArray {
 public:
  DeviceArray(Backend* backend, const std::vector<T>& host, size_t misalign = 0)
      : backend_(backend), size_(host.size()) {
    absl::StatusOr<void*> base = backend->Allocate((misalign + size_) * sizeof(T));
    status_ = base.status();
    if (!status_.ok()) return;
    base_ = *base;
    data_ = static_cast<T*>(base_) + misalign;
    status_ = backend->CopyFromHost(data_, host.data(), size_ * sizeof(T));
  }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  ~DeviceArray() { backend_->Free(base_); }

  const absl::Status& status() const { return status_; }
  T* data() { return data_; }

  // The contents; on failure records it and returns an empty vector, which then fails the
  // comparison it feeds.
  std::vector<T> Read() const {
    std::vector<T> host(size_);
    const absl::Status status = backend_->CopyToHost(host.data(), data_, size_ * sizeof(T));
    if (!status.ok()) {
      ADD_FAILURE() << "CopyToHost: " << status;
      return {};
    }
    return host;
  }

 private:
  Backend* backend_;
  size_t size_;
  void* base_ = nullptr;
  T* data_ = nullptr;
  absl::Status status_;
};

::testing::AssertionResult FloatsBitEqual(const std::vector<float>& cuda,
                                          const std::vector<float>& cpu) {
  if (cuda.size() != cpu.size()) {
    return ::testing::AssertionFailure()
           << "sizes differ: cuda " << cuda.size() << ", cpu " << cpu.size();
  }
  size_t mismatches = 0, first = 0;
  for (size_t i = 0; i < cpu.size(); ++i) {
    if (Bits(cuda[i]) != Bits(cpu[i]) && mismatches++ == 0) first = i;
  }
  if (mismatches == 0) return ::testing::AssertionSuccess();
  char detail[128];
  std::snprintf(detail, sizeof(detail), "cuda %.9g (0x%08x) vs cpu %.9g (0x%08x)",
                cuda[first], Bits(cuda[first]), cpu[first], Bits(cpu[first]));
  return ::testing::AssertionFailure() << mismatches << " of " << cpu.size()
                                       << " elements differ; first at " << first << ": "
                                       << detail;
}

// Values x - s*sign(x) computed with scales that may differ by rounding: bit-equal when the
// scales are, else within the scale's tolerance.
::testing::AssertionResult ErrorsMatch(const std::vector<float>& cuda,
                                       const std::vector<float>& cpu, float cuda_scale,
                                       float cpu_scale) {
  if (Bits(cuda_scale) == Bits(cpu_scale)) return FloatsBitEqual(cuda, cpu);
  if (cuda.size() != cpu.size()) return FloatsBitEqual(cuda, cpu);
  for (size_t i = 0; i < cpu.size(); ++i) {
    const double tolerance =
        kScaleTolerance * (cpu_scale + std::max(std::fabs(cuda[i]), std::fabs(cpu[i])));
    if (!(std::fabs(double{cuda[i]} - cpu[i]) <= tolerance)) {
      return ::testing::AssertionFailure()
             << "element " << i << ": cuda " << cuda[i] << " vs cpu " << cpu[i]
             << " (scales " << cuda_scale << ", " << cpu_scale << ")";
    }
  }
  return ::testing::AssertionSuccess();
}

// `num_blocks` compressed blocks of `chunk` elements: sign bytes equal, scales within
// tolerance.
::testing::AssertionResult BlocksMatch(const std::vector<uint8_t>& cuda,
                                       const std::vector<uint8_t>& cpu, size_t num_blocks,
                                       size_t chunk) {
  const size_t block_bytes = CompressedBlockBytes(chunk);
  if (cuda.size() != num_blocks * block_bytes || cpu.size() != cuda.size()) {
    return ::testing::AssertionFailure() << "sizes differ: cuda " << cuda.size() << ", cpu "
                                         << cpu.size();
  }
  for (size_t k = 0; k < num_blocks; ++k) {
    const size_t offset = k * block_bytes;
    const float s_cuda = BlockScale(cuda, offset), s_cpu = BlockScale(cpu, offset);
    if (!(std::fabs(double{s_cuda} - s_cpu) <= kScaleTolerance * s_cpu)) {
      return ::testing::AssertionFailure()
             << "block " << k << " scale: cuda " << s_cuda << " vs cpu " << s_cpu;
    }
    for (size_t b = 4; b < block_bytes; ++b) {
      if (cuda[offset + b] != cpu[offset + b]) {
        return ::testing::AssertionFailure()
               << "block " << k << " sign byte " << b - 4 << " (elements " << 8 * (b - 4)
               << ".." << 8 * (b - 4) + 7 << "): cuda 0x" << std::hex << int{cuda[offset + b]}
               << " vs cpu 0x" << int{cpu[offset + b]};
      }
    }
  }
  return ::testing::AssertionSuccess();
}

// Gaussian values with exact zeros of both signs mixed in (sign(+-0) = +1).
std::vector<float> RandomFloats(std::mt19937& rng, size_t n, float stddev = 1.0f) {
  std::normal_distribution<float> normal(0.0f, stddev);
  std::vector<float> x(n);
  for (size_t i = 0; i < n; ++i) {
    x[i] = i % 17 == 5 ? 0.0f : i % 19 == 7 ? -0.0f : normal(rng);
  }
  return x;
}

// Variances: non-negative, some exactly zero.
std::vector<float> RandomVariances(std::mt19937& rng, size_t n) {
  std::vector<float> v = RandomFloats(rng, n, 1e-2f);
  for (float& x : v) x = x * x;
  return v;
}

std::vector<float> RandomMask(std::mt19937& rng, size_t n) {
  std::bernoulli_distribution keep(0.8);
  std::vector<float> mask(n);
  for (float& x : mask) x = keep(rng) ? 1.0f : 0.0f;
  return mask;
}

// num_blocks blocks of random signs; scales random and positive, one of them zero.
std::vector<uint8_t> RandomBlocks(std::mt19937& rng, size_t num_blocks, size_t chunk) {
  const size_t block_bytes = CompressedBlockBytes(chunk);
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> scale(0.01f, 2.0f);
  std::vector<uint8_t> blocks(num_blocks * block_bytes);
  for (size_t k = 0; k < num_blocks; ++k) {
    const float s = k == 1 ? 0.0f : scale(rng);
    std::memcpy(blocks.data() + k * block_bytes, &s, sizeof(s));
    for (size_t b = 4; b < block_bytes; ++b) blocks[k * block_bytes + b] = byte(rng);
  }
  return blocks;
}

AdamHyper Hyper(float weight_decay) {
  AdamHyper h;
  h.lr = 3e-3f;
  h.beta1 = 0.9f;
  h.beta2 = 0.999f;
  h.eps = 1e-8f;
  h.weight_decay = weight_decay;
  return h;
}

class CudaBackendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (CudaDeviceCount() == 0) {
      GTEST_SKIP() << "no CUDA device: CudaDeviceCount() == 0 (no GPU or no driver on this "
                      "machine, or a build without CUDA); run this test on a GPU machine";
    }
    absl::StatusOr<std::unique_ptr<Backend>> cuda = NewCudaBackend(0);
    ASSERT_TRUE(cuda.ok()) << cuda.status();
    cuda_ = std::move(*cuda);
    // The scalar kernels define the arithmetic; the AVX2 ones are tested against them.
    cpu_ = NewCpuBackend(/*allow_simd=*/false);
  }

  void TearDown() override {
    if (cuda_ != nullptr) {
      EXPECT_TRUE(cuda_->Synchronize().ok());
    }
  }

  Backend* cuda() { return cuda_.get(); }
  Backend* cpu() { return cpu_.get(); }

  std::mt19937 rng_{12345};

  // ServerAggregate of random blocks (at `misalign` bytes past an aligned address) and a
  // random error on the CUDA backend and the CPU one: the same bits and error.
  void ExpectServerAggregateMatchesCpu(size_t chunk, int num_workers, size_t misalign) {
    const std::vector<uint8_t> blocks = RandomBlocks(rng_, num_workers, chunk);
    std::vector<float> err = RandomFloats(rng_, chunk, 0.1f);
    std::vector<uint8_t> out(CompressedBlockBytes(chunk), 0xAB);
    DeviceArray<uint8_t> blocks_dev(cuda(), blocks, misalign);
    DeviceArray<float> err_dev(cuda(), err);
    DeviceArray<uint8_t> out_dev(cuda(), out, /*misalign=*/3);
    ASSERT_OK(blocks_dev.status());
    ASSERT_OK(err_dev.status());
    ASSERT_OK(out_dev.status());
    ASSERT_OK(cuda()->ServerAggregate(blocks_dev.data(), num_workers, chunk, err_dev.data(),
                                      out_dev.data()));
    ASSERT_OK(cpu()->ServerAggregate(blocks.data(), num_workers, chunk, err.data(), out.data()));
    const std::vector<uint8_t> out_cuda = out_dev.Read();
    ASSERT_TRUE(BlocksMatch(out_cuda, out, 1, chunk));
    EXPECT_TRUE(ErrorsMatch(err_dev.Read(), err, BlockScale(out_cuda, 0), BlockScale(out, 0)));
  }

 private:
  std::unique_ptr<Backend> cuda_;
  std::unique_ptr<Backend> cpu_;
};

TEST_F(CudaBackendTest, AllocateZeroBytesGivesDistinctPointers) {
  absl::StatusOr<void*> a = cuda()->Allocate(0);
  absl::StatusOr<void*> b = cuda()->Allocate(0);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_NE(*a, nullptr);
  EXPECT_NE(*b, nullptr);
  EXPECT_NE(*a, *b);
  // Host code cannot touch device memory: kernels from outside kernels/ use the stream.
  EXPECT_EQ(cuda()->HostAddress(*a), nullptr);
  EXPECT_EQ(cuda()->HostAddress(nullptr), nullptr);
  cuda()->Free(*a);
  cuda()->Free(*b);
  cuda()->Free(nullptr);
  EXPECT_EQ(cuda()->memory_space(), MemorySpace::kCuda);
  EXPECT_NE(CudaStreamOf(cuda()), nullptr);
}

TEST_F(CudaBackendTest, CopiesAndZero) {
  const std::vector<float> host = RandomFloats(rng_, 1000);
  DeviceArray<float> a(cuda(), host);
  DeviceArray<float> b(cuda(), std::vector<float>(1000, 7.0f));
  ASSERT_OK(a.status());
  ASSERT_OK(b.status());
  ASSERT_OK(cuda()->Copy(b.data(), a.data(), 1000 * sizeof(float)));
  EXPECT_TRUE(FloatsBitEqual(b.Read(), host));
  ASSERT_OK(cuda()->Zero(b.data() + 10, 20 * sizeof(float)));
  std::vector<float> expected = host;
  std::fill(expected.begin() + 10, expected.begin() + 30, 0.0f);
  EXPECT_TRUE(FloatsBitEqual(b.Read(), expected));
  ASSERT_OK(cuda()->Copy(b.data(), a.data(), 0));
  ASSERT_OK(cuda()->Zero(b.data(), 0));
  ASSERT_OK(cuda()->Synchronize());
}

TEST_F(CudaBackendTest, MomentumUpdateMatchesCpu) {
  for (size_t n : kLengths) {
    SCOPED_TRACE(absl::StrCat("n = ", n));
    const std::vector<float> g = RandomFloats(rng_, n);
    std::vector<float> m = RandomFloats(rng_, n);
    DeviceArray<float> g_dev(cuda(), g), m_dev(cuda(), m);
    ASSERT_OK(g_dev.status());
    ASSERT_OK(m_dev.status());
    ASSERT_OK(cuda()->MomentumUpdate(0.9f, g_dev.data(), m_dev.data(), n));
    ASSERT_OK(cpu()->MomentumUpdate(0.9f, g.data(), m.data(), n));
    EXPECT_TRUE(FloatsBitEqual(m_dev.Read(), m));
  }
}

TEST_F(CudaBackendTest, CompressWorkerMatchesCpu) {
  for (size_t n : kLengths) {
    for (size_t num_chunks : kNumChunks) {
      // Padding to the next multiple of num_chunks * 8, and one more round of it, so that
      // some chunks are all padding.
      for (size_t extra_rounds : {0, 1}) {
        for (bool fused : {false, true}) {
          const size_t unit = num_chunks * 8;
          const size_t n_pad = (CeilDiv(n, unit) + extra_rounds) * unit;
          const size_t chunk = n_pad / num_chunks;
          SCOPED_TRACE(absl::StrCat("n = ", n, ", num_chunks = ", num_chunks, ", chunk = ",
                                    chunk, fused ? ", fused momentum" : ""));
          const std::vector<float> m = RandomFloats(rng_, n);
          const std::vector<float> g = RandomFloats(rng_, n);
          std::vector<float> err = RandomFloats(rng_, n_pad, 0.1f);
          // Some x = m + err exactly 0.
          for (size_t i = 3; i < n; i += 11) err[i] = -m[i];
          const size_t out_bytes = num_chunks * CompressedBlockBytes(chunk);
          std::vector<uint8_t> out(out_bytes, 0xAB);

          DeviceArray<float> m_dev(cuda(), m), g_dev(cuda(), g), err_dev(cuda(), err);
          DeviceArray<uint8_t> out_dev(cuda(), out, /*misalign=*/1);
          ASSERT_OK(m_dev.status());
          ASSERT_OK(g_dev.status());
          ASSERT_OK(err_dev.status());
          ASSERT_OK(out_dev.status());
          ASSERT_OK(cuda()->CompressWorker(m_dev.data(), fused ? g_dev.data() : nullptr, 0.9f,
                                           n, num_chunks, chunk, err_dev.data(),
                                           out_dev.data()));
          ASSERT_OK(cpu()->CompressWorker(m.data(), fused ? g.data() : nullptr, 0.9f, n,
                                          num_chunks, chunk, err.data(), out.data()));

          const std::vector<uint8_t> out_cuda = out_dev.Read();
          ASSERT_TRUE(BlocksMatch(out_cuda, out, num_chunks, chunk));
          EXPECT_TRUE(ErrorsMatch(err_dev.Read(), err, BlockScale(out_cuda, 0),
                                  BlockScale(out, 0)));
          // The fused momentum is not written back.
          EXPECT_TRUE(FloatsBitEqual(m_dev.Read(), m));
        }
      }
    }
  }
}

TEST_F(CudaBackendTest, ServerAggregateMatchesCpu) {
  for (size_t length : kLengths) {
    for (int num_workers : kNumWorkers) {
      const size_t chunk = CeilDiv(length, 8) * 8;
      SCOPED_TRACE(absl::StrCat("chunk = ", chunk, ", num_workers = ", num_workers));
      ExpectServerAggregateMatchesCpu(chunk, num_workers, /*misalign=*/1);
      if (HasFatalFailure()) return;
    }
  }
}

// Many workers: the kernel stages scales in shared memory in tiles of 256 workers.
TEST_F(CudaBackendTest, ServerAggregateManyWorkersMatchesCpu) {
  for (int num_workers : {255, 256, 257, 600}) {
    SCOPED_TRACE(absl::StrCat("num_workers = ", num_workers));
    ExpectServerAggregateMatchesCpu(1000, num_workers, /*misalign=*/0);
    if (HasFatalFailure()) return;
  }
}

// Every way of reading the workers' bits (ServerBitLoads) gives the CPU's bits and error:
// lengths in whole and partial warp rows, past one pass of the grid (4096 blocks of 8
// warps), 1 to 300 workers (word tiles of 8 and scale tiles of 256 crossed), and blocks at
// an odd address, where the word readings fall back to the thread bytes.
TEST_F(CudaBackendTest, ServerAggregateEveryBitLoadingMatchesCpu) {
  struct Case {
    size_t chunk;
    int num_workers;
    size_t misalign;
  };
  const std::vector<Case> cases = {
      {32, 1, 0},    {96, 3, 0},   {1024, 8, 0},  {1056, 9, 0},  {10016, 17, 0},
      {4128, 300, 0}, {1000, 8, 0}, {1024, 8, 1},  {(size_t{4096} * 8 * 4 * 128) + 160, 2, 0},
  };
  for (ServerBitLoads loads : {ServerBitLoads::kWarpWords2, ServerBitLoads::kWarpWords4,
                               ServerBitLoads::kThreadBytes}) {
    ASSERT_OK(SetServerBitLoads(cuda(), loads));
    for (const Case& c : cases) {
      SCOPED_TRACE(absl::StrCat("loads ", static_cast<int>(loads), ", chunk = ", c.chunk,
                                ", num_workers = ", c.num_workers, ", misalign = ", c.misalign));
      ExpectServerAggregateMatchesCpu(c.chunk, c.num_workers, c.misalign);
      if (HasFatalFailure()) return;
    }
  }
  std::unique_ptr<Backend> cpu_backend = NewCpuBackend();
  EXPECT_EQ(SetServerBitLoads(cpu_backend.get(), ServerBitLoads::kWarpWords2).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(CudaBackendTest, DecompressMatchesCpu) {
  constexpr float kSentinel = -12345.0f;
  for (size_t n : kLengths) {
    for (size_t num_chunks : kNumChunks) {
      const size_t unit = num_chunks * 8;
      const size_t chunk = CeilDiv(n, unit) * unit / num_chunks;
      SCOPED_TRACE(absl::StrCat("n = ", n, ", num_chunks = ", num_chunks));
      const std::vector<uint8_t> blocks = RandomBlocks(rng_, num_chunks, chunk);
      // One element past n shows that the padding is dropped.
      std::vector<float> out(n + 1, kSentinel);
      DeviceArray<uint8_t> blocks_dev(cuda(), blocks, /*misalign=*/1);
      DeviceArray<float> out_dev(cuda(), out);
      ASSERT_OK(blocks_dev.status());
      ASSERT_OK(out_dev.status());
      ASSERT_OK(cuda()->Decompress(blocks_dev.data(), num_chunks, chunk, n, out_dev.data()));
      ASSERT_OK(cpu()->Decompress(blocks.data(), num_chunks, chunk, n, out.data()));
      ASSERT_EQ(out[n], kSentinel);
      EXPECT_TRUE(FloatsBitEqual(out_dev.Read(), out));
    }
  }
}

TEST_F(CudaBackendTest, SumRowsMatchesCpu) {
  for (size_t count : kLengths) {
    for (int num_rows : {0, 1, 2, 3, 8}) {
      SCOPED_TRACE(absl::StrCat("count = ", count, ", num_rows = ", num_rows));
      const std::vector<float> rows = RandomFloats(rng_, num_rows * count);
      std::vector<float> out(count, 7.0f);
      DeviceArray<float> rows_dev(cuda(), rows), out_dev(cuda(), out);
      ASSERT_OK(rows_dev.status());
      ASSERT_OK(out_dev.status());
      ASSERT_OK(cuda()->SumRows(rows_dev.data(), num_rows, count, out_dev.data()));
      ASSERT_OK(cpu()->SumRows(rows.data(), num_rows, count, out.data()));
      EXPECT_TRUE(FloatsBitEqual(out_dev.Read(), out));
      if (num_rows > 0) {
        // In place, into the first row.
        ASSERT_OK(cuda()->SumRows(rows_dev.data(), num_rows, count, rows_dev.data()));
        std::vector<float> in_place = rows_dev.Read();
        in_place.resize(count);
        EXPECT_TRUE(FloatsBitEqual(in_place, out));
      }
    }
  }
}

TEST_F(CudaBackendTest, AverageRowsMatchesCpu) {
  for (size_t count : kLengths) {
    for (int num_rows : {1, 2, 3, 8}) {
      SCOPED_TRACE(absl::StrCat("count = ", count, ", num_rows = ", num_rows));
      const std::vector<float> rows = RandomFloats(rng_, num_rows * count);
      std::vector<float> out(count, 7.0f);
      DeviceArray<float> rows_dev(cuda(), rows), out_dev(cuda(), out);
      ASSERT_OK(rows_dev.status());
      ASSERT_OK(out_dev.status());
      ASSERT_OK(cuda()->AverageRows(rows_dev.data(), num_rows, count, out_dev.data()));
      ASSERT_OK(cpu()->AverageRows(rows.data(), num_rows, count, out.data()));
      EXPECT_TRUE(FloatsBitEqual(out_dev.Read(), out));
    }
  }
  EXPECT_FALSE(cuda()->AverageRows(nullptr, 0, 8, nullptr).ok());
}

// FloatsBitEqual, except that a NaN matches any NaN. inf + -inf is NaN on both, but the
// hardware picks its bits: x86 gives 0xffc00000, an H100 0x7fffffff (seen 2026-11-24).
// A NaN in a sum stops the trainer either way; every finite value must match bit for bit.
::testing::AssertionResult FloatsBitEqualNanAsNan(std::vector<float> cuda,
                                                  std::vector<float> cpu) {
  for (size_t i = 0; i < cuda.size() && i < cpu.size(); ++i) {
    if (std::isnan(cuda[i]) && std::isnan(cpu[i])) cuda[i] = cpu[i];
  }
  return FloatsBitEqual(cuda, cpu);
}

// The full-precision exchange's wire formats, with edge values (zeros, infinities,
// subnormals, fp16 overflow) among random ones: the same bits as the CPU backend.
TEST_F(CudaBackendTest, ToWireSumWireRowsAndWireToFloatMatchCpu) {
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> edges = {0.0f,  -0.0f, inf, -inf, 1e-30f, std::ldexp(1.0f, -25),
                                    std::ldexp(3.0f, -25), 65519.0f, 65520.0f, -7e4f, 3e38f,
                                    1.0f + std::ldexp(1.0f, -8), 1.0f + std::ldexp(1.0f, -11)};
  for (WireDtype dtype : {WireDtype::kFp32, WireDtype::kBf16, WireDtype::kFp16}) {
    const size_t eb = WireDtypeBytes(dtype);
    for (size_t count : kLengths) {
      for (int num_rows : {1, 3, 8}) {
        SCOPED_TRACE(absl::StrCat(WireDtypeName(dtype), ", count = ", count, ", rows = ",
                                  num_rows));
        const size_t total = count * num_rows;
        std::vector<float> x = RandomFloats(rng_, total);
        for (size_t i = 0; i < total && i < edges.size(); ++i) x[i] = edges[i];
        std::vector<uint8_t> wire(total * eb, 0);
        DeviceArray<float> x_dev(cuda(), x);
        DeviceArray<uint8_t> wire_dev(cuda(), wire);
        std::vector<float> sum(count, 7.0f), back(total, 7.0f);
        DeviceArray<float> sum_dev(cuda(), sum), back_dev(cuda(), back);
        ASSERT_OK(x_dev.status());
        ASSERT_OK(wire_dev.status());
        ASSERT_OK(sum_dev.status());
        ASSERT_OK(back_dev.status());
        ASSERT_OK(cuda()->ToWire(dtype, x_dev.data(), total, wire_dev.data()));
        ASSERT_OK(cpu()->ToWire(dtype, x.data(), total, wire.data()));
        EXPECT_EQ(wire_dev.Read(), wire);
        ASSERT_OK(cuda()->SumWireRows(dtype, wire_dev.data(), num_rows, count, sum_dev.data()));
        ASSERT_OK(cpu()->SumWireRows(dtype, wire.data(), num_rows, count, sum.data()));
        EXPECT_TRUE(FloatsBitEqualNanAsNan(sum_dev.Read(), sum));
        ASSERT_OK(cuda()->WireToFloat(dtype, wire_dev.data(), total, back_dev.data()));
        ASSERT_OK(cpu()->WireToFloat(dtype, wire.data(), total, back.data()));
        EXPECT_TRUE(FloatsBitEqual(back_dev.Read(), back));
      }
    }
  }
}

TEST_F(CudaBackendTest, AdamWarmupUpdateMatchesCpu) {
  for (size_t n : kLengths) {
    for (float weight_decay : {0.0f, 0.01f}) {
      for (float grad_scale : {1.0f, 0.37f}) {
        SCOPED_TRACE(absl::StrCat("n = ", n, ", weight_decay = ", weight_decay,
                                  ", grad_scale = ", grad_scale));
        const AdamHyper h = Hyper(weight_decay);
        const std::vector<float> g = RandomFloats(rng_, n);
        std::vector<float> m = RandomFloats(rng_, n, 0.1f);
        std::vector<float> v = RandomVariances(rng_, n);
        std::vector<float> p = RandomFloats(rng_, n);
        DeviceArray<float> g_dev(cuda(), g), m_dev(cuda(), m), v_dev(cuda(), v),
            p_dev(cuda(), p);
        ASSERT_OK(g_dev.status());
        ASSERT_OK(m_dev.status());
        ASSERT_OK(v_dev.status());
        ASSERT_OK(p_dev.status());
        ASSERT_OK(cuda()->AdamWarmupUpdate(h, g_dev.data(), grad_scale, m_dev.data(),
                                           v_dev.data(), p_dev.data(), n));
        ASSERT_OK(cpu()->AdamWarmupUpdate(h, g.data(), grad_scale, m.data(), v.data(),
                                          p.data(), n));
        EXPECT_TRUE(FloatsBitEqual(m_dev.Read(), m));
        EXPECT_TRUE(FloatsBitEqual(v_dev.Read(), v));
        EXPECT_TRUE(FloatsBitEqual(p_dev.Read(), p));
      }
    }
  }
}

TEST_F(CudaBackendTest, FrozenAdamUpdateMatchesCpu) {
  for (size_t n : kLengths) {
    for (float weight_decay : {0.0f, 0.01f}) {
      for (bool masked : {false, true}) {
        SCOPED_TRACE(absl::StrCat("n = ", n, ", weight_decay = ", weight_decay,
                                  masked ? ", masked, update_clip 2" : ""));
        AdamHyper h = Hyper(weight_decay);
        if (masked) h.update_clip = 2.0f;
        const std::vector<float> v = RandomVariances(rng_, n);
        const std::vector<float> mask = RandomMask(rng_, n);
        std::vector<float> m = RandomFloats(rng_, n, 0.1f);
        std::vector<float> p = RandomFloats(rng_, n);
        DeviceArray<float> v_dev(cuda(), v), mask_dev(cuda(), mask), m_dev(cuda(), m),
            p_dev(cuda(), p);
        ASSERT_OK(v_dev.status());
        ASSERT_OK(mask_dev.status());
        ASSERT_OK(m_dev.status());
        ASSERT_OK(p_dev.status());
        ASSERT_OK(cuda()->FrozenAdamUpdate(h, v_dev.data(), masked ? mask_dev.data() : nullptr,
                                           m_dev.data(), p_dev.data(), n));
        ASSERT_OK(cpu()->FrozenAdamUpdate(h, v.data(), masked ? mask.data() : nullptr,
                                          m.data(), p.data(), n));
        EXPECT_TRUE(FloatsBitEqual(m_dev.Read(), m));
        EXPECT_TRUE(FloatsBitEqual(p_dev.Read(), p));
      }
    }
  }
}

TEST_F(CudaBackendTest, ZeroOneKernelsMatchCpu) {
  for (size_t n : kLengths) {
    for (float weight_decay : {0.0f, 0.01f}) {
      for (bool masked : {false, true}) {
        SCOPED_TRACE(absl::StrCat("n = ", n, ", weight_decay = ", weight_decay,
                                  masked ? ", masked" : ""));
        const AdamHyper h = Hyper(weight_decay);
        const std::vector<float> g = RandomFloats(rng_, n);
        const std::vector<float> v = RandomVariances(rng_, n);
        const std::vector<float> mask = RandomMask(rng_, n);
        std::vector<float> m = RandomFloats(rng_, n, 0.1f);
        std::vector<float> p = RandomFloats(rng_, n);
        std::vector<float> acc = RandomFloats(rng_, n, 0.01f);
        std::vector<float> anchor = RandomFloats(rng_, n);
        DeviceArray<float> g_dev(cuda(), g), v_dev(cuda(), v), mask_dev(cuda(), mask),
            m_dev(cuda(), m), p_dev(cuda(), p), acc_dev(cuda(), acc), anchor_dev(cuda(), anchor);
        for (auto* a : {&g_dev, &v_dev, &mask_dev, &m_dev, &p_dev, &acc_dev, &anchor_dev}) {
          ASSERT_OK(a->status());
        }
        // A local step, a sync's preparation, then its application with the accumulator
        // as the exchanged average.
        ASSERT_OK(cuda()->ZeroOneLocalUpdate(h, g_dev.data(), v_dev.data(), m_dev.data(),
                                             p_dev.data(), acc_dev.data(), n));
        ASSERT_OK(cpu()->ZeroOneLocalUpdate(h, g.data(), v.data(), m.data(), p.data(),
                                            acc.data(), n));
        EXPECT_TRUE(FloatsBitEqual(m_dev.Read(), m));
        EXPECT_TRUE(FloatsBitEqual(p_dev.Read(), p));
        EXPECT_TRUE(FloatsBitEqual(acc_dev.Read(), acc));
        ASSERT_OK(cuda()->ZeroOneSyncPrepare(h.eps, v_dev.data(), acc_dev.data(), n));
        ASSERT_OK(cpu()->ZeroOneSyncPrepare(h.eps, v.data(), acc.data(), n));
        EXPECT_TRUE(FloatsBitEqual(acc_dev.Read(), acc));
        ASSERT_OK(cuda()->ZeroOneSyncApply(h.eps, 0.03f, v_dev.data(),
                                           masked ? mask_dev.data() : nullptr, acc_dev.data(),
                                           m_dev.data(), anchor_dev.data(), p_dev.data(), n));
        ASSERT_OK(cpu()->ZeroOneSyncApply(h.eps, 0.03f, v.data(), masked ? mask.data() : nullptr,
                                          acc.data(), m.data(), anchor.data(), p.data(), n));
        EXPECT_TRUE(FloatsBitEqual(m_dev.Read(), m));
        EXPECT_TRUE(FloatsBitEqual(p_dev.Read(), p));
        EXPECT_TRUE(FloatsBitEqual(anchor_dev.Read(), anchor));
      }
    }
  }
}

TEST_F(CudaBackendTest, LambKernelsMatchCpu) {
  for (size_t n : kLengths) {
    SCOPED_TRACE(absl::StrCat("n = ", n));
    const AdamHyper h = Hyper(0.01f);
    const std::vector<float> g = RandomFloats(rng_, n);
    std::vector<float> m = RandomFloats(rng_, n, 0.1f), m_last = RandomFloats(rng_, n, 0.1f);
    std::vector<float> v = RandomVariances(rng_, n), v_fresh = RandomVariances(rng_, n);
    std::vector<float> p = RandomFloats(rng_, n), u(n, 0.0f);
    DeviceArray<float> g_dev(cuda(), g), m_dev(cuda(), m), m_last_dev(cuda(), m_last),
        v_dev(cuda(), v), v_fresh_dev(cuda(), v_fresh), p_dev(cuda(), p), u_dev(cuda(), u);
    for (auto* a : {&g_dev, &m_dev, &m_last_dev, &v_dev, &v_fresh_dev, &p_dev, &u_dev}) {
      ASSERT_OK(a->status());
    }
    ASSERT_OK(cuda()->AdamMomentsUpdate(h, g_dev.data(), 0.25f, m_dev.data(), v_dev.data(), n));
    ASSERT_OK(cpu()->AdamMomentsUpdate(h, g.data(), 0.25f, m.data(), v.data(), n));
    EXPECT_TRUE(FloatsBitEqual(m_dev.Read(), m));
    EXPECT_TRUE(FloatsBitEqual(v_dev.Read(), v));
    ASSERT_OK(cuda()->AdamDirectionInto(h, m_dev.data(), v_dev.data(), p_dev.data(), u_dev.data(), n));
    ASSERT_OK(cpu()->AdamDirectionInto(h, m.data(), v.data(), p.data(), u.data(), n));
    EXPECT_TRUE(FloatsBitEqual(u_dev.Read(), u));
    ASSERT_OK(cuda()->Axpy(-0.01f, u_dev.data(), p_dev.data(), n));
    ASSERT_OK(cpu()->Axpy(-0.01f, u.data(), p.data(), n));
    EXPECT_TRUE(FloatsBitEqual(p_dev.Read(), p));
    ASSERT_OK(cuda()->Scale(3.7f, p_dev.data(), n));
    ASSERT_OK(cpu()->Scale(3.7f, p.data(), n));
    EXPECT_TRUE(FloatsBitEqual(p_dev.Read(), p));
    const std::vector<float> mask = RandomMask(rng_, n);
    DeviceArray<float> mask_dev(cuda(), mask);
    ASSERT_OK(mask_dev.status());
    ASSERT_OK(cuda()->ApplyMask(mask_dev.data(), p_dev.data(), n));
    ASSERT_OK(cpu()->ApplyMask(mask.data(), p.data(), n));
    EXPECT_TRUE(FloatsBitEqual(p_dev.Read(), p));
    // The masked parameters are exact zeros now: MarkNonzero leaves their flags alone.
    std::vector<float> seen(n, 0.0f);
    DeviceArray<float> seen_dev(cuda(), seen);
    ASSERT_OK(seen_dev.status());
    ASSERT_OK(cuda()->MarkNonzero(p_dev.data(), seen_dev.data(), n));
    ASSERT_OK(cpu()->MarkNonzero(p.data(), seen.data(), n));
    EXPECT_TRUE(FloatsBitEqual(seen_dev.Read(), seen));
    ASSERT_OK(cuda()->FreshVarianceUpdate(0.9f, 0.999f, m_dev.data(), m_last_dev.data(),
                                          v_fresh_dev.data(), n));
    ASSERT_OK(cpu()->FreshVarianceUpdate(0.9f, 0.999f, m.data(), m_last.data(), v_fresh.data(), n));
    EXPECT_TRUE(FloatsBitEqual(v_fresh_dev.Read(), v_fresh));
    float on_gpu = -1, on_cpu = -2;
    ASSERT_OK(cuda()->MaxDenomRatio(h.eps, v_dev.data(), v_fresh_dev.data(), n, &on_gpu));
    ASSERT_OK(cpu()->MaxDenomRatio(h.eps, v.data(), v_fresh.data(), n, &on_cpu));
    EXPECT_EQ(on_gpu, on_cpu);
  }
}

TEST_F(CudaBackendTest, DecompressFrozenAdamUpdateMatchesCpu) {
  for (size_t n : kLengths) {
    for (size_t num_chunks : kNumChunks) {
      for (bool masked : {false, true}) {
        const float weight_decay = n % 2 == 0 ? 0.0f : 0.01f;
        const size_t unit = num_chunks * 8;
        const size_t chunk = CeilDiv(n, unit) * unit / num_chunks;
        SCOPED_TRACE(absl::StrCat("n = ", n, ", num_chunks = ", num_chunks,
                                  ", weight_decay = ", weight_decay,
                                  masked ? ", masked, update_clip 2" : ""));
        AdamHyper h = Hyper(weight_decay);
        if (masked) h.update_clip = 2.0f;
        const std::vector<uint8_t> blocks = RandomBlocks(rng_, num_chunks, chunk);
        const std::vector<float> v = RandomVariances(rng_, n);
        const std::vector<float> mask = RandomMask(rng_, n);
        std::vector<float> m = RandomFloats(rng_, n, 0.1f);
        std::vector<float> p = RandomFloats(rng_, n);
        DeviceArray<uint8_t> blocks_dev(cuda(), blocks, /*misalign=*/1);
        DeviceArray<float> v_dev(cuda(), v), mask_dev(cuda(), mask), m_dev(cuda(), m),
            p_dev(cuda(), p);
        ASSERT_OK(blocks_dev.status());
        ASSERT_OK(v_dev.status());
        ASSERT_OK(mask_dev.status());
        ASSERT_OK(m_dev.status());
        ASSERT_OK(p_dev.status());
        ASSERT_OK(cuda()->DecompressFrozenAdamUpdate(
            blocks_dev.data(), num_chunks, chunk, h, v_dev.data(),
            masked ? mask_dev.data() : nullptr, m_dev.data(), p_dev.data(), n));
        ASSERT_OK(cpu()->DecompressFrozenAdamUpdate(blocks.data(), num_chunks, chunk, h,
                                                    v.data(), masked ? mask.data() : nullptr,
                                                    m.data(), p.data(), n));
        EXPECT_TRUE(FloatsBitEqual(m_dev.Read(), m));
        EXPECT_TRUE(FloatsBitEqual(p_dev.Read(), p));
      }
    }
  }
}

TEST_F(CudaBackendTest, SumSquaresMatchesCpu) {
  for (size_t n : kLengths) {
    SCOPED_TRACE(absl::StrCat("n = ", n));
    const std::vector<float> x = RandomFloats(rng_, n);
    DeviceArray<float> x_dev(cuda(), x);
    ASSERT_OK(x_dev.status());
    double cuda_sum = -1.0, cpu_sum = -1.0;
    const uint64_t to_host_before = cuda()->host_transfers().to_host;
    ASSERT_OK(cuda()->SumSquares(x_dev.data(), n, &cuda_sum));
    ASSERT_OK(cpu()->SumSquares(x.data(), n, &cpu_sum));
    // Float64 sums of exact squares in two orders: a few ulps apart.
    EXPECT_NEAR(cuda_sum, cpu_sum, 1e-12 * cpu_sum);
    // The result crossed to the host (through the backend's pinned buffer) and was counted.
    EXPECT_EQ(cuda()->host_transfers().to_host - to_host_before, sizeof(double));
    // The same sum again, and the sum of half the array: each call's own result.
    double again = -1.0, half = -1.0, half_cpu = -1.0;
    ASSERT_OK(cuda()->SumSquares(x_dev.data(), n, &again));
    EXPECT_EQ(again, cuda_sum);
    ASSERT_OK(cuda()->SumSquares(x_dev.data(), n / 2, &half));
    ASSERT_OK(cpu()->SumSquares(x.data(), n / 2, &half_cpu));
    EXPECT_NEAR(half, half_cpu, 1e-12 * half_cpu);
  }
}

// SumSquaresWire of a bf16 or fp16 tensor gives the bits of SumSquares over its float32
// widening (the same grid and order of additions; the widening is exact), whether the
// 16-bit tensor is 8-byte aligned (one 8-byte load a group) or not (element by element),
// at lengths around a group, a block's 1024 elements and past the 4M elements where the
// threads loop (4096 blocks). For fp32 it is SumSquares. Values of both signs, +-0, large
// ones and (fp16) subnormals.
TEST_F(CudaBackendTest, SumSquaresWireMatchesSumSquaresOfTheWidenedCopyBitForBit) {
  constexpr size_t kWireLengths[] = {0,     1,      3,          4,          5,
                                     7,     8,      1023,       1025,       10007,
                                     65537, 196613, 4194304 + 4, 2 * 4194304 + 4096 + 3};
  auto same_bits = [](double a, double b) { return std::memcmp(&a, &b, sizeof(a)) == 0; };
  for (size_t n : kWireLengths) {
    std::vector<float> x = RandomFloats(rng_, n);
    for (size_t i = 0; i < n; ++i) {
      if (i % 16 == 3) x[i] *= 1e4f;
      if (i % 16 == 9) x[i] *= 1e-6f;
    }
    for (WireDtype dtype : {WireDtype::kBf16, WireDtype::kFp16}) {
      std::vector<uint16_t> h(n);
      std::vector<float> wide(n);
      for (size_t i = 0; i < n; ++i) {
        h[i] = NarrowParam(dtype, std::max(-65504.0f, std::min(65504.0f, x[i])));
        wide[i] = WidenParam(dtype, h[i]);
      }
      DeviceArray<float> wide_dev(cuda(), wide);
      ASSERT_OK(wide_dev.status());
      double want = -1.0;
      ASSERT_OK(cuda()->SumSquares(wide_dev.data(), n, &want));
      // misalign 0 and 4: 8-byte aligned (cudaMalloc's 256); 1 and 2: not.
      for (size_t misalign : {0, 1, 2, 4}) {
        SCOPED_TRACE(absl::StrCat(WireDtypeName(dtype), ", n = ", n, ", misalign = ", misalign));
        DeviceArray<uint16_t> h_dev(cuda(), h, misalign);
        ASSERT_OK(h_dev.status());
        double got = -2.0;
        ASSERT_OK(cuda()->SumSquaresWire(dtype, h_dev.data(), n, &got));
        EXPECT_TRUE(same_bits(got, want)) << "got " << got << " want " << want;
      }
    }
    SCOPED_TRACE(absl::StrCat("fp32, n = ", n));
    DeviceArray<float> x_dev(cuda(), x, /*misalign=*/n % 2);
    ASSERT_OK(x_dev.status());
    double want = -1.0, got = -2.0;
    ASSERT_OK(cuda()->SumSquares(x_dev.data(), n, &want));
    ASSERT_OK(cuda()->SumSquaresWire(WireDtype::kFp32, x_dev.data(), n, &got));
    EXPECT_TRUE(same_bits(got, want)) << "got " << got << " want " << want;
  }
  // An unknown dtype is invalid; no elements sum to +0.
  DeviceArray<uint16_t> h_dev(cuda(), std::vector<uint16_t>{0x3c00, 0x4000});
  ASSERT_OK(h_dev.status());
  double got = -1.0;
  EXPECT_EQ(cuda()->SumSquaresWire(static_cast<WireDtype>(3), h_dev.data(), 2, &got).code(),
            absl::StatusCode::kInvalidArgument);
  for (WireDtype dtype : {WireDtype::kFp32, WireDtype::kBf16, WireDtype::kFp16}) {
    got = -1.0;
    ASSERT_OK(cuda()->SumSquaresWire(dtype, h_dev.data(), 0, &got));
    EXPECT_TRUE(same_bits(got, 0.0)) << WireDtypeName(dtype) << ": " << got;
  }
  got = -1.0;  // fp16 1 and 2
  ASSERT_OK(cuda()->SumSquaresWire(WireDtype::kFp16, h_dev.data(), 2, &got));
  EXPECT_EQ(got, 5.0);
}

// The worker -> server -> worker pipeline on the device alone, the blocks of one step
// feeding the next kernel through device pointers at block offsets (byte aligned only).
TEST_F(CudaBackendTest, CompressedExchangeOnDeviceMatchesCpu) {
  constexpr size_t kN = 10007;
  constexpr int kWorkers = 3;
  const size_t unit = kWorkers * 8;
  const size_t chunk = CeilDiv(kN, unit) * unit / kWorkers;
  const size_t block_bytes = CompressedBlockBytes(chunk);
  const AdamHyper h = Hyper(0.0f);

  // Worker 0's compression of its momentum.
  const std::vector<float> m = RandomFloats(rng_, kN);
  std::vector<float> worker_err(chunk * kWorkers, 0.0f);
  std::vector<uint8_t> worker_out(kWorkers * block_bytes);
  DeviceArray<float> m_dev(cuda(), m), worker_err_dev(cuda(), worker_err);
  DeviceArray<uint8_t> worker_out_dev(cuda(), worker_out);
  ASSERT_OK(m_dev.status());
  ASSERT_OK(worker_err_dev.status());
  ASSERT_OK(worker_out_dev.status());
  ASSERT_OK(cuda()->CompressWorker(m_dev.data(), nullptr, 0.9f, kN, kWorkers, chunk,
                                   worker_err_dev.data(), worker_out_dev.data()));
  ASSERT_OK(cpu()->CompressWorker(m.data(), nullptr, 0.9f, kN, kWorkers, chunk,
                                  worker_err.data(), worker_out.data()));
  const std::vector<uint8_t> worker_out_cuda = worker_out_dev.Read();
  ASSERT_TRUE(BlocksMatch(worker_out_cuda, worker_out, kWorkers, chunk));
  if (Bits(BlockScale(worker_out_cuda, 0)) != Bits(BlockScale(worker_out, 0))) {
    GTEST_SKIP() << "worker scales differ in the last bit; the rest would not be bit-exact";
  }

  // Server 1 aggregates as if every worker had sent worker 0's blocks 0..2 (a stand-in
  // for W blocks of its chunk), then every worker applies the result.
  std::vector<float> server_err(chunk, 0.0f);
  std::vector<uint8_t> server_out(block_bytes);
  DeviceArray<float> server_err_dev(cuda(), server_err);
  DeviceArray<uint8_t> server_out_dev(cuda(), server_out, /*misalign=*/1);
  ASSERT_OK(server_err_dev.status());
  ASSERT_OK(server_out_dev.status());
  ASSERT_OK(cuda()->ServerAggregate(worker_out_dev.data(), kWorkers, chunk,
                                    server_err_dev.data(), server_out_dev.data()));
  ASSERT_OK(cpu()->ServerAggregate(worker_out.data(), kWorkers, chunk, server_err.data(),
                                   server_out.data()));
  const std::vector<uint8_t> server_out_cuda = server_out_dev.Read();
  ASSERT_TRUE(BlocksMatch(server_out_cuda, server_out, 1, chunk));
  EXPECT_TRUE(ErrorsMatch(server_err_dev.Read(), server_err, BlockScale(server_out_cuda, 0),
                          BlockScale(server_out, 0)));
  if (Bits(BlockScale(server_out_cuda, 0)) != Bits(BlockScale(server_out, 0))) {
    GTEST_SKIP() << "server scales differ in the last bit; the update would not be bit-exact";
  }

  const std::vector<float> v = RandomVariances(rng_, chunk);
  std::vector<float> m_new(chunk), p = RandomFloats(rng_, chunk);
  DeviceArray<float> v_dev(cuda(), v), m_new_dev(cuda(), m_new), p_dev(cuda(), p);
  ASSERT_OK(v_dev.status());
  ASSERT_OK(m_new_dev.status());
  ASSERT_OK(p_dev.status());
  ASSERT_OK(cuda()->DecompressFrozenAdamUpdate(server_out_dev.data(), 1, chunk, h,
                                               v_dev.data(), nullptr, m_new_dev.data(),
                                               p_dev.data(), chunk));
  ASSERT_OK(cpu()->DecompressFrozenAdamUpdate(server_out.data(), 1, chunk, h, v.data(),
                                              nullptr, m_new.data(), p.data(), chunk));
  EXPECT_TRUE(FloatsBitEqual(m_new_dev.Read(), m_new));
  EXPECT_TRUE(FloatsBitEqual(p_dev.Read(), p));
}

TEST_F(CudaBackendTest, RejectsBadShapes) {
  DeviceArray<float> x(cuda(), std::vector<float>(64, 1.0f));
  DeviceArray<uint8_t> out(cuda(), std::vector<uint8_t>(64));
  ASSERT_OK(x.status());
  ASSERT_OK(out.status());
  EXPECT_EQ(cuda()->CompressWorker(x.data(), nullptr, 0.9f, 12, 1, 12, x.data(), out.data())
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cuda()->CompressWorker(x.data(), nullptr, 0.9f, 17, 2, 8, x.data(), out.data())
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cuda()->ServerAggregate(out.data(), 0, 8, x.data(), out.data()).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cuda()->Decompress(out.data(), 1, 8, 9, x.data()).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cuda()->DecompressFrozenAdamUpdate(out.data(), 1, 4, Hyper(0.0f), x.data(),
                                               nullptr, x.data(), x.data(), 4)
                .code(),
            absl::StatusCode::kInvalidArgument);
}

// Runs everywhere: asking for a device that is not there is kUnavailable, not a crash.
// ---- int8 (kernels.h, INT8 WIRE FORMAT): no sum of squares, so everything bit for bit.

// num_blocks int8 blocks of random codes; scale random and positive (one of them zero),
// offset random.
std::vector<uint8_t> RandomInt8Blocks(std::mt19937& rng, size_t num_blocks, size_t chunk) {
  const size_t block_bytes = Int8BlockBytes(chunk);
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> scale(0.001f, 0.02f), offset(-3.0f, 1.0f);
  std::vector<uint8_t> blocks(num_blocks * block_bytes);
  for (size_t k = 0; k < num_blocks; ++k) {
    const float s = k == 1 ? 0.0f : scale(rng), lo = offset(rng);
    std::memcpy(blocks.data() + k * block_bytes, &s, sizeof(s));
    std::memcpy(blocks.data() + k * block_bytes + 4, &lo, sizeof(lo));
    for (size_t b = 8; b < block_bytes; ++b) blocks[k * block_bytes + b] = byte(rng);
  }
  return blocks;
}

::testing::AssertionResult BytesEqual(const std::vector<uint8_t>& cuda,
                                      const std::vector<uint8_t>& cpu) {
  if (cuda.size() != cpu.size()) {
    return ::testing::AssertionFailure() << "sizes differ: " << cuda.size() << " vs " << cpu.size();
  }
  for (size_t i = 0; i < cpu.size(); ++i) {
    if (cuda[i] != cpu[i]) {
      return ::testing::AssertionFailure() << "byte " << i << ": cuda " << int{cuda[i]}
                                           << " vs cpu " << int{cpu[i]};
    }
  }
  return ::testing::AssertionSuccess();
}

TEST_F(CudaBackendTest, CompressWorkerInt8MatchesCpu) {
  for (size_t n : kLengths) {
    for (size_t num_chunks : kNumChunks) {
      for (size_t extra_rounds : {0, 1}) {
        for (bool fused : {false, true}) {
          const size_t unit = num_chunks * 8;
          const size_t n_pad = (CeilDiv(n, unit) + extra_rounds) * unit;
          const size_t chunk = n_pad / num_chunks;
          SCOPED_TRACE(absl::StrCat("n = ", n, ", num_chunks = ", num_chunks, ", chunk = ",
                                    chunk, fused ? ", fused momentum" : ""));
          const std::vector<float> m = RandomFloats(rng_, n);
          const std::vector<float> g = RandomFloats(rng_, n);
          std::vector<float> err = RandomFloats(rng_, n_pad, 0.1f);
          std::vector<uint8_t> out(num_chunks * Int8BlockBytes(chunk), 0xAB);
          DeviceArray<float> m_dev(cuda(), m), g_dev(cuda(), g), err_dev(cuda(), err);
          DeviceArray<uint8_t> out_dev(cuda(), out, /*misalign=*/1);
          ASSERT_OK(m_dev.status());
          ASSERT_OK(g_dev.status());
          ASSERT_OK(err_dev.status());
          ASSERT_OK(out_dev.status());
          // Two steps, so the second starts from the first's error.
          for (int step = 0; step < 2; ++step) {
            ASSERT_OK(cuda()->CompressWorkerInt8(m_dev.data(), fused ? g_dev.data() : nullptr,
                                                 0.9f, n, num_chunks, chunk, err_dev.data(),
                                                 out_dev.data()));
            ASSERT_OK(cpu()->CompressWorkerInt8(m.data(), fused ? g.data() : nullptr, 0.9f, n,
                                                num_chunks, chunk, err.data(), out.data()));
          }
          EXPECT_TRUE(BytesEqual(out_dev.Read(), out));
          EXPECT_TRUE(FloatsBitEqual(err_dev.Read(), err));
          EXPECT_TRUE(FloatsBitEqual(m_dev.Read(), m));
        }
      }
    }
  }
}

TEST_F(CudaBackendTest, ServerAggregateInt8MatchesCpu) {
  for (size_t length : kLengths) {
    for (int num_workers : {1, 2, 3, 8, 300}) {
      const size_t chunk = CeilDiv(length, 8) * 8;
      SCOPED_TRACE(absl::StrCat("chunk = ", chunk, ", num_workers = ", num_workers));
      const std::vector<uint8_t> blocks = RandomInt8Blocks(rng_, num_workers, chunk);
      std::vector<float> err = RandomFloats(rng_, chunk, 0.1f);
      std::vector<uint8_t> out(Int8BlockBytes(chunk), 0xAB);
      DeviceArray<uint8_t> blocks_dev(cuda(), blocks, /*misalign=*/1);
      DeviceArray<float> err_dev(cuda(), err);
      DeviceArray<uint8_t> out_dev(cuda(), out, /*misalign=*/3);
      ASSERT_OK(blocks_dev.status());
      ASSERT_OK(err_dev.status());
      ASSERT_OK(out_dev.status());
      ASSERT_OK(cuda()->ServerAggregateInt8(blocks_dev.data(), num_workers, chunk,
                                            err_dev.data(), out_dev.data()));
      ASSERT_OK(cpu()->ServerAggregateInt8(blocks.data(), num_workers, chunk, err.data(),
                                           out.data()));
      EXPECT_TRUE(BytesEqual(out_dev.Read(), out));
      EXPECT_TRUE(FloatsBitEqual(err_dev.Read(), err));
    }
  }
}

TEST_F(CudaBackendTest, DecompressInt8MatchesCpu) {
  for (size_t n : kLengths) {
    for (size_t num_chunks : kNumChunks) {
      const size_t chunk = CeilDiv(std::max<size_t>(n, 1), num_chunks * 8) * 8;
      SCOPED_TRACE(absl::StrCat("n = ", n, ", num_chunks = ", num_chunks));
      const std::vector<uint8_t> blocks = RandomInt8Blocks(rng_, num_chunks, chunk);
      std::vector<float> out(n + 1, 5.0f);
      DeviceArray<uint8_t> blocks_dev(cuda(), blocks, /*misalign=*/1);
      DeviceArray<float> out_dev(cuda(), out);
      ASSERT_OK(blocks_dev.status());
      ASSERT_OK(out_dev.status());
      ASSERT_OK(cuda()->DecompressInt8(blocks_dev.data(), num_chunks, chunk, n, out_dev.data()));
      ASSERT_OK(cpu()->DecompressInt8(blocks.data(), num_chunks, chunk, n, out.data()));
      EXPECT_TRUE(FloatsBitEqual(out_dev.Read(), out));
    }
  }
}

// Zeros of both signs, huge values, NaN and infinities: headers bit for bit (the CPU's
// canonical NaN), codes equal, decoded NaN where the CPU's is (any NaN).
TEST_F(CudaBackendTest, Int8EdgeCasesMatchCpu) {
  const std::vector<std::vector<float>> chunks = {
      {0.0f, -0.0f, 0.0f, -0.0f, -0.0f, 0.0f, -0.0f, 0.0f},
      {-0.0f, -0.0f, -0.0f, -0.0f, -0.0f, -0.0f, -0.0f, -0.0f},
      {3e38f, -3e38f, 0.0f, 1e38f, -1e38f, 3e38f, -3e38f, 2e38f},
      {1.0f, 2.0f, std::nanf(""), 4.0f, 5.0f, 6.0f, 7.0f, 8.0f},
      {1.0f, 2.0f, INFINITY, 4.0f, 5.0f, 6.0f, 7.0f, 8.0f},
      {1.0f, -INFINITY, 3.0f, 4.0f, 5.0f, 6.0f, 7.0f, 8.0f},
      std::vector<float>(8, INFINITY),
      {0.0f, 255.0f, 0.5f, 1.5f, 2.5f, 253.5f, 254.5f, 1e-40f},
  };
  for (size_t c = 0; c < chunks.size(); ++c) {
    SCOPED_TRACE(absl::StrCat("chunk ", c));
    std::vector<float> err(8, 0.0f), decoded(8);
    std::vector<uint8_t> out(Int8BlockBytes(8));
    DeviceArray<float> m_dev(cuda(), chunks[c]), err_dev(cuda(), err), decoded_dev(cuda(), decoded);
    DeviceArray<uint8_t> out_dev(cuda(), out);
    ASSERT_OK(cuda()->CompressWorkerInt8(m_dev.data(), nullptr, 0.0f, 8, 1, 8, err_dev.data(),
                                         out_dev.data()));
    ASSERT_OK(cuda()->DecompressInt8(out_dev.data(), 1, 8, 8, decoded_dev.data()));
    ASSERT_OK(cpu()->CompressWorkerInt8(chunks[c].data(), nullptr, 0.0f, 8, 1, 8, err.data(),
                                        out.data()));
    ASSERT_OK(cpu()->DecompressInt8(out.data(), 1, 8, 8, decoded.data()));
    EXPECT_TRUE(BytesEqual(out_dev.Read(), out));
    const std::vector<float> got = decoded_dev.Read(), got_err = err_dev.Read();
    for (size_t i = 0; i < 8; ++i) {
      if (std::isnan(decoded[i])) {
        EXPECT_TRUE(std::isnan(got[i])) << i;
        EXPECT_TRUE(std::isnan(got_err[i]) == std::isnan(err[i])) << i;
      } else {
        EXPECT_EQ(Bits(got[i]), Bits(decoded[i])) << i;
        EXPECT_EQ(Bits(got_err[i]), Bits(err[i])) << i;
      }
    }
  }
}

// The kernels move groups of 4 floats as one 16-byte access when every float array is
// 16-byte aligned, else as 4-byte ones (cuda_kernels_common.cuh, "Bandwidth"); the
// arithmetic must not depend on which. Float arrays here start 0 to 3 elements into their
// allocations (the exchanges' buffers hand out sub-arrays at any float offset), at lengths
// that are not multiples of 4 and past one pass of the grid (1056 blocks of 256 threads x 4
// elements on an H100), and every kernel family must match the CPU.
TEST_F(CudaBackendTest, EveryAlignmentAndLengthMatchesCpu) {
  using Dev = std::unique_ptr<DeviceArray<float>>;
  const AdamHyper h = Hyper(0.01f);
  for (size_t n : {size_t{1003}, size_t{10007}, (size_t{1} << 21) + 5}) {
    for (size_t misalign : {0, 1, 2, 3}) {
      SCOPED_TRACE(absl::StrCat("n = ", n, ", float arrays ", misalign, " elements in"));
      const auto dev = [&](const std::vector<float>& host) {
        auto array = std::make_unique<DeviceArray<float>>(cuda(), host, misalign);
        EXPECT_TRUE(array->status().ok()) << array->status();
        return array;
      };
      const std::vector<float> g = RandomFloats(rng_, n), mask = RandomMask(rng_, n);
      std::vector<float> m = RandomFloats(rng_, n, 0.1f), p = RandomFloats(rng_, n),
                         v = RandomVariances(rng_, n);
      Dev g_dev = dev(g), v_dev = dev(v), mask_dev = dev(mask), m_dev = dev(m), p_dev = dev(p);

      // 1 bit: the worker's compression (fused momentum), the server's, the decompressions.
      constexpr size_t kChunks = 3;
      const size_t chunk = CeilDiv(n, kChunks * 8) * 8, n_pad = kChunks * chunk;
      std::vector<float> err = RandomFloats(rng_, n_pad, 0.1f);
      std::vector<uint8_t> blocks(kChunks * CompressedBlockBytes(chunk));
      Dev err_dev = dev(err);
      DeviceArray<uint8_t> blocks_dev(cuda(), blocks, /*misalign=*/1);
      ASSERT_OK(cuda()->CompressWorker(m_dev->data(), g_dev->data(), 0.9f, n, kChunks, chunk,
                                       err_dev->data(), blocks_dev.data()));
      ASSERT_OK(cpu()->CompressWorker(m.data(), g.data(), 0.9f, n, kChunks, chunk, err.data(),
                                      blocks.data()));
      const std::vector<uint8_t> blocks_cuda = blocks_dev.Read();
      ASSERT_TRUE(BlocksMatch(blocks_cuda, blocks, kChunks, chunk));
      EXPECT_TRUE(ErrorsMatch(err_dev->Read(), err, BlockScale(blocks_cuda, 0),
                              BlockScale(blocks, 0)));

      // The server aggregates the three blocks as if three workers had sent them (the
      // CPU's blocks on both sides, so that the inputs are the same bits).
      std::vector<float> server_err = RandomFloats(rng_, chunk, 0.1f);
      std::vector<uint8_t> server_out(CompressedBlockBytes(chunk));
      Dev server_err_dev = dev(server_err);
      DeviceArray<uint8_t> cpu_blocks_dev(cuda(), blocks, /*misalign=*/3),
          server_out_dev(cuda(), server_out, /*misalign=*/1);
      ASSERT_OK(cuda()->ServerAggregate(cpu_blocks_dev.data(), kChunks, chunk,
                                        server_err_dev->data(), server_out_dev.data()));
      ASSERT_OK(cpu()->ServerAggregate(blocks.data(), kChunks, chunk, server_err.data(),
                                       server_out.data()));
      const std::vector<uint8_t> server_cuda = server_out_dev.Read();
      ASSERT_TRUE(BlocksMatch(server_cuda, server_out, 1, chunk));
      EXPECT_TRUE(ErrorsMatch(server_err_dev->Read(), server_err, BlockScale(server_cuda, 0),
                              BlockScale(server_out, 0)));

      std::vector<float> decoded(n);
      Dev decoded_dev = dev(decoded);
      ASSERT_OK(cuda()->Decompress(cpu_blocks_dev.data(), kChunks, chunk, n,
                                   decoded_dev->data()));
      ASSERT_OK(cpu()->Decompress(blocks.data(), kChunks, chunk, n, decoded.data()));
      EXPECT_TRUE(FloatsBitEqual(decoded_dev->Read(), decoded));
      ASSERT_OK(cuda()->DecompressFrozenAdamUpdate(cpu_blocks_dev.data(), kChunks, chunk, h,
                                                   v_dev->data(), mask_dev->data(),
                                                   m_dev->data(), p_dev->data(), n));
      ASSERT_OK(cpu()->DecompressFrozenAdamUpdate(blocks.data(), kChunks, chunk, h, v.data(),
                                                  mask.data(), m.data(), p.data(), n));
      EXPECT_TRUE(FloatsBitEqual(m_dev->Read(), m));
      EXPECT_TRUE(FloatsBitEqual(p_dev->Read(), p));

      // int8: the worker's compression, the server's, the decompression.
      std::vector<float> err8 = RandomFloats(rng_, n_pad, 0.1f);
      std::vector<uint8_t> blocks8(kChunks * Int8BlockBytes(chunk));
      Dev err8_dev = dev(err8);
      DeviceArray<uint8_t> blocks8_dev(cuda(), blocks8, /*misalign=*/2);
      ASSERT_OK(cuda()->CompressWorkerInt8(m_dev->data(), nullptr, 0.9f, n, kChunks, chunk,
                                           err8_dev->data(), blocks8_dev.data()));
      ASSERT_OK(cpu()->CompressWorkerInt8(m.data(), nullptr, 0.9f, n, kChunks, chunk,
                                          err8.data(), blocks8.data()));
      EXPECT_TRUE(BytesEqual(blocks8_dev.Read(), blocks8));
      EXPECT_TRUE(FloatsBitEqual(err8_dev->Read(), err8));
      std::vector<float> server_err8 = RandomFloats(rng_, chunk, 0.1f);
      std::vector<uint8_t> server_out8(Int8BlockBytes(chunk));
      Dev server_err8_dev = dev(server_err8);
      DeviceArray<uint8_t> server_out8_dev(cuda(), server_out8);
      ASSERT_OK(cuda()->ServerAggregateInt8(blocks8_dev.data(), kChunks, chunk,
                                            server_err8_dev->data(), server_out8_dev.data()));
      ASSERT_OK(cpu()->ServerAggregateInt8(blocks8.data(), kChunks, chunk, server_err8.data(),
                                           server_out8.data()));
      EXPECT_TRUE(BytesEqual(server_out8_dev.Read(), server_out8));
      EXPECT_TRUE(FloatsBitEqual(server_err8_dev->Read(), server_err8));
      ASSERT_OK(cuda()->DecompressInt8(blocks8_dev.data(), kChunks, chunk, n,
                                       decoded_dev->data()));
      ASSERT_OK(cpu()->DecompressInt8(blocks8.data(), kChunks, chunk, n, decoded.data()));
      EXPECT_TRUE(FloatsBitEqual(decoded_dev->Read(), decoded));

      // Element-wise kernels of the optimizer family, rows, sums and maxima.
      std::vector<float> acc = RandomFloats(rng_, n, 0.01f);
      Dev acc_dev = dev(acc);
      ASSERT_OK(cuda()->AdamWarmupUpdate(h, g_dev->data(), 0.5f, m_dev->data(), v_dev->data(),
                                         p_dev->data(), n));
      ASSERT_OK(cpu()->AdamWarmupUpdate(h, g.data(), 0.5f, m.data(), v.data(), p.data(), n));
      ASSERT_OK(cuda()->ZeroOneLocalUpdate(h, g_dev->data(), v_dev->data(), m_dev->data(),
                                           p_dev->data(), acc_dev->data(), n));
      ASSERT_OK(cpu()->ZeroOneLocalUpdate(h, g.data(), v.data(), m.data(), p.data(),
                                          acc.data(), n));
      ASSERT_OK(cuda()->FrozenAdamUpdate(h, v_dev->data(), mask_dev->data(), m_dev->data(),
                                         p_dev->data(), n));
      ASSERT_OK(cpu()->FrozenAdamUpdate(h, v.data(), mask.data(), m.data(), p.data(), n));
      EXPECT_TRUE(FloatsBitEqual(m_dev->Read(), m));
      EXPECT_TRUE(FloatsBitEqual(v_dev->Read(), v));
      EXPECT_TRUE(FloatsBitEqual(p_dev->Read(), p));
      EXPECT_TRUE(FloatsBitEqual(acc_dev->Read(), acc));
      ASSERT_OK(cuda()->Axpy(0.25f, g_dev->data(), acc_dev->data(), n));
      ASSERT_OK(cpu()->Axpy(0.25f, g.data(), acc.data(), n));
      ASSERT_OK(cuda()->ApplyMask(mask_dev->data(), acc_dev->data(), n));
      ASSERT_OK(cpu()->ApplyMask(mask.data(), acc.data(), n));
      ASSERT_OK(cuda()->Scale(1.5f, acc_dev->data(), n));
      ASSERT_OK(cpu()->Scale(1.5f, acc.data(), n));
      EXPECT_TRUE(FloatsBitEqual(acc_dev->Read(), acc));

      // Three rows of n (n is odd: rows after the first are never 16-byte aligned).
      std::vector<float> rows = g;
      rows.insert(rows.end(), m.begin(), m.end());
      rows.insert(rows.end(), p.begin(), p.end());
      std::vector<float> sum(n), average(n);
      Dev rows_dev = dev(rows), sum_dev = dev(sum), average_dev = dev(average);
      ASSERT_OK(cuda()->SumRows(rows_dev->data(), 3, n, sum_dev->data()));
      ASSERT_OK(cpu()->SumRows(rows.data(), 3, n, sum.data()));
      ASSERT_OK(cuda()->AverageRows(rows_dev->data(), 3, n, average_dev->data()));
      ASSERT_OK(cpu()->AverageRows(rows.data(), 3, n, average.data()));
      EXPECT_TRUE(FloatsBitEqual(sum_dev->Read(), sum));
      EXPECT_TRUE(FloatsBitEqual(average_dev->Read(), average));

      double cuda_sumsq = -1.0, cpu_sumsq = -1.0;
      ASSERT_OK(cuda()->SumSquares(p_dev->data(), n, &cuda_sumsq));
      ASSERT_OK(cpu()->SumSquares(p.data(), n, &cpu_sumsq));
      EXPECT_NEAR(cuda_sumsq, cpu_sumsq, 1e-12 * cpu_sumsq);
      const std::vector<float> v_fresh = RandomVariances(rng_, n);
      Dev v_fresh_dev = dev(v_fresh);
      float cuda_ratio = -1.0f, cpu_ratio = -1.0f;
      ASSERT_OK(
          cuda()->MaxDenomRatio(h.eps, v_dev->data(), v_fresh_dev->data(), n, &cuda_ratio));
      ASSERT_OK(cpu()->MaxDenomRatio(h.eps, v.data(), v_fresh.data(), n, &cpu_ratio));
      EXPECT_EQ(Bits(cuda_ratio), Bits(cpu_ratio));
    }
  }
}

TEST(CudaBackendNoDeviceTest, MissingDeviceIsUnavailable) {
  if (!CudaBuilt()) GTEST_SKIP() << "a build without CUDA (NoCudaBuildTest)";
  const int count = CudaDeviceCount();
  EXPECT_GE(count, 0);
  EXPECT_EQ(NewCudaBackend(count).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(NewCudaBackend(-1).status().code(), absl::StatusCode::kUnavailable);
  std::unique_ptr<Backend> cpu = NewCpuBackend();
  EXPECT_EQ(CudaStreamOf(cpu.get()), nullptr);
}

// A build without CUDA (cuda_backend_stub.cc): no devices, and asking for one is an error
// that names the build and that no restart fixes.
TEST(NoCudaBuildTest, CudaBackendIsAPermanentClearError) {
  if (CudaBuilt()) GTEST_SKIP() << "a build with CUDA";
  EXPECT_EQ(CudaDeviceCount(), 0);
  const absl::Status status = NewCudaBackend(0).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
  EXPECT_NE(status.message().find("this build of onebit has no CUDA"), std::string::npos)
      << status;
  EXPECT_NE(status.message().find("device \"cuda\" needs a build with CUDA"), std::string::npos)
      << status;
  EXPECT_TRUE(IsPermanent(status)) << status;
  std::unique_ptr<Backend> cpu = NewCpuBackend();
  EXPECT_EQ(CudaStreamOf(cpu.get()), nullptr);
  EXPECT_EQ(SetServerBitLoads(cpu.get(), ServerBitLoads::kWarpWords2).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace onebit::kernels
