#include "worker/exchange/compressed_allreduce_reference.h"

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

size_t ReferencePaddedSize(size_t n, int w) {
  const size_t ws = static_cast<size_t>(w);
  const size_t lcm = ws / Gcd(ws, 8) * 8;
  const size_t multiple = ws * lcm;
  return (n + multiple - 1) / multiple * multiple;
}

ReferenceCompressedAllreduce::ReferenceCompressedAllreduce(int workers, size_t n)
    : w_(workers),
      n_(n),
      n_pad_(ReferencePaddedSize(n, workers)),
      chunk_(n_pad_ / static_cast<size_t>(workers)),
      worker_error_(workers, std::vector<double>(n_pad_, 0.0)),
      server_error_(workers, std::vector<double>(chunk_, 0.0)) {}

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
    const double s = Rms(x, 0, n_pad_);
    for (size_t j = 0; j < n_pad_; ++j) {
      sent[i][j] = s * Sign(x[j]);
      worker_error_[i][j] = x[j] - sent[i][j];
    }
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
    const double s = Rms(y, begin, begin + chunk_);
    for (size_t j = 0; j < chunk_; ++j) {
      result[begin + j] = s * Sign(y[begin + j]);
      server_error_[r][j] = y[begin + j] - result[begin + j];
    }
  }
  result.resize(n_);
  return result;
}

}  // namespace onebit
