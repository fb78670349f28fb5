// Checks every optimizer applies to its options (INVALID_ARGUMENT naming the value).
#ifndef ONEBIT_WORKER_OPTIM_OPTIM_CHECKS_H_
#define ONEBIT_WORKER_OPTIM_OPTIM_CHECKS_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/kernels.h"

namespace onebit {

// lr >= 0 and finite, betas in [0, 1), eps > 0 and finite, weight_decay >= 0 and finite.
absl::Status ValidateAdamHyper(const kernels::AdamHyper& h);
// Empty, or n elements that are each 0 or 1.
absl::Status ValidateMomentumMask(const std::vector<float>& mask, size_t n);

// Whether an optimizer that has run `steps` steps with its warmup ending after `current`
// may move that end to `proposed`: only while the warmup has not ended, and not to before a
// step already run in it. INVALID_ARGUMENT for proposed < 0, FAILED_PRECONDITION otherwise.
absl::Status CheckFreezeStepMove(int64_t steps, int64_t current, int64_t proposed);

// BIAS CORRECTION (the optimizers' bias_correction option, off by default as in
// docs/algorithms.md). The corrected update m^/(sqrt(v^)+eps) (+ wd*p), with m^ = m/bc1,
// v^ = v/bc2, bc1 = 1 - b1^t and bc2 = 1 - b2^k (k: the variance updates so far, none: no
// correction of v), is the plain update with
//   lr' = lr*c, eps' = eps*sqrt(bc2), wd' = wd/c, clip' = clip/c,   where c = sqrt(bc2)/bc1,
// so the kernels run unchanged on the returned hyper-parameters (betas untouched). *c_out,
// when given, receives c: the true direction is c times the one computed with them.
kernels::AdamHyper BiasCorrectedHyper(const kernels::AdamHyper& h, int64_t t,
                                      int64_t variance_updates, double* c_out = nullptr);

// PARAMETER GROUPS WITH THEIR OWN HYPER-PARAMETERS (a PyTorch optimizer's param groups):
// consecutive ranges of the flat parameter vector, each with its own learning rate, as a
// multiple of the job's (so the lr schedule moves every group alike), and its own weight
// decay. The betas and eps are the job's for every group: the momentum is one flat
// exchange. Every update is elementwise, or per tensor for 1-bit LAMB, so a group's
// parameters get exactly the bits the job would give them with the group's lr and decay.
struct HyperGroup {
  size_t begin = 0;
  size_t end = 0;
  float lr_scale = 1.0f;
  float weight_decay = 0.0f;
  size_t size() const { return end - begin; }
};

// The groups an optimizer steps with: `groups` when given, checked (they cover [0, n) in
// order, none empty; lr_scale and weight_decay >= 0 and finite), else the one group of all
// n elements with lr_scale 1 and `weight_decay` (the job's). INVALID_ARGUMENT naming the
// group otherwise.
absl::StatusOr<std::vector<HyperGroup>> ResolveHyperGroups(const std::vector<HyperGroup>& groups,
                                                           size_t n, float weight_decay);

// `h` for a group: lr = h.lr * lr_scale (float; the scale 1 changes no bit), the group's
// weight decay, the rest as `h`.
kernels::AdamHyper GroupHyper(const kernels::AdamHyper& h, const HyperGroup& group);

// A weight-decay schedule's values for the steps that follow: `decays[i]` becomes group i's
// (one per group, each >= 0 and finite). INVALID_ARGUMENT naming the first that is not,
// with `groups` unchanged.
absl::Status SetGroupWeightDecays(const std::vector<double>& decays,
                                  std::vector<HyperGroup>* groups);
// Each group's weight decay, in order.
std::vector<double> GroupWeightDecays(const std::vector<HyperGroup>& groups);
// Whether every group steps with the same lr scale and weight decay: then one set of
// hyper-parameters serves all n elements (a kernel fused over the whole model).
bool GroupsAlike(const std::vector<HyperGroup>& groups);

}  // namespace onebit

#endif  // ONEBIT_WORKER_OPTIM_OPTIM_CHECKS_H_
