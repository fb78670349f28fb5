// The simulated device: its kernels give the CPU backend's bits, its copies are counted,
// and the host cannot touch its memory.
#include "kernels/simulated_device.h"

#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/buffer.h"
#include "kernels/kernels.h"

namespace onebit::kernels {
namespace {

std::vector<float> Random(size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> x(n);
  for (float& v : x) v = dist(rng);
  return x;
}

TEST(SimulatedDeviceTest, CompressesAsTheCpuBackendAndCountsItsCopies) {
  auto device = NewSimulatedDeviceBackend(2);
  ASSERT_TRUE(device.ok()) << device.status();
  std::unique_ptr<Backend> cpu = NewCpuBackend(true, 2);
  const size_t n = 1000, chunks = 4, chunk = 256;
  const std::vector<float> m = Random(n, 1), g = Random(n, 2);

  auto run = [&](Backend* b) {
    Buffer<float> dm = *Buffer<float>::FromHost(b, m.data(), n);
    Buffer<float> dg = *Buffer<float>::FromHost(b, g.data(), n);
    Buffer<float> err = *Buffer<float>::Create(b, chunks * chunk);
    Buffer<uint8_t> out = *Buffer<uint8_t>::Create(b, chunks * CompressedBlockBytes(chunk));
    for (int step = 0; step < 3; ++step) {
      EXPECT_TRUE(b->CompressWorker(dm.data(), dg.data(), 0.9f, n, chunks, chunk, err.data(),
                                    out.data())
                      .ok());
    }
    return std::make_pair(*out.ToHost(), *err.ToHost());
  };
  const auto on_device = run(device->get());
  const auto on_cpu = run(cpu.get());
  EXPECT_EQ(on_device.first, on_cpu.first);
  EXPECT_EQ(on_device.second, on_cpu.second);

  const Backend::HostTransfers t = (*device)->host_transfers();
  EXPECT_EQ(t.from_host, 2 * n * sizeof(float));
  EXPECT_EQ(t.to_host, chunks * CompressedBlockBytes(chunk) + chunks * chunk * sizeof(float));
  EXPECT_EQ(cpu->host_transfers().to_host, 0u);  // host memory: no bus
}

TEST(SimulatedDeviceDeathTest, TheHostCannotReadItsMemory) {
  auto device = NewSimulatedDeviceBackend();
  ASSERT_TRUE(device.ok()) << device.status();
  Buffer<float> x = *Buffer<float>::Create(device->get(), 16);
  EXPECT_DEATH({ volatile float v = x.data()[3]; (void)v; }, "");
}

TEST(SimulatedDeviceTest, ReusesItsRangeAndAllocatesPinnedStaging) {
  auto device = NewSimulatedDeviceBackend();
  ASSERT_TRUE(device.ok()) << device.status();
  for (int i = 0; i < 100; ++i) {  // 100 x 1 GB would not fit the range without reuse
    auto big = (*device)->Allocate(size_t{1} << 30);
    ASSERT_TRUE(big.ok()) << big.status();
    (*device)->Free(*big);
  }
  auto huge = (*device)->Allocate(size_t{1} << 40);
  EXPECT_EQ(huge.status().code(), absl::StatusCode::kResourceExhausted);
  auto host = (*device)->AllocateHost(64);
  ASSERT_TRUE(host.ok());
  static_cast<char*>(*host)[63] = 1;  // host memory: the host may write it
  (*device)->FreeHost(*host);
}

}  // namespace
}  // namespace onebit::kernels
