#include "kernels/simulated_device.h"

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <type_traits>
#include <utility>

#include "absl/strings/str_cat.h"

namespace onebit::kernels {
namespace {

// The reserved range: address space only (MAP_NORESERVE); pages of the shadow are backed
// once written and given back when their allocation is freed.
constexpr size_t kSpan = size_t{8} << 30;
constexpr size_t kAlign = 256;  // as cudaMalloc's

class SimulatedDevice final : public Backend {
 public:
  SimulatedDevice(std::unique_ptr<Backend> cpu, char* device, char* shadow)
      : cpu_(std::move(cpu)), device_(device), shadow_(shadow) {}
  ~SimulatedDevice() override {
    munmap(device_, kSpan);
    munmap(shadow_, kSpan);
  }

  std::string name() const override { return "simulated-device"; }
  MemorySpace memory_space() const override { return MemorySpace::kCuda; }

  absl::StatusOr<void*> Allocate(size_t bytes) override {
    const size_t size = (std::max<size_t>(bytes, 1) + kAlign - 1) / kAlign * kAlign;
    if (live_.empty()) next_ = 0;  // nothing allocated: start over
    if (size > kSpan - next_) {
      return absl::ResourceExhaustedError(
          absl::StrCat("simulated device: no room for ", bytes, " bytes"));
    }
    char* ptr = device_ + next_;
    next_ += size;
    live_[ptr] = size;
    return ptr;
  }
  void Free(void* ptr) override {
    auto it = live_.find(static_cast<char*>(ptr));
    if (it == live_.end()) return;
    // The whole pages inside the allocation go back to the system (they read as zeros).
    const uintptr_t page = 4096;
    const uintptr_t begin = (reinterpret_cast<uintptr_t>(D(it->first)) + page - 1) / page * page;
    const uintptr_t end = (reinterpret_cast<uintptr_t>(D(it->first)) + it->second) / page * page;
    if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
    live_.erase(it);
  }
  absl::Status Zero(void* ptr, size_t bytes) override {
    std::memset(D(ptr), 0, bytes);
    return absl::OkStatus();
  }
  absl::Status CopyFromHost(void* dst, const void* host_src, size_t bytes) override {
    from_host_.fetch_add(bytes, std::memory_order_relaxed);
    if (bytes > 0) std::memcpy(D(dst), host_src, bytes);
    return absl::OkStatus();
  }
  absl::Status CopyToHost(void* host_dst, const void* src, size_t bytes) override {
    to_host_.fetch_add(bytes, std::memory_order_relaxed);
    if (bytes > 0) std::memcpy(host_dst, D(src), bytes);
    return absl::OkStatus();
  }
  absl::Status Copy(void* dst, const void* src, size_t bytes) override {
    if (bytes > 0) std::memmove(D(dst), D(src), bytes);
    return absl::OkStatus();
  }
  absl::Status Synchronize() override { return absl::OkStatus(); }
  // Host code reaches the simulated memory through the shadow, as its kernels do.
  void* HostAddress(const void* p) const override {
    return const_cast<void*>(static_cast<const void*>(D(static_cast<const char*>(p))));
  }
  HostTransfers host_transfers() const override {
    return {to_host_.load(std::memory_order_relaxed), from_host_.load(std::memory_order_relaxed),
            0.0};  // the copies are memcpys: no bus to time
  }

