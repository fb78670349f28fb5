// The CUDA backend: kernels.h's contract on one GPU, every kernel queued on the backend's
// own stream. CudaBackend checks the arguments, makes its device current and queues the
// kernels through cuda_kernels.h, one nvcc object per family of kernels; the device code's
// rules (bit-exactness, vector width, the fixed-tree reductions) are
// cuda_kernels_common.cuh's.

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/cuda_backend.h"
#include "kernels/cuda_kernels.h"
#include "kernels/cuda_status.h"
#include "kernels/kernels.h"

namespace onebit::kernels {
namespace {

using cuda::Int8Ranges;
using cuda::ReductionScratch;

// ---------------------------------------------------------------------------------------
// Errors

// CudaErrorStatus and ONEBIT_CUDA_RETURN_IF_ERROR come from kernels/cuda_status.h.

absl::Status CheckChunking(size_t num_chunks, size_t chunk, size_t n) {
  if (chunk % 8 != 0) {
    return absl::InvalidArgumentError(absl::StrCat("chunk ", chunk, " is not a multiple of 8"));
  }
  if (chunk != 0 && num_chunks > SIZE_MAX / chunk) {
    return absl::InvalidArgumentError("num_chunks * chunk overflows");
  }
  if (n > num_chunks * chunk) {
    return absl::InvalidArgumentError(absl::StrCat("n = ", n, " exceeds num_chunks * chunk = ",
                                                   num_chunks * chunk));
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------
// The backend

// Adds the nanoseconds of its lifetime to *total: the time of a host copy (started once
// the stream is idle, so that no kernel's time is counted).
class CopyTimer {
 public:
  explicit CopyTimer(std::atomic<uint64_t>* total)
      : total_(total), start_(std::chrono::steady_clock::now()) {}
  ~CopyTimer() {
    total_->fetch_add(static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                                std::chrono::steady_clock::now() - start_)
                                                .count()),
                      std::memory_order_relaxed);
  }

 private:
  std::atomic<uint64_t>* total_;
  std::chrono::steady_clock::time_point start_;
};

// A reduction's result on its way to the host, in pinned memory: the copy is one DMA queued
// behind the kernel and the host waits once (a copy into pageable memory is staged by the
// driver and needs a wait of its own first).
struct HostResults {
  double total;
  unsigned max_bits;
};

class CudaBackend final : public Backend {
 public:
  // Takes ownership of `stream`, `scratch` (device memory, arrivals == 0) and `results`
  // (pinned host memory).
  CudaBackend(int device, int num_sms, cudaStream_t stream, ReductionScratch* scratch,
              HostResults* results)
      : device_(device),
        // Enough 256-thread blocks to fill every SM (2048 resident threads on sm_80/sm_90);
        // the kernels loop over the rest.
        max_blocks_(static_cast<size_t>(std::max(num_sms, 1)) * 8),
        stream_(stream),
        scratch_(scratch),
        results_(results) {}

  ~CudaBackend() override {
    // Errors here mean the context is already broken; there is nobody left to report to.
    cudaSetDevice(device_);
    cudaStreamSynchronize(stream_);
    cudaFree(scratch_);
    cudaFreeHost(results_);
    if (ranges_ != nullptr) cudaFree(ranges_);
    cudaStreamDestroy(stream_);
  }

  std::string name() const override { return absl::StrCat("cuda:", device_); }
  MemorySpace memory_space() const override { return MemorySpace::kCuda; }

  cudaStream_t stream() const { return stream_; }
  void set_server_bit_loads(ServerBitLoads loads) { server_bit_loads_ = loads; }

  absl::StatusOr<void*> Allocate(size_t bytes) override {
    ONEBIT_RETURN_IF_ERROR(Activate());
    void* ptr = nullptr;
    // cudaMalloc(0) may return null; one byte keeps pointers unique and non-null.
    ONEBIT_CUDA_RETURN_IF_ERROR(cudaMalloc(&ptr, std::max<size_t>(bytes, 1)));
    return ptr;
  }

  void Free(void* ptr) override {
    if (ptr == nullptr) return;
    // cudaFree waits for the device, so queued kernels that use ptr finish first. A failure
    // means a broken context, which the next call that returns a Status reports.
    if (cudaSetDevice(device_) == cudaSuccess) cudaFree(ptr);
  }

