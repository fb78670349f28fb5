// Gradient clipping by global norm (the job config's gradient_clipping, DeepSpeed's
// semantics): a gradient g whose norm exceeds max_norm is scaled by
// max_norm / (||g|| + 1e-6). Each optimizer clips the gradient before it enters the
// moments: the exact average on the steps that average exactly (the same on every worker,
// so every worker clips alike), the local gradient on the others (as DeepSpeed clips once
// it no longer allreduces).
//
// Thread safety: one thread at a time.
#ifndef ONEBIT_WORKER_OPTIM_GRADIENT_CLIPPER_H_
#define ONEBIT_WORKER_OPTIM_GRADIENT_CLIPPER_H_

#include <cstddef>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/buffer.h"
#include "kernels/kernels.h"
#include "worker/exchange/gradient.h"

namespace onebit {

class GradientClipper {
 public:
  GradientClipper() = default;
  // max_norm 0: clipping is off (and costs nothing); < 0 or not finite: INVALID_ARGUMENT.
  // `copy`: Clip's copy (n floats) is allocated while clipping is on; false: on Clip's
  // first call only, for an owner that clips through ClipScale (a sharded 1-bit Adam,
  // whose exchange scales the gradient as it sends it).
  static absl::StatusOr<GradientClipper> Create(kernels::Backend* backend, double max_norm,
                                                size_t n, bool copy = true);

  bool enabled() const { return max_norm_ > 0; }
  // The norm of the steps that follow (a training script's clip_grad_norm_); the same
  // checks as Create.
  absl::Status SetMaxNorm(double max_norm);
  // The factor that clips scale*g (n elements, backend memory): 1 when off or within the
  // norm, else max_norm / (||scale*g|| + 1e-6). ||g||^2 is cut at the multiples of
  // `stride` and the pieces added in slice order (sliced_reductions.h): the optimizers pass
  // the exchange's reduction_stride() for the exact sum, whose norm a sharded worker
  // assembles from every slice's piece. Stride 0: one SumSquares over g.
  absl::StatusOr<double> Factor(const float* g, double scale, size_t stride);
  // The same from ||g||^2 itself (a sum assembled elsewhere, in the same order).
  double FactorOf(double sumsq, double scale);
  // What Clip multiplies g by (n elements, backend memory), as a float: 1 within the norm
  // (or off), else float(Factor(g, 1, 0)). The norm is one SumSquares over g (stride 0):
  // each worker clips its own whole gradient, which no other worker sums. A 16-bit g
  // (gradient.h) is measured in place, with the bits of its float32 copy
  // (Backend::SumSquaresWire).
  absl::StatusOr<float> ClipScale(Gradient g);
  // g itself when ClipScale(g) is 1, else a copy multiplied by it (Backend::Scale), valid
  // until the next call. A factor that rounds to 1.0f copies nothing: its norm is finite,
  // so g holds no NaN, and x * 1.0f is x for every other float.
  absl::StatusOr<const float*> Clip(const float* g);
  // The bytes of Clip's copy (backend memory), for metrics: 0 until it exists.
  uint64_t bytes() const { return clipped_.bytes(); }
  // The norm of the last gradient measured (for metrics); 0 before any.
  double last_norm() const { return last_norm_; }

 private:
  kernels::Backend* backend_ = nullptr;
  double max_norm_ = 0;
  size_t n_ = 0;
  bool copy_ = true;
  double last_norm_ = 0;
  kernels::Buffer<float> clipped_;
};

// The grad_scale that turns a sum over `workers` into their mean clipped by `factor`:
// exactly 1.0f/workers when nothing is clipped (the bits of a run without clipping).
float MeanScale(double factor, int workers);

}  // namespace onebit

#endif  // ONEBIT_WORKER_OPTIM_GRADIENT_CLIPPER_H_
