// StagedTransport over a simulated device (kernels/simulated_device.h: memory the host
// cannot touch) against the host transport it wraps: every call gives the same bytes, and
// what crosses the "bus" is exactly what the call sends and receives.
#include "worker/transport/staged_transport.h"

#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/buffer.h"
#include "kernels/simulated_device.h"
#include "worker/transport/local_group.h"

namespace onebit {
namespace {

using ::testing::HasSubstr;

std::vector<uint8_t> Pattern(size_t bytes, int seed) {
  std::vector<uint8_t> v(bytes);
  for (size_t i = 0; i < bytes; ++i) v[i] = static_cast<uint8_t>(i * 7 + seed * 31);
  return v;
}

template <typename T>
absl::StatusOr<kernels::Buffer<T>> Up(kernels::Backend* b, const std::vector<T>& host) {
  return kernels::Buffer<T>::FromHost(b, host.data(), host.size());
}

absl::Status Expect(bool ok, const std::string& what) {
  return ok ? absl::OkStatus() : absl::InternalError(what);
}

class StagedTransportTest : public ::testing::TestWithParam<TransportKind> {};

TEST_P(StagedTransportTest, EveryCallAsOnTheHostMovingOnlyItsBytes) {
  const int w = 3;
  const absl::Status status = RunLocalGroup(GetParam(), w, [&](Transport& host) -> absl::Status {
    auto device = kernels::NewSimulatedDeviceBackend();
    if (!device.ok()) return device.status();
    kernels::Backend* d = device->get();
    auto staged = StagedTransport::Create(d, &host);
    if (!staged.ok()) return staged.status();
    Transport& t = **staged;
    EXPECT_EQ(t.memory_space(), kernels::MemorySpace::kCuda);
    EXPECT_EQ(t.rank(), host.rank());
    EXPECT_EQ(t.world_size(), w);
    const int r = host.rank();
    const size_t block = 37;

    // AllToAll: the device result against the host transport's on the same bytes.
    const std::vector<uint8_t> send = Pattern(w * block, r);
    std::vector<uint8_t> want(w * block);
    ONEBIT_RETURN_IF_ERROR(host.AllToAll(send.data(), want.data(), block));
    ONEBIT_ASSIGN_OR_RETURN(kernels::Buffer<uint8_t> dsend, Up(d, send));
    ONEBIT_ASSIGN_OR_RETURN(kernels::Buffer<uint8_t> drecv,
                            kernels::Buffer<uint8_t>::Create(d, w * block));
    kernels::Backend::HostTransfers before = d->host_transfers();
    ONEBIT_RETURN_IF_ERROR(t.AllToAll(dsend.data(), drecv.data(), block));
    kernels::Backend::HostTransfers after = d->host_transfers();
    EXPECT_EQ(after.to_host - before.to_host, w * block);
    EXPECT_EQ(after.from_host - before.from_host, w * block);
    ONEBIT_ASSIGN_OR_RETURN(std::vector<uint8_t> got, drecv.ToHost());
    ONEBIT_RETURN_IF_ERROR(Expect(got == want, "AllToAll differs"));

    // AllGather: one block down, W up.
    std::vector<uint8_t> gathered(w * block);
    ONEBIT_RETURN_IF_ERROR(host.AllGather(send.data(), gathered.data(), block));
    before = d->host_transfers();
    ONEBIT_RETURN_IF_ERROR(t.AllGather(dsend.data(), drecv.data(), block));
    after = d->host_transfers();
    EXPECT_EQ(after.to_host - before.to_host, block);
    EXPECT_EQ(after.from_host - before.from_host, w * block);
    ONEBIT_ASSIGN_OR_RETURN(got, drecv.ToHost());
    ONEBIT_RETURN_IF_ERROR(Expect(got == gathered, "AllGather differs"));

    // AllReduceSum, in place.
    std::vector<float> x(11);
    std::iota(x.begin(), x.end(), static_cast<float>(r));
    std::vector<float> sum = x;
    ONEBIT_RETURN_IF_ERROR(host.AllReduceSum(sum.data(), sum.size()));
    ONEBIT_ASSIGN_OR_RETURN(kernels::Buffer<float> dx, Up(d, x));
    ONEBIT_RETURN_IF_ERROR(t.AllReduceSum(dx.data(), dx.size()));
    ONEBIT_ASSIGN_OR_RETURN(std::vector<float> got_sum, dx.ToHost());
    ONEBIT_RETURN_IF_ERROR(Expect(got_sum == sum, "AllReduceSum differs"));

    // A ring shift, two calls in flight at once, and one of zero bytes sent.
    const int to = (r + 1) % w, from = (r + w - 1) % w;
    const std::vector<uint8_t> a = Pattern(100, r), b = Pattern(50, r + 10);
    ONEBIT_ASSIGN_OR_RETURN(kernels::Buffer<uint8_t> da, Up(d, a));
    ONEBIT_ASSIGN_OR_RETURN(kernels::Buffer<uint8_t> db, Up(d, b));
    ONEBIT_ASSIGN_OR_RETURN(kernels::Buffer<uint8_t> ra, kernels::Buffer<uint8_t>::Create(d, 100));
    ONEBIT_ASSIGN_OR_RETURN(kernels::Buffer<uint8_t> rb, kernels::Buffer<uint8_t>::Create(d, 50));
    ONEBIT_ASSIGN_OR_RETURN(auto p1, t.StartSendRecv(da.data(), 100, to, ra.data(), 100, from));
    ONEBIT_ASSIGN_OR_RETURN(auto p2, t.StartSendRecv(db.data(), 50, to, rb.data(), 50, from));
    ONEBIT_RETURN_IF_ERROR(p1->Wait());
    ONEBIT_RETURN_IF_ERROR(p2->Wait());
    ONEBIT_RETURN_IF_ERROR(p2->Wait());  // a second wait returns the first's status
    ONEBIT_ASSIGN_OR_RETURN(got, ra.ToHost());
    ONEBIT_RETURN_IF_ERROR(Expect(got == Pattern(100, from), "first SendRecv differs"));
    ONEBIT_ASSIGN_OR_RETURN(got, rb.ToHost());
    ONEBIT_RETURN_IF_ERROR(Expect(got == Pattern(50, from + 10), "second SendRecv differs"));
    ONEBIT_RETURN_IF_ERROR(t.SendRecv(nullptr, 0, to, nullptr, 0, from));
    ONEBIT_RETURN_IF_ERROR(t.Barrier());
    EXPECT_EQ(t.bytes_sent(), host.bytes_sent());
    return absl::OkStatus();
  });
  EXPECT_TRUE(status.ok()) << status;
}

INSTANTIATE_TEST_SUITE_P(Transports, StagedTransportTest,
                         ::testing::Values(TransportKind::kInproc, TransportKind::kGloo),
                         [](const auto& info) { return TransportKindName(info.param); });

TEST(StagedTransportCreateTest, TheWrappedTransportMustUseHostMemory) {
  const absl::Status status = RunLocalGroup(TransportKind::kInproc, 1, [](Transport& host) {
    auto device = kernels::NewSimulatedDeviceBackend();
    if (!device.ok()) return device.status();
    auto staged = StagedTransport::Create(device->get(), &host);
    if (!staged.ok()) return staged.status();
    auto twice = StagedTransport::Create(device->get(), staged->get());
    EXPECT_EQ(twice.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(twice.status().message()), HasSubstr("does not use host memory"));
    return absl::OkStatus();
  });
  EXPECT_TRUE(status.ok()) << status;
}

}  // namespace
}  // namespace onebit
