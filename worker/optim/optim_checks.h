// Checks every optimizer applies to its options (INVALID_ARGUMENT naming the value).
#ifndef ONEBIT_WORKER_OPTIM_OPTIM_CHECKS_H_
#define ONEBIT_WORKER_OPTIM_OPTIM_CHECKS_H_

#include <cstddef>
#include <vector>

#include "absl/status/status.h"
#include "kernels/kernels.h"

namespace onebit {

// lr >= 0 and finite, betas in [0, 1), eps > 0 and finite, weight_decay >= 0 and finite.
absl::Status ValidateAdamHyper(const kernels::AdamHyper& h);
// Empty, or n elements that are each 0 or 1.
absl::Status ValidateMomentumMask(const std::vector<float>& mask, size_t n);

}  // namespace onebit

#endif  // ONEBIT_WORKER_OPTIM_OPTIM_CHECKS_H_
