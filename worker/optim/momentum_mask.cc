#include "worker/optim/momentum_mask.h"

#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/optim/optim_checks.h"

namespace onebit {

absl::StatusOr<MomentumMask> MomentumMask::Create(kernels::Backend* backend,
                                                  const std::vector<float>& user, bool automatic,
                                                  size_t n) {
  ONEBIT_RETURN_IF_ERROR(ValidateMomentumMask(user, n));
  MomentumMask m;
  m.backend_ = backend;
  m.n_ = n;
  m.automatic_ = automatic;
  m.user_ = user;
  if (!user.empty()) {
    ONEBIT_ASSIGN_OR_RETURN(m.mask_, kernels::Buffer<float>::FromHost(backend, user.data(), n));
    ONEBIT_RETURN_IF_ERROR(m.CountMasked());
  }
  if (automatic) {
    ONEBIT_ASSIGN_OR_RETURN(m.seen_, kernels::Buffer<float>::Create(backend, n));
  }
  return m;
}

absl::Status MomentumMask::Observe(const float* g) {
  if (!automatic_ || fixed_) return absl::OkStatus();
  return backend_->MarkNonzero(g, seen_.data(), n_);
}

absl::Status MomentumMask::Fix() {
  if (!automatic_ || fixed_) return absl::OkStatus();
  if (mask_.size() == 0) {
    ONEBIT_ASSIGN_OR_RETURN(mask_, kernels::Buffer<float>::Create(backend_, n_));
    ONEBIT_RETURN_IF_ERROR(backend_->Copy(mask_.data(), seen_.data(), n_ * sizeof(float)));
  } else {
    ONEBIT_RETURN_IF_ERROR(backend_->ApplyMask(seen_.data(), mask_.data(), n_));
  }
  fixed_ = true;
  return CountMasked();
}

absl::Status MomentumMask::CountMasked() {
  // The mask is 0s and 1s: its sum of squares counts the ones, exactly in float64.
  double ones = 0.0;
  ONEBIT_RETURN_IF_ERROR(backend_->SumSquares(mask_.data(), n_, &ones));
  masked_ = static_cast<int64_t>(n_) - static_cast<int64_t>(std::llround(ones));
  return absl::OkStatus();
}

void MomentumMask::AddCheckpointStates(std::vector<StateSpec>* states) const {
  if (automatic_) states->push_back({"nonzero_seen", true});
}

void MomentumMask::AddCheckpointScalars(StateScalars* scalars) const {
  if (automatic_) (*scalars)["mask_fixed"] = fixed_ ? 1.0 : 0.0;
}

absl::StatusOr<std::vector<float>> MomentumMask::StateToHost(const std::string& name,
                                                             size_t begin, size_t end) const {
  if (!automatic_ || name != "nonzero_seen") {
    return absl::NotFoundError(absl::StrCat("no optimizer state ", name));
  }
  return seen_.SliceToHost(begin, end);
}

absl::Status MomentumMask::Restore(const StateTensors& states, const StateScalars& scalars) {
  if (!automatic_) return absl::OkStatus();
  ONEBIT_ASSIGN_OR_RETURN(const std::vector<float>* seen, FindState(states, "nonzero_seen", n_));
  const auto it = scalars.find("mask_fixed");
  if (it == scalars.end()) return absl::InvalidArgumentError("the checkpoint has no mask_fixed");
  const bool fixed = it->second != 0.0;
  ONEBIT_RETURN_IF_ERROR(seen_.CopyFromHost(seen->data(), n_));
  fixed_ = false;
  if (user_.empty()) {
    mask_ = kernels::Buffer<float>();
  } else {
    ONEBIT_RETURN_IF_ERROR(mask_.CopyFromHost(user_.data(), n_));
    ONEBIT_RETURN_IF_ERROR(CountMasked());
  }
  return fixed ? Fix() : absl::OkStatus();
}

}  // namespace onebit
