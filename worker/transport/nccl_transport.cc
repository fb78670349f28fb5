#include "worker/transport/nccl_transport.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "kernels/cuda_backend.h"
#include "kernels/cuda_status.h"
#include "common/status_macros.h"

namespace onebit {
namespace {

// NCCL's codes, read as "who should act": the network or a peer (retry elsewhere), the
// caller (bad arguments or state), or us.
absl::StatusCode NcclCode(ncclResult_t result) {
  switch (result) {
    case ncclSystemError:
    case ncclRemoteError:
      return absl::StatusCode::kUnavailable;
    case ncclInvalidArgument:
      return absl::StatusCode::kInvalidArgument;
    case ncclInvalidUsage:
      return absl::StatusCode::kFailedPrecondition;
    case ncclUnhandledCudaError:
    case ncclInternalError:
      return absl::StatusCode::kInternal;
    default:
      return absl::StatusCode::kUnknown;
  }
}


// Polling: spin briefly (a small collective finishes in microseconds), then back off so a
// long wait does not burn a core.
class Backoff {
 public:
  void Wait() {
    if (++polls_ < 64) return;
    absl::SleepFor(delay_);
    delay_ = std::min(delay_ * 2, absl::Milliseconds(1));
  }

 private:
  int polls_ = 0;
  absl::Duration delay_ = absl::Microseconds(10);
};

}  // namespace

// Inside NcclTransport's members: a failed call aborts the communicator and returns the
// error, with the call, file and line.
#define ONEBIT_NCCL_OR_FAIL(expr)                                                      \
  do {                                                                                 \
    const ncclResult_t onebit_nccl_result_ = (expr);                                   \
    if (onebit_nccl_result_ != ncclSuccess && onebit_nccl_result_ != ncclInProgress) { \
      return Fail(NcclError(onebit_nccl_result_, #expr, __FILE__, __LINE__));          \
    }                                                                                  \
  } while (0)

#define ONEBIT_CUDA_OR_FAIL(expr)                                                           \
  do {                                                                                      \
    const cudaError_t onebit_cuda_error_ = (expr);                                          \
    if (onebit_cuda_error_ != cudaSuccess) {                                                \
      return Fail(kernels::CudaErrorStatus(onebit_cuda_error_, #expr, __FILE__, __LINE__)); \
    }                                                                                       \
  } while (0)

static_assert(sizeof(NcclUniqueId) == NCCL_UNIQUE_ID_BYTES &&
                  sizeof(ncclUniqueId{}.internal) == NCCL_UNIQUE_ID_BYTES,
              "NcclUniqueId must hold nccl.h's ncclUniqueId");

absl::StatusOr<NcclUniqueId> NewNcclUniqueId() {
  ncclUniqueId id;
  const ncclResult_t result = ncclGetUniqueId(&id);
  if (result != ncclSuccess) {
    return absl::Status(NcclCode(result),
                        absl::StrCat(__FILE__, ":", __LINE__, ": ncclGetUniqueId: ",
                                     ncclGetErrorString(result), ": ", ncclGetLastError(nullptr)));
  }
  NcclUniqueId bytes;
  std::memcpy(bytes.data(), id.internal, bytes.size());
  return bytes;
}

NcclTransport::NcclTransport(int rank, int world_size, kernels::Backend* backend,
                             CUstream_st* stream, int device, absl::Duration deadline)
    : rank_(rank),
      world_size_(world_size),
      backend_(backend),
      stream_(stream),
      device_(device),
      deadline_(deadline) {}

absl::StatusOr<std::unique_ptr<NcclTransport>> NcclTransport::Create(int rank, int world_size,
                                                                     const NcclUniqueId& id,
                                                                     kernels::Backend* backend,
                                                                     absl::Duration deadline) {
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("NCCL rank ", rank, " is not in a world of ", world_size));
  }
  if (deadline <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("the NCCL deadline must be positive");
  }
  if (backend == nullptr || backend->memory_space() != kernels::MemorySpace::kCuda) {
    return absl::FailedPreconditionError(
        absl::StrCat("the NCCL transport needs a CUDA backend (device memory), got ",
                     backend == nullptr ? "none" : backend->name()));
  }
  auto stream = static_cast<cudaStream_t>(kernels::CudaStreamOf(backend));
  if (stream == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "backend ", backend->name(), " has no CUDA stream (make it with NewCudaBackend)"));
  }
  int device = 0;
  if (const cudaError_t e = cudaStreamGetDevice(stream, &device); e != cudaSuccess) {
    return kernels::CudaErrorStatus(e, "cudaStreamGetDevice(stream, &device)", __FILE__, __LINE__);
  }
  std::unique_ptr<NcclTransport> transport(
      new NcclTransport(rank, world_size, backend, stream, device, deadline));
  ONEBIT_RETURN_IF_ERROR(transport->Init(id));
  return transport;
}

absl::Status NcclTransport::Init(const NcclUniqueId& id_bytes) {
  const absl::Time deadline = absl::Now() + deadline_;
  ONEBIT_CUDA_OR_FAIL(cudaSetDevice(device_));
  ONEBIT_CUDA_OR_FAIL(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming));
  absl::StatusOr<void*> scratch = backend_->Allocate(sizeof(float));
  if (!scratch.ok()) return Fail(scratch.status());
  barrier_scratch_ = static_cast<float*>(*scratch);
  if (absl::Status s = backend_->Zero(barrier_scratch_, sizeof(float)); !s.ok()) return Fail(s);

