// Whole-tensor reductions in a canonical order: cut at slice boundaries, the pieces combined
// in slice order (docs/algorithms.md, "Sums of squares and threads"). A worker that holds a
// whole tensor and a worker that holds one slice of it (issue 47's sharded state) then get
// the same bits: the second computes only the pieces inside its slice, gathers the others,
// and combines the same doubles in the same order.
//
// The rule. A reduction over the elements [begin, end) (global indices into the parameter
// tensor) is cut at every multiple of `stride` inside it: stride is the exchange's
// reduction_stride() (the hierarchical slice, 0 for flat exchanges). Each piece is reduced
// by one Backend call. The pieces' float64 partials are combined in piece order, starting
// from 0.0. With stride 0, or a range inside one slice (stride >= n among them), there is
// one piece, and the result has the bits of one Backend call over the range: each partial
// is >= +0 or NaN, and 0.0 + p, max(0.0, p) are p then.
//
// Computing the partials and combining them are separate calls, so a gather can go between.
// An empty piece's partial is 0.0, which changes neither combination: a gather may send one
// partial per slice, 0.0 where the slice misses the range.
//
// Thread safety: pure functions; the backend calls are the backend's (one thread at a time).
#ifndef ONEBIT_WORKER_OPTIM_SLICED_REDUCTIONS_H_
#define ONEBIT_WORKER_OPTIM_SLICED_REDUCTIONS_H_

#include <cstddef>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/kernels.h"

namespace onebit {

// Global element indices [begin, end).
struct ElementRange {
  size_t begin = 0;
  size_t end = 0;
  size_t size() const { return end > begin ? end - begin : 0; }
  bool empty() const { return end <= begin; }
  bool operator==(const ElementRange& o) const { return begin == o.begin && end == o.end; }
};

// The pieces of `range` cut at the multiples of `stride` inside it, in order, none empty
// (an empty range has none). stride 0: `range` itself. Each piece lies in one slice
// [j*stride, (j+1)*stride).
std::vector<ElementRange> CutAtStride(ElementRange range, size_t stride);
// The same pieces, each intersected with `within`, the empty ones left out. With `within` a
// run of whole slices (a sharded worker's own: [l*stride, l*stride + count)), these are the
// canonical pieces that lie in it, whole.
std::vector<ElementRange> CutAtStride(ElementRange range, size_t stride, ElementRange within);

// Backend::SumSquares of each piece, in order. x[i - origin] is element i (backend memory):
// a whole tensor with origin 0, or a shard with its first element's index. Every piece
// must lie in what x holds.
absl::StatusOr<std::vector<double>> SumSquaresOfPieces(kernels::Backend& backend,
                                                       const float* x, size_t origin,
                                                       absl::Span<const ElementRange> pieces);
// Backend::MaxDenomRatio(eps, v, v_fresh) of each piece, in order, as doubles (exact); v
// and v_fresh indexed as x above.
absl::StatusOr<std::vector<double>> MaxDenomRatioOfPieces(kernels::Backend& backend, float eps,
                                                          const float* v, const float* v_fresh,
                                                          size_t origin,
                                                          absl::Span<const ElementRange> pieces);

// 0.0 + p[0] + p[1] + ... in order (float64).
double AddInOrder(absl::Span<const double> partials);
// The largest of 0.0 and the partials, the first NaN instead if any is one: the CPU
// backend's combination of its own pieces.
double MaxNanWins(absl::Span<const double> partials);

// Exchange::GatherPartials' answer for k reductions (every local rank's k partials, in rank
// order) as k lists, one per reduction, each in rank order: slice order, which AddInOrder
// or MaxNanWins then combine. INTERNAL unless `all` is whole rows of k.
absl::StatusOr<std::vector<std::vector<double>>> PartialsBySlice(absl::Span<const double> all,
                                                                 size_t k);

// Both steps for a worker that holds the range: x is the whole tensor (element i at x[i]).
absl::StatusOr<double> SlicedSumSquares(kernels::Backend& backend, const float* x,
                                        ElementRange range, size_t stride);
absl::StatusOr<double> SlicedMaxDenomRatio(kernels::Backend& backend, float eps, const float* v,
                                           const float* v_fresh, ElementRange range,
                                           size_t stride);

// The trainer's variance change ||now - prev|| / ||now|| (docs/algorithms.md, "When the
// warmup ends") in the same order, on host copies. Per piece, the float64 sums of
// (now[i] - prev[i])^2 and of now[i]^2 over its elements in element order; now[i - origin]
// and prev[i - origin] are element i (host memory).
struct ChangePartials {
  std::vector<double> diff;
  std::vector<double> norm;
};
ChangePartials RelativeChangePartials(const float* now, const float* prev, size_t origin,
                                      absl::Span<const ElementRange> pieces);
// sqrt(AddInOrder(diff) / AddInOrder(norm)), or 0 when that norm is 0.
double RelativeChange(const ChangePartials& partials);

}  // namespace onebit

#endif  // ONEBIT_WORKER_OPTIM_SLICED_REDUCTIONS_H_
