// The compression and optimizer math of 1-bit Adam: one API, two implementations
// (CPU: AVX2 with a scalar fallback; CUDA). docs/algorithms.md is the contract; the wire
// formats are at CompressedBlockBytes and Int8BlockBytes, the arithmetic at Backend.
//
// REPRODUCIBILITY: each backend sums the squares in an order fixed by n alone (the CUDA
// backend's does not depend on the GPU either; the CPU backend's not on its thread count),
// so the same inputs give the same bits on every run and a resumed run continues bit for
// bit. The CPU backend's order depends on whether it runs the AVX2 or the scalar kernels.
//
// MEMORY: every pointer passed to a Backend lives in its memory_space(): host memory for
// the CPU backend, device memory for CUDA. Kernels on the CUDA backend are queued on the
// backend's stream; Synchronize() waits for them. Scalars that a later kernel needs stay
// in backend memory, so a step runs without host round trips.
//
// THREAD SAFETY: a Backend may be used by one thread at a time.
#ifndef ONEBIT_KERNELS_KERNELS_H_
#define ONEBIT_KERNELS_KERNELS_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/wire_dtype.h"

namespace onebit::kernels {

enum class MemorySpace { kHost, kCuda };

// WIRE FORMAT: a compressed chunk of C elements (C a multiple of 8) is one block of
// CompressedBlockBytes(C) = 4 + C/8 bytes:
//
//   offset 0     float32 scale, little-endian IEEE 754
//   offset 4     packed signs, C/8 bytes: element j of the chunk is bit (j % 8) of byte
//                4 + j/8, least significant bit first. Bit 1 means +1 (x >= 0, so
//                sign(0) = +1), bit 0 means -1.
//
// Read as little-endian uint32 words the sign bytes are bit (j % 32) of word j/32: the
// layout a CUDA warp ballot produces. A tensor of N_pad elements split into K chunks is K
// consecutive blocks. This layout is a wire format: keep it stable.
//
// Bytes of one compressed block of `chunk` elements (chunk % 8 == 0).
constexpr size_t CompressedBlockBytes(size_t chunk) { return 4 + chunk / 8; }

// INT8 WIRE FORMAT (exchange.compressor "int8"): the same tensors, padding and chunks; a
// chunk of C elements is one block of Int8BlockBytes(C) = 8 + C bytes:
//
//   offset 0     float32 scale, little-endian IEEE 754
//   offset 4     float32 offset (lo), little-endian IEEE 754
//   offset 8     C uint8 codes, element j of the chunk at byte 8 + j
//
// The quantiser and the server's sum are at Backend::CompressWorkerInt8.
// Bytes of one int8 block of `chunk` elements.
constexpr size_t Int8BlockBytes(size_t chunk) { return 8 + chunk; }

struct AdamHyper {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
  // > 0: the direction m / (sqrt(v) + eps) of every element is clamped to
  // [-update_clip, update_clip] before the weight decay is added (a NaN stays NaN). The
  // optimizers set it on steps whose variance is frozen (docs/algorithms.md, "eps and the
  // update clip"); 0 (every warmup step) clamps nothing.
  float update_clip = 0.0f;
};

// EXACT ARITHMETIC: both implementations evaluate these float32 expressions, with explicit
// fused multiply-adds where written fma(), so that they agree bit for bit except for the
// order of the sums of squares (accumulated in float64):
//   momentum   m = fma(b1, m, (1 - b1) * g)
//   worker     x = m + err (m after the momentum update when fused); err = x - s*sign(x)
//   server     acc = sum over workers j in order of (bit_j ? s_j : -s_j);
//              y = fma(acc, 1/W, err);  err = y - s*sign(y)
//   scale      s = float(sqrt(sumsq / n)) computed in float64; s = 0 when n = 0
//   warmup     g' = g * grad_scale; m = fma(b1, m, (1-b1)*g'); v = fma(b2, v, ((1-b2)*g')*g')
//   update     u = m / (sqrt(v) + eps); if wd > 0: u = fma(wd, p, u); p = fma(-lr, u, p)
//   mask       m = m * mask (compression stage only, after the exchange)
//   0/1 Adam   local: m = fma(b1, m, (1-b1)*g); p = fma(-lr, u, p); acc = fma(-lr, u, acc)
//              sync:  acc = acc * (sqrt(v) + eps); after the exchange
//                     m = (-avg) / lrs (* mask); p = anchor + avg / (sqrt(v) + eps); anchor = p
//   LAMB       the Backend methods' own lines below (AdamMomentsUpdate ... MaxDenomRatio)
//   average    out = (sum over rows in order, from 0.0f) * (1.0f / num_rows)
//   wire rows  out = sum over rows in order, from 0.0f, of from_wire(row) (wire_dtype.h)
class Backend {
 public:
  virtual ~Backend() = default;

