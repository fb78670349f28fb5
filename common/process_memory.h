// The process's peak resident memory, as Linux keeps it (VmHWM of /proc/self/status: the
// high-water mark of the RSS; wait4's ru_maxrss reads the same). For summaries and reports.
//
// Thread safety: thread-safe (reads a file each call).
#ifndef ONEBIT_COMMON_PROCESS_MEMORY_H_
#define ONEBIT_COMMON_PROCESS_MEMORY_H_

#include <cstdint>

#include "absl/strings/string_view.h"

namespace onebit {

// The VmHWM line of a /proc/PID/status text ("VmHWM:   123456 kB"), in bytes; 0 where
// there is none or it does not parse.
uint64_t PeakRssBytesFromStatus(absl::string_view status);

// This process's VmHWM in bytes; 0 where /proc/self/status is absent or has no VmHWM
// (not Linux, or a sandbox without /proc).
uint64_t PeakRssBytes();

}  // namespace onebit

#endif  // ONEBIT_COMMON_PROCESS_MEMORY_H_
