// Throughput of the CPU kernels against memcpy, in one run.
//
// Each kernel reports GB/s over the fewest bytes it must move (a read of every input and a
// write of every output; compression and aggregation also need a second read of x,
// because the scale is a norm over the whole tensor and 64M floats do not fit a cache),
// and `vs_memcpy`: that bandwidth over memcpy's, measured in the same process on the same
// byte counts (a memcpy of B bytes moves 2B: B read, B written). Each kernel runs on 1, 2,
// 4, ... threads up to the usable CPUs (the argument /N); memcpy too, split the same way,
// so `vs_memcpy` of a kernel on N threads compares with memcpy on N threads.
//
//   bazel run -c opt //kernels:cpu_kernels_benchmark -- --benchmark_min_time=2
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include <map>

#include "benchmark/benchmark.h"
#include "common/parallel.h"
#include "kernels/buffer.h"
#include "kernels/kernels.h"

namespace onebit::kernels {
namespace {

constexpr size_t kN = size_t{64} << 20;  // 64M elements
constexpr int kWorkers = 4;              // chunks per tensor, as with 4 workers
constexpr size_t kChunk = kN / kWorkers;
constexpr double kBlockBytes = static_cast<double>(CompressedBlockBytes(kChunk));

// Minimum bytes per kernel (F = 4 bytes per float element, B = packed bits).
constexpr double F = 4.0 * kN, B = kN / 8.0;
constexpr double kMomentumBytes = 3 * F;                       // read m, g; write m
constexpr double kCompressBytes = 3 * F + F + F + B + 4.0 * kWorkers;  // read m,g,err; reread x; write err, signs
constexpr double kServerBytes = kWorkers * kBlockBytes + 3 * (F / kWorkers) + kBlockBytes;  // blocks; err r, x reread, err w; out
constexpr double kDecompressBytes = B + F;                     // read signs; write m
constexpr double kWarmupBytes = 7 * F;                         // read g,m,v,p; write m,v,p
constexpr double kFrozenBytes = 5 * F;                         // read m,v,p; write m,p
constexpr double kDecompressUpdateBytes = B + 4 * F;           // read signs,v,p; write m,p
constexpr double kStepBytes = kCompressBytes + kServerBytes + kDecompressUpdateBytes;
// int8 (Q = one byte per element): the same passes with codes instead of sign bits.
constexpr double Q = kN, kInt8BlockBytes = static_cast<double>(Int8BlockBytes(kChunk));
constexpr double kCompressInt8Bytes = 3 * F + F + F + Q + 8.0 * kWorkers;  // read m,g,err; reread x; write err, codes
constexpr double kServerInt8Bytes = kWorkers * kInt8BlockBytes + 3 * (F / kWorkers) + kInt8BlockBytes;
constexpr double kDecompressInt8Bytes = Q + F;  // read codes; write m

struct State {
  std::map<int, std::unique_ptr<Backend>> backends;  // by thread count
  std::map<int, double> memcpy_gbps;                 // by thread count, from BM_Memcpy
  std::vector<float> m, g, v, p, err, server_err;
  std::vector<uint8_t> blocks, server_out;
  std::vector<uint8_t> blocks8, server_out8;  // int8
  std::vector<char> src, dst;

  Backend* backend(int threads) {
    std::unique_ptr<Backend>& b = backends[threads];
    if (b == nullptr) b = NewCpuBackend(/*allow_simd=*/true, threads);
    return b.get();
  }

