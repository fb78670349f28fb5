// Errors that no restart fixes. A member whose training diverged (a NaN or infinite loss,
// fp16 overflowing at the minimum loss scale) would diverge the same way after every
// recovery: it marks the error permanent, and its process reports it to the coordinator,
// which fails the job at once (coordinator/member.h: exit code 78) instead of spending
// failure.max_restarts on the same end.
//
// The mark is a payload on the absl::Status: it survives copies, ONEBIT_RETURN_IF_ERROR
// and StatusOr, but not a new status built from the old one's message.
#ifndef ONEBIT_COMMON_PERMANENT_ERROR_H_
#define ONEBIT_COMMON_PERMANENT_ERROR_H_

#include <cstdint>

#include "absl/status/status.h"

namespace onebit {

// `status` marked permanent, the failure of `step` (0: of no step); OK stays OK.
absl::Status MarkPermanent(absl::Status status, int64_t step = 0);
bool IsPermanent(const absl::Status& status);
// The step a permanent error was marked with; 0 for none or for another error.
int64_t PermanentErrorStep(const absl::Status& status);

}  // namespace onebit

#endif  // ONEBIT_COMMON_PERMANENT_ERROR_H_
