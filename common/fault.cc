#include "common/fault.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"

namespace onebit {

absl::StatusOr<std::optional<Fault>> ParseFault(const std::string& text,
                                                const std::vector<std::string>& points) {
  if (text.empty()) return std::optional<Fault>();
  const size_t colon = text.rfind(':');
  Fault fault;
  if (colon != std::string::npos) fault.point = text.substr(0, colon);
  if (colon == std::string::npos ||
      std::find(points.begin(), points.end(), fault.point) == points.end() ||
      !absl::SimpleAtoi(text.substr(colon + 1), &fault.step) || fault.step < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--fault must be POINT:STEP with STEP >= 1 and POINT one of ",
                                                   absl::StrJoin(points, ", "), "; got '", text, "'"));
  }
  return std::optional<Fault>(fault);
}

void KillSelf(const std::string& who, const std::string& what) {
  std::fprintf(stderr, "fault injection: killing %s at %s (unix ms %lld)\n", who.c_str(),
               what.c_str(), static_cast<long long>(absl::ToUnixMillis(absl::Now())));
  std::fflush(stderr);
  std::fflush(stdout);
  raise(SIGKILL);
  std::abort();  // not reached
}

}  // namespace onebit
