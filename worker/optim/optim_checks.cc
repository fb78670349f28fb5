#include "worker/optim/optim_checks.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace onebit {

absl::Status ValidateAdamHyper(const kernels::AdamHyper& h) {
  if (!(h.lr >= 0.0f) || !std::isfinite(h.lr)) {
    return absl::InvalidArgumentError(absl::StrCat("lr must be >= 0, got ", h.lr));
  }
  if (!(h.beta1 >= 0.0f && h.beta1 < 1.0f) || !(h.beta2 >= 0.0f && h.beta2 < 1.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("betas must be in [0, 1), got ", h.beta1, ", ", h.beta2));
  }
  if (!(h.eps > 0.0f) || !std::isfinite(h.eps)) {
    return absl::InvalidArgumentError(absl::StrCat("eps must be > 0, got ", h.eps));
  }
  if (!(h.weight_decay >= 0.0f) || !std::isfinite(h.weight_decay)) {
    return absl::InvalidArgumentError(
        absl::StrCat("weight_decay must be >= 0, got ", h.weight_decay));
  }
  return absl::OkStatus();
}

absl::Status ValidateMomentumMask(const std::vector<float>& mask, size_t n) {
  if (mask.empty()) return absl::OkStatus();
  if (mask.size() != n) {
    return absl::InvalidArgumentError(
        absl::StrCat("momentum mask has ", mask.size(), " elements, the parameters ", n));
  }
  for (size_t i = 0; i < n; ++i) {
    if (mask[i] != 0.0f && mask[i] != 1.0f) {
      return absl::InvalidArgumentError(
          absl::StrCat("momentum mask must be 0 or 1; element ", i, " is ", mask[i]));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckFreezeStepMove(int64_t steps, int64_t current, int64_t proposed) {
  if (proposed < 0) return absl::InvalidArgumentError("freeze_step must be >= 0");
  if (steps > current && proposed != current) {
    return absl::FailedPreconditionError(
        absl::StrCat("already compressing since step ", current + 1));
  }
  if (proposed < steps) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot freeze at step ", proposed, ": step ", steps, " already ran in warmup"));
  }
  return absl::OkStatus();
}

kernels::AdamHyper BiasCorrectedHyper(const kernels::AdamHyper& h, int64_t t,
                                      int64_t variance_updates, double* c_out) {
  const double bc1 = t >= 1 ? 1.0 - std::pow(static_cast<double>(h.beta1), static_cast<double>(t)) : 1.0;
  const double bc2 =
      variance_updates >= 1
          ? 1.0 - std::pow(static_cast<double>(h.beta2), static_cast<double>(variance_updates))
          : 1.0;
  const double c = std::sqrt(bc2) / bc1;
  kernels::AdamHyper out = h;
  out.lr = static_cast<float>(h.lr * c);
  out.eps = static_cast<float>(h.eps * std::sqrt(bc2));
  out.weight_decay = static_cast<float>(h.weight_decay / c);
  out.update_clip = static_cast<float>(h.update_clip / c);
  if (c_out != nullptr) *c_out = c;
  return out;
}

absl::StatusOr<std::vector<HyperGroup>> ResolveHyperGroups(const std::vector<HyperGroup>& groups,
                                                           size_t n, float weight_decay) {
  if (groups.empty()) return std::vector<HyperGroup>{{0, n, 1.0f, weight_decay}};
  size_t at = 0;
  for (size_t i = 0; i < groups.size(); ++i) {
    const HyperGroup& g = groups[i];
    if (g.begin != at || g.end <= g.begin || g.end > n) {
      return absl::InvalidArgumentError(absl::StrCat(
          "parameter group ", i, " is [", g.begin, ", ", g.end, "); the groups must cover [0, ",
          n, ") in order, each non-empty, this one starting at ", at));
    }
    if (!(g.lr_scale >= 0.0f) || !std::isfinite(g.lr_scale)) {
      return absl::InvalidArgumentError(
          absl::StrCat("parameter group ", i, ": lr scale must be >= 0, got ", g.lr_scale));
    }
    if (!(g.weight_decay >= 0.0f) || !std::isfinite(g.weight_decay)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "parameter group ", i, ": weight_decay must be >= 0, got ", g.weight_decay));
    }
    at = g.end;
  }
  if (at != n) {
    return absl::InvalidArgumentError(
        absl::StrCat("the parameter groups cover [0, ", at, "), not all ", n, " parameters"));
  }
  return groups;
}

kernels::AdamHyper GroupHyper(const kernels::AdamHyper& h, const HyperGroup& group) {
  kernels::AdamHyper g = h;
  g.lr = h.lr * group.lr_scale;
  g.weight_decay = group.weight_decay;
  return g;
}

absl::Status SetGroupWeightDecays(const std::vector<double>& decays,
                                  std::vector<HyperGroup>* groups) {
  if (decays.size() != groups->size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        decays.size(), " weight decays for ", groups->size(), " parameter group(s)"));
  }
  for (size_t i = 0; i < decays.size(); ++i) {
    // As a float: what the kernels step with (a double beyond float's range is infinite).
    const float decay = static_cast<float>(decays[i]);
    if (!(decay >= 0.0f) || !std::isfinite(decay)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "parameter group ", i, ": weight_decay must be >= 0 and finite, got ", decays[i]));
    }
  }
  for (size_t i = 0; i < decays.size(); ++i) {
    (*groups)[i].weight_decay = static_cast<float>(decays[i]);
  }
  return absl::OkStatus();
}

bool GroupsAlike(const std::vector<HyperGroup>& groups) {
  for (const HyperGroup& g : groups) {
    if (g.lr_scale != groups[0].lr_scale || g.weight_decay != groups[0].weight_decay) {
      return false;
    }
  }
  return true;
}

std::vector<double> GroupWeightDecays(const std::vector<HyperGroup>& groups) {
  std::vector<double> decays;
  decays.reserve(groups.size());
  for (const HyperGroup& g : groups) decays.push_back(g.weight_decay);
  return decays;
}

}  // namespace onebit
