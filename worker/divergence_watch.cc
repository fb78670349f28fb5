#include "worker/divergence_watch.h"

#include <cmath>

#include "absl/strings/str_format.h"

namespace onebit {

std::optional<std::string> DivergenceWatch::Observe(int64_t step, bool compression, double loss,
                                                    double eps, double update_clip) {
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
  const std::string bound =
      update_clip > 0 ? absl::StrFormat("lr * update_clip = lr * %g", update_clip)
                      : absl::StrFormat("scale/eps = scale/%.3g (update_clip 0: none)", eps);
  return absl::StrFormat(
      "warning: the loss is %.4g at step %d, %.3gx the warmup's last losses (%.4g): the "
      "compression stage is diverging. Likely cause: elements whose variance froze at ~0 or "
      "far below their later gradients (dead units, unused embeddings, a freeze too early) "
      "move by up to %s each step. Fixes: a smaller optimizer.params.update_clip (2 or 1), a "
      "larger eps (1e-6 to 1e-5), onebit.momentum_mask.auto_zero_grad, or a later freeze",
      loss, step, loss / baseline, baseline, bound);
}

}  // namespace onebit