  absl::Status Zero(void* ptr, size_t bytes) override {
    if (bytes == 0) return absl::OkStatus();
    ONEBIT_RETURN_IF_ERROR(Activate());
    ONEBIT_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(ptr, 0, bytes, stream_));
    return absl::OkStatus();
  }

  absl::StatusOr<void*> AllocateHost(size_t bytes) override {
    ONEBIT_RETURN_IF_ERROR(Activate());
    void* ptr = nullptr;
    ONEBIT_CUDA_RETURN_IF_ERROR(cudaMallocHost(&ptr, std::max<size_t>(bytes, 1)));
    return ptr;
  }

  void FreeHost(void* ptr) override {
    if (ptr == nullptr) return;
    if (cudaSetDevice(device_) == cudaSuccess) cudaFreeHost(ptr);
  }

  HostTransfers host_transfers() const override {
    return {to_host_.load(std::memory_order_relaxed), from_host_.load(std::memory_order_relaxed),
            1e-9 * static_cast<double>(copy_ns_.load(std::memory_order_relaxed))};
  }

  absl::Status CopyFromHost(void* dst, const void* host_src, size_t bytes) override {
    return HostCopy(dst, host_src, bytes, cudaMemcpyHostToDevice, from_host_);
  }

  absl::Status CopyToHost(void* host_dst, const void* src, size_t bytes) override {
    return HostCopy(host_dst, src, bytes, cudaMemcpyDeviceToHost, to_host_);
  }