  virtual std::string name() const = 0;
  virtual MemorySpace memory_space() const = 0;

  // Memory in memory_space(). Allocate(0) returns a valid, unique, non-null pointer.
  virtual absl::StatusOr<void*> Allocate(size_t bytes) = 0;
  virtual void Free(void* ptr) = 0;
  virtual absl::Status Zero(void* ptr, size_t bytes) = 0;
  virtual absl::Status CopyFromHost(void* dst, const void* host_src, size_t bytes) = 0;
  virtual absl::Status CopyToHost(void* host_dst, const void* src, size_t bytes) = 0;
  virtual absl::Status Copy(void* dst, const void* src, size_t bytes) = 0;
  // Waits for all queued work; returns any asynchronous error.
  virtual absl::Status Synchronize() = 0;

  // STAGING. Host memory for copies to and from this backend's memory: page-locked
  // (pinned) on CUDA, so that copies run at the bus's speed; plain host memory elsewhere.
  // AllocateHost(0) returns a valid, non-null pointer; free it with FreeHost.
  virtual absl::StatusOr<void*> AllocateHost(size_t bytes);
  virtual void FreeHost(void* ptr);

  // Bytes copied so far between host memory and this backend's memory by CopyToHost
  // (to_host) and CopyFromHost (from_host): what crossed PCIe on a GPU, and the seconds
  // those calls took (they return once the copy is done). Zero for a backend whose memory
  // is the host's (its copies cross no bus). Cumulative.
  struct HostTransfers {
    uint64_t to_host = 0;
    uint64_t from_host = 0;
    double seconds = 0.0;
  };
  virtual HostTransfers host_transfers() const { return {}; }

  // KERNELS FROM OUTSIDE kernels/ (a codec's own, e.g. compression/fp8/): code that is not
  // a Backend method runs on every backend without the Backend knowing it.
  //   host   HostAddress(p) != nullptr: run host code on HostAddress(p) for every pointer
  //          p (the CPU backend: p itself; the simulated device: its shadow of p).
  //   CUDA   HostAddress(p) == nullptr: launch on CudaStreamOf(this) (cuda_backend.h)
  //          with the stream's device current (cudaStreamGetDevice). The launches are then
  //          ordered with the backend's own kernels, and Synchronize() waits for them.
  // HostAddress(p) is where host code reads and writes the bytes at p (p in memory_space(),
  // up to one past its allocation), or nullptr where host code cannot touch this backend's
  // memory. A backend answers nullptr for every p or for none (but nullptr, which maps to
  // nullptr). Default: p for MemorySpace::kHost, nullptr otherwise. THREADS: the address
  // lives as long as p's allocation; host code uses it only on the thread that holds the
  // backend (one at a time). A backend with host addresses finishes its kernels before its
  // methods return, so such code never races them.
  virtual void* HostAddress(const void* p) const;

