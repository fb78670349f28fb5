// The momentum mask an optimizer applies after its compressed exchanges (docs/algorithms.md,
// "Momentum masks"): the user's {0,1} mask, supplied at every start and never restored from
// a checkpoint; and, when asked for, an automatic one that masks the parameters whose
// exactly averaged gradient stayed exactly zero through warmup (unused embedding rows,
// pixels that are always black). Such a parameter's variance is zero, so without a mask
// the compression error it accumulates is divided by eps alone. The automatic part is
// fixed at the switch; the mask is then the product of both.
//
// Thread safety: one thread at a time.
#ifndef ONEBIT_WORKER_OPTIM_MOMENTUM_MASK_H_
#define ONEBIT_WORKER_OPTIM_MOMENTUM_MASK_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/buffer.h"
#include "kernels/kernels.h"
#include "worker/optim/optimizer.h"

namespace onebit {

class MomentumMask {
 public:
  MomentumMask() = default;
  // `user`: empty, or n values each 0 or 1 (INVALID_ARGUMENT otherwise). `automatic`:
  // detect parameters whose gradient stays zero.
  static absl::StatusOr<MomentumMask> Create(kernels::Backend* backend,
                                             const std::vector<float>& user, bool automatic,
                                             size_t n);

  // A warmup step's exactly averaged (or summed) gradient, the same on every worker.
  // Nothing to do unless automatic and not yet fixed.
  absl::Status Observe(const float* g);
  // At the switch: fixes the automatic part and counts the masked elements. Idempotent.
  absl::Status Fix();

  // The mask to apply now (backend memory), or null for none: the user's until the switch,
  // the product after it.
  const float* data() const { return mask_.size() ? mask_.data() : nullptr; }
  bool automatic() const { return automatic_; }
  bool fixed() const { return fixed_; }
  // Elements the mask zeroes (the user's before the switch).
  int64_t masked() const { return masked_; }
  // The bytes of its buffers in backend memory (the host copy of the user's mask aside).
  uint64_t bytes() const { return mask_.bytes() + seen_.bytes(); }

  // CHECKPOINTS (automatic only): the shared state "nonzero_seen" (which gradients were
  // ever non-zero) and the scalar "mask_fixed"; a restore recomputes the mask from them
  // and the user's mask of this start. Nothing is added or needed without automatic.
  void AddCheckpointStates(std::vector<StateSpec>* states) const;
  void AddCheckpointScalars(StateScalars* scalars) const;
  // The tensor "nonzero_seen", or NOT_FOUND for any other name.
  absl::StatusOr<std::vector<float>> StateToHost(const std::string& name, size_t begin,
                                                 size_t end) const;
  // INVALID_ARGUMENT naming what the checkpoint lacks; nothing changes then.
  absl::Status Restore(const StateTensors& states, const StateScalars& scalars);

 private:
  absl::Status CountMasked();

  kernels::Backend* backend_ = nullptr;
  size_t n_ = 0;
  bool automatic_ = false;
  bool fixed_ = false;
  int64_t masked_ = 0;
  std::vector<float> user_;        // host copy of the user's mask (empty: none)
  kernels::Buffer<float> mask_;    // empty: no mask applies
  kernels::Buffer<float> seen_;    // automatic: 1 where a gradient was non-zero
};

}  // namespace onebit

#endif  // ONEBIT_WORKER_OPTIM_MOMENTUM_MASK_H_
