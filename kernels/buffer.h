// Buffer<T>: an owned array in a Backend's memory space (host or device), zeroed on
// creation. Movable, not copyable. The backend must outlive the buffer.
#ifndef ONEBIT_KERNELS_BUFFER_H_
#define ONEBIT_KERNELS_BUFFER_H_

#include <cmath>
#include <cstddef>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "kernels/kernels.h"
#include "common/status_macros.h"

namespace onebit::kernels {

template <typename T>
class Buffer {
 public:
  Buffer() = default;
  static absl::StatusOr<Buffer> Create(Backend* backend, size_t count) {
    ONEBIT_ASSIGN_OR_RETURN(void* ptr, backend->Allocate(count * sizeof(T)));
    Buffer buffer(backend, static_cast<T*>(ptr), count);
    ONEBIT_RETURN_IF_ERROR(backend->Zero(ptr, count * sizeof(T)));
    return buffer;
  }
  static absl::StatusOr<Buffer> FromHost(Backend* backend, const T* host, size_t count) {
    ONEBIT_ASSIGN_OR_RETURN(Buffer buffer, Create(backend, count));
    ONEBIT_RETURN_IF_ERROR(buffer.CopyFromHost(host, count));
    return buffer;
  }

  Buffer(Buffer&& other) noexcept { *this = std::move(other); }
  Buffer& operator=(Buffer&& other) noexcept {
    Release();
    backend_ = std::exchange(other.backend_, nullptr);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    return *this;
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() { Release(); }

  T* data() { return data_; }
  const T* data() const { return data_; }
  size_t size() const { return size_; }
  size_t bytes() const { return size_ * sizeof(T); }

  absl::Status Zero() { return backend_->Zero(data_, bytes()); }

  absl::Status CopyFromHost(const T* host, size_t count) {
    if (count != size_) {
      return absl::InvalidArgumentError(
          absl::StrCat("expected ", size_, " elements, got ", count));
    }
    return backend_->CopyFromHost(data_, host, bytes());
  }

  // `count` elements from host memory into elements [offset, offset + count).
  absl::Status CopyFromHostAt(size_t offset, const T* host, size_t count) {
    if (offset > size_ || count > size_ - offset) {
      return absl::InvalidArgumentError(absl::StrCat("elements [", offset, ", ", offset + count,
                                                     ") are not within ", size_));
    }
    if (count == 0) return absl::OkStatus();
    return backend_->CopyFromHost(data_ + offset, host, count * sizeof(T));
  }
  absl::StatusOr<std::vector<T>> ToHost() const {
    std::vector<T> host(size_);
    ONEBIT_RETURN_IF_ERROR(backend_->CopyToHost(host.data(), data_, bytes()));
    return host;
  }

  // Elements [begin, end) copied to host memory; INVALID_ARGUMENT unless within the buffer.
  absl::StatusOr<std::vector<T>> SliceToHost(size_t begin, size_t end) const {
    if (begin > end || end > size_) {
      return absl::InvalidArgumentError(
          absl::StrCat("slice [", begin, ", ", end, ") is not within ", size_, " elements"));
    }
    std::vector<T> host(end - begin);
    if (!host.empty()) {
      ONEBIT_RETURN_IF_ERROR(
          backend_->CopyToHost(host.data(), data_ + begin, host.size() * sizeof(T)));
    }
    return host;
  }

 private:
  Buffer(Backend* backend, T* data, size_t size) : backend_(backend), data_(data), size_(size) {}
  void Release() {
    if (backend_ && data_) backend_->Free(data_);
    data_ = nullptr;
  }

  Backend* backend_ = nullptr;
  T* data_ = nullptr;
  size_t size_ = 0;
};

// Host memory for staging copies to and from a backend's memory (Backend::AllocateHost:
// pinned on CUDA), grown to fit and never shrunk: allocating pinned memory is slow, so a
// staging buffer is kept across calls. Movable, not copyable. The backend must outlive it.
class StagingBuffer {
 public:
  explicit StagingBuffer(Backend* backend = nullptr) : backend_(backend) {}
  StagingBuffer(StagingBuffer&& other) noexcept { *this = std::move(other); }
  StagingBuffer& operator=(StagingBuffer&& other) noexcept {
    Release();
    backend_ = std::exchange(other.backend_, nullptr);
    data_ = std::exchange(other.data_, nullptr);
    capacity_ = std::exchange(other.capacity_, 0);
    return *this;
  }
  StagingBuffer(const StagingBuffer&) = delete;
  StagingBuffer& operator=(const StagingBuffer&) = delete;
  ~StagingBuffer() { Release(); }

  // At least `bytes` of host memory (the contents are kept only while it does not grow).
  absl::StatusOr<void*> Reserve(size_t bytes) {
    if (data_ == nullptr || bytes > capacity_) {
      Release();
      ONEBIT_ASSIGN_OR_RETURN(data_, backend_->AllocateHost(bytes));
      capacity_ = bytes;
    }
    return data_;
  }
  void* data() const { return data_; }
  size_t capacity() const { return capacity_; }

 private:
  void Release() {
    if (backend_ && data_) backend_->FreeHost(data_);
    data_ = nullptr;
    capacity_ = 0;
  }

  Backend* backend_ = nullptr;
  void* data_ = nullptr;
  size_t capacity_ = 0;
};

// ||x|| of a float buffer (read back to the host: for metrics, not the hot path).
inline absl::StatusOr<double> L2Norm(Backend* backend, const Buffer<float>& x) {
  double sumsq = 0;
  ONEBIT_RETURN_IF_ERROR(backend->SumSquares(x.data(), x.size(), &sumsq));
  return std::sqrt(sumsq);
}

}  // namespace onebit::kernels

#endif  // ONEBIT_KERNELS_BUFFER_H_
