#include "worker/optim/sliced_reductions.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace onebit {

std::vector<ElementRange> CutAtStride(ElementRange range, size_t stride) {
  std::vector<ElementRange> pieces;
  if (range.empty()) return pieces;
  if (stride == 0) return {range};
  size_t at = range.begin;
  while (at < range.end) {
    // The next multiple of stride above `at`, without overflowing past end.
    const size_t to_next = stride - at % stride;
    const size_t next = range.end - at <= to_next ? range.end : at + to_next;
    pieces.push_back({at, next});
    at = next;
  }
  return pieces;
}

std::vector<ElementRange> CutAtStride(ElementRange range, size_t stride, ElementRange within) {
  std::vector<ElementRange> pieces;
  for (const ElementRange& p : CutAtStride(range, stride)) {
    const ElementRange cut{std::max(p.begin, within.begin), std::min(p.end, within.end)};
    if (!cut.empty()) pieces.push_back(cut);
  }
  return pieces;
}

absl::StatusOr<std::vector<double>> SumSquaresOfPieces(kernels::Backend& backend,
                                                       const float* x, size_t origin,
                                                       absl::Span<const ElementRange> pieces) {
  std::vector<double> partials(pieces.size(), 0.0);
  for (size_t j = 0; j < pieces.size(); ++j) {
    ONEBIT_RETURN_IF_ERROR(
        backend.SumSquares(x + (pieces[j].begin - origin), pieces[j].size(), &partials[j]));
  }
  return partials;
}

absl::StatusOr<std::vector<double>> MaxDenomRatioOfPieces(kernels::Backend& backend, float eps,
                                                          const float* v, const float* v_fresh,
                                                          size_t origin,
                                                          absl::Span<const ElementRange> pieces) {
  std::vector<double> partials(pieces.size(), 0.0);
  for (size_t j = 0; j < pieces.size(); ++j) {
    const size_t at = pieces[j].begin - origin;
    float ratio = 0.0f;
    ONEBIT_RETURN_IF_ERROR(
        backend.MaxDenomRatio(eps, v + at, v_fresh + at, pieces[j].size(), &ratio));
    partials[j] = ratio;
  }
  return partials;
}

double AddInOrder(absl::Span<const double> partials) {
  double total = 0.0;
  for (double p : partials) total += p;
  return total;
}

double MaxNanWins(absl::Span<const double> partials) {
  double total = 0.0;
  for (double p : partials) {
    if (std::isnan(p)) return p;
    total = std::max(total, p);
  }
  return total;
}

absl::StatusOr<double> SlicedSumSquares(kernels::Backend& backend, const float* x,
                                        ElementRange range, size_t stride) {
  ONEBIT_ASSIGN_OR_RETURN(std::vector<double> partials,
                          SumSquaresOfPieces(backend, x, 0, CutAtStride(range, stride)));
  return AddInOrder(partials);
}

absl::StatusOr<double> SlicedMaxDenomRatio(kernels::Backend& backend, float eps, const float* v,
                                           const float* v_fresh, ElementRange range,
                                           size_t stride) {
  ONEBIT_ASSIGN_OR_RETURN(
      std::vector<double> partials,
      MaxDenomRatioOfPieces(backend, eps, v, v_fresh, 0, CutAtStride(range, stride)));
  return MaxNanWins(partials);
}

ChangePartials RelativeChangePartials(const float* now, const float* prev, size_t origin,
                                      absl::Span<const ElementRange> pieces) {
  ChangePartials out;
  out.diff.assign(pieces.size(), 0.0);
  out.norm.assign(pieces.size(), 0.0);
  for (size_t j = 0; j < pieces.size(); ++j) {
    double diff = 0.0, norm = 0.0;
    for (size_t i = pieces[j].begin - origin; i < pieces[j].end - origin; ++i) {
      const double d = double{now[i]} - prev[i];
      diff += d * d;
      norm += double{now[i]} * now[i];
    }
    out.diff[j] = diff;
    out.norm[j] = norm;
  }
  return out;
}

absl::StatusOr<std::vector<std::vector<double>>> PartialsBySlice(absl::Span<const double> all,
                                                                 size_t k) {
  if (k == 0) return std::vector<std::vector<double>>();
  if (all.size() % k != 0) {
    return absl::InternalError(absl::StrCat("the node gathered ", all.size(),
                                            " partials for ", k, " reductions"));
  }
  std::vector<std::vector<double>> by_slice(k);
  for (size_t i = 0; i < all.size(); ++i) by_slice[i % k].push_back(all[i]);
  return by_slice;
}

double RelativeChange(const ChangePartials& partials) {
  const double diff = AddInOrder(partials.diff);
  const double norm = AddInOrder(partials.norm);
  return norm > 0.0 ? std::sqrt(diff / norm) : 0.0;
}

}  // namespace onebit
