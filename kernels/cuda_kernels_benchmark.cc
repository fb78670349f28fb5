// Memory bandwidth of every CUDA kernel at 64M elements, each next to a device-to-device
// cudaMemcpyAsync that moves the same number of bytes, timed in the same run with
// cudaEvents on the backend's stream. The kernels are memory bound, so the ratio to the
// copy says how far each is from what the GPU's memory allows.
//
// Counters per kernel:
//   min_bytes  the fewest bytes the kernel must move: every input read once, every output
//              written once
//   GB/s       min_bytes / kernel time
//   copy_GB/s  bytes moved / time of a copy of min_bytes/2 bytes (it reads and writes them)
//   vs_copy    GB/s / copy_GB/s; 1 is the ceiling
//   pass_bytes, vs_copy_passes (the compressions only): the same for the bytes their two
//              passes must move. The scale depends on every element before any sign can be
//              applied to the error, so pass 1 reads the input and writes x into the error
//              (its sum of squares on the way) and pass 2 reads and writes the error again
//              with the bits: 8 bytes per element more than min_bytes, so vs_copy tops out
//              near 0.6 for them (0.45 for ServerAggregate) and vs_copy_passes near 1.
//
// The optimizer family's kernels (the int8 compressor, 0/1 Adam's, 1-bit LAMB's, the
// momentum mask's) are measured the same way.
//
// ServerAggregate runs once for each way of reading the workers' bits (ServerBitLoads,
// cuda_backend.h): "/warp_words2" and "/warp_words4" beside the default.
//
// The kernels that reduce (the compressions, SumSquares) also run at 256K, 1M and 4M
// elements, where launches, the last wave of blocks and the last block's sum of the
// partials (cuda_kernels_common.cuh, "Reductions") weigh more than at 64M.
//
// Without a GPU it says so and exits 0.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "benchmark/benchmark.h"
#include "kernels/cuda_backend.h"
#include "kernels/kernels.h"

namespace onebit::kernels {
namespace {

constexpr size_t kN = size_t{64} << 20;  // elements
constexpr size_t kChunks = 8;            // worker blocks per tensor (W = 8 servers)
constexpr int kWorkers = 8;              // blocks per server aggregation; rows per SumRows
constexpr size_t kChunk = kN / kChunks;
constexpr size_t kCopyRepeats = 20;

void Check(cudaError_t error, const char* what) {
  if (error != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(error));
    std::exit(1);
  }
}

void Check(const absl::Status& status, const char* what) {
  if (!status.ok()) {
    std::fprintf(stderr, "%s: %s\n", what, status.ToString().c_str());
    std::exit(1);
  }
}

// Device buffers for every kernel, filled once with plausible values.
struct Workspace {
  std::unique_ptr<Backend> backend;
  cudaStream_t stream = nullptr;
  cudaEvent_t start = nullptr, stop = nullptr;
  float *g, *m, *v, *p, *mask, *err, *out, *rows, *v_fresh;
  uint8_t *worker_blocks, *server_blocks, *server_out;
  uint8_t *int8_worker_blocks, *int8_server_blocks, *int8_server_out;  // the int8 format
  void *copy_src, *copy_dst;
  size_t copy_capacity;

  template <typename T>
  T* Allocate(size_t count) {
    absl::StatusOr<void*> ptr = backend->Allocate(count * sizeof(T));
    Check(ptr.status(), "Allocate");
    return static_cast<T*>(*ptr);
  }

