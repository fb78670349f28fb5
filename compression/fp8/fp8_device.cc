#include "compression/fp8/fp8_device.h"

#include <atomic>

namespace onebit::fp8 {
namespace {

// Constant-initialized, so a registration from another file's static initializer finds it
// ready whatever the order of initialization.
std::atomic<const DeviceKernels*> registered{nullptr};

}  // namespace

void RegisterDeviceKernels(const DeviceKernels* kernels) {
  registered.store(kernels, std::memory_order_release);
}

const DeviceKernels* RegisteredDeviceKernels() {
  return registered.load(std::memory_order_acquire);
}

}  // namespace onebit::fp8
