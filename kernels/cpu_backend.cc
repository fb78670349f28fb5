// The CPU Backend: host memory, kernels from the scalar or AVX2 table (cpu_kernels.h),
// run over fixed pieces of kPiece elements on a pool of threads. Sums of squares are
// float64 partial sums per piece added in piece order, so the bits never depend on the
// thread count.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/parallel.h"
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

// A tensor of n elements compressed as num_chunks chunks of `chunk` (padded past n).
absl::Status CheckChunks(size_t n, size_t num_chunks, size_t chunk) {
  if (absl::Status s = CheckChunk(chunk); !s.ok()) return s;
  if (n > num_chunks * chunk) {
    return absl::InvalidArgumentError(absl::StrCat("tensor of ", n, " elements does not fit ",
                                                   num_chunks, " chunks of ", chunk));
  }
  return absl::OkStatus();
}

// Elements per piece of work: 256 KB of floats, a multiple of 8 (whole sign bytes). Big
// enough that handing a piece to a thread costs little, small enough that a 1M-element
// chunk keeps several threads busy.
constexpr size_t kPiece = size_t{1} << 16;

size_t Pieces(size_t n) { return (n + kPiece - 1) / kPiece; }

float ScaleFor(double sumsq, size_t n) {
  return n == 0 ? 0.0f : static_cast<float>(std::sqrt(sumsq / static_cast<double>(n)));
}

// A 16-bit wire dtype's conversions (wire_dtype.h), as a type, so that loops over them
// inline the conversion.
template <WireDtype kDtype>
struct Wire16 {
  static uint16_t From(float x) {
    return kDtype == WireDtype::kBf16 ? FloatToBf16(x) : FloatToFp16(x);
  }
  static float To(uint16_t h) { return kDtype == WireDtype::kBf16 ? Bf16ToFloat(h) : Fp16ToFloat(h); }
};

// The one switch over the wire dtypes: fp32() for fp32, half(Wire16<dtype>()) for a 16-bit
// dtype.
template <typename Fp32, typename Half>
absl::Status ForWireDtype(WireDtype dtype, Fp32 fp32, Half half) {
  switch (dtype) {
    case WireDtype::kFp32:
      return fp32();
    case WireDtype::kBf16:
      half(Wire16<WireDtype::kBf16>());
      return absl::OkStatus();
    case WireDtype::kFp16:
      half(Wire16<WireDtype::kFp16>());
      return absl::OkStatus();
  }
  return absl::InvalidArgumentError("unknown wire dtype");
}

// kPiece floats of the calling thread's own, for a piece's intermediate values (the pool's
// threads and the caller each have one, allocated on first use; it lives as long as the
// thread). A piece's task uses it from start to end, and a thread runs one task at a time.
float* PieceScratch() {
  thread_local const std::unique_ptr<float[]> scratch(new float[kPiece]);
  return scratch.get();
}

// n floats from `from` to `to` (they may be the same or overlap).
absl::Status CopyFloats(const void* from, size_t n, void* to) {
  if (n > 0 && from != to) std::memmove(to, from, n * sizeof(float));
  return absl::OkStatus();
}

class CpuBackend : public Backend {
 public:
  CpuBackend(const cpu::KernelTable& table, int threads) : k_(table), pool_(threads) {}

