// A "device" for tests on machines without a GPU: a Backend whose memory the host cannot
// touch, with the CPU backend's kernels. Its pointers lie in an address range mapped
// PROT_NONE, so host code that reads or writes device memory directly (instead of through
// CopyToHost/CopyFromHost) dies with SIGSEGV, as it would be wrong on a GPU; its kernels
// run the CPU kernels on a shadow mapping of the same layout. It counts the bytes copied
// to and from the host (host_transfers), which on a GPU would cross PCIe. HostAddress gives
// the shadow of a device pointer, so kernels from outside kernels/ (a codec's own) run on
// it as on the CPU backend.
//
// Its kernels give the CPU backend's bits (AVX2 where the CPU has it), so an exchange made
// with it must agree bit for bit with the same exchange on the CPU backend.
//
// Thread safety: as a Backend (one thread at a time), except host_transfers (any thread).
#ifndef ONEBIT_KERNELS_SIMULATED_DEVICE_H_
#define ONEBIT_KERNELS_SIMULATED_DEVICE_H_

#include <memory>

#include "absl/status/statusor.h"
#include "kernels/kernels.h"

namespace onebit::kernels {

// `threads`: the CPU kernels' threads. UNAVAILABLE when the address range cannot be
// reserved.
absl::StatusOr<std::unique_ptr<Backend>> NewSimulatedDeviceBackend(int threads = 1);

}  // namespace onebit::kernels

#endif  // ONEBIT_KERNELS_SIMULATED_DEVICE_H_