  // The kernels by family, one CUDA file each (cuda_kernels_FAMILY.cu).
  //
  // 1-BIT CODEC (the WIRE FORMAT above; compression/onebit_codec.cc).
  //
  // Worker-side compression with error feedback, into `num_chunks` blocks of
  // `chunk` elements each (n_pad = num_chunks * chunk, n <= n_pad, chunk % 8 == 0):
  //   x[i] = m'[i] + err[i] for i < n and x[i] = err[i] for n <= i < n_pad, where
  //   m' = fma(b1, m, (1-b1)*g) if g != nullptr (the fused momentum update; m is not
  //   written) and m' = m otherwise.
  //   s = ||x|| / sqrt(n_pad); every block gets scale s and the signs of its chunk;
  //   err = x - s*sign(x).
  // `err` has n_pad elements; `out` has num_chunks * CompressedBlockBytes(chunk) bytes.
  virtual absl::Status CompressWorker(const float* m, const float* g, float beta1, size_t n,
                                      size_t num_chunks, size_t chunk, float* err,
                                      uint8_t* out) = 0;

  // Server-side aggregation of one chunk: `blocks` holds num_workers consecutive blocks
  // of `chunk` elements (one per worker, in rank order). y = average of the decoded
  // blocks + err; out = compress(y) as one block; err = y - s*sign(y).
  virtual absl::Status ServerAggregate(const uint8_t* blocks, int num_workers, size_t chunk,
                                       float* err, uint8_t* out) = 0;

  // Decodes num_chunks consecutive blocks of `chunk` elements into the first n elements
  // of out (the padding is dropped).
  virtual absl::Status Decompress(const uint8_t* blocks, size_t num_chunks, size_t chunk,
                                  size_t n, float* out) = 0;

  // INT8 CODEC (compression/int8_codec.cc).
  //
  // The int8 format (INT8 WIRE FORMAT, at Int8BlockBytes). Same arguments as the 1-bit
  // methods; blocks are Int8BlockBytes(chunk) bytes.
  // Every block has its own scale and offset (the worker's K chunks each get their own; the
  // server's result is one block). Over the chunk's values x (a worker's x = m' + err, a
  // server's y, both as for 1 bit):
  //   lo    = min_j x_j + 0.0f,  hi = max_j x_j + 0.0f   (+ 0.0f: -0 becomes +0, so the
  //           result never depends on which of -0/+0 a min saw first)
  //   scale = float((double(hi) - double(lo)) / 255.0)   (float64, correctly rounded, then
  //           to float32 by round to nearest even: never overflows for finite lo, hi)
  //   inv   = 1.0f / scale, or 0.0f when scale is 0, not finite, or 1/scale is not finite
  //   r     = (x_j - lo) * inv;  r = (r > 0 ? r : 0);  r = (r < 255 ? r : 255)  (NaN -> 0)
  //   q_j   = uint8(round half to even(r))
  //   d_j   = fma(float(q_j), scale, lo)              (the decoded value)
  //   err_j = x_j - d_j
  // NON-FINITE INPUT: if any value of a chunk is NaN, lo = hi = NaN; an infinite one makes
  // hi - lo infinite or NaN. Either way the scale is not finite, every code is 0 and the
  // whole chunk decodes to NaN (fma(0, inf, lo) and fma(0, NaN, lo) are NaN), so the
  // trainer's NaN check stops the run; no float->int conversion ever sees NaN or inf. A
  // shard rejects a block whose scale or offset is not finite (or whose scale is < 0).
  virtual absl::Status CompressWorkerInt8(const float* m, const float* g, float beta1, size_t n,
                                          size_t num_chunks, size_t chunk, float* err,
                                          uint8_t* out) = 0;
  // SERVER: acc = sum over workers j in rank order, from 0.0f, of d_j (each worker's block
  // decoded with its own scale and offset); y = fma(acc, 1/W, err); then y is quantised
  // as above and err = y - d. min and max do not depend on the order they are taken in
  // (after the + 0.0f), so CPU (any thread count, scalar or AVX2) and CUDA give the same
  // bits for int8: there is no sum of squares.
  virtual absl::Status ServerAggregateInt8(const uint8_t* blocks, int num_workers, size_t chunk,
                                           float* err, uint8_t* out) = 0;
  virtual absl::Status DecompressInt8(const uint8_t* blocks, size_t num_chunks, size_t chunk,
                                      size_t n, float* out) = 0;