  std::string name() const override {
    return pool_.threads() == 1 ? absl::StrCat("cpu-", k_.name)
                                : absl::StrCat("cpu-", k_.name, "-x", pool_.threads());
  }
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
    ForEachPiece(n, [&](size_t i, size_t count) { k_.momentum(beta1, g + i, m + i, count); });
    return absl::OkStatus();
  }

  absl::Status CompressWorker(const float* m, const float* g, float beta1, size_t n,
                              size_t num_chunks, size_t chunk, float* err,
                              uint8_t* out) override {
    if (absl::Status s = CheckChunks(n, num_chunks, chunk); !s.ok()) return s;
    const size_t n_pad = num_chunks * chunk;
    // Pass 1 over [0, n_pad): elements past n are the padding, whose err is summed only.
    const double sumsq = SumOverPieces(n_pad, [&](size_t i, size_t count) {
      const size_t real = i < n ? std::min(count, n - i) : 0;
      return k_.worker_input(real ? m + i : m, g && real ? g + i : nullptr, beta1, real,
                             count, err + i);
    });
    const float scale = ScaleFor(sumsq, n_pad);
    const size_t stride = CompressedBlockBytes(chunk);
    for (size_t r = 0; r < num_chunks; ++r) cpu::SetBlockScale(out + r * stride, scale);
    ForEachPieceOfChunks(num_chunks, chunk, n_pad, [&](size_t r, size_t i, size_t count) {
      k_.sign_pack(err + r * chunk + i, count, scale, out + r * stride + 4 + i / 8);
    });
    return absl::OkStatus();
  }

  absl::Status ServerAggregate(const uint8_t* blocks, int num_workers, size_t chunk, float* err,
                               uint8_t* out) override {
    if (absl::Status s = CheckChunk(chunk); !s.ok()) return s;
    if (num_workers < 1) return absl::InvalidArgumentError("ServerAggregate needs a worker");
    const size_t stride = CompressedBlockBytes(chunk);
    const double sumsq = SumOverPieces(chunk, [&](size_t i, size_t count) {
      return k_.server_input(blocks, stride, num_workers, i, count, err + i);
    });
    const float scale = ScaleFor(sumsq, chunk);
    cpu::SetBlockScale(out, scale);
    ForEachPiece(chunk, [&](size_t i, size_t count) {
      k_.sign_pack(err + i, count, scale, out + 4 + i / 8);
    });
    return absl::OkStatus();
  }

  absl::Status Decompress(const uint8_t* blocks, size_t num_chunks, size_t chunk, size_t n,
                          float* out) override {
    if (absl::Status s = CheckChunk(chunk); !s.ok()) return s;
    if (n > num_chunks * chunk) return absl::InvalidArgumentError("n exceeds the blocks");
    const size_t stride = CompressedBlockBytes(chunk);
    ForEachPieceOfChunks(num_chunks, chunk, n, [&](size_t r, size_t i, size_t count) {
      const uint8_t* block = blocks + r * stride;
      k_.decode_block(cpu::BlockScale(block), block + 4 + i / 8, count, out + r * chunk + i);
    });
    return absl::OkStatus();
  }

  absl::Status CompressWorkerInt8(const float* m, const float* g, float beta1, size_t n,
                                  size_t num_chunks, size_t chunk, float* err,
                                  uint8_t* out) override {
    if (absl::Status s = CheckChunks(n, num_chunks, chunk); !s.ok()) return s;
    const size_t n_pad = num_chunks * chunk;
    // Pass 1: x into err, and each piece's range; pieces never span two chunks.
    const size_t per_chunk = Pieces(chunk);
    ranges_.assign(num_chunks * per_chunk, cpu::int8::Range());
    ForEachPieceOfChunks(num_chunks, chunk, n_pad, [&](size_t r, size_t i, size_t count) {
      const size_t at = r * chunk + i;
      const size_t real = at < n ? std::min(count, n - at) : 0;
      k_.int8_worker_input(real ? m + at : m, g && real ? g + at : nullptr, beta1, real, count,
                             err + at, &ranges_[r * per_chunk + i / kPiece]);
    });
    // Each chunk's scale and offset (min and max: the order of the pieces does not matter).
    params_.resize(num_chunks);
    const size_t stride = Int8BlockBytes(chunk);
    for (size_t r = 0; r < num_chunks; ++r) {
      cpu::int8::Range range;
      for (size_t t = 0; t < per_chunk; ++t) cpu::int8::Merge(ranges_[r * per_chunk + t], &range);
      params_[r] = cpu::int8::ParamsFor(range);
      cpu::SetBlockScale(out + r * stride, params_[r].scale);
      cpu::SetBlockOffset(out + r * stride, params_[r].lo);
    }
    ForEachPieceOfChunks(num_chunks, chunk, n_pad, [&](size_t r, size_t i, size_t count) {
      k_.int8_quantize(params_[r], count, err + r * chunk + i, out + r * stride + 8 + i);
    });
    return absl::OkStatus();
  }

  absl::Status ServerAggregateInt8(const uint8_t* blocks, int num_workers, size_t chunk,
                                   float* err, uint8_t* out) override {
    if (absl::Status s = CheckChunk(chunk); !s.ok()) return s;
    if (num_workers < 1) return absl::InvalidArgumentError("ServerAggregate needs a worker");
    const size_t stride = Int8BlockBytes(chunk);
    ranges_.assign(Pieces(chunk), cpu::int8::Range());
    ForEachPiece(chunk, [&](size_t i, size_t count) {
      k_.int8_server_input(blocks, stride, num_workers, i, count, err + i, &ranges_[i / kPiece]);
    });
    cpu::int8::Range range;
    for (const cpu::int8::Range& r : ranges_) cpu::int8::Merge(r, &range);
    const cpu::int8::Params p = cpu::int8::ParamsFor(range);
    cpu::SetBlockScale(out, p.scale);
    cpu::SetBlockOffset(out, p.lo);
    ForEachPiece(chunk, [&](size_t i, size_t count) {
      k_.int8_quantize(p, count, err + i, out + 8 + i);
    });
    return absl::OkStatus();
  }

  absl::Status DecompressInt8(const uint8_t* blocks, size_t num_chunks, size_t chunk, size_t n,
                              float* out) override {
    if (absl::Status s = CheckChunk(chunk); !s.ok()) return s;
    if (n > num_chunks * chunk) return absl::InvalidArgumentError("n exceeds the blocks");
    const size_t stride = Int8BlockBytes(chunk);
    ForEachPieceOfChunks(num_chunks, chunk, n, [&](size_t r, size_t i, size_t count) {
      k_.int8_decode(blocks + r * stride, i, count, out + r * chunk + i);
    });
    return absl::OkStatus();
  }

  absl::Status SumRows(const float* rows, int num_rows, size_t count, float* out) override {
    if (num_rows < 0) return absl::InvalidArgumentError("negative row count");
    SumRowsPieces(rows, num_rows, count, out, 1.0f, false);
    return absl::OkStatus();
  }

  absl::Status AverageRows(const float* rows, int num_rows, size_t count, float* out) override {
    if (num_rows < 1) return absl::InvalidArgumentError("AverageRows needs at least one row");
    SumRowsPieces(rows, num_rows, count, out, 1.0f / static_cast<float>(num_rows), true);
    return absl::OkStatus();
  }

  absl::Status AdamWarmupUpdate(const AdamHyper& h, const float* g, float grad_scale, float* m,
                                float* v, float* p, size_t n) override {
    ForEachPiece(n, [&](size_t i, size_t count) {
      k_.adam_warmup(h, g + i, grad_scale, m + i, v + i, p + i, count);
    });
    return absl::OkStatus();
  }

  absl::Status FrozenAdamUpdate(const AdamHyper& h, const float* v, const float* mask, float* m,
                                float* p, size_t n) override {
    ForEachPiece(n, [&](size_t i, size_t count) {
      k_.frozen_update(h, v + i, mask ? mask + i : nullptr, m + i, p + i, count);
    });
    return absl::OkStatus();
  }

  absl::Status DecompressFrozenAdamUpdate(const uint8_t* blocks, size_t num_chunks, size_t chunk,
                                          const AdamHyper& h, const float* v, const float* mask,
                                          float* m, float* p, size_t n) override {
    if (absl::Status s = CheckChunk(chunk); !s.ok()) return s;
    if (n > num_chunks * chunk) return absl::InvalidArgumentError("n exceeds the blocks");
    const size_t stride = CompressedBlockBytes(chunk);
    ForEachPieceOfChunks(num_chunks, chunk, n, [&](size_t r, size_t i, size_t count) {
      const uint8_t* block = blocks + r * stride;
      const size_t at = r * chunk + i;
      k_.decode_block_frozen_update(cpu::BlockScale(block), block + 4 + i / 8, h, v + at,
                                    mask ? mask + at : nullptr, m + at, p + at, count);
    });
    return absl::OkStatus();
  }

  absl::Status SumSquares(const float* x, size_t n, double* host_result) override {
    *host_result =
        SumOverPieces(n, [&](size_t i, size_t count) { return k_.sum_squares(x + i, count); });
    return absl::OkStatus();
  }

  // SumSquares of the float32 widening: each piece is widened into the thread's scratch
  // and summed by the same piece kernel, the partials added in piece order by the same
  // SumOverPieces, so the bits are those of SumSquares on a float32 copy (widening is exact).
  absl::Status SumSquaresWire(WireDtype dtype, const void* x, size_t n,
                              double* host_result) override {
    return ForWireDtype(
        dtype, [&] { return SumSquares(static_cast<const float*>(x), n, host_result); },
        [&](auto wire) {
          const uint16_t* h = static_cast<const uint16_t*>(x);
          *host_result = SumOverPieces(n, [&](size_t i, size_t count) {
            if (count == 0) return k_.sum_squares(nullptr, 0);
            float* widened = PieceScratch();
            for (size_t k = 0; k < count; ++k) widened[k] = wire.To(h[i + k]);
            return k_.sum_squares(widened, count);
          });
        });
  }

  // 0/1 Adam: the kernel table's (AVX2+FMA where the CPU has it).
  absl::Status ZeroOneLocalUpdate(const AdamHyper& h, const float* g, const float* v, float* m,
                                  float* p, float* acc, size_t n) override {
    ForEachPiece(n, [&](size_t i, size_t count) {
      k_.zero_one_local(h, g + i, v + i, m + i, p + i, acc + i, count);
    });
    return absl::OkStatus();
  }

  absl::Status ZeroOneSyncPrepare(float eps, const float* v, float* acc, size_t n) override {
    ForEachPiece(n, [&](size_t i, size_t count) {
      k_.zero_one_sync_prepare(eps, v + i, acc + i, count);
    });
    return absl::OkStatus();
  }

  absl::Status ZeroOneSyncApply(float eps, float lrs, const float* v, const float* mask,
                                const float* avg, float* m, float* anchor, float* p,
                                size_t n) override {
    ForEachPiece(n, [&](size_t i, size_t count) {
      k_.zero_one_sync_apply(eps, lrs, v + i, mask ? mask + i : nullptr, avg + i, m + i,
                             anchor + i, p + i, count);
    });
    return absl::OkStatus();
  }

  absl::Status AdamMomentsUpdate(const AdamHyper& h, const float* g, float grad_scale, float* m,
                                 float* v, size_t n) override {
    const float one_minus_b1 = 1.0f - h.beta1, one_minus_b2 = 1.0f - h.beta2;
    ForEachPiece(n, [&](size_t i0, size_t count) {
      for (size_t i = i0; i < i0 + count; ++i) {
        const float gi = g[i] * grad_scale;
        m[i] = std::fma(h.beta1, m[i], one_minus_b1 * gi);
        v[i] = std::fma(h.beta2, v[i], (one_minus_b2 * gi) * gi);
      }
    });
    return absl::OkStatus();
  }

  absl::Status AdamDirectionInto(const AdamHyper& h, const float* m, const float* v,
                                 const float* p, float* u, size_t n) override {
    ForEachPiece(n, [&](size_t i0, size_t count) {
      for (size_t i = i0; i < i0 + count; ++i) u[i] = cpu::AdamDirection(h, m[i], v[i], p[i]);
    });
    return absl::OkStatus();
  }

  absl::Status Axpy(float a, const float* x, float* y, size_t n) override {
    ForEachPiece(n, [&](size_t i0, size_t count) {
      for (size_t i = i0; i < i0 + count; ++i) y[i] = std::fma(a, x[i], y[i]);
    });
    return absl::OkStatus();
  }

  absl::Status Scale(float a, float* x, size_t n) override {
    ForEachPiece(n, [&](size_t i0, size_t count) {
      for (size_t i = i0; i < i0 + count; ++i) x[i] = x[i] * a;
    });
    return absl::OkStatus();
  }

  absl::Status ApplyMask(const float* mask, float* x, size_t n) override {
    ForEachPiece(n, [&](size_t i0, size_t count) {
      for (size_t i = i0; i < i0 + count; ++i) x[i] = x[i] * mask[i];
    });
    return absl::OkStatus();
  }

  absl::Status MarkNonzero(const float* g, float* seen, size_t n) override {
    ForEachPiece(n, [&](size_t i0, size_t count) {
      for (size_t i = i0; i < i0 + count; ++i) {
        if (g[i] != 0.0f || std::isnan(g[i])) seen[i] = 1.0f;
      }
    });
    return absl::OkStatus();
  }

  absl::Status FreshVarianceUpdate(float beta1, float beta2, const float* m, const float* m_last,
                                   float* v_fresh, size_t n) override {
    const float one_minus_b1 = 1.0f - beta1, one_minus_b2 = 1.0f - beta2;
    ForEachPiece(n, [&](size_t i0, size_t count) {
      for (size_t i = i0; i < i0 + count; ++i) {
        const float g = std::fma(-beta1, m_last[i], m[i]) / one_minus_b1;
        v_fresh[i] = std::fma(beta2, v_fresh[i], (one_minus_b2 * g) * g);
      }
    });
    return absl::OkStatus();
  }

  absl::Status MaxDenomRatio(float eps, const float* v, const float* v_fresh, size_t n,
                             float* host_result) override {
    // A max does not depend on the order: pieces in any order give the same value.
    const double max = SumOverPieces(n, [&](size_t i0, size_t count) {
      double piece = 0.0;
      for (size_t i = i0; i < i0 + count; ++i) {
        const float r = (std::sqrt(v[i]) + eps) / (std::sqrt(v_fresh[i]) + eps);
        if (std::isnan(r) || std::isnan(piece)) {
          piece = std::numeric_limits<double>::quiet_NaN();
        } else if (r > piece) {
          piece = r;
        }
      }
      return piece;
    }, /*combine_max=*/true);
    *host_result = static_cast<float>(max);
    return absl::OkStatus();
  }

  // Plain loops: the compiler vectorises them, and they run at memory speed, far above any
  // link the exchange crosses.
  absl::Status ToWire(WireDtype dtype, const float* x, size_t n, void* out) override {
    return ForWireDtype(
        dtype, [&] { return CopyFloats(x, n, out); },
        [&](auto wire) {
          uint16_t* o = static_cast<uint16_t*>(out);
          for (size_t i = 0; i < n; ++i) o[i] = wire.From(x[i]);
        });
  }

  absl::Status SumWireRows(WireDtype dtype, const void* rows, int num_rows, size_t count,
                           float* out) override {
    if (num_rows < 0) return absl::InvalidArgumentError("negative row count");
    return ForWireDtype(
        dtype,
        [&] {
          SumRowsPieces(static_cast<const float*>(rows), num_rows, count, out, 1.0f, false);
          return absl::OkStatus();
        },
        [&](auto wire) {
          // Row by row (out may not alias a row: the rows are 16-bit).
          for (size_t i = 0; i < count; ++i) out[i] = 0.0f;
          for (int j = 0; j < num_rows; ++j) {
            const uint16_t* row = static_cast<const uint16_t*>(rows) + static_cast<size_t>(j) * count;
            for (size_t i = 0; i < count; ++i) out[i] += wire.To(row[i]);
          }
        });
  }

  absl::Status WireToFloat(WireDtype dtype, const void* in, size_t n, float* out) override {
    return ForWireDtype(
        dtype, [&] { return CopyFloats(in, n, out); },
        [&](auto wire) {
          const uint16_t* a = static_cast<const uint16_t*>(in);
          for (size_t i = 0; i < n; ++i) out[i] = wire.To(a[i]);
        });
  }

 private:
  // fn(first element, count) for the pieces of [0, n), on the pool.
  template <typename Fn>
  void ForEachPiece(size_t n, Fn fn) {
    pool_.Run(Pieces(n), [&](size_t t) {
      const size_t i = t * kPiece;
      fn(i, std::min(kPiece, n - i));
    });
  }

  // The sum of fn(first element, count) (a float64 partial sum) over the pieces of [0, n),
  // added in piece order; with combine_max, their maximum instead (a NaN if any is one).
  template <typename Fn>
  double SumOverPieces(size_t n, Fn fn, bool combine_max = false) {
    const size_t pieces = Pieces(n);
    if (pieces <= 1) return n == 0 ? fn(0, 0) : fn(0, n);
    partial_.assign(pieces, 0.0);
    pool_.Run(pieces, [&](size_t t) {
      const size_t i = t * kPiece;
      partial_[t] = fn(i, std::min(kPiece, n - i));
    });
    double total = 0.0;
    for (double p : partial_) {
      if (!combine_max) {
        total += p;
      } else if (std::isnan(p) || std::isnan(total)) {
        total = std::numeric_limits<double>::quiet_NaN();
      } else {
        total = std::max(total, p);
      }
    }
    return total;
  }

  // fn(chunk r, first element within the chunk, count) for the pieces of the first n
  // elements of num_chunks chunks of `chunk` elements; a piece never spans two chunks.
  template <typename Fn>
  void ForEachPieceOfChunks(size_t num_chunks, size_t chunk, size_t n, Fn fn) {
    const size_t per_chunk = Pieces(chunk);
    pool_.Run(num_chunks * per_chunk, [&](size_t t) {
      const size_t r = t / per_chunk, i = (t % per_chunk) * kPiece;
      const size_t begin = r * chunk + i;
      if (begin >= n) return;
      fn(r, i, std::min({kPiece, chunk - i, n - begin}));
    });
  }

  // out = sum of the rows (in row order, `count` apart) [* scale], over pieces.
  void SumRowsPieces(const float* rows, int num_rows, size_t count, float* out, float scale,
                     bool apply_scale) {
    ForEachPiece(count, [&](size_t i, size_t c) {
      k_.sum_rows(rows + i, count, num_rows, c, out + i);
      if (apply_scale) {
        for (size_t k = 0; k < c; ++k) out[i + k] *= scale;
      }
    });
  }

  const cpu::KernelTable& k_;
  ParallelFor pool_;
  std::vector<double> partial_;  // SumOverPieces' partial sums
  std::vector<cpu::int8::Range> ranges_;    // int8: the ranges of the pieces
  std::vector<cpu::int8::Params> params_;   // int8: each chunk's scale and offset
};

}  // namespace

absl::StatusOr<void*> Backend::AllocateHost(size_t bytes) {
  void* ptr = std::malloc(std::max<size_t>(bytes, 1));
  if (ptr == nullptr) {
    return absl::ResourceExhaustedError(absl::StrCat("no ", bytes, " bytes of host memory"));
  }
  return ptr;
}

void Backend::FreeHost(void* ptr) { std::free(ptr); }

void* Backend::HostAddress(const void* p) const {
  return memory_space() == MemorySpace::kHost ? const_cast<void*>(p) : nullptr;
}

bool CpuHasAvx2() {
#if defined(__x86_64__) && defined(__GNUC__)
  return cpu::Avx2Kernels() != nullptr && __builtin_cpu_supports("avx2") &&
         __builtin_cpu_supports("fma");
#else
  return false;
#endif
}

std::unique_ptr<Backend> NewCpuBackend(bool allow_simd, int threads) {
  const cpu::KernelTable& table =
      allow_simd && CpuHasAvx2() ? *cpu::Avx2Kernels() : cpu::ScalarKernels();
  return std::make_unique<CpuBackend>(table, std::max(threads, 1));
}

}  // namespace onebit::kernels
