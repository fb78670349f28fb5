// HostStagedExchange: an Exchange for a worker whose tensors live in device memory (the
// CUDA backend's), made from an exchange that works in host memory: the parameter-server
// exchange (PsExchange), or the peer exchange over gloo. Each call copies its inputs from
// the device into host buffers, runs the host exchange on them, and copies the results
// back into device buffers; everything else (errors, checkpoints, bytes, the overflow
// vote) is the host exchange's.
//
// So a GPU worker can use the ps shards and gloo, not only NCCL: several GPU workers on one
// machine (or one GPU), GPU workers with parameter-server shards, and hierarchical jobs
// with shards between the nodes. The compression and its worker error then run on the
// host, with the host exchange's CPU backend: the kernels give the same bits on either
// backend, so a staged job's numbers are those of the same job on the CPU's exchange. The
// cost per step is the copies (each input once down, each result once up; PCIe moves them
// far faster than the links this exchange is for carry the bytes) and the compression's
// CPU time. NCCL keeps everything on the device; use it where each rank has its own GPU.
//
// Thread safety: one thread at a time (as Exchange).
#ifndef ONEBIT_WORKER_EXCHANGE_HOST_STAGED_EXCHANGE_H_
#define ONEBIT_WORKER_EXCHANGE_HOST_STAGED_EXCHANGE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/buffer.h"
#include "kernels/kernels.h"
#include "worker/exchange/forwarding_exchange.h"

namespace onebit {

class HostStagedExchange final : public ForwardingExchange {
 public:
  // `device`: the caller's backend (borrowed), whose memory the tensors are in.
  // `host`: a host-memory backend, owned here, that `inner` was made with; `inner` is owned
  // here too and destroyed first. `n`: the elements of the tensors the calls pass (the
  // size `inner` was made for). INVALID_ARGUMENT when `host` is not host memory.
  static absl::StatusOr<std::unique_ptr<HostStagedExchange>> Create(
      kernels::Backend* device, std::unique_ptr<kernels::Backend> host,
      std::unique_ptr<Exchange> inner, size_t n);
  ~HostStagedExchange() override;

  absl::StatusOr<const float*> SumGradients(int64_t step, const float* grad) override;
  absl::StatusOr<CompressedResult> AverageMomentum(int64_t step, const float* m, const float* g,
                                                   float beta1) override;
  absl::StatusOr<CompressedResult> CompressedAverage(int64_t step, const float* x) override;
  // The host exchange's compression time plus this exchange's copies. Everything else
  // (the worker error, in host memory, checkpoints, bytes, the overflow vote) is the host
  // exchange's, forwarded.
  double compress_seconds() const override {
    return ForwardingExchange::compress_seconds() + compress_seconds_;
  }

 private:
  HostStagedExchange(kernels::Backend* device, std::unique_ptr<kernels::Backend> host,
                     std::unique_ptr<Exchange> inner, size_t n);
  // n floats from the device into `host`.
  absl::Status Down(const float* device_src, std::vector<float>& host);
  // A host result into device buffers; the device pointers replace the host ones.
  absl::StatusOr<CompressedResult> Up(const CompressedResult& host_result);

  kernels::Backend* const device_;
  std::unique_ptr<kernels::Backend> host_;  // before inner_: it outlives it
  std::unique_ptr<Exchange> inner_;
  const size_t n_;
  std::vector<float> host_a_, host_b_;  // the inputs, on the host
  kernels::Buffer<float> sum_;          // SumGradients' result, n floats
  kernels::Buffer<uint8_t> blocks_;     // the compressed result (grown to fit)
  kernels::Buffer<float> momentum_;     // a result's floats, n
};

}  // namespace onebit

#endif  // ONEBIT_WORKER_EXCHANGE_HOST_STAGED_EXCHANGE_H_
