#include "worker/exchange/compressed_allreduce_reference.h"

#include <algorithm>
#include <cmath>

namespace onebit {
namespace {

size_t Gcd(size_t a, size_t b) { return b == 0 ? a : Gcd(b, a % b); }

double Rms(const std::vector<double>& x, size_t begin, size_t end) {
  if (end == begin) return 0.0;
  double sumsq = 0.0;
  for (size_t i = begin; i < end; ++i) sumsq += x[i] * x[i];
  return std::sqrt(sumsq / static_cast<double>(end - begin));
}

double Sign(double x) { return x >= 0.0 ? 1.0 : -1.0; }

}  // namespace

Int8Comparison CompareInt8(const std::vector<float>& got, const std::vector<double>& want) {
  Int8Comparison c;
  if (want.empty()) return c;
  const auto [lo, hi] = std::minmax_element(want.begin(), want.end());
  const double step = (*hi - *lo) / 255;
  for (size_t i = 0; i < want.size() && i < got.size(); ++i) {
    const double d = std::abs(got[i] - want[i]);
    // Float rounding, relative to the terms: the offset and q * scale, up to the range.
    if (d <= 1e-5 * (std::abs(want[i]) + 255 * step)) continue;
    ++c.flips;
    c.worst_steps = std::max(c.worst_steps, step > 0 ? d / step : HUGE_VAL);
  }
  return c;
}

size_t ReferencePaddedSize(size_t n, int w) {
  const size_t ws = static_cast<size_t>(w);
  const size_t lcm = ws / Gcd(ws, 8) * 8;
  const size_t multiple = ws * lcm;
  return (n + multiple - 1) / multiple * multiple;
}

ReferenceCompressedAllreduce::ReferenceCompressedAllreduce(int workers, size_t n, bool int8)
    : w_(workers),
      int8_(int8),
      n_(n),
      n_pad_(ReferencePaddedSize(n, workers)),
      chunk_(n_pad_ / static_cast<size_t>(workers)),
      worker_error_(workers, std::vector<double>(n_pad_, 0.0)),
      server_error_(workers, std::vector<double>(chunk_, 0.0)) {}

void ReferenceCompressedAllreduce::Quantize(std::vector<double>* x, size_t begin,
                                            size_t end) const {
  if (!int8_) {  // one scale for [begin, end)
    const double s = Rms(*x, begin, end);
    for (size_t j = begin; j < end; ++j) (*x)[j] = s * Sign((*x)[j]);
    return;
  }
  for (size_t c = begin; c < end; c += chunk_) {  // a scale and an offset per chunk
    double lo = (*x)[c], hi = (*x)[c];
    for (size_t j = c; j < c + chunk_; ++j) {
      lo = std::min(lo, (*x)[j]);
      hi = std::max(hi, (*x)[j]);
    }
    const double scale = (hi - lo) / 255.0;
    for (size_t j = c; j < c + chunk_; ++j) {
      const double q =
          scale > 0 ? std::min(255.0, std::max(0.0, std::nearbyint(((*x)[j] - lo) / scale))) : 0;
      (*x)[j] = lo + q * scale;
    }
  }
}

void ReferenceCompressedAllreduce::ResetErrors() {
  for (auto& e : worker_error_) e.assign(e.size(), 0.0);
  for (auto& e : server_error_) e.assign(e.size(), 0.0);
}

std::vector<double> ReferenceCompressedAllreduce::Run(
    const std::vector<std::vector<double>>& inputs) {
  // Workers: x = pad(m_i) + error, one scale, signs, new error.
  std::vector<std::vector<double>> sent(w_, std::vector<double>(n_pad_));
  for (int i = 0; i < w_; ++i) {
    std::vector<double> x(n_pad_, 0.0);
    for (size_t j = 0; j < n_; ++j) x[j] = inputs[i][j];
    for (size_t j = 0; j < n_pad_; ++j) x[j] += worker_error_[i][j];
    sent[i] = x;
    Quantize(&sent[i], 0, n_pad_);
    for (size_t j = 0; j < n_pad_; ++j) worker_error_[i][j] = x[j] - sent[i][j];
  }
  // Servers: average their chunk, add the server error, recompress.
  std::vector<double> result(n_pad_);
  for (int r = 0; r < w_; ++r) {
    const size_t begin = r * chunk_;
    std::vector<double> y(n_pad_, 0.0);  // only [begin, begin + chunk) is used
    for (size_t j = 0; j < chunk_; ++j) {
      double sum = 0.0;
      for (int i = 0; i < w_; ++i) sum += sent[i][begin + j];
      y[begin + j] = sum / w_ + server_error_[r][j];
    }
    std::vector<double> q = y;
    Quantize(&q, begin, begin + chunk_);
    for (size_t j = 0; j < chunk_; ++j) {
      result[begin + j] = q[begin + j];
      server_error_[r][j] = y[begin + j] - result[begin + j];
    }
  }
  result.resize(n_);
  return result;
}

}  // namespace onebit
