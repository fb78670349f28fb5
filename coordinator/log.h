// One log line to stderr: "2024-05-01T12:00:00.123Z onebit-coordinator: <message>".
// Thread-safe (one write per line). Quiet when ONEBIT_QUIET is set in the environment.
#ifndef ONEBIT_COORDINATOR_LOG_H_
#define ONEBIT_COORDINATOR_LOG_H_

#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace onebit {

inline void LogLine(absl::string_view message) {
  static const bool quiet = std::getenv("ONEBIT_QUIET") != nullptr;
  if (quiet) return;
  const std::string line =
      absl::StrCat(absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::Now(), absl::UTCTimeZone()),
                   " onebit-coordinator: ", message, "\n");
  std::fwrite(line.data(), 1, line.size(), stderr);
}

}  // namespace onebit

#endif  // ONEBIT_COORDINATOR_LOG_H_