  // ROWS AND WIRE FORMATS (the full-precision exchanges).
  //
  // out[i] = rows[0][i] + rows[1][i] + ... in row order (float), for the rows
  // rows[j] = rows + j*count. The fixed order makes a full-precision allreduce built on it
  // give the same bits over every transport.
  virtual absl::Status SumRows(const float* rows, int num_rows, size_t count, float* out) = 0;

  // out[i] = SumRows(...)[i] * (1.0f / num_rows) (num_rows >= 1): the mean of the rows, the
  // sum in the same fixed order, so every backend gives the same bits. The hierarchical
  // exchange averages a node's gradients with it.
  virtual absl::Status AverageRows(const float* rows, int num_rows, size_t count, float* out) = 0;

  // The full-precision exchange's wire formats (wire_dtype.h; worker/exchange/
  // exact_allreduce.h). ToWire: out[i] = to_wire(x[i]), round to nearest even.
  virtual absl::Status ToWire(WireDtype dtype, const float* x, size_t n, void* out) = 0;

  // SumRows over rows that travel as `dtype`: out[i] = from_wire(rows[0][i]) +
  // from_wire(rows[1][i]) + ... in row order, in float32 from 0.0f; rows[j] starts
  // j*count elements into `rows`. For fp32 this is SumRows.
  virtual absl::Status SumWireRows(WireDtype dtype, const void* rows, int num_rows, size_t count,
                                   float* out) = 0;

  // out[i] = FromWire(in[i]) for n elements of dtype.
  virtual absl::Status WireToFloat(WireDtype dtype, const void* in, size_t n, float* out) = 0;

  // ADAM (the warmup, the frozen-variance update and its fused 1-bit decode; 0/1 Adam).
  //
  // m = fma(b1, m, (1-b1)*g) over n elements.
  virtual absl::Status MomentumUpdate(float beta1, const float* g, float* m, size_t n) = 0;

  // Warmup Adam step on the gradient g*grad_scale: updates m, v and p.
  virtual absl::Status AdamWarmupUpdate(const AdamHyper& h, const float* g, float grad_scale,
                                        float* m, float* v, float* p, size_t n) = 0;

  // Frozen-variance update: m *= mask (if mask != nullptr), then p -= lr * u.
  virtual absl::Status FrozenAdamUpdate(const AdamHyper& h, const float* v, const float* mask,
                                        float* m, float* p, size_t n) = 0;

  // Decompress fused with FrozenAdamUpdate: m = decode(blocks)[0..n) * mask; p update.
  virtual absl::Status DecompressFrozenAdamUpdate(const uint8_t* blocks, size_t num_chunks,
                                                  size_t chunk, const AdamHyper& h,
                                                  const float* v, const float* mask, float* m,
                                                  float* p, size_t n) = 0;

  // 0/1 ADAM (docs/algorithms.md, "0/1 Adam"; worker/optim/zero_one_adam.h). With d = sqrt(v) + eps
  // and u = m / d, u = fma(wd, p, u) if wd > 0 (the update's direction, as above):
  //
  // A local step on this worker's gradient g:
  //   m = fma(b1, m, (1-b1)*g); p = fma(-lr, u, p); acc = fma(-lr, u, acc).
  virtual absl::Status ZeroOneLocalUpdate(const AdamHyper& h, const float* g, const float* v,
                                          float* m, float* p, float* acc, size_t n) = 0;
  // Before a sync step's exchange: acc = acc * d.
  virtual absl::Status ZeroOneSyncPrepare(float eps, const float* v, float* acc, size_t n) = 0;
  // After it, `avg` being the exchanged average of acc and `anchor` the parameters after the
  // last sync (what p - acc is in exact arithmetic, the same bits on every worker):
  // m = (-avg) / lrs, then m = m * mask (if mask != nullptr); p = anchor + avg / d;
  // anchor = p. With lrs == 0 (the learning rate was 0 since the last sync) m is left as
  // it is. avg may not alias m, p or anchor.
  virtual absl::Status ZeroOneSyncApply(float eps, float lrs, const float* v, const float* mask,
                                        const float* avg, float* m, float* anchor, float* p,
                                        size_t n) = 0;

