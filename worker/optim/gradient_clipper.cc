#include "worker/optim/gradient_clipper.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/optim/sliced_reductions.h"

namespace onebit {

absl::StatusOr<GradientClipper> GradientClipper::Create(kernels::Backend* backend,
                                                        double max_norm, size_t n, bool copy) {
  if (!(max_norm >= 0) || !std::isfinite(max_norm)) {
    return absl::InvalidArgumentError(
        absl::StrCat("gradient clipping norm must be >= 0 and finite, got ", max_norm));
  }
  GradientClipper c;
  c.backend_ = backend;
  c.max_norm_ = max_norm;
  c.n_ = n;
  c.copy_ = copy;
  if (max_norm > 0 && copy) {
    ONEBIT_ASSIGN_OR_RETURN(c.clipped_, kernels::Buffer<float>::Create(backend, n));
  }
  return c;
}

absl::Status GradientClipper::SetMaxNorm(double max_norm) {
  if (!(max_norm >= 0) || !std::isfinite(max_norm)) {
    return absl::InvalidArgumentError(
        absl::StrCat("gradient clipping norm must be >= 0 and finite, got ", max_norm));
  }
  if (max_norm > 0 && copy_ && clipped_.size() < n_) {
    ONEBIT_ASSIGN_OR_RETURN(clipped_, kernels::Buffer<float>::Create(backend_, n_));
  }
  max_norm_ = max_norm;
  return absl::OkStatus();
}

absl::StatusOr<double> GradientClipper::Factor(const float* g, double scale, size_t stride) {
  if (!enabled()) return 1.0;
  ONEBIT_ASSIGN_OR_RETURN(double sumsq, SlicedSumSquares(*backend_, g, {0, n_}, stride));
  return FactorOf(sumsq, scale);
}

double GradientClipper::FactorOf(double sumsq, double scale) {
  if (!enabled()) return 1.0;
  last_norm_ = std::sqrt(sumsq) * std::abs(scale);
  const double factor = max_norm_ / (last_norm_ + 1e-6);
  // A NaN norm passes unclipped: the trainer stops on the NaN it makes.
  return factor < 1.0 ? factor : 1.0;
}

absl::StatusOr<float> GradientClipper::ClipScale(Gradient g) {
  if (!enabled()) return 1.0f;
  // Stride 0: one sum over [0, n), which for float32 is SumSquares itself.
  double sumsq = 0.0;
  ONEBIT_RETURN_IF_ERROR(backend_->SumSquaresWire(g.dtype, g.data, n_, &sumsq));
  const double factor = FactorOf(sumsq, 1.0);
  return factor >= 1.0 ? 1.0f : static_cast<float>(factor);
}

absl::StatusOr<const float*> GradientClipper::Clip(const float* g) {
  ONEBIT_ASSIGN_OR_RETURN(const float scale, ClipScale(g));
  if (scale == 1.0f) return g;
  if (clipped_.size() < n_) {  // Create(copy = false)
    ONEBIT_ASSIGN_OR_RETURN(clipped_, kernels::Buffer<float>::Create(backend_, n_));
  }
  ONEBIT_RETURN_IF_ERROR(backend_->Copy(clipped_.data(), g, n_ * sizeof(float)));
  ONEBIT_RETURN_IF_ERROR(backend_->Scale(scale, clipped_.data(), n_));
  return static_cast<const float*>(clipped_.data());
}

float MeanScale(double factor, int workers) {
  if (factor == 1.0) return 1.0f / static_cast<float>(workers);
  return static_cast<float>(factor / workers);
}

}  // namespace onebit