  State() {
    std::mt19937 rng(1);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    auto fill = [&](std::vector<float>& x) {
      x.resize(kN);
      for (float& e : x) e = dist(rng);
    };
    fill(m), fill(g), fill(v), fill(p), fill(err);
    for (float& e : v) e = e * e;
    server_err.assign(kChunk, 0.0f);
    blocks.assign(kWorkers * CompressedBlockBytes(kChunk), 0x5A);
    server_out.assign(CompressedBlockBytes(kChunk), 0);
    blocks8.assign(kWorkers * Int8BlockBytes(kChunk), 0x5A);
    for (int r = 0; r < kWorkers; ++r) {  // sane headers: scale 0.01, offset -1
      const float header[2] = {0.01f, -1.0f};
      std::memcpy(blocks8.data() + r * Int8BlockBytes(kChunk), header, sizeof(header));
    }
    server_out8.assign(Int8BlockBytes(kChunk), 0);
    src.assign(static_cast<size_t>(F), 1);
    dst.assign(static_cast<size_t>(F), 0);
  }
};

State& S() {
  static State* state = new State();
  return *state;
}

// Reports bandwidth over `bytes` per iteration and the ratio to memcpy on as many threads.
void Report(benchmark::State& st, double bytes) {
  st.SetBytesProcessed(static_cast<int64_t>(bytes) * st.iterations());
  st.counters["min_bytes"] = bytes;
  st.counters["GBps"] = benchmark::Counter(bytes * st.iterations() / 1e9, benchmark::Counter::kIsRate);
  const double memcpy_gbps = S().memcpy_gbps[static_cast<int>(st.range(0))];
  if (memcpy_gbps > 0) {
    st.counters["vs_memcpy"] = benchmark::Counter(
        bytes * st.iterations() / 1e9 / memcpy_gbps, benchmark::Counter::kIsRate);
  }
}

// memcpy of the whole buffer, cut into as many pieces as threads, one per thread.
void BM_Memcpy(benchmark::State& st) {
  State& s = S();
  const int threads = static_cast<int>(st.range(0));
  ParallelFor pool(threads);
  const size_t piece = (s.src.size() / threads + 63) / 64 * 64;
  double seconds = 0;
  for (auto _ : st) {
    const auto start = std::chrono::steady_clock::now();
    pool.Run(threads, [&](size_t t) {
      const size_t begin = std::min(s.src.size(), t * piece);
      const size_t end = std::min(s.src.size(), begin + piece);
      std::memcpy(s.dst.data() + begin, s.src.data() + begin, end - begin);
    });
    benchmark::ClobberMemory();
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  s.memcpy_gbps[threads] = 2 * F * st.iterations() / seconds / 1e9;
  Report(st, 2 * F);
}

void BM_MomentumUpdate(benchmark::State& st) {
  State& s = S();
  for (auto _ : st) (void)s.backend(static_cast<int>(st.range(0)))->MomentumUpdate(0.9f, s.g.data(), s.m.data(), kN);
  Report(st, kMomentumBytes);
}

void BM_CompressWorkerFused(benchmark::State& st) {
  State& s = S();
  for (auto _ : st) {
    (void)s.backend(static_cast<int>(st.range(0)))->CompressWorker(s.m.data(), s.g.data(), 0.9f, kN, kWorkers, kChunk,
                                    s.err.data(), s.blocks.data());
  }
  Report(st, kCompressBytes);
}

void BM_ServerAggregate(benchmark::State& st) {
  State& s = S();
  for (auto _ : st) {
    (void)s.backend(static_cast<int>(st.range(0)))->ServerAggregate(s.blocks.data(), kWorkers, kChunk, s.server_err.data(),
                                     s.server_out.data());
  }
  Report(st, kServerBytes);
}

void BM_Decompress(benchmark::State& st) {
  State& s = S();
  for (auto _ : st) (void)s.backend(static_cast<int>(st.range(0)))->Decompress(s.blocks.data(), kWorkers, kChunk, kN, s.m.data());
  Report(st, kDecompressBytes);
}

void BM_CompressWorkerFusedInt8(benchmark::State& st) {
  State& s = S();
  for (auto _ : st) {
    (void)s.backend(static_cast<int>(st.range(0)))->CompressWorkerInt8(
        s.m.data(), s.g.data(), 0.9f, kN, kWorkers, kChunk, s.err.data(), s.blocks8.data());
  }
  Report(st, kCompressInt8Bytes);
}

void BM_ServerAggregateInt8(benchmark::State& st) {
  State& s = S();
  for (auto _ : st) {
    (void)s.backend(static_cast<int>(st.range(0)))->ServerAggregateInt8(
        s.blocks8.data(), kWorkers, kChunk, s.server_err.data(), s.server_out8.data());
  }
  Report(st, kServerInt8Bytes);
}

void BM_DecompressInt8(benchmark::State& st) {
  State& s = S();
  for (auto _ : st) {
    (void)s.backend(static_cast<int>(st.range(0)))->DecompressInt8(s.blocks8.data(), kWorkers,
                                                                   kChunk, kN, s.m.data());
  }
  Report(st, kDecompressInt8Bytes);
}

void BM_AdamWarmupUpdate(benchmark::State& st) {
  State& s = S();
  AdamHyper h;
  h.lr = 1e-9f;  // keep the values sane over many iterations
  for (auto _ : st) {
    (void)s.backend(static_cast<int>(st.range(0)))->AdamWarmupUpdate(h, s.g.data(), 1.0f, s.m.data(), s.v.data(), s.p.data(), kN);
  }
  Report(st, kWarmupBytes);
}

void BM_FrozenAdamUpdate(benchmark::State& st) {
  State& s = S();
  AdamHyper h;
  h.lr = 1e-9f;
  for (auto _ : st) (void)s.backend(static_cast<int>(st.range(0)))->FrozenAdamUpdate(h, s.v.data(), nullptr, s.m.data(), s.p.data(), kN);
  Report(st, kFrozenBytes);
}

void BM_DecompressFrozenAdamUpdate(benchmark::State& st) {
  State& s = S();
  AdamHyper h;
  h.lr = 1e-9f;
  for (auto _ : st) {
    (void)s.backend(static_cast<int>(st.range(0)))->DecompressFrozenAdamUpdate(s.blocks.data(), kWorkers, kChunk, h, s.v.data(),
                                                nullptr, s.m.data(), s.p.data(), kN);
  }
  Report(st, kDecompressUpdateBytes);
}

// The compute of one compression-stage step of one worker (4 workers): momentum update
// fused into compression, aggregation of its own chunk, decompression fused into the
// parameter update. The exchange itself is not included.
void BM_CompressionStep(benchmark::State& st) {
  State& s = S();
  AdamHyper h;
  h.lr = 1e-9f;
  for (auto _ : st) {
    (void)s.backend(static_cast<int>(st.range(0)))->CompressWorker(s.m.data(), s.g.data(), 0.9f, kN, kWorkers, kChunk,
                                    s.err.data(), s.blocks.data());
    (void)s.backend(static_cast<int>(st.range(0)))->ServerAggregate(s.blocks.data(), kWorkers, kChunk, s.server_err.data(),
                                     s.server_out.data());
    (void)s.backend(static_cast<int>(st.range(0)))->DecompressFrozenAdamUpdate(s.blocks.data(), kWorkers, kChunk, h, s.v.data(),
                                                nullptr, s.m.data(), s.p.data(), kN);
  }
  Report(st, kStepBytes);
}

// 1, 2, 4, ... threads, up to the CPUs this process may use.
void ThreadCounts(benchmark::internal::Benchmark* b) {
  const int cpus = UsableCpus();
  for (int t = 1; t < cpus; t *= 2) b->Arg(t);
  b->Arg(cpus);
}

BENCHMARK(BM_Memcpy)->Unit(benchmark::kMillisecond)->UseRealTime()->Apply(ThreadCounts);
BENCHMARK(BM_MomentumUpdate)->Unit(benchmark::kMillisecond)->UseRealTime()->Apply(ThreadCounts);
BENCHMARK(BM_CompressWorkerFused)->Unit(benchmark::kMillisecond)->UseRealTime()->Apply(ThreadCounts);
BENCHMARK(BM_ServerAggregate)->Unit(benchmark::kMillisecond)->UseRealTime()->Apply(ThreadCounts);
BENCHMARK(BM_Decompress)->Unit(benchmark::kMillisecond)->UseRealTime()->Apply(ThreadCounts);
BENCHMARK(BM_CompressWorkerFusedInt8)->Unit(benchmark::kMillisecond)->UseRealTime()->Apply(ThreadCounts);
BENCHMARK(BM_ServerAggregateInt8)->Unit(benchmark::kMillisecond)->UseRealTime()->Apply(ThreadCounts);
BENCHMARK(BM_DecompressInt8)->Unit(benchmark::kMillisecond)->UseRealTime()->Apply(ThreadCounts);
BENCHMARK(BM_AdamWarmupUpdate)->Unit(benchmark::kMillisecond)->UseRealTime()->Apply(ThreadCounts);
BENCHMARK(BM_FrozenAdamUpdate)->Unit(benchmark::kMillisecond)->UseRealTime()->Apply(ThreadCounts);
BENCHMARK(BM_DecompressFrozenAdamUpdate)->Unit(benchmark::kMillisecond)->UseRealTime()->Apply(ThreadCounts);
BENCHMARK(BM_CompressionStep)->Unit(benchmark::kMillisecond)->UseRealTime()->Apply(ThreadCounts);
BENCHMARK(BM_Memcpy)->Name("BM_Memcpy_again")->Unit(benchmark::kMillisecond)->UseRealTime()->Apply(ThreadCounts);

}  // namespace
}  // namespace onebit::kernels

int main(int argc, char** argv) {
  std::printf("backend: %s, %zu elements, %d chunks, %d usable CPUs\n",
              onebit::kernels::NewCpuBackend()->name().c_str(), onebit::kernels::kN,
              onebit::kernels::kWorkers, onebit::UsableCpus());
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
