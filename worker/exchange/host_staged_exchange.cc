#include "worker/exchange/host_staged_exchange.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace onebit {

absl::StatusOr<std::unique_ptr<HostStagedExchange>> HostStagedExchange::Create(
    kernels::Backend* device, std::unique_ptr<kernels::Backend> host,
    std::unique_ptr<Exchange> inner, size_t n) {
  if (device == nullptr || host == nullptr || inner == nullptr) {
    return absl::InvalidArgumentError("HostStagedExchange needs a device backend, a host "
                                      "backend and an exchange");
  }
  if (host->memory_space() != kernels::MemorySpace::kHost) {
    return absl::InvalidArgumentError(
        absl::StrCat("HostStagedExchange: the host backend ", host->name(),
                     " does not use host memory"));
  }
  std::unique_ptr<HostStagedExchange> e(
      new HostStagedExchange(device, std::move(host), std::move(inner), n));
  ONEBIT_ASSIGN_OR_RETURN(e->sum_, kernels::Buffer<float>::Create(device, n));
  ONEBIT_ASSIGN_OR_RETURN(e->momentum_, kernels::Buffer<float>::Create(device, n));
  return e;
}

HostStagedExchange::HostStagedExchange(kernels::Backend* device,
                                       std::unique_ptr<kernels::Backend> host,
                                       std::unique_ptr<Exchange> inner, size_t n)
    : ForwardingExchange(inner.get()), device_(device), host_(std::move(host)),
      inner_(std::move(inner)), n_(n),
      host_a_(n), host_b_(n) {}

HostStagedExchange::~HostStagedExchange() {
  inner_.reset();  // it borrows host_
}

absl::Status HostStagedExchange::Down(const float* device_src, std::vector<float>& host) {
  if (n_ == 0) return absl::OkStatus();
  return device_->CopyToHost(host.data(), device_src, n_ * sizeof(float));
}

absl::StatusOr<CompressedResult> HostStagedExchange::Up(const CompressedResult& r) {
  CompressedResult out = r;
  if (r.blocks != nullptr) {
    const size_t bytes = r.num_chunks * kernels::BlockBytes(r.compressor, r.chunk);
    if (blocks_.size() < bytes) {
      ONEBIT_ASSIGN_OR_RETURN(blocks_, kernels::Buffer<uint8_t>::Create(device_, bytes));
    }
    if (bytes > 0) ONEBIT_RETURN_IF_ERROR(device_->CopyFromHost(blocks_.data(), r.blocks, bytes));
    out.blocks = blocks_.data();
  }
  if (r.momentum != nullptr) {
    if (n_ > 0) {
      ONEBIT_RETURN_IF_ERROR(device_->CopyFromHost(momentum_.data(), r.momentum, n_ * sizeof(float)));
    }
    out.momentum = momentum_.data();
  }
  return out;
}

absl::StatusOr<const float*> HostStagedExchange::SumGradients(int64_t step, const float* grad) {
  ONEBIT_RETURN_IF_ERROR(Down(grad, host_a_));
  ONEBIT_ASSIGN_OR_RETURN(const float* sum, inner_->SumGradients(step, host_a_.data()));
  if (n_ > 0) ONEBIT_RETURN_IF_ERROR(sum_.CopyFromHost(sum, n_));
  return sum_.data();
}

absl::StatusOr<CompressedResult> HostStagedExchange::AverageMomentum(int64_t step,
                                                                      const float* m,
                                                                      const float* g,
                                                                      float beta1) {
  {
    ScopedStepTime t(step_clock(), &compress_seconds_);
    ONEBIT_RETURN_IF_ERROR(Down(m, host_a_));
    ONEBIT_RETURN_IF_ERROR(Down(g, host_b_));
  }
  ONEBIT_ASSIGN_OR_RETURN(CompressedResult r,
                          inner_->AverageMomentum(step, host_a_.data(), host_b_.data(), beta1));
  ScopedStepTime t(step_clock(), &compress_seconds_);
  return Up(r);
}

absl::StatusOr<CompressedResult> HostStagedExchange::CompressedAverage(int64_t step,
                                                                        const float* x) {
  {
    ScopedStepTime t(step_clock(), &compress_seconds_);
    ONEBIT_RETURN_IF_ERROR(Down(x, host_a_));
  }
  ONEBIT_ASSIGN_OR_RETURN(CompressedResult r, inner_->CompressedAverage(step, host_a_.data()));
  ScopedStepTime t(step_clock(), &compress_seconds_);
  return Up(r);
}

}  // namespace onebit
