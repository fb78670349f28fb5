// The CPU Backend: host memory, kernels from the scalar or AVX2 table (cpu_kernels.h).
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <string>

#include "absl/strings/str_cat.h"
#include "kernels/cpu_kernels.h"
#include "kernels/kernels.h"

namespace onebit::kernels {
namespace {

absl::Status CheckChunk(size_t chunk) {
  if (chunk % 8 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk length ", chunk, " is not a multiple of 8"));
  }
  return absl::OkStatus();
}

float ScaleFor(double sumsq, size_t n) {
  return n == 0 ? 0.0f : static_cast<float>(std::sqrt(sumsq / static_cast<double>(n)));
}

class CpuBackend : public Backend {
 public:
  explicit CpuBackend(const cpu::KernelTable& table) : k_(table) {}

  std::string name() const override { return absl::StrCat("cpu-", k_.name); }
  MemorySpace memory_space() const override { return MemorySpace::kHost; }

  absl::StatusOr<void*> Allocate(size_t bytes) override {
    // 64-byte alignment: whole cache lines, and aligned AVX loads where lengths allow.
    const size_t rounded = (bytes + 63) / 64 * 64;
    void* ptr = std::aligned_alloc(64, rounded == 0 ? 64 : rounded);
    if (ptr == nullptr) {
      return absl::ResourceExhaustedError(absl::StrCat("cannot allocate ", bytes, " bytes"));
    }
    return ptr;
  }
  void Free(void* ptr) override { std::free(ptr); }
  absl::Status Zero(void* ptr, size_t bytes) override {
    if (bytes) std::memset(ptr, 0, bytes);
    return absl::OkStatus();
  }
  absl::Status CopyFromHost(void* dst, const void* src, size_t bytes) override {
    return Copy(dst, src, bytes);
  }
  absl::Status CopyToHost(void* dst, const void* src, size_t bytes) override {
    return Copy(dst, src, bytes);
  }
  absl::Status Copy(void* dst, const void* src, size_t bytes) override {
    if (bytes && dst != src) std::memmove(dst, src, bytes);
    return absl::OkStatus();
  }
  absl::Status Synchronize() override { return absl::OkStatus(); }

  absl::Status MomentumUpdate(float beta1, const float* g, float* m, size_t n) override {
    k_.momentum(beta1, g, m, n);
    return absl::OkStatus();
  }

