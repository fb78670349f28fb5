#include "config/zero_one_schedule.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace onebit {
namespace {

// var_interval stops doubling here: no run has 2^40 steps, and it cannot overflow.
constexpr int64_t kMaxVarInterval = int64_t{1} << 40;

}  // namespace

const char* ZeroOneStepName(ZeroOneStep kind) {
  switch (kind) {
    case ZeroOneStep::kVarianceUpdate:
      return "variance_update";
    case ZeroOneStep::kCompressedGradient:
      return "compressed_gradient";
    case ZeroOneStep::kLocal:
      return "local";
    case ZeroOneStep::kSync:
      return "sync";
  }
  return "unknown";
}

absl::Status ValidateZeroOneScheduleParams(const ZeroOneScheduleParams& p) {
  const std::pair<const char*, int64_t> values[] = {{"var_update_scaler", p.var_update_scaler},
                                                    {"local_step_scaler", p.local_step_scaler},
                                                    {"local_step_clipper", p.local_step_clipper}};
  for (const auto& [name, value] : values) {
    if (value < 1) {
      return absl::InvalidArgumentError(absl::StrCat(name, " must be >= 1, got ", value));
    }
  }
  return absl::OkStatus();
}

ZeroOneSchedule ZeroOneSchedule::After(const ZeroOneScheduleParams& params, int64_t steps,
                                       int64_t var_freeze_step) {
  ZeroOneSchedule s(params);
  while (s.steps_ < steps) s.Advance(var_freeze_step);
  return s;
}

ZeroOneStep ZeroOneSchedule::Next(int64_t var_freeze_step) const {
  const int64_t t = steps_ + 1;
  if (t <= var_freeze_step) {
    return t % var_interval_ == 0 ? ZeroOneStep::kVarianceUpdate
                                  : ZeroOneStep::kCompressedGradient;
  }
  return t % local_interval_ == 0 ? ZeroOneStep::kSync : ZeroOneStep::kLocal;
}

void ZeroOneSchedule::Advance(int64_t var_freeze_step) {
  const ZeroOneStep kind = Next(var_freeze_step);
  ++steps_;
  if (kind == ZeroOneStep::kVarianceUpdate) {
    if (++var_updates_ % params_.var_update_scaler == 0 && var_interval_ < kMaxVarInterval) {
      var_interval_ *= 2;
    }
  } else if (kind == ZeroOneStep::kLocal || kind == ZeroOneStep::kSync) {
    if (++local_steps_ % params_.local_step_scaler == 0) {
      local_interval_ = std::min(local_interval_ * 2, params_.local_step_clipper);
    }
  }
}

}  // namespace onebit
