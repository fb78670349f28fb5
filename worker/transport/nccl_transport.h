// The GPU Transport of peer mode: NCCL collectives on the stream of a CUDA backend, so
// they are ordered with the backend's kernels. Buffers are device memory (kCuda).
//
// NEVER A HANG: the communicator is non-blocking (ncclConfig_t.blocking = 0). Every call
// is enqueued, then this thread polls ncclCommGetAsyncError and a CUDA event recorded
// after the operation until it completes, an error shows up, Abort() is called, or the
// deadline passes; in the last three cases the communicator is aborted (ncclCommAbort) and
// the call returns kAborted / kDeadlineExceeded / the mapped NCCL error. After an error the
// transport is unusable and every call returns that error (transport.h).
//
// RENDEZVOUS: one rank makes a unique id (NewNcclUniqueId), the coordinator's key/value
// store carries it as bytes (SerializeNcclUniqueId / ParseNcclUniqueId) to the others, and
// every rank calls Create with it.
//
// THREAD SAFETY: collectives from one thread at a time; Abort() and the byte counters from
// any thread.
//
// WITHOUT CUDA (kernels/cuda.bzl): this header includes neither CUDA's nor NCCL's, and the
// build links nccl_transport_stub.cc: NewNcclUniqueId and Create fail with
// kFailedPrecondition (no NCCL in this build); the id's bytes still parse.
#ifndef ONEBIT_WORKER_TRANSPORT_NCCL_TRANSPORT_H_
#define ONEBIT_WORKER_TRANSPORT_NCCL_TRANSPORT_H_

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "kernels/kernels.h"
#include "worker/transport/transport.h"

// CUDA's stream and event and NCCL's communicator, declared as their headers declare them
// (cudaStream_t is CUstream_st*, cudaEvent_t CUevent_st*, ncclComm_t ncclComm*).
struct CUstream_st;
struct CUevent_st;
struct ncclComm;

namespace onebit {

// NCCL's ncclUniqueId: its NCCL_UNIQUE_ID_BYTES (128) bytes, opaque (nccl_transport.cc
// checks the size against nccl.h).
using NcclUniqueId = std::array<char, 128>;

// A fresh id for a new communicator (needs no GPU: it opens the bootstrap socket).
absl::StatusOr<NcclUniqueId> NewNcclUniqueId();
// The id's 128 bytes.
std::string SerializeNcclUniqueId(const NcclUniqueId& id);
// kInvalidArgument unless `bytes` is exactly 128 bytes long.
absl::StatusOr<NcclUniqueId> ParseNcclUniqueId(absl::string_view bytes);

class NcclTransport final : public Transport {
 public:
  static constexpr absl::Duration kDefaultDeadline = absl::Minutes(5);

  // Joins communicator `id` as `rank` of `world_size` on the GPU of `backend`, which must
  // be a CUDA backend (kernels::NewCudaBackend) and outlive the transport. Returns once
  // every rank has joined. `deadline` bounds the join and then each collective (size it
  // for the largest buffer on the slowest link). Errors: kInvalidArgument (rank, world
  // size), kFailedPrecondition (not a CUDA backend), kDeadlineExceeded (a rank did not
  // join), kUnavailable (NCCL could not reach the GPU or the network), kInternal.
  static absl::StatusOr<std::unique_ptr<NcclTransport>> Create(
      int rank, int world_size, const NcclUniqueId& id, kernels::Backend* backend,
      absl::Duration deadline = kDefaultDeadline);

  // Finalizes and destroys the communicator (aborts it if that does not finish in time).
  ~NcclTransport() override;

  NcclTransport(const NcclTransport&) = delete;
  NcclTransport& operator=(const NcclTransport&) = delete;

  std::string name() const override { return "nccl"; }
  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  kernels::MemorySpace memory_space() const override { return kernels::MemorySpace::kCuda; }

  absl::Status AllToAll(const void* send, void* recv, size_t block_bytes) override;
  absl::Status AllGather(const void* send, void* recv, size_t block_bytes) override;
  absl::Status AllReduceSum(float* data, size_t count) override;
  absl::Status Barrier() override;
  // ncclSend and ncclRecv in one group on the backend's stream.
  absl::Status SendRecv(const void* send, size_t send_bytes, int to, void* recv,
                        size_t recv_bytes, int from) override;

  uint64_t bytes_sent() const override { return bytes_sent_.load(std::memory_order_relaxed); }
  uint64_t bytes_received() const override {
    return bytes_received_.load(std::memory_order_relaxed);
  }

  // Makes the collective in progress (or the next one) fail with kAborted and abort the
  // communicator: how a coordinator stops a step when a peer died. Any thread.
  void Abort() { abort_requested_.store(true, std::memory_order_relaxed); }

 private:
  NcclTransport(int rank, int world_size, kernels::Backend* backend, CUstream_st* stream,
                int device, absl::Duration deadline);

  // Joins the communicator (Create's second half).
  absl::Status Init(const NcclUniqueId& id);
  // Wait for the communicator's pending init or call, and for the stream work.
  absl::Status WaitForComm(const char* what, absl::Time deadline);
  absl::Status WaitForStream(const char* what, absl::Time deadline);
  // Checks the sticky error and makes the backend's device current.
  absl::Status Begin();
  // Waits for the enqueued collective and counts its bytes (`received`: the same as
  // sent unless given).
  absl::Status Complete(const char* what, uint64_t wire_bytes, int64_t received = -1);
  // Aborts the communicator and makes `status` sticky. Returns it.
  absl::Status Fail(absl::Status status);
  // The error of a failed NCCL call (`result`: its ncclResult_t), with NCCL's last message.
  absl::Status NcclError(int result, const char* expr, const char* file, int line);

  const int rank_;
  const int world_size_;
  kernels::Backend* const backend_;
  CUstream_st* const stream_;  // backend_'s stream
  const int device_;
  const absl::Duration deadline_;
  ncclComm* comm_ = nullptr;          // null once aborted or destroyed
  CUevent_st* event_ = nullptr;       // recorded after each collective
  float* barrier_scratch_ = nullptr;  // one float of device memory for Barrier
  absl::Status status_;               // first error; only touched by the calling thread
  std::atomic<bool> abort_requested_{false};
  std::atomic<uint64_t> bytes_sent_{0};
  std::atomic<uint64_t> bytes_received_{0};
};

}  // namespace onebit

#endif  // ONEBIT_WORKER_TRANSPORT_NCCL_TRANSPORT_H_
