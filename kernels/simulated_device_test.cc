// The simulated device: its kernels give the CPU backend's bits, its copies are counted,
// and the host cannot touch its memory.
#include "kernels/simulated_device.h"

#include <cstring>
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

// SumSquaresWire reads the 16-bit tensor in the device's memory and gives the CPU backend's
// bits for its float32 widening.
TEST(SimulatedDeviceTest, SumSquaresWireIsTheCpuBackendsOnTheWidenedCopy) {
  auto device = NewSimulatedDeviceBackend(2);
  ASSERT_TRUE(device.ok()) << device.status();
  std::unique_ptr<Backend> cpu = NewCpuBackend(true, 2);
  const size_t n = 3 * 65536 + 5;
  const std::vector<float> x = Random(n, 3);
  for (WireDtype dtype : {WireDtype::kBf16, WireDtype::kFp16}) {
    std::vector<uint16_t> h(n);
    std::vector<float> wide(n);
    for (size_t i = 0; i < n; ++i) {
      h[i] = NarrowParam(dtype, x[i]);
      wide[i] = WidenParam(dtype, h[i]);
    }
    Buffer<uint16_t> dh = *Buffer<uint16_t>::FromHost(device->get(), h.data(), n);
    double got = -1, want = -2;
    ASSERT_TRUE((*device)->SumSquaresWire(dtype, dh.data(), n, &got).ok());
    ASSERT_TRUE(cpu->SumSquares(wide.data(), n, &want).ok());
    EXPECT_EQ(std::memcmp(&got, &want, sizeof(got)), 0)
        << WireDtypeName(dtype) << ": " << got << " vs " << want;
  }
  Buffer<float> dx = *Buffer<float>::FromHost(device->get(), x.data(), n);
  double got = -1, want = -2;
  ASSERT_TRUE((*device)->SumSquaresWire(WireDtype::kFp32, dx.data(), n, &got).ok());
  ASSERT_TRUE(cpu->SumSquares(x.data(), n, &want).ok());
  EXPECT_EQ(std::memcmp(&got, &want, sizeof(got)), 0) << "fp32: " << got << " vs " << want;
}

// A kernel from outside kernels/ (Backend::HostAddress): host code on the translated
// pointers reads what the backend's copies and kernels wrote and writes what they read.
void ExternalAxpy(const Backend& b, float a, const float* x, float* y, size_t n) {
  const float* hx = HostAddressOf(b, x);
  float* hy = HostAddressOf(b, y);
  for (size_t i = 0; i < n; ++i) hy[i] = a * hx[i] + hy[i];
}

TEST(SimulatedDeviceTest, HostAddressIsTheShadowOfEachPointer) {
  auto device = NewSimulatedDeviceBackend();
  ASSERT_TRUE(device.ok()) << device.status();
  Backend& b = **device;
  const size_t n = 300;
  const std::vector<float> x0 = Random(n, 5), y0 = Random(n, 6);
  Buffer<float> x = *Buffer<float>::FromHost(&b, x0.data(), n);
  Buffer<float> y = *Buffer<float>::FromHost(&b, y0.data(), n);
  EXPECT_EQ(b.HostAddress(nullptr), nullptr);
  float* hx = HostAddressOf(b, x.data());
  float* hy = HostAddressOf(b, y.data());
  ASSERT_NE(hx, nullptr);
  EXPECT_NE(hx, x.data());  // device addresses are PROT_NONE: the host must not use them
  // Every element, and interior pointers, map to the bytes CopyFromHost wrote.
  for (size_t i = 0; i < n; ++i) {
    ASSERT_EQ(hx[i], x0[i]) << i;
    ASSERT_EQ(hy[i], y0[i]) << i;
    ASSERT_EQ(HostAddressOf(b, x.data() + i), hx + i) << i;
  }
  EXPECT_EQ(HostAddressOf(b, x.data() + n), hx + n);  // one past the end
  // A backend kernel sees what host code wrote, and host code sees what it wrote.
  hx[7] = 3.0f;
  ASSERT_TRUE(b.Scale(2.0f, x.data(), n).ok());
  EXPECT_EQ(hx[7], 6.0f);
  EXPECT_EQ(x.ToHost()->at(7), 6.0f);
  // An external kernel on the device gives the CPU backend's bits.
  ExternalAxpy(b, 0.5f, x.data(), y.data(), n);
  std::unique_ptr<Backend> cpu = NewCpuBackend();
  std::vector<float> cx = x0, cy = y0;
  cx[7] = 3.0f;
  ASSERT_TRUE(cpu->Scale(2.0f, cx.data(), n).ok());
  EXPECT_EQ(HostAddressOf(*cpu, cx.data()), cx.data());  // host memory: itself
  ExternalAxpy(*cpu, 0.5f, cx.data(), cy.data(), n);
  EXPECT_EQ(*y.ToHost(), cy);
  EXPECT_EQ(*x.ToHost(), cx);
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
