#include "worker/transport/inproc_transport.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"

namespace onebit {

// ---- InprocHub ----

absl::StatusOr<std::shared_ptr<InprocHub>> InprocHub::Create(int world_size,
                                                             absl::Duration deadline) {
  if (world_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat("world_size must be >= 1, got ", world_size));
  }
  if (deadline <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("deadline must be positive");
  }
  // Not make_shared: the constructor is private.
  return std::shared_ptr<InprocHub>(new InprocHub(world_size, deadline));
}

InprocHub::InprocHub(int world_size, absl::Duration deadline)
    : world_size_(world_size),
      deadline_(deadline),
      connected_(world_size, false),
      calls_(world_size),
      arrived_(world_size, false) {}

absl::StatusOr<std::unique_ptr<InprocTransport>> InprocHub::Connect(int rank) {
  if (rank < 0 || rank >= world_size_) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " out of range [0, ", world_size_, ")"));
  }
  {
    absl::MutexLock lock(&mu_);
    if (connected_[rank]) {
      return absl::AlreadyExistsError(absl::StrCat("rank ", rank, " is already connected"));
    }
    connected_[rank] = true;
  }
  // Not make_unique: the constructor is private.
  return std::unique_ptr<InprocTransport>(new InprocTransport(shared_from_this(), rank));
}

absl::StatusOr<std::vector<std::unique_ptr<InprocTransport>>> InprocHub::ConnectAll() {
  std::vector<std::unique_ptr<InprocTransport>> transports;
  for (int r = 0; r < world_size_; ++r) {
    ONEBIT_ASSIGN_OR_RETURN(std::unique_ptr<InprocTransport> t, Connect(r));
    transports.push_back(std::move(t));
  }
  return transports;
}

void InprocHub::Abort(absl::Status status) {
  absl::MutexLock lock(&mu_);
  AbortLocked(std::move(status));
}

void InprocHub::AbortLocked(absl::Status status) {
  if (!abort_status_.ok()) return;  // the first cause is the one worth reporting
  abort_status_ = status.ok() ? absl::AbortedError("InprocHub aborted") : std::move(status);
  cv_.SignalAll();
}

absl::Status InprocHub::Collective(int rank, const Call& call, Exchange exchange) {
  ONEBIT_ASSIGN_OR_RETURN(std::vector<Call> calls, Arrive(rank, call));
  // Every rank sees the same `calls`, so every rank reaches the same verdict.
  absl::Status status;
  for (int j = 0; j < world_size_ && status.ok(); ++j) {
    if (calls[j].op != calls[0].op) {
      status = absl::InvalidArgumentError(absl::StrCat(
          "mismatched collectives: rank 0 called ", OpName(calls[0].op), ", rank ", j,
          " called ", OpName(calls[j].op)));
    } else if (calls[j].op == Op::kSendRecv) {
      const int to = calls[j].to;
      if (to < 0 || to >= world_size_ || calls[j].from < 0 || calls[j].from >= world_size_) {
        status = absl::InvalidArgumentError(absl::StrCat(
            "SendRecv: rank ", j, " names peers (to ", to, ", from ", calls[j].from,
            ") outside [0, ", world_size_, ")"));
      } else if (calls[to].from != j || calls[to].recv_bytes != calls[j].bytes) {
        status = absl::InvalidArgumentError(absl::StrCat(
            "SendRecv: rank ", j, " sends ", calls[j].bytes, " bytes to rank ", to,
            ", which receives ", calls[to].recv_bytes, " bytes from rank ", calls[to].from));
      }
    } else if (calls[j].bytes != calls[0].bytes) {
      status = absl::InvalidArgumentError(absl::StrCat(
          OpName(calls[0].op), ": mismatched sizes: rank 0 passed ", calls[0].bytes,
          " bytes, rank ", j, " passed ", calls[j].bytes));
    }
  }
  if (status.ok()) exchange(calls);
  Depart();
  return status;
}

absl::StatusOr<std::vector<InprocHub::Call>> InprocHub::Arrive(int rank, const Call& call) {
  absl::MutexLock lock(&mu_);
  if (!abort_status_.ok()) return abort_status_;
  calls_[rank] = call;
  arrived_[rank] = true;
  if (++num_arrived_ == world_size_) {
    complete_ = true;
    cv_.SignalAll();
  }
  const absl::Time deadline = absl::Now() + deadline_;
  // Once complete, the round runs to the end even if an abort comes in: other ranks are
  // already reading this rank's buffer.
  while (!complete_ && abort_status_.ok()) {
    const bool timed_out = cv_.WaitWithDeadline(&mu_, deadline);
    if (timed_out && !complete_ && abort_status_.ok()) {
      // Abort rather than just return: the round can never complete, and a late rank
      // must fail fast instead of waiting for ranks that have left.
      AbortLocked(absl::DeadlineExceededError(absl::StrCat(
          OpName(call.op), ": ranks ", MissingRanksLocked(), " did not arrive within ",
          absl::FormatDuration(deadline_), " (seen by rank ", rank, ")")));
    }
  }
  if (!complete_) return abort_status_;
  return calls_;
}

void InprocHub::Depart() {
  absl::MutexLock lock(&mu_);
  const uint64_t generation = generation_;
  if (++num_departed_ == world_size_) {
    // Last one out resets the round. Nobody can arrive at the next round before this:
    // every other rank is still waiting below.
    num_arrived_ = 0;
    num_departed_ = 0;
    complete_ = false;
    arrived_.assign(world_size_, false);
    ++generation_;
    cv_.SignalAll();
  }
  while (generation_ == generation) cv_.Wait(&mu_);
}

