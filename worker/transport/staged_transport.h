// StagedTransport: a Transport in a device backend's memory, made from one in host memory
// (gloo; in-process for tests). Each call copies what it sends from the device into pinned
// host buffers (Backend::AllocateHost), runs the host transport's call on them, and copies
// what it received back up. Only the bytes a collective moves cross PCIe: for the
// compressed exchange, the packed blocks (N/8 bytes and a scale per chunk each way), never
// the fp32 tensors they were made from, which stay on the device with the worker and
// server errors. So GPU workers compress on the device whatever carries their blocks:
// CompressedAllreduce and ExactAllreduce over a StagedTransport run their kernels on the
// device backend, as over NCCL.
//
// Contract: Transport's. StartSendRecv stages the send at once and the receive when it is
// waited for; each call in flight has staging buffers of its own (kept for reuse).
//
// Thread safety: as a Transport (one thread at a time). The device backend is borrowed;
// the host transport is owned or borrowed (Create).
#ifndef ONEBIT_WORKER_TRANSPORT_STAGED_TRANSPORT_H_
#define ONEBIT_WORKER_TRANSPORT_STAGED_TRANSPORT_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/buffer.h"
#include "kernels/kernels.h"
#include "worker/transport/transport.h"

namespace onebit {

class StagedTransport final : public Transport {
 public:
  // INVALID_ARGUMENT when `host` does not use host memory. `host` is owned here.
  static absl::StatusOr<std::unique_ptr<StagedTransport>> Create(kernels::Backend* device,
                                                                 std::unique_ptr<Transport> host);
  // The same over a borrowed `host`, which must outlive this transport.
  static absl::StatusOr<std::unique_ptr<StagedTransport>> Create(kernels::Backend* device,
                                                                 Transport* host);

  std::string name() const override { return "staged " + host_->name(); }
  int rank() const override { return host_->rank(); }
  int world_size() const override { return host_->world_size(); }
  kernels::MemorySpace memory_space() const override { return device_->memory_space(); }

  absl::Status AllToAll(const void* send, void* recv, size_t block_bytes) override;
  absl::Status AllGather(const void* send, void* recv, size_t block_bytes) override;
  absl::Status AllReduceSum(float* data, size_t count) override;
  absl::Status Barrier() override { return host_->Barrier(); }
  absl::Status SendRecv(const void* send, size_t send_bytes, int to, void* recv,
                        size_t recv_bytes, int from) override;
  absl::StatusOr<std::unique_ptr<PendingSendRecv>> StartSendRecv(const void* send,
                                                                  size_t send_bytes, int to,
                                                                  void* recv, size_t recv_bytes,
                                                                  int from) override;
  uint64_t bytes_sent() const override { return host_->bytes_sent(); }
  uint64_t bytes_received() const override { return host_->bytes_received(); }

  Transport& host() { return *host_; }

 private:
  class Pending;
  // Staging for one call: what is sent and what is received.
  struct Stage {
    explicit Stage(kernels::Backend* b) : send(b), recv(b) {}
    kernels::StagingBuffer send, recv;
  };

  StagedTransport(kernels::Backend* device, Transport* host) : device_(device), host_(host) {}
  // A stage of the pool (made when none is free), reserved for the sizes.
  absl::StatusOr<std::unique_ptr<Stage>> TakeStage(size_t send_bytes, size_t recv_bytes);
  void ReturnStage(std::unique_ptr<Stage> stage) { free_.push_back(std::move(stage)); }
  // `bytes` of device memory at `src` into the stage's send buffer.
  absl::Status Down(Stage& stage, const void* src, size_t bytes);
  // The stage's recv buffer into `bytes` of device memory at `dst`.
  absl::Status Up(Stage& stage, void* dst, size_t bytes);

  kernels::Backend* const device_;
  Transport* const host_;
  std::unique_ptr<Transport> owned_;  // host_, when it is owned
  std::vector<std::unique_ptr<Stage>> free_;  // stages no call uses
};

}  // namespace onebit

#endif  // ONEBIT_WORKER_TRANSPORT_STAGED_TRANSPORT_H_
