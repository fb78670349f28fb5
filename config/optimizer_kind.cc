#include "config/optimizer_kind.h"

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace onebit {

const std::vector<OptimizerTraits>& AllOptimizerTraits() {
  static const auto* all = new std::vector<OptimizerTraits>{
      {OptimizerKind::kOneBitAdam, "OneBitAdam", "1-bit Adam", /*compresses=*/true,
       /*has_local_steps=*/false, /*one_switch=*/true, "freeze_step",
       {"freeze_step", "update_clip"}},
      {OptimizerKind::kZeroOneAdam, "ZeroOneAdam", "0/1 Adam", /*compresses=*/true,
       /*has_local_steps=*/true, /*one_switch=*/false, "var_freeze_step",
       {"var_freeze_step", "var_update_scaler", "local_step_scaler", "local_step_clipper",
        "update_clip"}},
      {OptimizerKind::kOneBitLamb, "OneBitLamb", "1-bit LAMB", /*compresses=*/true,
       /*has_local_steps=*/false, /*one_switch=*/true, "freeze_step",
       {"freeze_step", "max_coeff", "min_coeff", "coeff_beta", "factor_max", "factor_min",
        "factor_threshold"}},
      // 1-bit Adam's warmup throughout: it takes freeze_step (unused) and the 1-bit keys, so
      // that a config can switch type alone.
      {OptimizerKind::kAdam, "Adam", "Adam", /*compresses=*/false, /*has_local_steps=*/false,
       /*one_switch=*/false, "freeze_step",
       {"freeze_step", "update_clip", "adam_w_mode", "torch_adam", "set_grad_none"}},
  };
  return *all;
}

const OptimizerTraits& Traits(OptimizerKind kind) {
  return AllOptimizerTraits()[static_cast<size_t>(kind)];
}

absl::StatusOr<OptimizerKind> ParseOptimizerKind(absl::string_view name) {
  const std::string lower = absl::AsciiStrToLower(name);
  if (lower == "adamw") return OptimizerKind::kAdam;
  for (const OptimizerTraits& t : AllOptimizerTraits()) {
    if (lower == absl::AsciiStrToLower(t.name)) return t.kind;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown optimizer type '", name, "'"));
}

}  // namespace onebit
