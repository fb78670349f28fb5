// Fault injection for the recovery tests (tests/recovery_test.cc): a binary given
// --fault=POINT:STEP kills itself with SIGKILL (what `kill -9` does) when it reaches POINT
// of step STEP, so that a real process dies at a reproducible moment. Each binary names
// the points it knows; the launcher drops --fault when it restarts a process.
#ifndef ONEBIT_COMMON_FAULT_H_
#define ONEBIT_COMMON_FAULT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace onebit {

struct Fault {
  std::string point;
  int64_t step = 0;
  // Whether the fault fires at `point` of `step`.
  bool At(const std::string& p, int64_t s) const { return point == p && step == s; }
};

// "" -> none; "POINT:STEP" with POINT in `points` and STEP >= 1 -> the fault;
// anything else INVALID_ARGUMENT naming the known points.
absl::StatusOr<std::optional<Fault>> ParseFault(const std::string& text,
                                                const std::vector<std::string>& points);

// Prints "fault injection: killing <who> at <what> (unix ms T)" to stderr, then SIGKILL.
[[noreturn]] void KillSelf(const std::string& who, const std::string& what);

}  // namespace onebit

#endif  // ONEBIT_COMMON_FAULT_H_