  // 1-BIT LAMB (docs/algorithms.md, "1-bit LAMB"; worker/optim/onebit_lamb.h) and other small
  // element-wise steps. The per-tensor norms it needs come from SumSquares.
  //
  // Sum of squares of x (float64), written to *host_result: LAMB's norms, gradient
  // clipping's global norm and the error metrics.
  virtual absl::Status SumSquares(const float* x, size_t n, double* host_result) = 0;
  // The float64 sum of squares of the float32 values of n elements of `dtype` at x (backend
  // memory): for kFp32 exactly SumSquares(x, n); for kBf16 and kFp16 the bits SumSquares gives
  // for the tensor widened to float32 (WireToFloat), without a float32 copy of it.
  // INVALID_ARGUMENT for a value that is no WireDtype; 0.0 when n == 0.
  virtual absl::Status SumSquaresWire(WireDtype dtype, const void* x, size_t n,
                                      double* host_result) = 0;
  // AdamWarmupUpdate's moments without the update: g' = g * grad_scale;
  // m = fma(b1, m, (1-b1)*g'); v = fma(b2, v, ((1-b2)*g')*g').
  virtual absl::Status AdamMomentsUpdate(const AdamHyper& h, const float* g, float grad_scale,
                                         float* m, float* v, size_t n) = 0;
  // u = m / (sqrt(v) + eps); then u = fma(wd, p, u) if h.weight_decay > 0.
  virtual absl::Status AdamDirectionInto(const AdamHyper& h, const float* m, const float* v,
                                         const float* p, float* u, size_t n) = 0;
  // y = fma(a, x, y).
  virtual absl::Status Axpy(float a, const float* x, float* y, size_t n) = 0;
  // x = x * a.
  virtual absl::Status Scale(float a, float* x, size_t n) = 0;
  // x = x * mask (element-wise; a momentum mask of 0s and 1s).
  virtual absl::Status ApplyMask(const float* mask, float* x, size_t n) = 0;
  // seen[i] = 1 where g[i] != 0 (a NaN counts), else unchanged: which gradients were ever
  // non-zero (the automatic momentum mask).
  virtual absl::Status MarkNonzero(const float* g, float* seen, size_t n) = 0;
  // The fresh variance from the gradient the momentum implies:
  // g = fma(-b1, m_last, m) / (1 - b1); v_fresh = fma(b2, v_fresh, ((1-b2)*g)*g).
  virtual absl::Status FreshVarianceUpdate(float beta1, float beta2, const float* m,
                                           const float* m_last, float* v_fresh, size_t n) = 0;
  // The largest (sqrt(v[i]) + eps) / (sqrt(v_fresh[i]) + eps) over i (a NaN if any ratio
  // is one; 0 when n == 0), written to *host_result.
  virtual absl::Status MaxDenomRatio(float eps, const float* v, const float* v_fresh, size_t n,
                                     float* host_result) = 0;
};

// HostAddress typed: the host address of p (T*), or nullptr.
template <typename T>
T* HostAddressOf(const Backend& backend, T* p) {
  return static_cast<T*>(backend.HostAddress(p));
}

// The CPU backend. With allow_simd, uses AVX2+FMA when the CPU has them (checked at run
// time) and the scalar code otherwise; the two agree bit for bit but for the summation
// order of the norms. Kernels run on `threads` threads (the caller's included) over
// fixed pieces of the data: every thread count gives the same bits.
std::unique_ptr<Backend> NewCpuBackend(bool allow_simd = true, int threads = 1);

// True when this CPU runs the AVX2 path.
bool CpuHasAvx2();

}  // namespace onebit::kernels

#endif  // ONEBIT_KERNELS_KERNELS_H_
