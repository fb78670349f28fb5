#include "kernels/kernels_reference.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace onebit::kernels::reference {
namespace {

double Rms(const std::vector<double>& x, size_t begin, size_t count) {
  if (count == 0) return 0.0;
  double sumsq = 0.0;
  for (size_t i = begin; i < begin + count; ++i) sumsq += x[i] * x[i];
  return std::sqrt(sumsq / count);
}

int Sign(double x) { return x >= 0.0 ? 1 : -1; }

double Direction(const AdamHyper& h, double m, double v, double p) {
  double u = m / (std::sqrt(v) + h.eps);
  const double c = h.update_clip;
  if (c > 0) u = u > c ? c : u < -c ? -c : u;
  if (h.weight_decay > 0) u += static_cast<double>(h.weight_decay) * p;
  return u;
}

}  // namespace

std::vector<uint8_t> EncodeBlocks(const SignTensor& t, size_t chunk) {
  const size_t num_chunks = t.scales.size();
  const size_t block_bytes = 4 + chunk / 8;
  std::vector<uint8_t> out(num_chunks * block_bytes, 0);
  for (size_t r = 0; r < num_chunks; ++r) {
    uint8_t* block = out.data() + r * block_bytes;
    const float scale = static_cast<float>(t.scales[r]);
    uint32_t word;
    std::memcpy(&word, &scale, 4);
    for (int b = 0; b < 4; ++b) block[b] = static_cast<uint8_t>(word >> (8 * b));  // little endian
    for (size_t j = 0; j < chunk; ++j) {
      if (t.signs[r * chunk + j] > 0) block[4 + j / 8] |= static_cast<uint8_t>(1u << (j % 8));
    }
  }
  return out;
}

SignTensor DecodeBlocks(const uint8_t* blocks, size_t num_chunks, size_t chunk) {
  SignTensor t;
  const size_t block_bytes = 4 + chunk / 8;
  for (size_t r = 0; r < num_chunks; ++r) {
    const uint8_t* block = blocks + r * block_bytes;
    uint32_t word = 0;
    for (int b = 0; b < 4; ++b) word |= static_cast<uint32_t>(block[b]) << (8 * b);
    float scale;
    std::memcpy(&scale, &word, 4);
    t.scales.push_back(scale);
    for (size_t j = 0; j < chunk; ++j) {
      t.signs.push_back(((block[4 + j / 8] >> (j % 8)) & 1) ? 1 : -1);
    }
  }
  return t;
}

void Momentum(double beta1, const float* g, std::vector<double>* m) {
  for (size_t i = 0; i < m->size(); ++i) (*m)[i] = beta1 * (*m)[i] + (1 - beta1) * g[i];
}

SignTensor CompressWorker(const float* m, const float* g, double beta1, size_t n,
                          size_t num_chunks, size_t chunk, std::vector<double>* err) {
  const size_t n_pad = num_chunks * chunk;
  std::vector<double> x(n_pad, 0.0);
  for (size_t i = 0; i < n; ++i) x[i] = g ? beta1 * m[i] + (1 - beta1) * g[i] : m[i];
  for (size_t i = 0; i < n_pad; ++i) x[i] += (*err)[i];
  const double scale = Rms(x, 0, n_pad);  // one scale for the whole tensor
  SignTensor t;
  t.scales.assign(num_chunks, scale);
  for (size_t i = 0; i < n_pad; ++i) {
    t.signs.push_back(Sign(x[i]));
    (*err)[i] = x[i] - scale * t.signs[i];
  }
  return t;
}

SignTensor ServerAggregate(const std::vector<SignTensor>& workers, std::vector<double>* err) {
  const size_t chunk = err->size();
  const double w = static_cast<double>(workers.size());
  std::vector<double> y(chunk, 0.0);
  for (size_t i = 0; i < chunk; ++i) {
    for (const SignTensor& worker : workers) y[i] += worker.scales[0] * worker.signs[i];
    y[i] = y[i] / w + (*err)[i];
  }
  SignTensor t;
  t.scales.push_back(Rms(y, 0, chunk));
  for (size_t i = 0; i < chunk; ++i) {
    t.signs.push_back(Sign(y[i]));
    (*err)[i] = y[i] - t.scales[0] * t.signs[i];
  }
  return t;
}

std::vector<double> Decode(const SignTensor& t, size_t chunk, size_t n) {
  std::vector<double> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = t.scales[i / chunk] * t.signs[i];
  return out;
}

void AdamWarmup(const AdamHyper& h, const float* g, double grad_scale, std::vector<double>* m,
                std::vector<double>* v, std::vector<double>* p) {
  for (size_t i = 0; i < p->size(); ++i) {
    const double gi = g[i] * grad_scale;
    (*m)[i] = h.beta1 * (*m)[i] + (1.0 - h.beta1) * gi;
    (*v)[i] = h.beta2 * (*v)[i] + (1.0 - h.beta2) * gi * gi;
    (*p)[i] -= h.lr * Direction(h, (*m)[i], (*v)[i], (*p)[i]);
  }
}

