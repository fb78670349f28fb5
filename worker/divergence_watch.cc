#include "worker/divergence_watch.h"

#include <cmath>

#include "absl/strings/str_format.h"

namespace onebit {

std::optional<std::string> DivergenceWatch::Observe(int64_t step, bool compression, double loss,
                                                    double eps) {
  if (!std::isfinite(loss)) return std::nullopt;
  if (!compression) {
    warmup_.push_back(loss);
    if (warmup_.size() > window_) warmup_.pop_front();
    return std::nullopt;
  }
  if (warned_ || warmup_.empty()) return std::nullopt;
  double baseline = 0.0;
  for (double l : warmup_) baseline += l;
  baseline /= static_cast<double>(warmup_.size());
  if (!(baseline > 0.0) || loss <= factor_ * baseline) return std::nullopt;
  warned_ = true;
  return absl::StrFormat(
      "warning: the loss is %.4g at step %d, %.3gx the warmup's last losses (%.4g): the "
      "compression stage is diverging. Likely cause: elements whose variance froze at ~0 "
      "(dead units, unused embeddings) move by about scale/eps = scale/%.3g each step. Fixes: "
      "a larger optimizer eps (1e-6 to 1e-5), onebit.momentum_mask.auto_zero_grad, or a "
      "later freeze",
      loss, step, loss / baseline, baseline, eps);
}

}  // namespace onebit