  // Non-blocking, so that a rank that never joins cannot hang us: the join runs in the
  // background while WaitForComm watches the deadline.
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclUniqueId id;
  std::memcpy(id.internal, id_bytes.data(), id_bytes.size());
  ONEBIT_NCCL_OR_FAIL(ncclCommInitRankConfig(&comm_, world_size_, id, rank_, &config));
  return WaitForComm("communicator init (waiting for every rank to join)", deadline);
}

NcclTransport::~NcclTransport() {
  if (comm_ != nullptr) {
    // Flush, then free. Nothing is pending (every call waits for its collective), so this
    // is quick; if it is not, abort rather than hang a destructor.
    cudaSetDevice(device_);
    const absl::Time deadline = absl::Now() + std::min(deadline_, absl::Seconds(10));
    const ncclResult_t result = ncclCommFinalize(comm_);
    if ((result == ncclSuccess || result == ncclInProgress) &&
        WaitForComm("communicator finalize", deadline).ok() && comm_ != nullptr) {
      ncclCommDestroy(comm_);
      comm_ = nullptr;
    }
    if (comm_ != nullptr) ncclCommAbort(comm_);
  }
  if (event_ != nullptr) cudaEventDestroy(event_);
  if (barrier_scratch_ != nullptr) backend_->Free(barrier_scratch_);
}

absl::Status NcclTransport::NcclError(int result, const char* expr, const char* file,
                                      int line) {
  const auto nccl_result = static_cast<ncclResult_t>(result);
  return absl::Status(
      NcclCode(nccl_result),
      absl::StrCat(file, ":", line, ": ", expr, ": ", ncclGetErrorString(nccl_result), ": ",
                   ncclGetLastError(comm_), " (rank ", rank_, " of ", world_size_, ")"));
}

absl::Status NcclTransport::Fail(absl::Status status) {
  if (comm_ != nullptr) {
    // Frees the communicator and unblocks its kernels; peers see their collectives fail.
    ncclCommAbort(comm_);
    comm_ = nullptr;
  }
  if (status_.ok()) status_ = status;
  return status;
}

absl::Status NcclTransport::WaitForComm(const char* what, absl::Time deadline) {
  Backoff backoff;
  while (true) {
    ncclResult_t state = ncclSuccess;
    ONEBIT_NCCL_OR_FAIL(ncclCommGetAsyncError(comm_, &state));
    if (state == ncclSuccess) return absl::OkStatus();
    if (state != ncclInProgress) {
      return Fail(NcclError(state, what, __FILE__, __LINE__));
    }
    if (abort_requested_.load(std::memory_order_relaxed)) {
      return Fail(absl::AbortedError(absl::StrCat("NCCL ", what, " aborted")));
    }
    if (absl::Now() > deadline) {
      return Fail(absl::DeadlineExceededError(
          absl::StrCat("NCCL ", what, " did not finish within ", absl::FormatDuration(deadline_),
                       " (rank ", rank_, " of ", world_size_, "): a peer is gone or stuck")));
    }
    backoff.Wait();
  }
}

