// Internal to the CUDA backend: its kernels by family, each family an nvcc object of its own
// that queues its kernels on a given stream. cuda_backend.cu's CudaBackend checks the
// arguments, makes its device current and calls these; each returns the launch's error (or
// that of the stream call it makes) as a Status. What the kernels compute is kernels.h's
// contract, under the same name there.
//
//   cuda_kernels_onebit.cu   1-bit compression: CompressWorker, ServerAggregate, Decompress
//   cuda_kernels_int8.cu     the int8 format: CompressWorkerInt8, ServerAggregateInt8, ...
//   cuda_kernels_wire.cu     the full-precision exchange: SumRows, AverageRows, the wire dtypes
//   cuda_kernels_adam.cu     the momentum, 1-bit Adam's updates and 0/1 Adam's
//   cuda_kernels_lamb.cu     1-bit LAMB's element-wise steps, and SumSquares
//
// The device code they share is cuda_kernels_common.cuh's. No CUDA header here: the stream
// is CUDA's own stream type, declared (cudaStream_t is a CUstream_st*).
#ifndef ONEBIT_KERNELS_CUDA_KERNELS_H_
#define ONEBIT_KERNELS_CUDA_KERNELS_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda_backend.h"
#include "kernels/kernels.h"

struct CUstream_st;