  absl::Status Copy(void* dst, const void* src, size_t bytes) override {
    if (bytes == 0) return absl::OkStatus();
    ONEBIT_RETURN_IF_ERROR(Activate());
    ONEBIT_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_));
    return absl::OkStatus();
  }

  absl::Status Synchronize() override {
    ONEBIT_RETURN_IF_ERROR(Activate());
    ONEBIT_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    return absl::OkStatus();
  }

  absl::Status MomentumUpdate(float beta1, const float* g, float* m, size_t n) override {
    if (n == 0) return absl::OkStatus();
    ONEBIT_RETURN_IF_ERROR(Activate());
    return cuda::MomentumUpdate(launch(), beta1, g, m, n);
  }

  absl::Status CompressWorker(const float* m, const float* g, float beta1, size_t n,
                              size_t num_chunks, size_t chunk, float* err,
                              uint8_t* out) override {
    ONEBIT_RETURN_IF_ERROR(CheckChunking(num_chunks, chunk, n));
    ONEBIT_RETURN_IF_ERROR(Activate());
    if (num_chunks * chunk == 0) return ZeroScales(out, num_chunks);
    return cuda::CompressWorker(launch(), scratch_, m, g, beta1, n, num_chunks, chunk, err, out);
  }

  absl::Status ServerAggregate(const uint8_t* blocks, int num_workers, size_t chunk,
                               float* err, uint8_t* out) override {
    if (num_workers < 1) {
      return absl::InvalidArgumentError(absl::StrCat("num_workers = ", num_workers));
    }
    ONEBIT_RETURN_IF_ERROR(CheckChunking(1, chunk, chunk));
    ONEBIT_RETURN_IF_ERROR(Activate());
    if (chunk == 0) return ZeroScales(out, 1);
    return cuda::ServerAggregate(launch(), scratch_, server_bit_loads_, blocks, num_workers,
                                 chunk, err, out);
  }

  absl::Status Decompress(const uint8_t* blocks, size_t num_chunks, size_t chunk, size_t n,
                          float* out) override {
    ONEBIT_RETURN_IF_ERROR(CheckChunking(num_chunks, chunk, n));
    if (n == 0) return absl::OkStatus();
    ONEBIT_RETURN_IF_ERROR(Activate());
    return cuda::Decompress(launch(), blocks, num_chunks, chunk, n, out);
  }

  absl::Status CompressWorkerInt8(const float* m, const float* g, float beta1, size_t n,
                                  size_t num_chunks, size_t chunk, float* err,
                                  uint8_t* out) override {
    ONEBIT_RETURN_IF_ERROR(CheckChunking(num_chunks, chunk, n));
    ONEBIT_RETURN_IF_ERROR(Activate());
    if (num_chunks == 0) return absl::OkStatus();
    if (chunk == 0) return ZeroInt8Headers(out, num_chunks);
    ONEBIT_ASSIGN_OR_RETURN(Int8Ranges ranges, ResetRanges(num_chunks));
    return cuda::CompressWorkerInt8(launch(), ranges, m, g, beta1, n, num_chunks, chunk, err,
                                    out);
  }

  absl::Status ServerAggregateInt8(const uint8_t* blocks, int num_workers, size_t chunk,
                                   float* err, uint8_t* out) override {
    if (num_workers < 1) {
      return absl::InvalidArgumentError(absl::StrCat("num_workers = ", num_workers));
    }
    ONEBIT_RETURN_IF_ERROR(CheckChunking(1, chunk, chunk));
    ONEBIT_RETURN_IF_ERROR(Activate());
    if (chunk == 0) return ZeroInt8Headers(out, 1);
    ONEBIT_ASSIGN_OR_RETURN(Int8Ranges ranges, ResetRanges(1));
    return cuda::ServerAggregateInt8(launch(), ranges, blocks, num_workers, chunk, err, out);
  }

  absl::Status DecompressInt8(const uint8_t* blocks, size_t num_chunks, size_t chunk, size_t n,
                              float* out) override {
    ONEBIT_RETURN_IF_ERROR(CheckChunking(num_chunks, chunk, n));
    if (n == 0) return absl::OkStatus();
    ONEBIT_RETURN_IF_ERROR(Activate());
    return cuda::DecompressInt8(launch(), blocks, num_chunks, chunk, n, out);
  }

  absl::Status SumRows(const float* rows, int num_rows, size_t count, float* out) override {
    if (num_rows < 0) {
      return absl::InvalidArgumentError(absl::StrCat("num_rows = ", num_rows));
    }
    if (count == 0) return absl::OkStatus();
    ONEBIT_RETURN_IF_ERROR(Activate());
    return cuda::SumRows(launch(), rows, num_rows, count, out);
  }

  absl::Status AverageRows(const float* rows, int num_rows, size_t count, float* out) override {
    if (num_rows < 1) {
      return absl::InvalidArgumentError(absl::StrCat("num_rows = ", num_rows));
    }
    if (count == 0) return absl::OkStatus();
    ONEBIT_RETURN_IF_ERROR(Activate());
    return cuda::AverageRows(launch(), rows, num_rows, count, out);
  }

  absl::Status AdamWarmupUpdate(const AdamHyper& h, const float* g, float grad_scale, float* m,
                                float* v, float* p, size_t n) override {
    if (n == 0) return absl::OkStatus();
    ONEBIT_RETURN_IF_ERROR(Activate());
    return cuda::AdamWarmupUpdate(launch(), h, g, grad_scale, m, v, p, n);
  }

  absl::Status FrozenAdamUpdate(const AdamHyper& h, const float* v, const float* mask,
                                float* m, float* p, size_t n) override {
    if (n == 0) return absl::OkStatus();
    ONEBIT_RETURN_IF_ERROR(Activate());
    return cuda::FrozenAdamUpdate(launch(), h, v, mask, m, p, n);
  }

  absl::Status DecompressFrozenAdamUpdate(const uint8_t* blocks, size_t num_chunks,
                                          size_t chunk, const AdamHyper& h, const float* v,
                                          const float* mask, float* m, float* p,
                                          size_t n) override {
    ONEBIT_RETURN_IF_ERROR(CheckChunking(num_chunks, chunk, n));
    if (n == 0) return absl::OkStatus();
    ONEBIT_RETURN_IF_ERROR(Activate());
    return cuda::DecompressFrozenAdamUpdate(launch(), blocks, num_chunks, chunk, h, v, mask, m,
                                            p, n);
  }

  absl::Status SumSquares(const float* x, size_t n, double* host_result) override {
    return SumSquaresWire(WireDtype::kFp32, x, n, host_result);
  }

  absl::Status SumSquaresWire(WireDtype dtype, const void* x, size_t n,
                              double* host_result) override {
    if (dtype != WireDtype::kFp32 && dtype != WireDtype::kBf16 && dtype != WireDtype::kFp16) {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown wire dtype ", static_cast<int>(dtype)));
    }
    ONEBIT_RETURN_IF_ERROR(Activate());
    if (n == 0) {
      ONEBIT_CUDA_RETURN_IF_ERROR(
          cudaMemsetAsync(&scratch_->total, 0, sizeof(double), stream_));
    } else {
      ONEBIT_RETURN_IF_ERROR(cuda::SumSquaresWire(launch(), scratch_, dtype, x, n));
    }
    ONEBIT_RETURN_IF_ERROR(ResultToHost(&results_->total, &scratch_->total));
    *host_result = results_->total;
    return absl::OkStatus();
  }

  absl::Status ZeroOneLocalUpdate(const AdamHyper& h, const float* g, const float* v, float* m,
                                  float* p, float* acc, size_t n) override {
    if (n == 0) return absl::OkStatus();
    ONEBIT_RETURN_IF_ERROR(Activate());
    return cuda::ZeroOneLocalUpdate(launch(), h, g, v, m, p, acc, n);
  }

  absl::Status ZeroOneSyncPrepare(float eps, const float* v, float* acc, size_t n) override {
    if (n == 0) return absl::OkStatus();
    ONEBIT_RETURN_IF_ERROR(Activate());
    return cuda::ZeroOneSyncPrepare(launch(), eps, v, acc, n);
  }

  absl::Status ZeroOneSyncApply(float eps, float lrs, const float* v, const float* mask,
                                const float* avg, float* m, float* anchor, float* p,
                                size_t n) override {
    if (n == 0) return absl::OkStatus();
    ONEBIT_RETURN_IF_ERROR(Activate());
    return cuda::ZeroOneSyncApply(launch(), eps, lrs, v, mask, avg, m, anchor, p, n);
  }

  absl::Status AdamMomentsUpdate(const AdamHyper& h, const float* g, float grad_scale, float* m,
                                 float* v, size_t n) override {
    if (n == 0) return absl::OkStatus();
    ONEBIT_RETURN_IF_ERROR(Activate());
    return cuda::AdamMomentsUpdate(launch(), h, g, grad_scale, m, v, n);
  }

  absl::Status AdamDirectionInto(const AdamHyper& h, const float* m, const float* v,
                                 const float* p, float* u, size_t n) override {
    if (n == 0) return absl::OkStatus();
    ONEBIT_RETURN_IF_ERROR(Activate());
    return cuda::AdamDirectionInto(launch(), h, m, v, p, u, n);
  }

  absl::Status Axpy(float a, const float* x, float* y, size_t n) override {
    if (n == 0) return absl::OkStatus();
    ONEBIT_RETURN_IF_ERROR(Activate());
    return cuda::Axpy(launch(), a, x, y, n);
  }

  absl::Status Scale(float a, float* x, size_t n) override {
    if (n == 0) return absl::OkStatus();
    ONEBIT_RETURN_IF_ERROR(Activate());
    return cuda::Scale(launch(), a, x, n);
  }

  absl::Status ApplyMask(const float* mask, float* x, size_t n) override {
    if (n == 0) return absl::OkStatus();
    ONEBIT_RETURN_IF_ERROR(Activate());
    return cuda::ApplyMask(launch(), mask, x, n);
  }

  absl::Status MarkNonzero(const float* g, float* seen, size_t n) override {
    if (n == 0) return absl::OkStatus();
    ONEBIT_RETURN_IF_ERROR(Activate());
    return cuda::MarkNonzero(launch(), g, seen, n);
  }

  absl::Status FreshVarianceUpdate(float beta1, float beta2, const float* m, const float* m_last,
                                   float* v_fresh, size_t n) override {
    if (n == 0) return absl::OkStatus();
    ONEBIT_RETURN_IF_ERROR(Activate());
    return cuda::FreshVarianceUpdate(launch(), beta1, beta2, m, m_last, v_fresh, n);
  }

  absl::Status MaxDenomRatio(float eps, const float* v, const float* v_fresh, size_t n,
                             float* host_result) override {
    ONEBIT_RETURN_IF_ERROR(Activate());
    ONEBIT_CUDA_RETURN_IF_ERROR(
        cudaMemsetAsync(&scratch_->max_bits, 0, sizeof(unsigned), stream_));
    if (n > 0) {
      ONEBIT_RETURN_IF_ERROR(
          cuda::MaxDenomRatio(launch(), eps, v, v_fresh, n, &scratch_->max_bits));
    }
    ONEBIT_RETURN_IF_ERROR(ResultToHost(&results_->max_bits, &scratch_->max_bits));
    static_assert(sizeof(float) == sizeof(unsigned), "max_bits holds a float's bits");
    std::memcpy(host_result, &results_->max_bits, sizeof(float));
    return absl::OkStatus();
  }

  absl::Status ToWire(WireDtype dtype, const float* x, size_t n, void* out) override {
    if (n == 0) return absl::OkStatus();
    ONEBIT_RETURN_IF_ERROR(Activate());
    return cuda::ToWire(launch(), dtype, x, n, out);
  }

  absl::Status SumWireRows(WireDtype dtype, const void* rows, int num_rows, size_t count,
                           float* out) override {
    if (num_rows < 0) {
      return absl::InvalidArgumentError(absl::StrCat("num_rows = ", num_rows));
    }
    if (count == 0) return absl::OkStatus();
    ONEBIT_RETURN_IF_ERROR(Activate());
    return cuda::SumWireRows(launch(), dtype, rows, num_rows, count, out);
  }

  absl::Status WireToFloat(WireDtype dtype, const void* in, size_t n, float* out) override {
    if (n == 0) return absl::OkStatus();
    ONEBIT_RETURN_IF_ERROR(Activate());
    return cuda::WireToFloat(launch(), dtype, in, n, out);
  }

 private:
  // A copy between the host and the device, counted in `bytes_counter`, timed alone (the
  // kernels queued before it finish first), and finished when it returns: CUDA may still
  // read host memory after cudaMemcpyAsync returns (always pinned, sometimes pageable), and
  // callers written against Backend reuse the buffer at once, as with the CPU backend.
  absl::Status HostCopy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                        std::atomic<uint64_t>& bytes_counter) {
    if (bytes == 0) return absl::OkStatus();
    ONEBIT_RETURN_IF_ERROR(Activate());
    bytes_counter.fetch_add(bytes, std::memory_order_relaxed);
    ONEBIT_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    const CopyTimer timer(&copy_ns_);
    ONEBIT_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, bytes, kind, stream_));
    ONEBIT_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    return absl::OkStatus();
  }

  // The calling thread's current device may be another backend's.
  absl::Status Activate() const {
    ONEBIT_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    return absl::OkStatus();
  }

  // A reduction's result, queued behind its kernel, into `pinned` (a member of results_);
  // the host waits once. Counted in host_transfers()' bytes; its time is the kernel's as
  // much as the copy's, so it is left out of their copy time.
  template <typename T>
  absl::Status ResultToHost(T* pinned, const T* device_src) {
    to_host_.fetch_add(sizeof(T), std::memory_order_relaxed);
    ONEBIT_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(pinned, device_src, sizeof(T), cudaMemcpyDeviceToHost, stream_));
    ONEBIT_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    return absl::OkStatus();
  }

  // Where the kernels go (cuda_kernels.h).
  cuda::Launch launch() const { return {stream_, max_blocks_}; }

  // Blocks of chunk 0 are bare scales, and their scale is 0 (a float 0 is all zero bytes).
  absl::Status ZeroScales(uint8_t* out, size_t num_chunks) {
    if (num_chunks == 0) return absl::OkStatus();
    ONEBIT_CUDA_RETURN_IF_ERROR(
        cudaMemsetAsync(out, 0, num_chunks * CompressedBlockBytes(0), stream_));
    return absl::OkStatus();
  }

  // int8 headers of empty chunks: scale 0, offset 0.
  absl::Status ZeroInt8Headers(uint8_t* out, size_t num_chunks) {
    ONEBIT_CUDA_RETURN_IF_ERROR(
        cudaMemsetAsync(out, 0, num_chunks * Int8BlockBytes(0), stream_));
    return absl::OkStatus();
  }

  // The int8 ranges of num_chunks chunks, reset on the stream (grown as needed; growing
  // waits for the kernels that may still use the old memory).
  absl::StatusOr<Int8Ranges> ResetRanges(size_t num_chunks) {
    if (num_chunks > ranges_capacity_) {
      ONEBIT_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
      if (ranges_ != nullptr) cudaFree(ranges_);
      ranges_ = nullptr;
      ranges_capacity_ = 0;
      ONEBIT_CUDA_RETURN_IF_ERROR(
          cudaMalloc(reinterpret_cast<void**>(&ranges_), 3 * num_chunks * sizeof(unsigned)));
      ranges_capacity_ = num_chunks;
    }
    Int8Ranges r{ranges_, ranges_ + num_chunks, ranges_ + 2 * num_chunks};
    ONEBIT_CUDA_RETURN_IF_ERROR(
        cudaMemsetAsync(r.min_key, 0xff, num_chunks * sizeof(unsigned), stream_));
    ONEBIT_CUDA_RETURN_IF_ERROR(
        cudaMemsetAsync(r.max_key, 0, 2 * num_chunks * sizeof(unsigned), stream_));
    return r;
  }

  const int device_;
  const size_t max_blocks_;
  const cudaStream_t stream_;
  // The reductions' partials and result. Stream order makes one enough: the next
  // reduction is queued after the previous one's last reader.
  ReductionScratch* const scratch_;
  HostResults* const results_;  // pinned: the reductions' results for the host
  unsigned* ranges_ = nullptr;  // int8: 3 * ranges_capacity_ (ResetRanges)
  size_t ranges_capacity_ = 0;
  // host_transfers(); atomic so that a metrics thread may read them.
  std::atomic<uint64_t> to_host_{0}, from_host_{0}, copy_ns_{0};
  ServerBitLoads server_bit_loads_ = ServerBitLoads::kThreadBytes;
};

}  // namespace