absl::Status NcclTransport::WaitForStream(const char* what, absl::Time deadline) {
  ONEBIT_CUDA_OR_FAIL(cudaEventRecord(event_, stream_));
  Backoff backoff;
  while (true) {
    const cudaError_t query = cudaEventQuery(event_);
    if (query == cudaSuccess) break;
    if (query != cudaErrorNotReady) {
      return Fail(kernels::CudaErrorStatus(query, "cudaEventQuery(event_)", __FILE__, __LINE__));
    }
    // The kernels are still running: a peer may have failed, which NCCL reports here.
    ncclResult_t state = ncclSuccess;
    ONEBIT_NCCL_OR_FAIL(ncclCommGetAsyncError(comm_, &state));
    if (state != ncclSuccess && state != ncclInProgress) {
      return Fail(NcclError(state, what, __FILE__, __LINE__));
    }
    if (abort_requested_.load(std::memory_order_relaxed)) {
      return Fail(absl::AbortedError(absl::StrCat("NCCL ", what, " aborted")));
    }
    if (absl::Now() > deadline) {
      return Fail(absl::DeadlineExceededError(
          absl::StrCat("NCCL ", what, " did not complete within ", absl::FormatDuration(deadline_),
                       " (rank ", rank_, " of ", world_size_, "): a peer is gone or stuck")));
    }
    backoff.Wait();
  }
  return absl::OkStatus();
}

absl::Status NcclTransport::Begin() {
  if (!status_.ok()) return status_;
  if (abort_requested_.load(std::memory_order_relaxed)) {
    return Fail(absl::AbortedError("NCCL transport aborted"));
  }
  // The calling thread's current device may belong to another backend.
  ONEBIT_CUDA_OR_FAIL(cudaSetDevice(device_));
  return absl::OkStatus();
}

absl::Status NcclTransport::Complete(const char* what, uint64_t wire_bytes, int64_t received) {
  const absl::Time deadline = absl::Now() + deadline_;
  // Non-blocking NCCL may still be enqueueing: nothing else may touch the stream until the
  // communicator says so; then the stream work itself must finish.
  ONEBIT_RETURN_IF_ERROR(WaitForComm(what, deadline));
  ONEBIT_RETURN_IF_ERROR(WaitForStream(what, deadline));
  bytes_sent_.fetch_add(wire_bytes, std::memory_order_relaxed);
  bytes_received_.fetch_add(received < 0 ? wire_bytes : static_cast<uint64_t>(received),
                            std::memory_order_relaxed);
  return absl::OkStatus();
}

absl::Status NcclTransport::AllToAll(const void* send, void* recv, size_t block_bytes) {
  ONEBIT_RETURN_IF_ERROR(Begin());
  if (block_bytes == 0) return absl::OkStatus();  // pointers may be null
  const char* in = static_cast<const char*>(send);
  char* out = static_cast<char*>(recv);
  // Our own block is a device copy on the same stream: no wire bytes.
  ONEBIT_CUDA_OR_FAIL(cudaMemcpyAsync(out + rank_ * block_bytes, in + rank_ * block_bytes,
                                      block_bytes, cudaMemcpyDeviceToDevice, stream_));
  if (world_size_ > 1) {
    ONEBIT_NCCL_OR_FAIL(ncclGroupStart());
    // Every call in the group is made even after a failure: a group must be closed.
    ncclResult_t first_error = ncclSuccess;
    const char* failed_call = "";
    for (int peer = 0; peer < world_size_; ++peer) {
      if (peer == rank_) continue;
      ncclResult_t r =
          ncclSend(in + peer * block_bytes, block_bytes, ncclUint8, peer, comm_, stream_);
      if (r != ncclSuccess && r != ncclInProgress && first_error == ncclSuccess) {
        first_error = r;
        failed_call = "ncclSend";
      }
      r = ncclRecv(out + peer * block_bytes, block_bytes, ncclUint8, peer, comm_, stream_);
      if (r != ncclSuccess && r != ncclInProgress && first_error == ncclSuccess) {
        first_error = r;
        failed_call = "ncclRecv";
      }
    }
    const ncclResult_t end = ncclGroupEnd();
    if (first_error != ncclSuccess) {
      return Fail(NcclError(first_error, failed_call, __FILE__, __LINE__));
    }
    if (end != ncclSuccess && end != ncclInProgress) {
      return Fail(NcclError(end, "ncclGroupEnd()", __FILE__, __LINE__));
    }
  }
  return Complete("all-to-all", static_cast<uint64_t>(world_size_ - 1) * block_bytes);
}

