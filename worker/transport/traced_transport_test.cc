// TracedTransport over real transports (in-process and gloo on 127.0.0.1): every call
// still does what the inner one does, and the trace has one line per call with its
// peers, its bytes and its times on the injected clock.
#include "worker/transport/traced_transport.h"

#include <atomic>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "worker/transport/inproc_transport.h"
#include "worker/transport/local_group.h"

namespace onebit {
namespace {

absl::Status Expect(bool ok, const std::string& what) {
  return ok ? absl::OkStatus() : absl::InternalError(what);
}

// A clock that moves 1 s at every read, from 1000 s after the epoch.
TracedTransport::Now Ticking() {
  auto t = std::make_shared<std::atomic<int>>(1000);
  return [t] { return absl::UnixEpoch() + absl::Seconds(t->fetch_add(1)); };
}

class TracedTransportTest : public ::testing::TestWithParam<TransportKind> {};

TEST_P(TracedTransportTest, OneLinePerCallWithItsPeersBytesAndTimes) {
  constexpr int kW = 3;
  std::vector<std::string> traces(kW);
  ASSERT_TRUE(RunLocalGroup(GetParam(), kW, [&](Transport& inner) -> absl::Status {
                const int r = inner.rank();
                std::ostringstream out;
                {
                  TracedTransport t(&inner, &out, Ticking());
                  std::vector<uint8_t> send(kW * 4, static_cast<uint8_t>(r)), recv(kW * 4);
                  if (absl::Status s = t.AllToAll(send.data(), recv.data(), 4); !s.ok()) return s;
                  for (int j = 0; j < kW; ++j) {
                    if (absl::Status s = Expect(recv[j * 4] == j, "all-to-all through the trace");
                        !s.ok()) {
                      return s;
                    }
                  }
                  if (absl::Status s = t.AllGather(send.data(), recv.data(), 4); !s.ok()) return s;
                  std::vector<float> sum = {1.0f, 2.0f};
                  if (absl::Status s = t.AllReduceSum(sum.data(), sum.size()); !s.ok()) return s;
                  if (absl::Status s = Expect(sum[1] == 2.0f * kW, "sum through the trace");
                      !s.ok()) {
                    return s;
                  }
                  const int to = (r + 1) % kW, from = (r + kW - 1) % kW;
                  uint8_t one = static_cast<uint8_t>(r), got = 0;
                  auto p = t.StartSendRecv(&one, 1, to, &got, 1, from);
                  if (!p.ok()) return p.status();
                  if (absl::Status s = (*p)->Wait(); !s.ok()) return s;
                  if (absl::Status s = Expect(got == from, "shift through the trace"); !s.ok()) {
                    return s;
                  }
                  if (absl::Status s = t.Barrier(); !s.ok()) return s;
                }
                traces[r] = out.str();
                return absl::OkStatus();
              }).ok());
  for (int r = 0; r < kW; ++r) {
    SCOPED_TRACE(absl::StrCat("rank ", r));
    const std::vector<std::string> lines =
        absl::StrSplit(traces[r], '\n', absl::SkipEmpty());
    ASSERT_EQ(lines.size(), 6u) << traces[r];
    EXPECT_EQ(lines[0], "op,to,from,block_bytes,sent,received,start_unix,end_unix");
    // Each call reads the clock at its start and its end: 1000/1001, 1002/1003, ...
    EXPECT_EQ(lines[1], "AllToAll,-1,-1,4,8,8,1000.000000,1001.000000");
    EXPECT_EQ(lines[2], "AllGather,-1,-1,4,8,8,1002.000000,1003.000000");
    // A ring allreduce of 8 bytes over 3 ranks counts 2*2*8/3 = 10 bytes each way.
    EXPECT_EQ(lines[3], "AllReduceSum,-1,-1,8,10,10,1004.000000,1005.000000");
    EXPECT_EQ(lines[4], absl::StrCat("SendRecv,", (r + 1) % kW, ",", (r + kW - 1) % kW,
                                     ",1,1,1,1006.000000,1007.000000"));
    EXPECT_EQ(lines[5], "Barrier,-1,-1,0,0,0,1008.000000,1009.000000");
  }
}

TEST_P(TracedTransportTest, AFailedCallIsTracedAndItsErrorReturned) {
  ASSERT_TRUE(RunLocalGroup(GetParam(), 2, [&](Transport& inner) -> absl::Status {
                std::ostringstream out;
                TracedTransport t(&inner, &out, Ticking());
                uint8_t b = 0;
                // Rank 5 of 2: refused before anything is posted.
                absl::Status s = t.SendRecv(&b, 1, 5, &b, 1, 5);
                if (absl::Status e = Expect(s.code() == absl::StatusCode::kInvalidArgument,
                                            s.ToString());
                    !e.ok()) {
                  return e;
                }
                return Expect(out.str().find("\nSendRecv!,5,5,1,0,0,1000.000000,1001.000000\n") !=
                                  std::string::npos,
                              out.str());
              }).ok());
}

// Create owns the transport and a file; a file it cannot write is a clear error.
TEST(TracedTransportCreateTest, WritesItsFileOrSaysWhyNot) {
  auto hub = InprocHub::Create(1);
  ASSERT_TRUE(hub.ok());
  auto inner = (*hub)->Connect(0);
  ASSERT_TRUE(inner.ok());
  const std::string dir = ::testing::TempDir();
  auto bad = TracedTransport::Create(std::move(*inner), dir + "/no/such/dir/trace.csv");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("no/such/dir"), std::string::npos);

  auto again = (*InprocHub::Create(1))->Connect(0);
  ASSERT_TRUE(again.ok());
  const std::string path = dir + "/trace.csv";
  {
    auto traced = TracedTransport::Create(std::move(*again), path);
    ASSERT_TRUE(traced.ok()) << traced.status();
    ASSERT_TRUE((*traced)->Barrier().ok());
  }
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  const std::vector<std::string> lines = absl::StrSplit(text.str(), '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 2u) << text.str();
  EXPECT_EQ(lines[1].rfind("Barrier,-1,-1,0,0,0,", 0), 0u) << lines[1];
}

INSTANTIATE_TEST_SUITE_P(Transports, TracedTransportTest,
                         ::testing::Values(TransportKind::kInproc, TransportKind::kGloo),
                         [](const auto& info) { return TransportKindName(info.param); });

}  // namespace
}  // namespace onebit