  absl::Status CompressWorker(const float* m, const float* g, float beta1, size_t n,
                              size_t num_chunks, size_t chunk, float* err,
                              uint8_t* out) override {
    if (absl::Status s = CheckChunk(chunk); !s.ok()) return s;
    const size_t n_pad = num_chunks * chunk;
    if (n > n_pad) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor of ", n, " elements does not fit ", num_chunks, " chunks of ",
                       chunk));
    }
    const float scale = ScaleFor(k_.worker_input(m, g, beta1, n, n_pad, err), n_pad);
    const size_t stride = CompressedBlockBytes(chunk);
    for (size_t r = 0; r < num_chunks; ++r) {
      uint8_t* block = out + r * stride;
      cpu::SetBlockScale(block, scale);
      k_.sign_pack(err + r * chunk, chunk, scale, block + 4);
    }
    return absl::OkStatus();
  }

  absl::Status ServerAggregate(const uint8_t* blocks, int num_workers, size_t chunk, float* err,
                               uint8_t* out) override {
    if (absl::Status s = CheckChunk(chunk); !s.ok()) return s;
    if (num_workers < 1) return absl::InvalidArgumentError("ServerAggregate needs a worker");
    const float scale = ScaleFor(k_.server_input(blocks, num_workers, chunk, err), chunk);
    cpu::SetBlockScale(out, scale);
    k_.sign_pack(err, chunk, scale, out + 4);
    return absl::OkStatus();
  }

  absl::Status Decompress(const uint8_t* blocks, size_t num_chunks, size_t chunk, size_t n,
                          float* out) override {
    if (absl::Status s = CheckChunk(chunk); !s.ok()) return s;
    if (n > num_chunks * chunk) return absl::InvalidArgumentError("n exceeds the blocks");
    ForEachChunk(num_chunks, chunk, n, [&](size_t r, size_t begin, size_t count) {
      k_.decode_block(blocks + r * CompressedBlockBytes(chunk), count, out + begin);
    });
    return absl::OkStatus();
  }

  absl::Status SumRows(const float* rows, int num_rows, size_t count, float* out) override {
    if (num_rows < 0) return absl::InvalidArgumentError("negative row count");
    k_.sum_rows(rows, num_rows, count, out);
    return absl::OkStatus();
  }

  absl::Status AverageRows(const float* rows, int num_rows, size_t count, float* out) override {
    if (num_rows < 1) return absl::InvalidArgumentError("AverageRows needs at least one row");
    k_.sum_rows(rows, num_rows, count, out);
    const float inv = 1.0f / static_cast<float>(num_rows);
    for (size_t i = 0; i < count; ++i) out[i] *= inv;
    return absl::OkStatus();
  }

  absl::Status AdamWarmupUpdate(const AdamHyper& h, const float* g, float grad_scale, float* m,
                                float* v, float* p, size_t n) override {
    k_.adam_warmup(h, g, grad_scale, m, v, p, n);
    return absl::OkStatus();
  }

  absl::Status FrozenAdamUpdate(const AdamHyper& h, const float* v, const float* mask, float* m,
                                float* p, size_t n) override {
    k_.frozen_update(h, v, mask, m, p, n);
    return absl::OkStatus();
  }

  absl::Status DecompressFrozenAdamUpdate(const uint8_t* blocks, size_t num_chunks, size_t chunk,
                                          const AdamHyper& h, const float* v, const float* mask,
                                          float* m, float* p, size_t n) override {
    if (absl::Status s = CheckChunk(chunk); !s.ok()) return s;
    if (n > num_chunks * chunk) return absl::InvalidArgumentError("n exceeds the blocks");
    ForEachChunk(num_chunks, chunk, n, [&](size_t r, size_t begin, size_t count) {
      k_.decode_block_frozen_update(blocks + r * CompressedBlockBytes(chunk), h, v + begin,
                                    mask ? mask + begin : nullptr, m + begin, p + begin, count);
    });
    return absl::OkStatus();
  }

  absl::Status SumSquares(const float* x, size_t n, double* host_result) override {
    *host_result = k_.sum_squares(x, n);
    return absl::OkStatus();
  }

  absl::Status ToWire(WireDtype dtype, const float* x, size_t n, void* out) override {
    // Plain loops: the compiler vectorises them, and they run at memory speed, far above
    // any link the exchange crosses.
    switch (dtype) {
      case WireDtype::kFp32:
        if (n > 0 && out != x) std::memmove(out, x, n * sizeof(float));
        return absl::OkStatus();
      case WireDtype::kBf16: {
        uint16_t* o = static_cast<uint16_t*>(out);
        for (size_t i = 0; i < n; ++i) o[i] = FloatToBf16(x[i]);
        return absl::OkStatus();
      }
      case WireDtype::kFp16: {
        uint16_t* o = static_cast<uint16_t*>(out);
        for (size_t i = 0; i < n; ++i) o[i] = FloatToFp16(x[i]);
        return absl::OkStatus();
      }
    }
    return absl::InvalidArgumentError("unknown wire dtype");
  }

  absl::Status SumWireRows(WireDtype dtype, const void* rows, int num_rows, size_t count,
                           float* out) override {
    if (num_rows < 0) return absl::InvalidArgumentError("negative row count");
    switch (dtype) {
      case WireDtype::kFp32:
        k_.sum_rows(static_cast<const float*>(rows), num_rows, count, out);
        return absl::OkStatus();
      case WireDtype::kBf16:
      case WireDtype::kFp16: {
        const uint16_t* r = static_cast<const uint16_t*>(rows);
        const bool bf16 = dtype == WireDtype::kBf16;
        // Row by row (out may not alias a row: the rows are 16-bit).
        for (size_t i = 0; i < count; ++i) out[i] = 0.0f;
        for (int j = 0; j < num_rows; ++j) {
          const uint16_t* row = r + static_cast<size_t>(j) * count;
          if (bf16) {
            for (size_t i = 0; i < count; ++i) out[i] += Bf16ToFloat(row[i]);
          } else {
            for (size_t i = 0; i < count; ++i) out[i] += Fp16ToFloat(row[i]);
          }
        }
        return absl::OkStatus();
      }
    }
    return absl::InvalidArgumentError("unknown wire dtype");
  }

  absl::Status WireToFloat(WireDtype dtype, const void* in, size_t n, float* out) override {
    switch (dtype) {
      case WireDtype::kFp32:
        if (n > 0 && in != out) std::memmove(out, in, n * sizeof(float));
        return absl::OkStatus();
      case WireDtype::kBf16: {
        const uint16_t* a = static_cast<const uint16_t*>(in);
        for (size_t i = 0; i < n; ++i) out[i] = Bf16ToFloat(a[i]);
        return absl::OkStatus();
      }
      case WireDtype::kFp16: {
        const uint16_t* a = static_cast<const uint16_t*>(in);
        for (size_t i = 0; i < n; ++i) out[i] = Fp16ToFloat(a[i]);
        return absl::OkStatus();
      }
    }
    return absl::InvalidArgumentError("unknown wire dtype");
  }

 private:
  // Calls fn(chunk index, first element, element count) for the chunks holding [0, n).
  template <typename Fn>
  static void ForEachChunk(size_t num_chunks, size_t chunk, size_t n, Fn fn) {
    for (size_t r = 0; r < num_chunks; ++r) {
      const size_t begin = r * chunk;
      if (begin >= n) break;
      fn(r, begin, std::min(chunk, n - begin));
    }
  }

  const cpu::KernelTable& k_;
};

}  // namespace

bool CpuHasAvx2() {
#if defined(__x86_64__) && defined(__GNUC__)
  return cpu::Avx2Kernels() != nullptr && __builtin_cpu_supports("avx2") &&
         __builtin_cpu_supports("fma");
#else
  return false;
#endif
}

std::unique_ptr<Backend> NewCpuBackend(bool allow_simd) {
  const cpu::KernelTable& table =
      allow_simd && CpuHasAvx2() ? *cpu::Avx2Kernels() : cpu::ScalarKernels();
  return std::make_unique<CpuBackend>(table);
}

}  // namespace onebit::kernels