void FrozenUpdate(const AdamHyper& h, const std::vector<double>& v, const float* mask,
                  std::vector<double>* m, std::vector<double>* p) {
  for (size_t i = 0; i < p->size(); ++i) {
    if (mask) (*m)[i] *= mask[i];
    (*p)[i] -= h.lr * Direction(h, (*m)[i], v[i], (*p)[i]);
  }
}

std::vector<uint8_t> EncodeInt8Blocks(const Int8Tensor& t, size_t chunk) {
  const size_t num_chunks = t.scales.size();
  const size_t block_bytes = 8 + chunk;
  std::vector<uint8_t> out(num_chunks * block_bytes, 0);
  for (size_t r = 0; r < num_chunks; ++r) {
    uint8_t* block = out.data() + r * block_bytes;
    const float header[2] = {static_cast<float>(t.scales[r]), static_cast<float>(t.offsets[r])};
    for (int h = 0; h < 2; ++h) {
      uint32_t word;
      std::memcpy(&word, &header[h], 4);
      for (int b = 0; b < 4; ++b) block[4 * h + b] = static_cast<uint8_t>(word >> (8 * b));
    }
    for (size_t j = 0; j < chunk; ++j) block[8 + j] = static_cast<uint8_t>(t.codes[r * chunk + j]);
  }
  return out;
}

Int8Tensor DecodeInt8Blocks(const uint8_t* blocks, size_t num_chunks, size_t chunk) {
  Int8Tensor t;
  const size_t block_bytes = 8 + chunk;
  for (size_t r = 0; r < num_chunks; ++r) {
    const uint8_t* block = blocks + r * block_bytes;
    float header[2];
    for (int h = 0; h < 2; ++h) {
      uint32_t word = 0;
      for (int b = 0; b < 4; ++b) word |= static_cast<uint32_t>(block[4 * h + b]) << (8 * b);
      std::memcpy(&header[h], &word, 4);
    }
    t.scales.push_back(header[0]);
    t.offsets.push_back(header[1]);
    for (size_t j = 0; j < chunk; ++j) t.codes.push_back(block[8 + j]);
  }
  return t;
}

void QuantizeInt8Chunk(const std::vector<double>& x, size_t begin, size_t count, Int8Tensor* t,
                       std::vector<double>* err) {
  double lo = 0.0, hi = 0.0;
  if (count > 0) {
    lo = *std::min_element(x.begin() + begin, x.begin() + begin + count);
    hi = *std::max_element(x.begin() + begin, x.begin() + begin + count);
  }
  const double scale = (hi - lo) / 255.0;
  t->scales.push_back(scale);
  t->offsets.push_back(lo);
  for (size_t i = begin; i < begin + count; ++i) {
    const int q = scale > 0 ? static_cast<int>(std::clamp(std::nearbyint((x[i] - lo) / scale),
                                                          0.0, 255.0))
                            : 0;
    t->codes.push_back(q);
    (*err)[i] = x[i] - (lo + q * scale);
  }
}

Int8Tensor CompressWorkerInt8(const float* m, const float* g, double beta1, size_t n,
                              size_t num_chunks, size_t chunk, std::vector<double>* err) {
  const size_t n_pad = num_chunks * chunk;
  std::vector<double> x(n_pad, 0.0);
  for (size_t i = 0; i < n; ++i) x[i] = g ? beta1 * m[i] + (1 - beta1) * g[i] : m[i];
  for (size_t i = 0; i < n_pad; ++i) x[i] += (*err)[i];
  Int8Tensor t;
  for (size_t r = 0; r < num_chunks; ++r) QuantizeInt8Chunk(x, r * chunk, chunk, &t, err);
  return t;
}

Int8Tensor ServerAggregateInt8(const std::vector<Int8Tensor>& workers, std::vector<double>* err) {
  const size_t chunk = err->size();
  const double w = static_cast<double>(workers.size());
  std::vector<double> y(chunk, 0.0);
  for (size_t i = 0; i < chunk; ++i) {
    for (const Int8Tensor& k : workers) y[i] += k.offsets[0] + k.codes[i] * k.scales[0];
    y[i] = y[i] / w + (*err)[i];
  }
  Int8Tensor t;
  QuantizeInt8Chunk(y, 0, chunk, &t, err);
  return t;
}

std::vector<double> DecodeInt8(const Int8Tensor& t, size_t chunk, size_t n) {
  std::vector<double> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = t.offsets[i / chunk] + t.codes[i] * t.scales[i / chunk];
  return out;
}

double RoundToWire(WireDtype dtype, double x) {
  if (dtype == WireDtype::kFp32) return static_cast<float>(x);
  if (!std::isfinite(x) || x == 0.0) return x;
  const int precision = dtype == WireDtype::kBf16 ? 8 : 11;  // significand bits
  const int emin = dtype == WireDtype::kBf16 ? -126 : -14;   // of the smallest normal
  const double max =
      dtype == WireDtype::kBf16 ? std::ldexp(2.0 - std::ldexp(1.0, -7), 127) : 65504.0;
  const int e = std::max(std::ilogb(x), emin);
  const double quantum = std::ldexp(1.0, e - (precision - 1));
  const double r = std::nearbyint(x / quantum) * quantum;  // ties to even
  return std::fabs(r) > max ? std::copysign(HUGE_VAL, x) : r;
}

}  // namespace onebit::kernels::reference