namespace onebit::kernels::cuda {

// Where the kernels run: the backend's stream, and the most blocks of an element-wise grid
// (enough to fill every SM; the kernels loop over the rest).
struct Launch {
  CUstream_st* stream;
  size_t max_blocks;
};

// At most this many blocks per reduction: ~4 waves of 256-thread blocks on an H100 (132 SMs
// x 8 resident), ~5 on an A100 (108 x 8), so the last, partial wave costs little on either;
// 32 KB of partials. Past n = 4096 * kThreads * kGroup (4M elements) threads loop.
// (cuda_kernels_common.cuh, "Reductions".)
constexpr size_t kMaxReduceBlocks = 4096;

// Device memory of the reductions, one per backend: its kernels run one at a time on the
// backend's stream, so one scratch is enough.
struct ReductionScratch {
  unsigned max_bits;                   // MaxDenomRatio's result: a non-negative float's bits
  double total;                        // the result of the last reduction
  unsigned arrivals;                   // blocks done in the running reduction; 0 between
  double partials[kMaxReduceBlocks];   // per-block sums of the running reduction
};

// The int8 compressions' per-chunk ranges (cuda_kernels_int8.cu), in device memory, reset
// with cudaMemsetAsync before each use.
struct Int8Ranges {
  unsigned* min_key;  // num_chunks, reset to 0xffffffff
  unsigned* max_key;  // num_chunks, reset to 0
  unsigned* nan;      // num_chunks, reset to 0
};

// ---- 1-bit (cuda_kernels_onebit.cu) ----
// Both passes of CompressWorker; num_chunks * chunk > 0. The sum of squares goes through
// `scratch`.
absl::Status CompressWorker(Launch launch, ReductionScratch* scratch, const float* m,
                            const float* g, float beta1, size_t n, size_t num_chunks,
                            size_t chunk, float* err, uint8_t* out);
// Both passes of ServerAggregate, the first as `loads` says where the words are aligned
// (cuda_backend.h); num_workers >= 1, chunk > 0.
absl::Status ServerAggregate(Launch launch, ReductionScratch* scratch, ServerBitLoads loads,
                             const uint8_t* blocks, int num_workers, size_t chunk, float* err,
                             uint8_t* out);
// n > 0, chunk > 0.
absl::Status Decompress(Launch launch, const uint8_t* blocks, size_t num_chunks, size_t chunk,
                        size_t n, float* out);

// ---- int8 (cuda_kernels_int8.cu) ----
// `ranges` covers num_chunks chunks, reset. num_chunks > 0, chunk > 0.
absl::Status CompressWorkerInt8(Launch launch, Int8Ranges ranges, const float* m,
                                const float* g, float beta1, size_t n, size_t num_chunks,
                                size_t chunk, float* err, uint8_t* out);
// `ranges` covers one chunk, reset. num_workers >= 1, chunk > 0.
absl::Status ServerAggregateInt8(Launch launch, Int8Ranges ranges, const uint8_t* blocks,
                                 int num_workers, size_t chunk, float* err, uint8_t* out);
// n > 0, chunk > 0.
absl::Status DecompressInt8(Launch launch, const uint8_t* blocks, size_t num_chunks,
                            size_t chunk, size_t n, float* out);

// ---- The full-precision exchange (cuda_kernels_wire.cu) ----
// count > 0; num_rows >= 0 (SumRows), >= 1 (AverageRows).
absl::Status SumRows(Launch launch, const float* rows, int num_rows, size_t count, float* out);
absl::Status AverageRows(Launch launch, const float* rows, int num_rows, size_t count,
                         float* out);
// n, count > 0; num_rows >= 0. INVALID_ARGUMENT for an unknown dtype. The fp32 wire is the
// floats themselves: a copy on the stream (none in place), and SumRows.
absl::Status ToWire(Launch launch, WireDtype dtype, const float* x, size_t n, void* out);
absl::Status SumWireRows(Launch launch, WireDtype dtype, const void* rows, int num_rows,
                         size_t count, float* out);
absl::Status WireToFloat(Launch launch, WireDtype dtype, const void* in, size_t n, float* out);

// ---- The momentum, Adam and 0/1 Adam (cuda_kernels_adam.cu); n > 0 ----
absl::Status MomentumUpdate(Launch launch, float beta1, const float* g, float* m, size_t n);
absl::Status AdamWarmupUpdate(Launch launch, const AdamHyper& h, const float* g,
                              float grad_scale, float* m, float* v, float* p, size_t n);
absl::Status FrozenAdamUpdate(Launch launch, const AdamHyper& h, const float* v,
                              const float* mask, float* m, float* p, size_t n);
// chunk > 0.
absl::Status DecompressFrozenAdamUpdate(Launch launch, const uint8_t* blocks, size_t num_chunks,
                                        size_t chunk, const AdamHyper& h, const float* v,
                                        const float* mask, float* m, float* p, size_t n);
absl::Status ZeroOneLocalUpdate(Launch launch, const AdamHyper& h, const float* g,
                                const float* v, float* m, float* p, float* acc, size_t n);
absl::Status ZeroOneSyncPrepare(Launch launch, float eps, const float* v, float* acc, size_t n);
absl::Status ZeroOneSyncApply(Launch launch, float eps, float lrs, const float* v,
                              const float* mask, const float* avg, float* m, float* anchor,
                              float* p, size_t n);

// ---- 1-bit LAMB's steps and SumSquares (cuda_kernels_lamb.cu); n > 0 ----
absl::Status AdamMomentsUpdate(Launch launch, const AdamHyper& h, const float* g,
                               float grad_scale, float* m, float* v, size_t n);
absl::Status AdamDirectionInto(Launch launch, const AdamHyper& h, const float* m,
                               const float* v, const float* p, float* u, size_t n);
absl::Status Axpy(Launch launch, float a, const float* x, float* y, size_t n);
absl::Status Scale(Launch launch, float a, float* x, size_t n);
absl::Status ApplyMask(Launch launch, const float* mask, float* x, size_t n);
absl::Status MarkNonzero(Launch launch, const float* g, float* seen, size_t n);
absl::Status FreshVarianceUpdate(Launch launch, float beta1, float beta2, const float* m,
                                 const float* m_last, float* v_fresh, size_t n);
// The largest ratio's bits into `max_bits` (device memory, zeroed by the caller).
absl::Status MaxDenomRatio(Launch launch, float eps, const float* v, const float* v_fresh,
                           size_t n, unsigned* max_bits);
// The sum of squares of n elements of `dtype` widened to float32 (Backend::SumSquares for
// kFp32, Backend::SumSquaresWire), into scratch->total. The grid and the order of the
// additions depend on n alone, not on the dtype, so a 16-bit tensor gives the bits of its
// float32 widening. INVALID_ARGUMENT for a value that is no WireDtype.
absl::Status SumSquaresWire(Launch launch, ReductionScratch* scratch, WireDtype dtype,
                            const void* x, size_t n);

}  // namespace onebit::kernels::cuda

#endif  // ONEBIT_KERNELS_CUDA_KERNELS_H_