  absl::Status MomentumUpdate(float beta1, const float* g, float* m, size_t n) override {
    return cpu_->MomentumUpdate(beta1, D(g), D(m), n);
  }
  absl::Status CompressWorker(const float* m, const float* g, float beta1, size_t n,
                              size_t num_chunks, size_t chunk, float* err,
                              uint8_t* out) override {
    return cpu_->CompressWorker(D(m), D(g), beta1, n, num_chunks, chunk, D(err), D(out));
  }
  absl::Status ServerAggregate(const uint8_t* blocks, int num_workers, size_t chunk, float* err,
                               uint8_t* out) override {
    return cpu_->ServerAggregate(D(blocks), num_workers, chunk, D(err), D(out));
  }
  absl::Status Decompress(const uint8_t* blocks, size_t num_chunks, size_t chunk, size_t n,
                          float* out) override {
    return cpu_->Decompress(D(blocks), num_chunks, chunk, n, D(out));
  }
  absl::Status CompressWorkerInt8(const float* m, const float* g, float beta1, size_t n,
                                  size_t num_chunks, size_t chunk, float* err,
                                  uint8_t* out) override {
    return cpu_->CompressWorkerInt8(D(m), D(g), beta1, n, num_chunks, chunk, D(err), D(out));
  }
  absl::Status ServerAggregateInt8(const uint8_t* blocks, int num_workers, size_t chunk,
                                   float* err, uint8_t* out) override {
    return cpu_->ServerAggregateInt8(D(blocks), num_workers, chunk, D(err), D(out));
  }
  absl::Status DecompressInt8(const uint8_t* blocks, size_t num_chunks, size_t chunk, size_t n,
                              float* out) override {
    return cpu_->DecompressInt8(D(blocks), num_chunks, chunk, n, D(out));
  }
  absl::Status SumRows(const float* rows, int num_rows, size_t count, float* out) override {
    return cpu_->SumRows(D(rows), num_rows, count, D(out));
  }
  absl::Status AverageRows(const float* rows, int num_rows, size_t count, float* out) override {
    return cpu_->AverageRows(D(rows), num_rows, count, D(out));
  }
  absl::Status AdamWarmupUpdate(const AdamHyper& h, const float* g, float grad_scale, float* m,
                                float* v, float* p, size_t n) override {
    return cpu_->AdamWarmupUpdate(h, D(g), grad_scale, D(m), D(v), D(p), n);
  }
  absl::Status FrozenAdamUpdate(const AdamHyper& h, const float* v, const float* mask, float* m,
                                float* p, size_t n) override {
    return cpu_->FrozenAdamUpdate(h, D(v), D(mask), D(m), D(p), n);
  }
  absl::Status DecompressFrozenAdamUpdate(const uint8_t* blocks, size_t num_chunks, size_t chunk,
                                          const AdamHyper& h, const float* v, const float* mask,
                                          float* m, float* p, size_t n) override {
    return cpu_->DecompressFrozenAdamUpdate(D(blocks), num_chunks, chunk, h, D(v), D(mask), D(m),
                                            D(p), n);
  }
  absl::Status ToWire(WireDtype dtype, const float* x, size_t n, void* out) override {
    return cpu_->ToWire(dtype, D(x), n, D(out));
  }
  absl::Status SumWireRows(WireDtype dtype, const void* rows, int num_rows, size_t count,
                           float* out) override {
    return cpu_->SumWireRows(dtype, D(rows), num_rows, count, D(out));
  }
  absl::Status WireToFloat(WireDtype dtype, const void* in, size_t n, float* out) override {
    return cpu_->WireToFloat(dtype, D(in), n, D(out));
  }
  absl::Status SumSquares(const float* x, size_t n, double* host_result) override {
    return cpu_->SumSquares(D(x), n, host_result);  // the result is the host's
  }
  absl::Status SumSquaresWire(WireDtype dtype, const void* x, size_t n,
                              double* host_result) override {
    return cpu_->SumSquaresWire(dtype, D(x), n, host_result);  // the result is the host's
  }
  absl::Status ZeroOneLocalUpdate(const AdamHyper& h, const float* g, const float* v, float* m,
                                  float* p, float* acc, size_t n) override {
    return cpu_->ZeroOneLocalUpdate(h, D(g), D(v), D(m), D(p), D(acc), n);
  }
  absl::Status ZeroOneSyncPrepare(float eps, const float* v, float* acc, size_t n) override {
    return cpu_->ZeroOneSyncPrepare(eps, D(v), D(acc), n);
  }
  absl::Status ZeroOneSyncApply(float eps, float lrs, const float* v, const float* mask,
                                const float* avg, float* m, float* anchor, float* p,
                                size_t n) override {
    return cpu_->ZeroOneSyncApply(eps, lrs, D(v), D(mask), D(avg), D(m), D(anchor), D(p), n);
  }
  absl::Status AdamMomentsUpdate(const AdamHyper& h, const float* g, float grad_scale, float* m,
                                 float* v, size_t n) override {
    return cpu_->AdamMomentsUpdate(h, D(g), grad_scale, D(m), D(v), n);
  }
  absl::Status AdamDirectionInto(const AdamHyper& h, const float* m, const float* v,
                                 const float* p, float* u, size_t n) override {
    return cpu_->AdamDirectionInto(h, D(m), D(v), D(p), D(u), n);
  }
  absl::Status Axpy(float a, const float* x, float* y, size_t n) override {
    return cpu_->Axpy(a, D(x), D(y), n);
  }
  absl::Status Scale(float a, float* x, size_t n) override { return cpu_->Scale(a, D(x), n); }
  absl::Status ApplyMask(const float* mask, float* x, size_t n) override {
    return cpu_->ApplyMask(D(mask), D(x), n);
  }
  absl::Status MarkNonzero(const float* g, float* seen, size_t n) override {
    return cpu_->MarkNonzero(D(g), D(seen), n);
  }
  absl::Status FreshVarianceUpdate(float beta1, float beta2, const float* m, const float* m_last,
                                   float* v_fresh, size_t n) override {
    return cpu_->FreshVarianceUpdate(beta1, beta2, D(m), D(m_last), D(v_fresh), n);
  }
  absl::Status MaxDenomRatio(float eps, const float* v, const float* v_fresh, size_t n,
                             float* host_result) override {
    return cpu_->MaxDenomRatio(eps, D(v), D(v_fresh), n, host_result);
  }

 private:
  // The shadow address of a device pointer (null stays null).
  template <typename T>
  T* D(T* p) const {
    if (p == nullptr) return nullptr;
    using Byte = std::conditional_t<std::is_const_v<T>, const char, char>;
    return reinterpret_cast<T*>(reinterpret_cast<Byte*>(p) + (shadow_ - device_));
  }

  std::unique_ptr<Backend> cpu_;
  char* const device_;  // kSpan bytes, PROT_NONE: what callers get
  char* const shadow_;  // kSpan bytes, read-write: where the bytes are
  size_t next_ = 0;     // the next free offset
  std::map<char*, size_t> live_;
  std::atomic<uint64_t> to_host_{0}, from_host_{0};
};

}  // namespace

absl::StatusOr<std::unique_ptr<Backend>> NewSimulatedDeviceBackend(int threads) {
  const int flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE;
  void* device = mmap(nullptr, kSpan, PROT_NONE, flags, -1, 0);
  if (device == MAP_FAILED) {
    return absl::UnavailableError(
        absl::StrCat("simulated device: cannot reserve its range: ", std::strerror(errno)));
  }
  void* shadow = mmap(nullptr, kSpan, PROT_READ | PROT_WRITE, flags, -1, 0);
  if (shadow == MAP_FAILED) {
    const int error = errno;
    munmap(device, kSpan);
    return absl::UnavailableError(
        absl::StrCat("simulated device: cannot map its memory: ", std::strerror(error)));
  }
  return std::unique_ptr<Backend>(new SimulatedDevice(NewCpuBackend(true, threads),
                                                      static_cast<char*>(device),
                                                      static_cast<char*>(shadow)));
}

}  // namespace onebit::kernels
