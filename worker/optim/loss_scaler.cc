#include "worker/optim/loss_scaler.h"

#include <algorithm>
#include <cmath>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace onebit {
namespace {

absl::Status Bad(const char* field, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat("fp16.", field, ": ", why));
}

}  // namespace

LossScaler::LossScaler(const LossScalerOptions& options) : options_(options) {
  state_.scale = dynamic() ? std::ldexp(1.0, options.initial_scale_power) : options.loss_scale;
  state_.hysteresis_left = options.hysteresis;
}

absl::StatusOr<LossScaler> LossScaler::Create(const LossScalerOptions& o) {
  if (!(o.loss_scale >= 0) || !std::isfinite(o.loss_scale)) {
    return Bad("loss_scale", absl::StrCat("must be 0 (dynamic) or > 0, got ", o.loss_scale));
  }
  if (o.loss_scale == 0) {
    if (o.initial_scale_power < 0 || o.initial_scale_power > 126) {
      return Bad("initial_scale_power",
                 absl::StrCat("must be in [0, 126], got ", o.initial_scale_power));
    }
    if (o.loss_scale_window < 1) {
      return Bad("loss_scale_window", absl::StrCat("must be >= 1, got ", o.loss_scale_window));
    }
    if (o.hysteresis < 1) {
      return Bad("hysteresis", absl::StrCat("must be >= 1, got ", o.hysteresis));
    }
    const double initial = std::ldexp(1.0, o.initial_scale_power);
    if (!(o.min_loss_scale > 0) || o.min_loss_scale > initial) {
      return Bad("min_loss_scale", absl::StrCat("must be in (0, 2^initial_scale_power = ",
                                                initial, "], got ", o.min_loss_scale));
    }
  }
  return LossScaler(o);
}

void LossScaler::Update(bool overflow) {
  LossScalerState& s = state_;
  if (overflow) {
    ++s.overflows;
    if (dynamic()) {
      if (s.hysteresis_left <= 1) {
        s.scale = std::max(s.scale / 2, options_.min_loss_scale);
      } else {
        --s.hysteresis_left;
      }
    }
    s.last_overflow = s.updates;
  } else if (dynamic()) {
    if (options_.consecutive_hysteresis) s.hysteresis_left = options_.hysteresis;
    if ((s.updates - s.last_overflow) % options_.loss_scale_window == 0) {
      s.hysteresis_left = options_.hysteresis;
      // Never beyond float's range: a scale of 2^127 would turn every gradient into inf.
      s.scale = std::min(s.scale * 2, std::ldexp(1.0, 126));
    }
  }
  ++s.updates;
}

absl::Status LossScaler::Restore(const LossScalerState& state) {
  if (!(state.scale > 0) || !std::isfinite(state.scale)) {
    return absl::InvalidArgumentError(absl::StrCat("loss scale ", state.scale, " in the state"));
  }
  const int max_left = dynamic() ? options_.hysteresis : state_.hysteresis_left;
  if (state.hysteresis_left < 1 || state.hysteresis_left > max_left) {
    return absl::InvalidArgumentError(
        absl::StrCat("hysteresis left ", state.hysteresis_left, " is not in [1, ", max_left, "]"));
  }
  if (state.updates < 0 || state.overflows < 0 || state.overflows > state.updates ||
      state.last_overflow < -1 || state.last_overflow >= state.updates) {
    return absl::InvalidArgumentError(absl::StrCat(
        "loss scaler counters: ", state.updates, " updates, ", state.overflows,
        " overflows, last at ", state.last_overflow));
  }
  state_ = state;
  return absl::OkStatus();
}

}  // namespace onebit