absl::Status NcclTransport::AllGather(const void* send, void* recv, size_t block_bytes) {
  ONEBIT_RETURN_IF_ERROR(Begin());
  if (block_bytes == 0) return absl::OkStatus();
  ONEBIT_NCCL_OR_FAIL(ncclAllGather(send, recv, block_bytes, ncclUint8, comm_, stream_));
  return Complete("all-gather", static_cast<uint64_t>(world_size_ - 1) * block_bytes);
}

absl::Status NcclTransport::AllReduceSum(float* data, size_t count) {
  ONEBIT_RETURN_IF_ERROR(Begin());
  if (count == 0) return absl::OkStatus();
  ONEBIT_NCCL_OR_FAIL(ncclAllReduce(data, data, count, ncclFloat32, ncclSum, comm_, stream_));
  return Complete("all-reduce", RingAllReduceWireBytes(count * sizeof(float), world_size_));
}

absl::Status NcclTransport::Barrier() {
  ONEBIT_RETURN_IF_ERROR(Begin());
  // A one-element allreduce: returns only once every rank has entered it.
  ONEBIT_NCCL_OR_FAIL(
      ncclAllReduce(barrier_scratch_, barrier_scratch_, 1, ncclFloat32, ncclSum, comm_, stream_));
  return Complete("barrier", 0);
}

absl::Status NcclTransport::SendRecv(const void* send, size_t send_bytes, int to, void* recv,
                                     size_t recv_bytes, int from) {
  ONEBIT_RETURN_IF_ERROR(Begin());
  if (to < 0 || to >= world_size_ || from < 0 || from >= world_size_ ||
      (to == rank_) != (from == rank_)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "SendRecv: rank ", rank_, " of ", world_size_, " cannot send to ", to,
        " and receive from ", from));
  }
  if (to == rank_) {
    if (send_bytes != recv_bytes) {
      return absl::InvalidArgumentError(absl::StrCat("SendRecv to itself: sends ", send_bytes,
                                                     " bytes but receives ", recv_bytes));
    }
    if (send_bytes > 0) {
      ONEBIT_CUDA_OR_FAIL(
          cudaMemcpyAsync(recv, send, send_bytes, cudaMemcpyDeviceToDevice, stream_));
    }
    return Complete("send/recv to itself", 0);
  }
  if (send_bytes == 0 && recv_bytes == 0) return absl::OkStatus();
  ONEBIT_NCCL_OR_FAIL(ncclGroupStart());
  // Both calls are made even after a failure: a group must be closed.
  ncclResult_t first_error = ncclSuccess;
  const char* failed_call = "";
  if (send_bytes > 0) {
    const ncclResult_t r = ncclSend(send, send_bytes, ncclUint8, to, comm_, stream_);
    if (r != ncclSuccess && r != ncclInProgress) {
      first_error = r;
      failed_call = "ncclSend";
    }
  }
  if (recv_bytes > 0) {
    const ncclResult_t r = ncclRecv(recv, recv_bytes, ncclUint8, from, comm_, stream_);
    if (r != ncclSuccess && r != ncclInProgress && first_error == ncclSuccess) {
      first_error = r;
      failed_call = "ncclRecv";
    }
  }
  const ncclResult_t end = ncclGroupEnd();
  if (first_error != ncclSuccess) {
    return Fail(NcclError(first_error, failed_call, __FILE__, __LINE__));
  }
  if (end != ncclSuccess && end != ncclInProgress) {
    return Fail(NcclError(end, "ncclGroupEnd()", __FILE__, __LINE__));
  }
  return Complete("send/recv", send_bytes, static_cast<int64_t>(recv_bytes));
}

}  // namespace onebit