std::string InprocHub::MissingRanksLocked() const {
  std::vector<int> missing;
  for (int r = 0; r < world_size_; ++r) {
    if (!arrived_[r]) missing.push_back(r);
  }
  return absl::StrCat("[", absl::StrJoin(missing, ", "), "]");
}

absl::string_view InprocHub::OpName(Op op) {
  switch (op) {
    case Op::kAllToAll:
      return "AllToAll";
    case Op::kAllGather:
      return "AllGather";
    case Op::kAllReduceSum:
      return "AllReduceSum";
    case Op::kBarrier:
      return "Barrier";
    case Op::kSendRecv:
      return "SendRecv";
  }
  return "unknown collective";
}

// ---- InprocTransport ----

InprocTransport::InprocTransport(std::shared_ptr<InprocHub> hub, int rank)
    : hub_(std::move(hub)), rank_(rank) {}

InprocTransport::~InprocTransport() {
  // Like a TCP peer closing its sockets: the others fail instead of waiting for the
  // deadline. Harmless at the end of a run, when nobody calls any more.
  hub_->Abort(absl::UnavailableError(
      absl::StrCat("inproc transport of rank ", rank_, " was destroyed")));
}

absl::Status InprocTransport::Run(const InprocHub::Call& call, InprocHub::Exchange exchange,
                                  uint64_t sent, uint64_t received) {
  if (!status_.ok()) return status_;
  status_ = hub_->Collective(rank_, call, exchange);
  if (!status_.ok()) return status_;
  bytes_sent_.fetch_add(sent, std::memory_order_relaxed);
  bytes_received_.fetch_add(received, std::memory_order_relaxed);
  return absl::OkStatus();
}

absl::Status InprocTransport::AllToAll(const void* send, void* recv, size_t block_bytes) {
  const int rank = rank_;
  auto exchange = [rank, recv, block_bytes](absl::Span<const InprocHub::Call> calls) {
    if (block_bytes == 0) return;  // pointers may be null
    for (size_t j = 0; j < calls.size(); ++j) {
      std::memcpy(static_cast<char*>(recv) + j * block_bytes,
                  static_cast<const char*>(calls[j].send) + rank * block_bytes, block_bytes);
    }
  };
  const uint64_t wire = static_cast<uint64_t>(world_size() - 1) * block_bytes;
  return Run({InprocHub::Op::kAllToAll, block_bytes, send}, exchange, wire, wire);
}

absl::Status InprocTransport::AllGather(const void* send, void* recv, size_t block_bytes) {
  auto exchange = [recv, block_bytes](absl::Span<const InprocHub::Call> calls) {
    if (block_bytes == 0) return;
    for (size_t j = 0; j < calls.size(); ++j) {
      std::memcpy(static_cast<char*>(recv) + j * block_bytes, calls[j].send, block_bytes);
    }
  };
  const uint64_t wire = static_cast<uint64_t>(world_size() - 1) * block_bytes;
  return Run({InprocHub::Op::kAllGather, block_bytes, send}, exchange, wire, wire);
}

absl::Status InprocTransport::AllReduceSum(float* data, size_t count) {
  // In place, so the sum goes to a scratch buffer first: writing `data` while another
  // rank still reads it would corrupt that rank's sum. Allocated before the round so the
  // others do not wait on the allocation.
  std::vector<float> sum(count);
  auto exchange = [&sum](absl::Span<const InprocHub::Call> calls) {
    if (sum.empty()) return;
    // Summed in rank order on every rank, so all ranks get bit-identical results.
    std::memcpy(sum.data(), calls[0].send, sum.size() * sizeof(float));
    for (size_t j = 1; j < calls.size(); ++j) {
      const float* peer = static_cast<const float*>(calls[j].send);
      for (size_t i = 0; i < sum.size(); ++i) sum[i] += peer[i];
    }
  };
  const size_t bytes = count * sizeof(float);
  const uint64_t wire = RingAllReduceWireBytes(bytes, world_size());
  ONEBIT_RETURN_IF_ERROR(Run({InprocHub::Op::kAllReduceSum, bytes, data}, exchange, wire, wire));
  if (count > 0) std::memcpy(data, sum.data(), bytes);
  return absl::OkStatus();
}

absl::Status InprocTransport::Barrier() {
  auto exchange = [](absl::Span<const InprocHub::Call>) {};
  return Run({InprocHub::Op::kBarrier, 0, nullptr}, exchange, 0, 0);
}

absl::Status InprocTransport::SendRecv(const void* send, size_t send_bytes, int to, void* recv,
                                       size_t recv_bytes, int from) {
  // The round checks that the calls pair up (a rank that sends to itself must receive
  // from itself) before any copy.
  auto exchange = [recv, recv_bytes, from](absl::Span<const InprocHub::Call> calls) {
    if (recv_bytes == 0) return;  // pointers may be null
    std::memcpy(recv, calls[from].send, recv_bytes);
  };
  InprocHub::Call call{InprocHub::Op::kSendRecv, send_bytes, send};
  call.to = to;
  call.from = from;
  call.recv_bytes = recv_bytes;
  const bool self = to == rank_;
  return Run(call, exchange, self ? 0 : send_bytes, self ? 0 : recv_bytes);
}

}  // namespace onebit