bool CudaBuilt() { return true; }

int CudaDeviceCount() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    // No driver or no device: clear the error so that it does not leak into later calls.
    cudaGetLastError();
    return 0;
  }
  return count;
}

absl::StatusOr<std::unique_ptr<Backend>> NewCudaBackend(int device) {
  const int count = CudaDeviceCount();
  if (device < 0 || device >= count) {
    return absl::UnavailableError(
        absl::StrCat("no CUDA device ", device, ": ", count,
                     " device(s) visible (no GPU, no driver, or CUDA_VISIBLE_DEVICES)"));
  }
  ONEBIT_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  int num_sms = 0;
  ONEBIT_CUDA_RETURN_IF_ERROR(
      cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, device));
  cudaStream_t stream = nullptr;
  // Non-blocking: the legacy default stream, which other libraries may use, does not
  // serialize against this backend's work.
  ONEBIT_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  ReductionScratch* scratch = nullptr;
  cudaError_t error = cudaMalloc(&scratch, sizeof(ReductionScratch));
  if (error != cudaSuccess) {
    cudaStreamDestroy(stream);
    return CudaErrorStatus(error, "cudaMalloc(&scratch, sizeof(ReductionScratch))", __FILE__,
                           __LINE__);
  }
  // On the backend's stream: a non-blocking stream is not ordered after the legacy one.
  error = cudaMemsetAsync(scratch, 0, sizeof(ReductionScratch), stream);
  if (error == cudaSuccess) error = cudaStreamSynchronize(stream);
  if (error != cudaSuccess) {
    cudaFree(scratch);
    cudaStreamDestroy(stream);
    return CudaErrorStatus(error, "cudaMemsetAsync(scratch, 0, ...)", __FILE__, __LINE__);
  }
  HostResults* results = nullptr;
  error = cudaMallocHost(&results, sizeof(HostResults));
  if (error != cudaSuccess) {
    cudaFree(scratch);
    cudaStreamDestroy(stream);
    return CudaErrorStatus(error, "cudaMallocHost(&results, sizeof(HostResults))", __FILE__,
                           __LINE__);
  }
  return std::unique_ptr<Backend>(new CudaBackend(device, num_sms, stream, scratch, results));
}

void* CudaStreamOf(Backend* backend) {
  auto* cuda = dynamic_cast<CudaBackend*>(backend);
  return cuda == nullptr ? nullptr : static_cast<void*>(cuda->stream());
}

absl::Status SetServerBitLoads(Backend* backend, ServerBitLoads loads) {
  auto* cuda = dynamic_cast<CudaBackend*>(backend);
  if (cuda == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "SetServerBitLoads: ", backend == nullptr ? "no backend" : backend->name(),
        " is not a CUDA backend"));
  }
  cuda->set_server_bit_loads(loads);
  return absl::OkStatus();
}

}  // namespace onebit::kernels
