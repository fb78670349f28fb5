// The NCCL transport. Without a GPU: the id helpers, and Create failing cleanly (in a
// build without CUDA too: nccl_transport_stub.cc). With
// GPUs (skipped otherwise): the collectives over min(GPUs, 4) ranks as threads (one GPU
// each: NCCL does not put two ranks on one GPU), sticky Abort, and a rank that never joins
// turning into kDeadlineExceeded instead of a hang.
#include "worker/transport/nccl_transport.h"

#include <algorithm>
#include <memory>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "kernels/buffer.h"
#include "kernels/cuda_backend.h"
#include "kernels/kernels.h"
#include "common/status_macros.h"

namespace onebit {
namespace {

constexpr char kNoGpu[] =
    "no CUDA device here (no GPU, no driver, or a build without CUDA): NCCL GPU tests skipped";

TEST(NcclUniqueIdTest, SerializeAndParseRoundTrip) {
  NcclUniqueId id;
  for (size_t i = 0; i < id.size(); ++i) id[i] = static_cast<char>(i * 3);
  const std::string bytes = SerializeNcclUniqueId(id);
  ASSERT_EQ(bytes.size(), size_t{128});
  auto parsed = ParseNcclUniqueId(bytes);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(*parsed, id);
  EXPECT_EQ(ParseNcclUniqueId("short").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseNcclUniqueId(bytes + "x").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(NcclUniqueIdTest, NewIdsDiffer) {
  // ncclGetUniqueId needs no GPU, only a network interface for the bootstrap socket.
  auto a = NewNcclUniqueId();
  if (!kernels::CudaBuilt()) {
    EXPECT_EQ(a.status().code(), absl::StatusCode::kFailedPrecondition) << a.status();
    EXPECT_NE(a.status().message().find("ONEBIT_CUDA=off"), absl::string_view::npos)
        << a.status();
    GTEST_SKIP() << "a build without CUDA: no NCCL (" << a.status() << ")";
  }
  if (!a.ok()) GTEST_SKIP() << "ncclGetUniqueId failed here: " << a.status();
  auto b = NewNcclUniqueId();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_NE(SerializeNcclUniqueId(*a), SerializeNcclUniqueId(*b));
}

TEST(NcclTransportTest, CreateFailsCleanlyWithoutACudaBackend) {
  NcclUniqueId id{};
  auto cpu = kernels::NewCpuBackend();
  auto t = NcclTransport::Create(0, 1, id, cpu.get());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kFailedPrecondition) << t.status();
  EXPECT_NE(t.status().message().find("CUDA backend"), absl::string_view::npos);
  EXPECT_EQ(NcclTransport::Create(0, 1, id, nullptr).status().code(),
            absl::StatusCode::kFailedPrecondition);
  // A build without CUDA fails every Create (and has no CUDA backend to give it:
  // cuda_backend_test checks its error).
  if (!kernels::CudaBuilt()) return;
  EXPECT_EQ(NcclTransport::Create(1, 1, id, cpu.get()).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(NcclTransport::Create(0, 0, id, cpu.get()).status().code(),
            absl::StatusCode::kInvalidArgument);
  if (kernels::CudaDeviceCount() == 0) {
    // The step before: without a GPU there is no CUDA backend to give it.
    EXPECT_EQ(kernels::NewCudaBackend(0).status().code(), absl::StatusCode::kUnavailable);
  }
}

uint8_t Pattern(int from, int to, size_t i) { return static_cast<uint8_t>(from * 31 + to * 7 + i); }

absl::Status Check(bool ok, const std::string& what) {
  return ok ? absl::OkStatus() : absl::InternalError(what);
}

// One rank's sweep of every collective over the transport-test lengths.
absl::Status RunRank(int rank, int world, const NcclUniqueId& id) {
  using kernels::Buffer;
  ONEBIT_ASSIGN_OR_RETURN(std::unique_ptr<kernels::Backend> backend, kernels::NewCudaBackend(rank));
  ONEBIT_ASSIGN_OR_RETURN(std::unique_ptr<NcclTransport> t,
                          NcclTransport::Create(rank, world, id, backend.get(), absl::Seconds(60)));
  kernels::Backend* b = backend.get();
  uint64_t expected_bytes = 0;
  for (size_t len : {0, 1, 7, 100, 1000, 10007}) {
    const std::string where = absl::StrCat(" (rank ", rank, ", length ", len, ")");
    // All-to-all: block j goes to rank j.
    std::vector<uint8_t> send(world * len);
    for (int j = 0; j < world; ++j) {
      for (size_t i = 0; i < len; ++i) send[j * len + i] = Pattern(rank, j, i);
    }
    ONEBIT_ASSIGN_OR_RETURN(Buffer<uint8_t> d_send,
                            Buffer<uint8_t>::FromHost(b, send.data(), send.size()));
    ONEBIT_ASSIGN_OR_RETURN(Buffer<uint8_t> d_recv, Buffer<uint8_t>::Create(b, world * len));
    ONEBIT_RETURN_IF_ERROR(t->AllToAll(d_send.data(), d_recv.data(), len));
    ONEBIT_ASSIGN_OR_RETURN(std::vector<uint8_t> recv, d_recv.ToHost());
    for (int j = 0; j < world; ++j) {
      for (size_t i = 0; i < len; ++i) {
        ONEBIT_RETURN_IF_ERROR(Check(recv[j * len + i] == Pattern(j, rank, i),
                                     absl::StrCat("all-to-all block ", j, " byte ", i, where)));
      }
    }
    expected_bytes += (world - 1) * len;

    // All-gather: block j is rank j's buffer.
    std::vector<uint8_t> mine(len);
    for (size_t i = 0; i < len; ++i) mine[i] = Pattern(rank, rank, i);
    ONEBIT_ASSIGN_OR_RETURN(Buffer<uint8_t> d_mine, Buffer<uint8_t>::FromHost(b, mine.data(), len));
    ONEBIT_RETURN_IF_ERROR(t->AllGather(d_mine.data(), d_recv.data(), len));
    ONEBIT_ASSIGN_OR_RETURN(recv, d_recv.ToHost());
    for (int j = 0; j < world; ++j) {
      for (size_t i = 0; i < len; ++i) {
        ONEBIT_RETURN_IF_ERROR(Check(recv[j * len + i] == Pattern(j, j, i),
                                     absl::StrCat("all-gather block ", j, " byte ", i, where)));
      }
    }
    expected_bytes += (world - 1) * len;

    // All-reduce: small integers, so the float sums are exact in any order.
    std::vector<float> data(len);
    for (size_t i = 0; i < len; ++i) data[i] = static_cast<float>(rank + i % 100);
    ONEBIT_ASSIGN_OR_RETURN(Buffer<float> d_data, Buffer<float>::FromHost(b, data.data(), len));
    ONEBIT_RETURN_IF_ERROR(t->AllReduceSum(d_data.data(), len));
    ONEBIT_ASSIGN_OR_RETURN(data, d_data.ToHost());
    for (size_t i = 0; i < len; ++i) {
      const float want = static_cast<float>(world * (world - 1) / 2 + world * (i % 100));
      ONEBIT_RETURN_IF_ERROR(Check(data[i] == want, absl::StrCat("all-reduce element ", i, where)));
    }
    expected_bytes += 2 * static_cast<uint64_t>(world - 1) * len * sizeof(float) / world;
  }
  ONEBIT_RETURN_IF_ERROR(t->Barrier());
  ONEBIT_RETURN_IF_ERROR(
      Check(t->bytes_sent() == expected_bytes && t->bytes_received() == expected_bytes,
            absl::StrCat("byte counters ", t->bytes_sent(), "/", t->bytes_received(), ", expected ",
                         expected_bytes)));
  return absl::OkStatus();
}

TEST(NcclTransportGpuTest, CollectivesOnEveryGpu) {
  const int world = std::min(kernels::CudaDeviceCount(), 4);
  if (world == 0) GTEST_SKIP() << kNoGpu;
  auto id = NewNcclUniqueId();
  ASSERT_TRUE(id.ok()) << id.status();
  std::vector<absl::Status> results(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] { results[r] = RunRank(r, world, *id); });
  }
  for (std::thread& thread : threads) thread.join();
  for (int r = 0; r < world; ++r)
    EXPECT_TRUE(results[r].ok()) << "rank " << r << ": " << results[r];
}

TEST(NcclTransportGpuTest, AbortIsSticky) {
  if (kernels::CudaDeviceCount() == 0) GTEST_SKIP() << kNoGpu;
  auto backend = kernels::NewCudaBackend(0);
  ASSERT_TRUE(backend.ok()) << backend.status();
  auto id = NewNcclUniqueId();
  ASSERT_TRUE(id.ok()) << id.status();
  auto t = NcclTransport::Create(0, 1, *id, backend->get(), absl::Seconds(60));
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_TRUE((*t)->Barrier().ok());
  (*t)->Abort();
  EXPECT_EQ((*t)->Barrier().code(), absl::StatusCode::kAborted);
  EXPECT_EQ((*t)->Barrier().code(), absl::StatusCode::kAborted);
}

TEST(NcclTransportGpuTest, RankThatNeverJoinsIsADeadlineNotAHang) {
  if (kernels::CudaDeviceCount() == 0) GTEST_SKIP() << kNoGpu;
  auto backend = kernels::NewCudaBackend(0);
  ASSERT_TRUE(backend.ok()) << backend.status();
  auto id = NewNcclUniqueId();
  ASSERT_TRUE(id.ok()) << id.status();
  const absl::Time start = absl::Now();
  // Rank 1 of 2 never comes.
  auto t = NcclTransport::Create(0, 2, *id, backend->get(), absl::Seconds(3));
  EXPECT_EQ(t.status().code(), absl::StatusCode::kDeadlineExceeded) << t.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(30));
}

}  // namespace
}  // namespace onebit
