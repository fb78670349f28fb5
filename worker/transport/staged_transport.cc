#include "worker/transport/staged_transport.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace onebit {

// A SendRecv in flight: the host transport's, then the received bytes up to the device.
class StagedTransport::Pending final : public Transport::PendingSendRecv {
 public:
  Pending(StagedTransport* owner, std::unique_ptr<Stage> stage,
          std::unique_ptr<PendingSendRecv> inner, void* recv, size_t recv_bytes)
      : owner_(owner), stage_(std::move(stage)), inner_(std::move(inner)), recv_(recv),
        recv_bytes_(recv_bytes) {}
  ~Pending() override {
    if (!waited_) inner_->Wait().IgnoreError();  // the host buffers must outlive the call
    owner_->ReturnStage(std::move(stage_));
  }

  absl::Status Wait() override {
    if (waited_) return status_;
    waited_ = true;
    status_ = inner_->Wait();
    if (status_.ok()) status_ = owner_->Up(*stage_, recv_, recv_bytes_);
    return status_;
  }

 private:
  StagedTransport* const owner_;
  std::unique_ptr<Stage> stage_;
  std::unique_ptr<PendingSendRecv> inner_;
  void* const recv_;
  const size_t recv_bytes_;
  bool waited_ = false;
  absl::Status status_;
};

absl::StatusOr<std::unique_ptr<StagedTransport>> StagedTransport::Create(
    kernels::Backend* device, Transport* host) {
  if (device == nullptr || host == nullptr) {
    return absl::InvalidArgumentError("StagedTransport needs a device backend and a transport");
  }
  if (host->memory_space() != kernels::MemorySpace::kHost) {
    return absl::InvalidArgumentError(
        absl::StrCat("StagedTransport: transport ", host->name(), " does not use host memory"));
  }
  return std::unique_ptr<StagedTransport>(new StagedTransport(device, host));
}

absl::StatusOr<std::unique_ptr<StagedTransport>> StagedTransport::Create(
    kernels::Backend* device, std::unique_ptr<Transport> host) {
  ONEBIT_ASSIGN_OR_RETURN(std::unique_ptr<StagedTransport> staged, Create(device, host.get()));
  staged->owned_ = std::move(host);
  return staged;
}

absl::StatusOr<std::unique_ptr<StagedTransport::Stage>> StagedTransport::TakeStage(
    size_t send_bytes, size_t recv_bytes) {
  std::unique_ptr<Stage> stage;
  if (free_.empty()) {
    stage = std::make_unique<Stage>(device_);
  } else {
    stage = std::move(free_.back());
    free_.pop_back();
  }
  ONEBIT_RETURN_IF_ERROR(stage->send.Reserve(send_bytes).status());
  ONEBIT_RETURN_IF_ERROR(stage->recv.Reserve(recv_bytes).status());
  return stage;
}

absl::Status StagedTransport::Down(Stage& stage, const void* src, size_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  return device_->CopyToHost(stage.send.data(), src, bytes);
}

absl::Status StagedTransport::Up(Stage& stage, void* dst, size_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  return device_->CopyFromHost(dst, stage.recv.data(), bytes);
}

absl::Status StagedTransport::AllToAll(const void* send, void* recv, size_t block_bytes) {
  const size_t bytes = block_bytes * static_cast<size_t>(world_size());
  ONEBIT_ASSIGN_OR_RETURN(std::unique_ptr<Stage> stage, TakeStage(bytes, bytes));
  absl::Status status = Down(*stage, send, bytes);
  if (status.ok()) status = host_->AllToAll(stage->send.data(), stage->recv.data(), block_bytes);
  if (status.ok()) status = Up(*stage, recv, bytes);
  ReturnStage(std::move(stage));
  return status;
}

absl::Status StagedTransport::AllGather(const void* send, void* recv, size_t block_bytes) {
  const size_t bytes = block_bytes * static_cast<size_t>(world_size());
  ONEBIT_ASSIGN_OR_RETURN(std::unique_ptr<Stage> stage, TakeStage(block_bytes, bytes));
  absl::Status status = Down(*stage, send, block_bytes);
  if (status.ok()) {
    status = host_->AllGather(stage->send.data(), stage->recv.data(), block_bytes);
  }
  if (status.ok()) status = Up(*stage, recv, bytes);
  ReturnStage(std::move(stage));
  return status;
}

absl::Status StagedTransport::AllReduceSum(float* data, size_t count) {
  const size_t bytes = count * sizeof(float);
  // In place on the host: the send buffer is also the result.
  ONEBIT_ASSIGN_OR_RETURN(std::unique_ptr<Stage> stage, TakeStage(bytes, 0));
  absl::Status status = Down(*stage, data, bytes);
  if (status.ok()) status = host_->AllReduceSum(static_cast<float*>(stage->send.data()), count);
  if (status.ok() && bytes > 0) status = device_->CopyFromHost(data, stage->send.data(), bytes);
  ReturnStage(std::move(stage));
  return status;
}

absl::Status StagedTransport::SendRecv(const void* send, size_t send_bytes, int to, void* recv,
                                       size_t recv_bytes, int from) {
  ONEBIT_ASSIGN_OR_RETURN(std::unique_ptr<PendingSendRecv> pending,
                          StartSendRecv(send, send_bytes, to, recv, recv_bytes, from));
  return pending->Wait();
}

absl::StatusOr<std::unique_ptr<Transport::PendingSendRecv>> StagedTransport::StartSendRecv(
    const void* send, size_t send_bytes, int to, void* recv, size_t recv_bytes, int from) {
  ONEBIT_ASSIGN_OR_RETURN(std::unique_ptr<Stage> stage, TakeStage(send_bytes, recv_bytes));
  absl::Status status = Down(*stage, send, send_bytes);
  absl::StatusOr<std::unique_ptr<PendingSendRecv>> inner =
      status.ok() ? host_->StartSendRecv(send_bytes > 0 ? stage->send.data() : nullptr,
                                         send_bytes, to,
                                         recv_bytes > 0 ? stage->recv.data() : nullptr,
                                         recv_bytes, from)
                  : absl::StatusOr<std::unique_ptr<PendingSendRecv>>(status);
  if (!inner.ok()) {
    ReturnStage(std::move(stage));
    return inner.status();
  }
  return std::unique_ptr<PendingSendRecv>(
      new Pending(this, std::move(stage), *std::move(inner), recv, recv_bytes));
}

}  // namespace onebit