  // Milliseconds of `fn`'s work on the stream.
  float Time(const std::function<absl::Status()>& fn) {
    Check(cudaEventRecord(start, stream), "cudaEventRecord");
    Check(fn(), "kernel");
    Check(cudaEventRecord(stop, stream), "cudaEventRecord");
    Check(cudaEventSynchronize(stop), "cudaEventSynchronize");
    float ms = 0.0f;
    Check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
    return ms;
  }
};

Workspace* workspace = nullptr;

// `num_workers` server blocks of `chunk` elements: fixed signs, a scale of its own each.
std::vector<uint8_t> ServerBlocks(int num_workers, size_t chunk) {
  const size_t block_bytes = CompressedBlockBytes(chunk);
  std::vector<uint8_t> blocks(num_workers * block_bytes);
  for (int r = 0; r < num_workers; ++r) {
    uint8_t* block = blocks.data() + r * block_bytes;
    const float s = 0.5f + 0.1f * r;
    std::memcpy(block, &s, sizeof(s));
    for (size_t i = 4; i < block_bytes; ++i) block[i] = static_cast<uint8_t>(i * 37 + r);
  }
  return blocks;
}

// A cheap deterministic fill: generating 64M normal floats on the host would dominate.
std::vector<float> Pattern(size_t n, uint32_t seed, bool non_negative) {
  std::vector<float> x(n);
  uint32_t state = seed;
  for (size_t i = 0; i < n; ++i) {
    state = state * 1664525u + 1013904223u;
    const float u = static_cast<float>(state >> 8) / 16777216.0f;  // [0, 1)
    x[i] = non_negative ? u * 1e-4f : u - 0.5f;
  }
  return x;
}

Workspace* MakeWorkspace() {
  auto* w = new Workspace;
  absl::StatusOr<std::unique_ptr<Backend>> backend = NewCudaBackend(0);
  Check(backend.status(), "NewCudaBackend");
  w->backend = std::move(*backend);
  w->stream = static_cast<cudaStream_t>(CudaStreamOf(w->backend.get()));
  Check(cudaEventCreate(&w->start), "cudaEventCreate");
  Check(cudaEventCreate(&w->stop), "cudaEventCreate");

  Backend* b = w->backend.get();
  const std::vector<float> signed_values = Pattern(kN, 1, false);
  const std::vector<float> variances = Pattern(kN, 2, true);
  std::vector<float> mask(kN);
  for (size_t i = 0; i < kN; ++i) mask[i] = i % 10 == 0 ? 0.0f : 1.0f;
  w->g = w->Allocate<float>(kN);
  w->m = w->Allocate<float>(kN);
  w->v = w->Allocate<float>(kN);
  w->p = w->Allocate<float>(kN);
  w->mask = w->Allocate<float>(kN);
  w->err = w->Allocate<float>(kN);
  w->out = w->Allocate<float>(kN);
  w->rows = w->Allocate<float>(kWorkers * kN);
  w->v_fresh = w->Allocate<float>(kN);
  for (float* x : {w->g, w->m, w->p}) {
    Check(b->CopyFromHost(x, signed_values.data(), kN * sizeof(float)), "CopyFromHost");
  }
  for (int r = 0; r < kWorkers; ++r) {
    Check(b->CopyFromHost(w->rows + r * kN, signed_values.data(), kN * sizeof(float)),
          "CopyFromHost");
  }
  Check(b->CopyFromHost(w->v, variances.data(), kN * sizeof(float)), "CopyFromHost");
  Check(b->CopyFromHost(w->v_fresh, variances.data(), kN * sizeof(float)), "CopyFromHost");
  Check(b->CopyFromHost(w->mask, mask.data(), kN * sizeof(float)), "CopyFromHost");
  Check(b->Zero(w->err, kN * sizeof(float)), "Zero");

  // Worker blocks come from a real compression; the server's W blocks of a 64M-element
  // chunk are the first worker block's signs repeated, each with its own scale.
  w->worker_blocks = w->Allocate<uint8_t>(kChunks * CompressedBlockBytes(kChunk));
  Check(b->CompressWorker(w->m, nullptr, 0.9f, kN, kChunks, kChunk, w->err, w->worker_blocks),
        "CompressWorker");
  const size_t server_block_bytes = CompressedBlockBytes(kN);
  const std::vector<uint8_t> server_blocks = ServerBlocks(kWorkers, kN);
  w->server_blocks = w->Allocate<uint8_t>(server_blocks.size());
  Check(b->CopyFromHost(w->server_blocks, server_blocks.data(), server_blocks.size()),
        "CopyFromHost");
  w->server_out = w->Allocate<uint8_t>(server_block_bytes);

  // The int8 format likewise: worker blocks from a real compression; the server's W blocks
  // are one real block of the whole tensor, repeated (valid scales and offsets).
  w->int8_worker_blocks = w->Allocate<uint8_t>(kChunks * Int8BlockBytes(kChunk));
  Check(b->CompressWorkerInt8(w->m, nullptr, 0.9f, kN, kChunks, kChunk, w->err,
                              w->int8_worker_blocks),
        "CompressWorkerInt8");
  const size_t int8_server_block_bytes = Int8BlockBytes(kN);
  w->int8_server_blocks = w->Allocate<uint8_t>(kWorkers * int8_server_block_bytes);
  Check(b->CompressWorkerInt8(w->m, nullptr, 0.9f, kN, 1, kN, w->err, w->int8_server_blocks),
        "CompressWorkerInt8");
  for (int r = 1; r < kWorkers; ++r) {
    Check(b->Copy(w->int8_server_blocks + r * int8_server_block_bytes, w->int8_server_blocks,
                  int8_server_block_bytes),
          "Copy");
  }
  w->int8_server_out = w->Allocate<uint8_t>(int8_server_block_bytes);
  Check(b->Zero(w->err, kN * sizeof(float)), "Zero");

  // Half of the largest min_bytes (SumRows: 9 arrays of 4 bytes per element).
  w->copy_capacity = (kWorkers + 1) * kN * sizeof(float) / 2;
  w->copy_src = w->Allocate<uint8_t>(w->copy_capacity);
  w->copy_dst = w->Allocate<uint8_t>(w->copy_capacity);
  Check(b->Zero(w->copy_src, w->copy_capacity), "Zero");
  Check(b->Synchronize(), "Synchronize");
  return w;
}

struct Case {
  std::string name;
  double min_bytes;
  std::function<absl::Status()> fn;
  double pass_bytes = 0.0;  // the two-pass kernels: what both passes move
};

// ServerAggregate of kWorkers `blocks` of n elements, once for each way of reading the bits
// (ServerBitLoads; the default first). Reads W blocks and err; writes err and one block.
std::vector<Case> ServerAggregateCases(Backend* b, const uint8_t* blocks, size_t n) {
  const double f32 = 4.0 * static_cast<double>(n);
  const double block = CompressedBlockBytes(n);
  std::vector<Case> cases;
  for (const auto& [suffix, loads] :
       {std::pair<const char*, ServerBitLoads>{"", ServerBitLoads::kThreadBytes},
        {"/warp_words2", ServerBitLoads::kWarpWords2},
        {"/warp_words4", ServerBitLoads::kWarpWords4}}) {
    cases.push_back({std::string("ServerAggregate/W=8") + suffix,
                     kWorkers * block + 2 * f32 + block,
                     [=, loads = loads] {
                       Check(SetServerBitLoads(b, loads), "SetServerBitLoads");
                       return b->ServerAggregate(blocks, kWorkers, n, workspace->err,
                                                 workspace->server_out);
                     },
                     kWorkers * block + 4 * f32 + block});
  }
  return cases;
}

void RunKernel(benchmark::State& state, double min_bytes, double pass_bytes,
               std::function<absl::Status()> fn) {
  Workspace& w = *workspace;
  w.Time(fn);  // Warm up: first launches load modules.
  double kernel_seconds = 0.0;
  for (auto _ : state) {
    const double seconds = w.Time(fn) * 1e-3;
    kernel_seconds += seconds;
    state.SetIterationTime(seconds);
  }
  const size_t copy_bytes = std::min(static_cast<size_t>(min_bytes / 2), w.copy_capacity);
  const auto copy = [&w, copy_bytes] {
    const cudaError_t error = cudaMemcpyAsync(w.copy_dst, w.copy_src, copy_bytes,
                                              cudaMemcpyDeviceToDevice, w.stream);
    return error == cudaSuccess ? absl::OkStatus() : absl::InternalError(cudaGetErrorString(error));
  };
  w.Time(copy);
  double copy_seconds = 0.0;
  for (size_t i = 0; i < kCopyRepeats; ++i) copy_seconds += w.Time(copy) * 1e-3;

  const double kernel_gbps = min_bytes * state.iterations() / kernel_seconds * 1e-9;
  const double copy_gbps = 2.0 * copy_bytes * kCopyRepeats / copy_seconds * 1e-9;
  state.counters["min_bytes"] = min_bytes;
  state.counters["GB/s"] = kernel_gbps;
  state.counters["copy_GB/s"] = copy_gbps;
  state.counters["vs_copy"] = kernel_gbps / copy_gbps;
  if (pass_bytes > 0) {
    state.counters["pass_bytes"] = pass_bytes;
    state.counters["vs_copy_passes"] = kernel_gbps * (pass_bytes / min_bytes) / copy_gbps;
  }
}

void RegisterAll() {
  Workspace& w = *workspace;
  Backend* b = w.backend.get();
  const double n = static_cast<double>(kN);
  const double f32 = 4.0 * n;                                          // one float array
  const double worker_blocks = kChunks * CompressedBlockBytes(kChunk);  // N/8 + scales
  const double int8_worker_blocks = kChunks * Int8BlockBytes(kChunk);  // N + 8 per chunk
  const double int8_server_block = Int8BlockBytes(kN);
  const AdamHyper h;
  AdamHyper h_wd;
  h_wd.weight_decay = 0.01f;

  std::vector<Case> cases = {
      {"DeviceToDeviceCopy", 2.0 * f32,
       [&w] {
         const cudaError_t e = cudaMemcpyAsync(w.out, w.g, kN * sizeof(float),
                                               cudaMemcpyDeviceToDevice, w.stream);
         return e == cudaSuccess ? absl::OkStatus() : absl::InternalError(cudaGetErrorString(e));
       }},
      // Reads g, m; writes m.
      {"MomentumUpdate", 3 * f32, [=, &w] { return b->MomentumUpdate(0.9f, w.g, w.m, kN); }},
      // Reads m, err; writes err and the blocks.
      {"CompressWorker", 3 * f32 + worker_blocks,
       [=, &w] {
         return b->CompressWorker(w.m, nullptr, 0.9f, kN, kChunks, kChunk, w.err,
                                  w.worker_blocks);
       },
       5 * f32 + worker_blocks},
      // Reads m, g, err; writes err and the blocks.
      {"CompressWorkerFusedMomentum", 4 * f32 + worker_blocks,
       [=, &w] {
         return b->CompressWorker(w.m, w.g, 0.9f, kN, kChunks, kChunk, w.err, w.worker_blocks);
       },
       6 * f32 + worker_blocks},
      // Reads the blocks; writes out.
      {"Decompress", worker_blocks + f32,
       [=, &w] { return b->Decompress(w.worker_blocks, kChunks, kChunk, kN, w.out); }},
      // Reads W rows; writes out.
      {"SumRows/rows=8", (kWorkers + 1) * f32,
       [=, &w] { return b->SumRows(w.rows, kWorkers, kN, w.out); }},
      // Reads g, m, v, p; writes m, v, p.
      {"AdamWarmupUpdate", 7 * f32,
       [=, &w] { return b->AdamWarmupUpdate(h, w.g, 1.0f, w.m, w.v, w.p, kN); }},
      {"AdamWarmupUpdate/weight_decay", 7 * f32,
       [=, &w] { return b->AdamWarmupUpdate(h_wd, w.g, 1.0f, w.m, w.v, w.p, kN); }},
      // Reads v, m, p; writes p.
      {"FrozenAdamUpdate", 4 * f32,
       [=, &w] { return b->FrozenAdamUpdate(h, w.v, nullptr, w.m, w.p, kN); }},
      // Reads v, mask, m, p; writes m, p.
      {"FrozenAdamUpdate/mask", 6 * f32,
       [=, &w] { return b->FrozenAdamUpdate(h, w.v, w.mask, w.m, w.p, kN); }},
      // Reads the blocks, v, p; writes m, p.
      {"DecompressFrozenAdamUpdate", worker_blocks + 4 * f32,
       [=, &w] {
         return b->DecompressFrozenAdamUpdate(w.worker_blocks, kChunks, kChunk, h, w.v,
                                              nullptr, w.m, w.p, kN);
       }},
      // Reads the blocks, v, mask, p; writes m, p.
      {"DecompressFrozenAdamUpdate/mask", worker_blocks + 5 * f32,
       [=, &w] {
         return b->DecompressFrozenAdamUpdate(w.worker_blocks, kChunks, kChunk, h, w.v, w.mask,
                                              w.m, w.p, kN);
       }},
      // Reads x (and waits for the 8-byte result on the host).
      {"SumSquares", f32,
       [=, &w] {
         double result;
         return b->SumSquares(w.err, kN, &result);
       }},
      // The int8 compressor (exchange.compressor int8), as the 1-bit cases above.
      {"CompressWorkerInt8", 3 * f32 + int8_worker_blocks,
       [=, &w] {
         return b->CompressWorkerInt8(w.m, nullptr, 0.9f, kN, kChunks, kChunk, w.err,
                                      w.int8_worker_blocks);
       },
       5 * f32 + int8_worker_blocks},
      {"ServerAggregateInt8/W=8", kWorkers * int8_server_block + 2 * f32 + int8_server_block,
       [=, &w] {
         return b->ServerAggregateInt8(w.int8_server_blocks, kWorkers, kN, w.err,
                                       w.int8_server_out);
       },
       kWorkers * int8_server_block + 4 * f32 + int8_server_block},
      {"DecompressInt8", int8_worker_blocks + f32,
       [=, &w] {
         return b->DecompressInt8(w.int8_worker_blocks, kChunks, kChunk, kN, w.out);
       }},
      // 0/1 Adam. Local step: reads g, v, m, p, acc; writes m, p, acc (acc: err).
      {"ZeroOneLocalUpdate", 8 * f32,
       [=, &w] { return b->ZeroOneLocalUpdate(h, w.g, w.v, w.m, w.p, w.err, kN); }},
      // Reads v, acc; writes acc.
      {"ZeroOneSyncPrepare", 3 * f32,
       [=, &w] { return b->ZeroOneSyncPrepare(h.eps, w.v, w.err, kN); }},
      // Reads v, avg, anchor; writes m, anchor, p (avg: the first row; anchor: out).
      {"ZeroOneSyncApply", 6 * f32,
       [=, &w] {
         return b->ZeroOneSyncApply(h.eps, 0.01f, w.v, nullptr, w.rows, w.m, w.out, w.p, kN);
       }},
      // 1-bit LAMB. Reads g, m, v; writes m, v.
      {"AdamMomentsUpdate", 5 * f32,
       [=, &w] { return b->AdamMomentsUpdate(h, w.g, 1.0f, w.m, w.v, kN); }},
      // Reads m, v; writes u (out).
      {"AdamDirectionInto", 3 * f32,
       [=, &w] { return b->AdamDirectionInto(h, w.m, w.v, w.p, w.out, kN); }},
      // Reads x, y; writes y.
      {"Axpy", 3 * f32, [=, &w] { return b->Axpy(1e-3f, w.g, w.out, kN); }},
      // Reads x; writes x.
      {"Scale", 2 * f32, [=, &w] { return b->Scale(1.0f, w.out, kN); }},
      // Reads m, v_last (m_last: g), v_fresh; writes v_fresh.
      {"FreshVarianceUpdate", 4 * f32,
       [=, &w] { return b->FreshVarianceUpdate(0.9f, 0.999f, w.m, w.g, w.v_fresh, kN); }},
      // Reads v, v_fresh (and waits for the 4-byte result on the host).
      {"MaxDenomRatio", 2 * f32,
       [=, &w] {
         float result;
         return b->MaxDenomRatio(h.eps, w.v, w.v_fresh, kN, &result);
       }},
      // Momentum masks. Reads mask, x; writes x.
      {"ApplyMask", 3 * f32, [=, &w] { return b->ApplyMask(w.mask, w.out, kN); }},
      // Reads g; writes seen where g != 0 (here: every element).
      {"MarkNonzero", 2 * f32, [=, &w] { return b->MarkNonzero(w.g, w.out, kN); }},
  };
  for (Case& c : ServerAggregateCases(b, w.server_blocks, kN)) cases.push_back(std::move(c));
  for (const Case& c : cases) {
    benchmark::RegisterBenchmark(c.name.c_str(), RunKernel, c.min_bytes, c.pass_bytes, c.fn)
        ->UseManualTime()
        ->Unit(benchmark::kMicrosecond);
  }

  // The reductions at smaller sizes, on prefixes of the same buffers (min_bytes as above).
  for (size_t n : {size_t{1} << 18, size_t{1} << 20, size_t{1} << 22}) {
    const size_t chunk = n / kChunks;
    const double f32_n = 4.0 * static_cast<double>(n);
    const double worker_blocks_n = kChunks * CompressedBlockBytes(chunk);
    const std::vector<uint8_t> host_blocks = ServerBlocks(kWorkers, n);
    uint8_t* server_blocks = w.Allocate<uint8_t>(host_blocks.size());
    Check(b->CopyFromHost(server_blocks, host_blocks.data(), host_blocks.size()),
          "CopyFromHost");
    const std::string size = "/n=" + std::to_string(n);
    std::vector<Case> small = {
        {"CompressWorker", 3 * f32_n + worker_blocks_n,
         [=, &w] {
           return b->CompressWorker(w.m, nullptr, 0.9f, n, kChunks, chunk, w.err,
                                    w.worker_blocks);
         },
         5 * f32_n + worker_blocks_n},
        {"CompressWorkerFusedMomentum", 4 * f32_n + worker_blocks_n,
         [=, &w] {
           return b->CompressWorker(w.m, w.g, 0.9f, n, kChunks, chunk, w.err, w.worker_blocks);
         },
         6 * f32_n + worker_blocks_n},
        {"SumSquares", f32_n,
         [=, &w] {
           double result;
           return b->SumSquares(w.err, n, &result);
         }},
    };
    for (Case& c : ServerAggregateCases(b, server_blocks, n)) small.push_back(std::move(c));
    for (const Case& c : small) {
      benchmark::RegisterBenchmark((c.name + size).c_str(), RunKernel, c.min_bytes,
                                   c.pass_bytes, c.fn)
          ->UseManualTime()
          ->Unit(benchmark::kMicrosecond);
    }
  }
}

}  // namespace
}  // namespace onebit::kernels

int main(int argc, char** argv) {
  using namespace onebit::kernels;
  if (CudaDeviceCount() == 0) {
    std::printf(
        "cuda_kernels_benchmark: no CUDA device (no GPU or no driver on this machine); "
        "nothing to measure. Run it on a GPU machine.\n");
    return 0;
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  workspace = MakeWorkspace();
  cudaDeviceProp prop;
  Check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  std::printf("device 0: %s, %d SMs; %zu elements per tensor\n", prop.name,
              prop.multiProcessorCount, kN);
  RegisterAll();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  // The workspace lives to the end of the process; the driver frees device memory at exit.
  return 0;
}
