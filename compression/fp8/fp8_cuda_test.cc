// The fp8 codec's CUDA kernels: registered when linked, refused on a backend that is
// neither host-addressable nor CUDA, and on a GPU bit for bit the host loops' (bytes, worker
// and server errors, decoded values), NaN sub-blocks included. Without a GPU the comparison
// skips.
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "compression/codec.h"
#include "compression/codec_registry.h"
#include "compression/fp8/fp8_device.h"
#include "gtest/gtest.h"
#include "kernels/buffer.h"
#include "kernels/cuda_backend.h"
#include "kernels/kernels.h"

namespace onebit::fp8 {
namespace {

std::vector<float> Random(size_t n, uint32_t seed, float stddev) {
  std::mt19937 rng(seed);
  std::student_t_distribution<float> dist(3.0f);  // heavy tails: many scales per chunk
  std::vector<float> v(n);
  for (float& x : v) x = stddev * dist(rng);
  return v;
}

TEST(Fp8CudaTest, LinkingRegistersTheDeviceKernels) {
  const DeviceKernels* device = RegisteredDeviceKernels();
  ASSERT_NE(device, nullptr);
  // A backend with host addresses never reaches them through the codec; called directly,
  // they refuse a backend without a CUDA stream.
  std::unique_ptr<kernels::Backend> cpu = kernels::NewCpuBackend();
  std::vector<float> err(32);
  std::vector<uint8_t> out(33);
  const absl::Status s =
      device->compress(*cpu, err.data(), nullptr, 0.9f, 32, 1, 32, err.data(), out.data());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("neither host addresses"), std::string::npos) << s;
}

struct Outputs {
  std::vector<uint8_t> blocks, aggregated;
  std::vector<float> err, server_err, decoded;
};

// Three worker steps (plain, fused, fused), the blocks aggregated as W workers' blocks of one
// chunk twice, and a decode.
Outputs RunCodec(kernels::Backend* backend, const std::vector<float>& m,
                 const std::vector<float>& g, size_t num_chunks, size_t chunk) {
  const Codec& codec = Fp8Codec();
  const size_t n = m.size();
  auto dm = *kernels::Buffer<float>::FromHost(backend, m.data(), n);
  auto dg = *kernels::Buffer<float>::FromHost(backend, g.data(), n);
  auto err = *kernels::Buffer<float>::Create(backend, num_chunks * chunk);
  auto out = *kernels::Buffer<uint8_t>::Create(backend, num_chunks * codec.BlockBytes(chunk));
  for (int step = 0; step < 3; ++step) {
    EXPECT_TRUE(codec.Compress(*backend, dm.data(), step == 0 ? nullptr : dg.data(), 0.9f, n,
                               num_chunks, chunk, err.data(), out.data()).ok());
  }
  auto serr = *kernels::Buffer<float>::Create(backend, chunk);
  auto agg = *kernels::Buffer<uint8_t>::Create(backend, codec.BlockBytes(chunk));
  for (int step = 0; step < 2; ++step) {
    EXPECT_TRUE(codec.Aggregate(*backend, out.data(), static_cast<int>(num_chunks), chunk,
                                serr.data(), agg.data()).ok());
  }
  auto dec = *kernels::Buffer<float>::Create(backend, n);
  EXPECT_TRUE(codec.Decode(*backend, out.data(), num_chunks, chunk, n, dec.data()).ok());
  EXPECT_TRUE(backend->Synchronize().ok());
  return {*out.ToHost(), *agg.ToHost(), *err.ToHost(), *serr.ToHost(), *dec.ToHost()};
}

// NaN bits may differ (x86 keeps a NaN operand's payload, CUDA makes its canonical NaN);
// every other value must have the same bits.
void ExpectSameFloats(const std::vector<float>& a, const std::vector<float>& b,
                      const char* what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) || std::isnan(b[i])) {
      ASSERT_TRUE(std::isnan(a[i]) && std::isnan(b[i])) << what << " " << i;
    } else {
      ASSERT_EQ(0, std::memcmp(&a[i], &b[i], 4)) << what << " " << i << ": " << a[i] << " "
                                                 << b[i];
    }
  }
}

TEST(Fp8CudaTest, CudaGivesTheHostLoopsBits) {
  if (kernels::CudaDeviceCount() == 0) GTEST_SKIP() << "no GPU";
  absl::StatusOr<std::unique_ptr<kernels::Backend>> cuda = kernels::NewCudaBackend(0);
  ASSERT_TRUE(cuda.ok()) << cuda.status();
  std::unique_ptr<kernels::Backend> cpu = kernels::NewCpuBackend();
  for (size_t chunk : {1, 8, 37, 1000, 250008, 1 << 22}) {
    for (size_t num_chunks : {1, 4}) {
      for (bool nan : {false, true}) {
        const size_t n = chunk * num_chunks - (chunk > 8 ? 7 : 0);
        SCOPED_TRACE(testing::Message() << "chunk " << chunk << " x" << num_chunks << " n " << n
                                        << " nan " << nan);
        std::vector<float> m = Random(n, 1, 1e-3f), g = Random(n, 2, 1e-2f);
        for (size_t i = 0; i < n; i += 4099) m[i] *= 1e-30f;  // float32 subnormal results
        if (nan) m[n / 2] = std::numeric_limits<float>::quiet_NaN();
        const Outputs a = RunCodec(cpu.get(), m, g, num_chunks, chunk);
        const Outputs b = RunCodec(cuda->get(), m, g, num_chunks, chunk);
        EXPECT_EQ(a.blocks, b.blocks);
        EXPECT_EQ(a.aggregated, b.aggregated);
        ExpectSameFloats(a.err, b.err, "worker error");
        ExpectSameFloats(a.server_err, b.server_err, "server error");
        ExpectSameFloats(a.decoded, b.decoded, "decoded");
      }
    }
  }
}

}  // namespace
}  // namespace onebit::fp8
