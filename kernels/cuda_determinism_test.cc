// The CUDA backend is reproducible to the bit: every kernel that reduces (the sums of
// squares behind the scales of CompressWorker and ServerAggregate, and SumSquares, which
// the error-norm metrics use) runs twice on identical inputs, on two backends of the same
// GPU (a resumed run gets a new one) and on every other visible GPU, and must give
// identical bytes each time. Then a short 1-bit Adam sequence built from the kernels
// (warmup, then compression with W workers and W servers simulated on one device) runs
// twice, and once interrupted and resumed on a fresh backend: the bytes on the wire, the
// error norms and the final state must not differ in a single bit.
//
// Reproducibility is this file's subject; agreement with the CPU backend is
// cuda_backend_test's. The scales are still checked against the CPU here, to within
// rounding, at lengths past what cuda_backend_test covers.
//
// Every test also runs on the CPU backend (scalar and AVX2), which is deterministic by
// construction: that keeps the harness honest where there is no GPU. Without a GPU the
// CUDA instances skip.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/buffer.h"
#include "kernels/cuda_backend.h"
#include "kernels/kernels.h"
#include "common/status_macros.h"

namespace onebit::kernels {
namespace {

// Not multiples of 8, 32 or 256; more blocks than one reduction may have (4096), so that
// threads loop; 1 << 22 plus a tail.
constexpr size_t kLengths[] = {1, 7, 9, 255, 257, 1023, 1025, 4097, 10007, 1 << 20,
                               (1 << 22) + 3};
constexpr double kScaleTolerance = 1e-6;

#define ASSERT_OK(expr)                                                         \
  do {                                                                          \
    const absl::Status assert_ok_status_ = (expr);                              \
    ASSERT_TRUE(assert_ok_status_.ok()) << #expr << ": " << assert_ok_status_;  \
  } while (0)

#define ASSERT_OK_AND_ASSIGN(lhs, expr) \
  ASSERT_OK_AND_ASSIGN_IMPL_(ONEBIT_CONCAT_(assert_statusor_, __LINE__), lhs, expr)
#define ASSERT_OK_AND_ASSIGN_IMPL_(tmp, lhs, expr)                    \
  auto tmp = (expr);                                                  \
  ASSERT_TRUE(tmp.ok()) << #expr << ": " << tmp.status();             \
  lhs = std::move(tmp).value()

size_t CeilDiv(size_t a, size_t b) { return (a + b - 1) / b; }

// Cheap deterministic values in [-1, 1) with exact zeros of both signs: generating
// millions of normal floats per case would dominate the test.
std::vector<float> Pattern(size_t n, uint32_t seed, float scale = 1.0f) {
  std::vector<float> x(n);
  uint32_t state = seed * 2654435761u + 12345u;
  for (size_t i = 0; i < n; ++i) {
    state = state * 1664525u + 1013904223u;
    const float u = static_cast<float>(state >> 8) / 8388608.0f - 1.0f;
    x[i] = i % 17 == 5 ? 0.0f : i % 19 == 7 ? -0.0f : u * scale;
  }
  return x;
}

std::vector<uint8_t> RandomBlocks(size_t num_blocks, size_t chunk, uint32_t seed) {
  const size_t block_bytes = CompressedBlockBytes(chunk);
  std::vector<uint8_t> blocks(num_blocks * block_bytes);
  uint32_t state = seed * 2654435761u + 777u;
  for (size_t k = 0; k < num_blocks; ++k) {
    const float s = 0.25f + 0.125f * static_cast<float>(k % 11);
    std::memcpy(blocks.data() + k * block_bytes, &s, sizeof(s));
    for (size_t b = 4; b < block_bytes; ++b) {
      state = state * 1664525u + 1013904223u;
      blocks[k * block_bytes + b] = static_cast<uint8_t>(state >> 24);
    }
  }
  return blocks;
}

float BlockScale(const std::vector<uint8_t>& blocks, size_t offset) {
  float s;
  std::memcpy(&s, blocks.data() + offset, sizeof(s));
  return s;
}

// Equal as bytes (floats by their bits: -0 != +0, NaN == the same NaN).
template <typename T>
::testing::AssertionResult BitIdentical(const std::vector<T>& a, const std::vector<T>& b) {
  if (a.size() != b.size()) {
    return ::testing::AssertionFailure() << "sizes differ: " << a.size() << " vs " << b.size();
  }
  const size_t bytes = a.size() * sizeof(T);
  const auto* pa = reinterpret_cast<const uint8_t*>(a.data());
  const auto* pb = reinterpret_cast<const uint8_t*>(b.data());
  size_t mismatches = 0, first = 0;
  for (size_t i = 0; i < bytes; ++i) {
    if (pa[i] != pb[i] && mismatches++ == 0) first = i;
  }
  if (mismatches == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << mismatches << " of " << bytes
                                       << " bytes differ; first at byte " << first
                                       << " (element " << first / sizeof(T) << ")";
}

// A backend's run of one kernel: its outputs as bytes.
using Bytes = std::vector<uint8_t>;

template <typename T>
void Append(Bytes& out, const std::vector<T>& x) {
  const auto* p = reinterpret_cast<const uint8_t*>(x.data());
  out.insert(out.end(), p, p + x.size() * sizeof(T));
}

// CompressWorker from scratch on `backend`: the blocks, then the error after the call.
absl::StatusOr<Bytes> RunCompressWorker(Backend* backend, const std::vector<float>& m,
                                        const std::vector<float>& g, bool fused,
                                        const std::vector<float>& err, size_t num_chunks,
                                        size_t chunk) {
  ONEBIT_ASSIGN_OR_RETURN(auto m_dev, Buffer<float>::FromHost(backend, m.data(), m.size()));
  ONEBIT_ASSIGN_OR_RETURN(auto g_dev, Buffer<float>::FromHost(backend, g.data(), g.size()));
  ONEBIT_ASSIGN_OR_RETURN(auto err_dev,
                          Buffer<float>::FromHost(backend, err.data(), err.size()));
  ONEBIT_ASSIGN_OR_RETURN(auto out_dev, Buffer<uint8_t>::Create(
                                            backend, num_chunks * CompressedBlockBytes(chunk)));
  ONEBIT_RETURN_IF_ERROR(backend->CompressWorker(m_dev.data(), fused ? g_dev.data() : nullptr,
                                                 0.9f, m.size(), num_chunks, chunk,
                                                 err_dev.data(), out_dev.data()));
  Bytes result;
  ONEBIT_ASSIGN_OR_RETURN(const std::vector<uint8_t> out, out_dev.ToHost());
  ONEBIT_ASSIGN_OR_RETURN(const std::vector<float> err_after, err_dev.ToHost());
  Append(result, out);
  Append(result, err_after);
  return result;
}

absl::StatusOr<Bytes> RunServerAggregate(Backend* backend, const std::vector<uint8_t>& blocks,
                                         int num_workers, size_t chunk,
                                         const std::vector<float>& err) {
  ONEBIT_ASSIGN_OR_RETURN(auto blocks_dev,
                          Buffer<uint8_t>::FromHost(backend, blocks.data(), blocks.size()));
  ONEBIT_ASSIGN_OR_RETURN(auto err_dev,
                          Buffer<float>::FromHost(backend, err.data(), err.size()));
  ONEBIT_ASSIGN_OR_RETURN(auto out_dev,
                          Buffer<uint8_t>::Create(backend, CompressedBlockBytes(chunk)));
  ONEBIT_RETURN_IF_ERROR(backend->ServerAggregate(blocks_dev.data(), num_workers, chunk,
                                                  err_dev.data(), out_dev.data()));
  Bytes result;
  ONEBIT_ASSIGN_OR_RETURN(const std::vector<uint8_t> out, out_dev.ToHost());
  ONEBIT_ASSIGN_OR_RETURN(const std::vector<float> err_after, err_dev.ToHost());
  Append(result, out);
  Append(result, err_after);
  return result;
}

absl::StatusOr<double> RunSumSquares(Backend* backend, const std::vector<float>& x) {
  ONEBIT_ASSIGN_OR_RETURN(auto x_dev, Buffer<float>::FromHost(backend, x.data(), x.size()));
  double sum = -1.0;
  ONEBIT_RETURN_IF_ERROR(backend->SumSquares(x_dev.data(), x.size(), &sum));
  return sum;
}

// ---------------------------------------------------------------------------------------
// A 1-bit Adam sequence from the kernels alone (docs/algorithms.md): W workers that hold the same
// p, m and v (as real ones do), each with its own gradient and worker error, and W servers,
// one per chunk, each with its server error. Steps 1..freeze are warmup on the average
// gradient; later steps exchange the compressed momentum, masked.

constexpr int kWorkers = 3;
constexpr int kFreezeStep = 2;
constexpr int kSteps = 6;

struct AdamState {  // host copies
  std::vector<float> p, m, v;
  std::vector<std::vector<float>> worker_err;  // kWorkers x n_pad
  std::vector<std::vector<float>> server_err;  // kWorkers x chunk
};

// What one step shows: every block that would go on the wire, and the norms the metrics
// would report (sums of squares of every error buffer).
struct StepTrace {
  Bytes wire;
  std::vector<double> error_sumsq;
};

AdamHyper Hyper() {
  AdamHyper h;
  h.lr = 1e-2f;
  h.weight_decay = 0.01f;
  return h;
}

class SimulatedOnebitAdam {
 public:
  static absl::StatusOr<std::unique_ptr<SimulatedOnebitAdam>> Create(Backend* backend,
                                                                    size_t n,
                                                                    const AdamState& state) {
    auto adam = std::unique_ptr<SimulatedOnebitAdam>(new SimulatedOnebitAdam(backend, n));
    ONEBIT_RETURN_IF_ERROR(adam->Init(state));
    return adam;
  }

  static AdamState InitialState(size_t n) {
    const size_t chunk = ChunkFor(n);
    AdamState s;
    s.p = Pattern(n, 1);
    s.m.assign(n, 0.0f);
    s.v.assign(n, 0.0f);
    s.worker_err.assign(kWorkers, std::vector<float>(chunk * kWorkers, 0.0f));
    s.server_err.assign(kWorkers, std::vector<float>(chunk, 0.0f));
    return s;
  }

  // Step `step` (from 1) on gradients made from the step number alone.
  absl::StatusOr<StepTrace> Step(int step) {
    for (int w = 0; w < kWorkers; ++w) {
      const std::vector<float> g = Pattern(n_, 1000 * step + w, 0.1f);
      ONEBIT_RETURN_IF_ERROR(backend_->CopyFromHost(grads_.data() + w * n_, g.data(),
                                                    n_ * sizeof(float)));
    }
    StepTrace trace;
    const AdamHyper h = Hyper();
    if (step <= kFreezeStep) {
      ONEBIT_RETURN_IF_ERROR(backend_->AverageRows(grads_.data(), kWorkers, n_, avg_.data()));
      ONEBIT_RETURN_IF_ERROR(
          backend_->AdamWarmupUpdate(h, avg_.data(), 1.0f, m_.data(), v_.data(), p_.data(), n_));
    } else {
      const size_t block_bytes = CompressedBlockBytes(chunk_);
      for (int w = 0; w < kWorkers; ++w) {
        ONEBIT_RETURN_IF_ERROR(backend_->CompressWorker(
            m_.data(), grads_.data() + w * n_, h.beta1, n_, kWorkers, chunk_,
            worker_err_[w].data(), worker_out_.data() + w * kWorkers * block_bytes));
      }
      for (int r = 0; r < kWorkers; ++r) {
        for (int w = 0; w < kWorkers; ++w) {  // server r receives block r of every worker
          ONEBIT_RETURN_IF_ERROR(
              backend_->Copy(server_in_.data() + w * block_bytes,
                             worker_out_.data() + (w * kWorkers + r) * block_bytes, block_bytes));
        }
        ONEBIT_RETURN_IF_ERROR(backend_->ServerAggregate(server_in_.data(), kWorkers, chunk_,
                                                         server_err_[r].data(),
                                                         server_out_.data() + r * block_bytes));
      }
      ONEBIT_RETURN_IF_ERROR(backend_->DecompressFrozenAdamUpdate(
          server_out_.data(), kWorkers, chunk_, h, v_.data(), mask_.data(), m_.data(),
          p_.data(), n_));
      ONEBIT_ASSIGN_OR_RETURN(const std::vector<uint8_t> worker_out, worker_out_.ToHost());
      ONEBIT_ASSIGN_OR_RETURN(const std::vector<uint8_t> server_out, server_out_.ToHost());
      Append(trace.wire, worker_out);
      Append(trace.wire, server_out);
    }
    for (const auto* errors : {&worker_err_, &server_err_}) {
      for (const Buffer<float>& err : *errors) {
        double sumsq = -1.0;
        ONEBIT_RETURN_IF_ERROR(backend_->SumSquares(err.data(), err.size(), &sumsq));
        trace.error_sumsq.push_back(sumsq);
      }
    }
    return trace;
  }

  absl::StatusOr<AdamState> Save() const {
    AdamState s;
    ONEBIT_ASSIGN_OR_RETURN(s.p, p_.ToHost());
    ONEBIT_ASSIGN_OR_RETURN(s.m, m_.ToHost());
    ONEBIT_ASSIGN_OR_RETURN(s.v, v_.ToHost());
    for (const Buffer<float>& err : worker_err_) {
      ONEBIT_ASSIGN_OR_RETURN(std::vector<float> host, err.ToHost());
      s.worker_err.push_back(std::move(host));
    }
    for (const Buffer<float>& err : server_err_) {
      ONEBIT_ASSIGN_OR_RETURN(std::vector<float> host, err.ToHost());
      s.server_err.push_back(std::move(host));
    }
    return s;
  }

 private:
  SimulatedOnebitAdam(Backend* backend, size_t n)
      : backend_(backend), n_(n), chunk_(ChunkFor(n)) {}

  // n padded to a multiple of W*8, split W ways.
  static size_t ChunkFor(size_t n) { return CeilDiv(n, kWorkers * 8) * 8; }

  absl::Status Init(const AdamState& s) {
    const size_t block_bytes = CompressedBlockBytes(chunk_);
    ONEBIT_ASSIGN_OR_RETURN(p_, Buffer<float>::FromHost(backend_, s.p.data(), n_));
    ONEBIT_ASSIGN_OR_RETURN(m_, Buffer<float>::FromHost(backend_, s.m.data(), n_));
    ONEBIT_ASSIGN_OR_RETURN(v_, Buffer<float>::FromHost(backend_, s.v.data(), n_));
    // Masked where Pattern() gives every gradient a zero: unused parameters, the mask's use.
    std::vector<float> mask(n_);
    for (size_t i = 0; i < n_; ++i) mask[i] = i % 17 == 5 || i % 19 == 7 ? 0.0f : 1.0f;
    ONEBIT_ASSIGN_OR_RETURN(mask_, Buffer<float>::FromHost(backend_, mask.data(), n_));
    for (const std::vector<float>& err : s.worker_err) {
      ONEBIT_ASSIGN_OR_RETURN(Buffer<float> dev,
                              Buffer<float>::FromHost(backend_, err.data(), err.size()));
      worker_err_.push_back(std::move(dev));
    }
    for (const std::vector<float>& err : s.server_err) {
      ONEBIT_ASSIGN_OR_RETURN(Buffer<float> dev,
                              Buffer<float>::FromHost(backend_, err.data(), err.size()));
      server_err_.push_back(std::move(dev));
    }
    ONEBIT_ASSIGN_OR_RETURN(grads_, Buffer<float>::Create(backend_, kWorkers * n_));
    ONEBIT_ASSIGN_OR_RETURN(avg_, Buffer<float>::Create(backend_, n_));
    ONEBIT_ASSIGN_OR_RETURN(worker_out_,
                            Buffer<uint8_t>::Create(backend_, kWorkers * kWorkers * block_bytes));
    ONEBIT_ASSIGN_OR_RETURN(server_in_, Buffer<uint8_t>::Create(backend_, kWorkers * block_bytes));
    ONEBIT_ASSIGN_OR_RETURN(server_out_,
                            Buffer<uint8_t>::Create(backend_, kWorkers * block_bytes));
    return absl::OkStatus();
  }

  Backend* const backend_;
  const size_t n_, chunk_;
  Buffer<float> p_, m_, v_, mask_, grads_, avg_;
  std::vector<Buffer<float>> worker_err_, server_err_;
  Buffer<uint8_t> worker_out_, server_out_, server_in_;
};

// Steps first..last on a fresh simulation from `state`; the traces, and the state after.
struct RunResult {
  std::vector<StepTrace> steps;
  AdamState state;
};

absl::StatusOr<RunResult> RunSteps(Backend* backend, size_t n, const AdamState& state,
                                   int first, int last) {
  ONEBIT_ASSIGN_OR_RETURN(auto adam, SimulatedOnebitAdam::Create(backend, n, state));
  RunResult result;
  for (int step = first; step <= last; ++step) {
    ONEBIT_ASSIGN_OR_RETURN(StepTrace trace, adam->Step(step));
    result.steps.push_back(std::move(trace));
  }
  ONEBIT_ASSIGN_OR_RETURN(result.state, adam->Save());
  return result;
}

void ExpectSameState(const AdamState& a, const AdamState& b) {
  EXPECT_TRUE(BitIdentical(a.p, b.p)) << "params";
  EXPECT_TRUE(BitIdentical(a.m, b.m)) << "momentum";
  EXPECT_TRUE(BitIdentical(a.v, b.v)) << "variance";
  ASSERT_EQ(a.worker_err.size(), b.worker_err.size());
  for (size_t w = 0; w < a.worker_err.size(); ++w) {
    EXPECT_TRUE(BitIdentical(a.worker_err[w], b.worker_err[w])) << "worker error " << w;
  }
  ASSERT_EQ(a.server_err.size(), b.server_err.size());
  for (size_t r = 0; r < a.server_err.size(); ++r) {
    EXPECT_TRUE(BitIdentical(a.server_err[r], b.server_err[r])) << "server error " << r;
  }
}

void ExpectSameTrace(const StepTrace& a, const StepTrace& b, int step) {
  EXPECT_TRUE(BitIdentical(a.wire, b.wire)) << "blocks on the wire, step " << step;
  EXPECT_TRUE(BitIdentical(a.error_sumsq, b.error_sumsq)) << "error norms, step " << step;
}

// ---------------------------------------------------------------------------------------

enum class Kind { kCuda, kCpuScalar, kCpuSimd };

std::string KindName(const ::testing::TestParamInfo<Kind>& info) {
  switch (info.param) {
    case Kind::kCuda:
      return "Cuda";
    case Kind::kCpuScalar:
      return "CpuScalar";
    case Kind::kCpuSimd:
      return "CpuSimd";
  }
  return "Unknown";
}

// Parameterized by backend: the CUDA one is the subject; the CPU ones (deterministic by
// construction) hold the harness to account on machines without a GPU, and are the
// resume guarantee's other half.
class DeterminismTest : public ::testing::TestWithParam<Kind> {
 protected:
  void SetUp() override {
    int devices = 1;
    if (GetParam() == Kind::kCuda) {
      devices = CudaDeviceCount();
      if (devices == 0) {
        GTEST_SKIP() << "no CUDA device: CudaDeviceCount() == 0 (no GPU or no driver on this "
                        "machine, or a build without CUDA); run this test on a GPU machine";
      }
    }
    // Two backends on device 0 (a resumed run gets a fresh one), then one per other GPU:
    // the order of the sums does not depend on the device.
    for (int device : {0, 0}) AddBackend(device);
    for (int device = 1; device < devices; ++device) AddBackend(device);
    if (HasFatalFailure()) return;  // the body does not run; backends_ may be short
    cpu_ = NewCpuBackend(/*allow_simd=*/false);
  }

  void TearDown() override {
    for (const auto& backend : backends_) EXPECT_TRUE(backend->Synchronize().ok());
  }

  absl::StatusOr<std::unique_ptr<Backend>> NewBackend(int device) {
    switch (GetParam()) {
      case Kind::kCuda:
        return NewCudaBackend(device);
      case Kind::kCpuScalar:
        return NewCpuBackend(/*allow_simd=*/false);
      case Kind::kCpuSimd:
        return NewCpuBackend(/*allow_simd=*/true);
    }
    return absl::InternalError("unknown backend kind");
  }

  void AddBackend(int device) {
    absl::StatusOr<std::unique_ptr<Backend>> backend = NewBackend(device);
    ASSERT_TRUE(backend.ok()) << backend.status();
    backends_.push_back(std::move(*backend));
  }

  // Every run of `run` on every backend, twice each, must give the bytes of the first.
  template <typename Run>
  void ExpectReproducible(const Run& run) {
    std::optional<Bytes> first;
    for (size_t b = 0; b < backends_.size(); ++b) {
      for (int repeat = 0; repeat < 2; ++repeat) {
        SCOPED_TRACE(absl::StrCat(backends_[b]->name(), ", backend ", b, ", run ", repeat));
        absl::StatusOr<Bytes> bytes = run(backends_[b].get());
        ASSERT_TRUE(bytes.ok()) << bytes.status();
        if (!first.has_value()) {
          first = std::move(*bytes);
          continue;
        }
        ASSERT_TRUE(BitIdentical(*bytes, *first));
      }
    }
  }

  std::vector<std::unique_ptr<Backend>> backends_;
  std::unique_ptr<Backend> cpu_;
};

TEST_P(DeterminismTest, CompressWorkerIsBitReproducible) {
  uint32_t seed = 0;
  for (size_t n : kLengths) {
    for (size_t num_chunks : {1, 3}) {
      for (bool fused : {false, true}) {
        const size_t unit = num_chunks * 8;
        const size_t chunk = CeilDiv(n, unit) * unit / num_chunks;
        SCOPED_TRACE(absl::StrCat("n = ", n, ", num_chunks = ", num_chunks,
                                  fused ? ", fused momentum" : ""));
        const std::vector<float> m = Pattern(n, ++seed);
        const std::vector<float> g = Pattern(n, ++seed);
        const std::vector<float> err = Pattern(num_chunks * chunk, ++seed, 0.1f);
        ExpectReproducible([&](Backend* backend) {
          return RunCompressWorker(backend, m, g, fused, err, num_chunks, chunk);
        });
        if (HasFatalFailure()) return;

        // The order is fixed, and as accurate as before: the scale is the scalar CPU
        // kernels' to within rounding.
        absl::StatusOr<Bytes> result =
            RunCompressWorker(backends_[0].get(), m, g, fused, err, num_chunks, chunk);
        ASSERT_TRUE(result.ok()) << result.status();
        std::vector<float> cpu_err = err;
        std::vector<uint8_t> cpu_out(num_chunks * CompressedBlockBytes(chunk));
        ASSERT_OK(cpu_->CompressWorker(m.data(), fused ? g.data() : nullptr, 0.9f, n,
                                       num_chunks, chunk, cpu_err.data(), cpu_out.data()));
        const double s_backend = BlockScale(*result, 0), s_cpu = BlockScale(cpu_out, 0);
        EXPECT_NEAR(s_backend, s_cpu, kScaleTolerance * s_cpu);
      }
    }
  }
}

TEST_P(DeterminismTest, ServerAggregateIsBitReproducible) {
  uint32_t seed = 100;
  for (size_t length : kLengths) {
    for (int num_workers : {1, 3, 8}) {
      const size_t chunk = CeilDiv(length, 8) * 8;
      SCOPED_TRACE(absl::StrCat("chunk = ", chunk, ", num_workers = ", num_workers));
      const std::vector<uint8_t> blocks = RandomBlocks(num_workers, chunk, ++seed);
      const std::vector<float> err = Pattern(chunk, ++seed, 0.1f);
      ExpectReproducible([&](Backend* backend) {
        return RunServerAggregate(backend, blocks, num_workers, chunk, err);
      });
      if (HasFatalFailure()) return;

      absl::StatusOr<Bytes> result =
          RunServerAggregate(backends_[0].get(), blocks, num_workers, chunk, err);
      ASSERT_TRUE(result.ok()) << result.status();
      std::vector<float> cpu_err = err;
      std::vector<uint8_t> cpu_out(CompressedBlockBytes(chunk));
      ASSERT_OK(cpu_->ServerAggregate(blocks.data(), num_workers, chunk, cpu_err.data(),
                                      cpu_out.data()));
      const double s_backend = BlockScale(*result, 0), s_cpu = BlockScale(cpu_out, 0);
      EXPECT_NEAR(s_backend, s_cpu, kScaleTolerance * s_cpu);
    }
  }
}

// The warp-word readings of the workers' bits (ServerBitLoads) are as reproducible: their
// sums of squares follow a fixed order too, a function of the length alone.
TEST_P(DeterminismTest, ServerAggregateByWarpWordsIsBitReproducible) {
  if (GetParam() != Kind::kCuda) {
    GTEST_SKIP() << "the readings of the bits are the CUDA backend's; "
                    "ServerAggregateIsBitReproducible covers this backend";
  }
  uint32_t seed = 300;
  for (ServerBitLoads loads : {ServerBitLoads::kWarpWords2, ServerBitLoads::kWarpWords4}) {
    for (const auto& backend : backends_) ASSERT_OK(SetServerBitLoads(backend.get(), loads));
    for (size_t chunk : {size_t{1} << 20, (size_t{1} << 22) + 32, size_t{16777376}}) {
      for (int num_workers : {3, 9}) {
        SCOPED_TRACE(absl::StrCat("loads ", static_cast<int>(loads), ", chunk = ", chunk,
                                  ", num_workers = ", num_workers));
        const std::vector<uint8_t> blocks = RandomBlocks(num_workers, chunk, ++seed);
        const std::vector<float> err = Pattern(chunk, ++seed, 0.1f);
        ExpectReproducible([&](Backend* backend) {
          return RunServerAggregate(backend, blocks, num_workers, chunk, err);
        });
        if (HasFatalFailure()) return;
      }
    }
  }
}

// The error norms of the metrics.
TEST_P(DeterminismTest, SumSquaresIsBitReproducible) {
  uint32_t seed = 200;
  std::vector<size_t> lengths(std::begin(kLengths), std::end(kLengths));
  lengths.push_back(0);
  lengths.push_back((size_t{1} << 24) + 5);  // 16 elements per thread of the largest grid
  for (size_t n : lengths) {
    SCOPED_TRACE(absl::StrCat("n = ", n));
    const std::vector<float> x = Pattern(n, ++seed);
    ExpectReproducible([&](Backend* backend) -> absl::StatusOr<Bytes> {
      ONEBIT_ASSIGN_OR_RETURN(const double sum, RunSumSquares(backend, x));
      Bytes bytes;
      Append(bytes, std::vector<double>{sum});
      return bytes;
    });
    if (HasFatalFailure()) return;
    absl::StatusOr<double> result = RunSumSquares(backends_[0].get(), x);
    ASSERT_TRUE(result.ok()) << result.status();
    double cpu = -1.0;
    ASSERT_OK(cpu_->SumSquares(x.data(), n, &cpu));
    // Two orders of a float64 sum of n positive terms: each within (n - 1) * 2^-53 of the
    // exact sum (the scalar kernels' sequential order is the worst).
    EXPECT_NEAR(*result, cpu, (1e-12 + static_cast<double>(n) * 0x1p-53) * cpu);
  }
}

// Reductions of other lengths in between leave nothing behind that changes the next one.
TEST_P(DeterminismTest, ReductionsDoNotDependOnHistory) {
  Backend* backend = backends_[0].get();
  const std::vector<float> big = Pattern((1 << 22) + 3, 7);
  const std::vector<float> small = Pattern(1025, 8);
  ASSERT_OK_AND_ASSIGN(const double big_alone, RunSumSquares(backend, big));
  ASSERT_OK_AND_ASSIGN(const double small_alone, RunSumSquares(backend, small));
  for (int round = 0; round < 3; ++round) {
    ASSERT_OK_AND_ASSIGN(const double s, RunSumSquares(backend, small));
    ASSERT_OK_AND_ASSIGN(const double b, RunSumSquares(backend, big));
    EXPECT_TRUE(BitIdentical(std::vector<double>{s}, std::vector<double>{small_alone}));
    EXPECT_TRUE(BitIdentical(std::vector<double>{b}, std::vector<double>{big_alone}));
  }
}

TEST_P(DeterminismTest, OnebitAdamSequenceIsBitReproducible) {
  for (size_t n : {size_t{10007}, (size_t{1} << 21) + 3}) {
    SCOPED_TRACE(absl::StrCat("n = ", n));
    const AdamState initial = SimulatedOnebitAdam::InitialState(n);
    ASSERT_OK_AND_ASSIGN(const RunResult first, RunSteps(backends_[0].get(), n, initial, 1,
                                                         kSteps));
    for (size_t b = 0; b < backends_.size(); ++b) {
      SCOPED_TRACE(absl::StrCat(backends_[b]->name(), ", backend ", b));
      ASSERT_OK_AND_ASSIGN(const RunResult again,
                           RunSteps(backends_[b].get(), n, initial, 1, kSteps));
      ASSERT_EQ(again.steps.size(), first.steps.size());
      for (size_t t = 0; t < first.steps.size(); ++t) {
        ExpectSameTrace(again.steps[t], first.steps[t], static_cast<int>(t) + 1);
      }
      ExpectSameState(again.state, first.state);
    }
    // The sequence did compress: the error buffers are not all zero.
    EXPECT_GT(first.steps.back().error_sumsq.front(), 0.0);
  }
}

// Stop after step k, carry the state through the host as a checkpoint would, go on from
// step k + 1 on a new backend: the same bits as a run never interrupted.
TEST_P(DeterminismTest, ResumedOnebitAdamSequenceContinuesBitForBit) {
  const size_t n = (size_t{1} << 20) + 3;
  const AdamState initial = SimulatedOnebitAdam::InitialState(n);
  ASSERT_OK_AND_ASSIGN(const RunResult whole,
                       RunSteps(backends_[0].get(), n, initial, 1, kSteps));
  for (int stop_after : {1, kFreezeStep, kFreezeStep + 2}) {
    SCOPED_TRACE(absl::StrCat("stopped after step ", stop_after));
    ASSERT_OK_AND_ASSIGN(const RunResult before,
                         RunSteps(backends_[0].get(), n, initial, 1, stop_after));
    absl::StatusOr<std::unique_ptr<Backend>> fresh = NewBackend(0);
    ASSERT_TRUE(fresh.ok()) << fresh.status();
    ASSERT_OK_AND_ASSIGN(const RunResult after,
                         RunSteps(fresh->get(), n, before.state, stop_after + 1, kSteps));
    for (int t = 1; t <= kSteps; ++t) {
      const StepTrace& resumed =
          t <= stop_after ? before.steps[t - 1] : after.steps[t - stop_after - 1];
      ExpectSameTrace(resumed, whole.steps[t - 1], t);
    }
    ExpectSameState(after.state, whole.state);
    ASSERT_TRUE((*fresh)->Synchronize().ok());
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, DeterminismTest,
                         ::testing::Values(Kind::kCuda, Kind::kCpuScalar, Kind::kCpuSimd),
                         KindName);

}  // namespace
}  // namespace onebit::kernels
