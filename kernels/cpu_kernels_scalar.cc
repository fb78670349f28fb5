// Portable scalar kernels: the definition of the arithmetic that the SIMD and CUDA
// kernels must reproduce.
#include <cmath>

#include "kernels/cpu_kernels.h"

namespace onebit::kernels::cpu {
namespace {

void Momentum(float beta1, const float* g, float* m, size_t n) {
  const float omb1 = 1.0f - beta1;
  for (size_t i = 0; i < n; ++i) m[i] = std::fma(beta1, m[i], omb1 * g[i]);
}

double WorkerInput(const float* m, const float* g, float beta1, size_t n, size_t n_pad,
                   float* err) {
  const float omb1 = 1.0f - beta1;
  double sumsq = 0.0;
  for (size_t i = 0; i < n; ++i) {
    const float mi = g ? std::fma(beta1, m[i], omb1 * g[i]) : m[i];
    const float x = mi + err[i];
    err[i] = x;
    sumsq += static_cast<double>(x) * x;
  }
  for (size_t i = n; i < n_pad; ++i) sumsq += static_cast<double>(err[i]) * err[i];
  return sumsq;
}

double ServerInput(const uint8_t* blocks, size_t stride, int num_workers, size_t first,
                   size_t count, float* err) {
  const float inv_w = 1.0f / static_cast<float>(num_workers);
  double sumsq = 0.0;
  for (size_t i = 0; i < count; ++i) {
    float acc = 0.0f;
    for (int j = 0; j < num_workers; ++j) {
      const uint8_t* block = blocks + j * stride;
      const float s = BlockScale(block);
      acc += SignBit(block + 4 + first / 8, i) ? s : -s;
    }
    const float y = std::fma(acc, inv_w, err[i]);
    err[i] = y;
    sumsq += static_cast<double>(y) * y;
  }
  return sumsq;
}

void SignPack(float* err, size_t chunk, float scale, uint8_t* bits) {
  for (size_t k = 0; k < chunk / 8; ++k) {
    uint8_t byte = 0;
    for (int b = 0; b < 8; ++b) {
      float& x = err[8 * k + b];
      if (x >= 0.0f) {
        byte |= static_cast<uint8_t>(1u << b);
        x = x - scale;
      } else {
        x = x + scale;
      }
    }
    bits[k] = byte;
  }
}

void DecodeBlock(float s, const uint8_t* bits, size_t count, float* out) {
  for (size_t i = 0; i < count; ++i) out[i] = SignBit(bits, i) ? s : -s;
}

void SumRows(const float* rows, size_t stride, int num_rows, size_t count, float* out) {
  for (size_t i = 0; i < count; ++i) {
    float acc = 0.0f;
    for (int j = 0; j < num_rows; ++j) acc += rows[j * stride + i];
    out[i] = acc;
  }
}

void AdamWarmup(const AdamHyper& h, const float* g, float grad_scale, float* m, float* v,
                float* p, size_t n) {
  const float omb1 = 1.0f - h.beta1, omb2 = 1.0f - h.beta2;
  for (size_t i = 0; i < n; ++i) {
    const float gi = g[i] * grad_scale;
    m[i] = std::fma(h.beta1, m[i], omb1 * gi);
    v[i] = std::fma(h.beta2, v[i], (omb2 * gi) * gi);
    p[i] = std::fma(-h.lr, AdamDirection(h, m[i], v[i], p[i]), p[i]);
  }
}

void FrozenUpdate(const AdamHyper& h, const float* v, const float* mask, float* m, float* p,
                  size_t n) {
  for (size_t i = 0; i < n; ++i) {
    if (mask) m[i] = m[i] * mask[i];
    p[i] = std::fma(-h.lr, AdamDirection(h, m[i], v[i], p[i]), p[i]);
  }
}

void DecodeBlockFrozenUpdate(float s, const uint8_t* bits, const AdamHyper& h, const float* v,
                             const float* mask, float* m, float* p, size_t count) {
  for (size_t i = 0; i < count; ++i) {
    float mi = SignBit(bits, i) ? s : -s;
    if (mask) mi = mi * mask[i];
    m[i] = mi;
    p[i] = std::fma(-h.lr, AdamDirection(h, mi, v[i], p[i]), p[i]);
  }
}

double SumSquares(const float* x, size_t n) {
  double sumsq = 0.0;
  for (size_t i = 0; i < n; ++i) sumsq += static_cast<double>(x[i]) * x[i];
  return sumsq;
}

// std::fma where the contract says fma.
void ZeroOneLocal(const AdamHyper& h, const float* g, const float* v, float* m, float* p,
                  float* acc, size_t n) {
  const float one_minus_b1 = 1.0f - h.beta1;
  for (size_t i = 0; i < n; ++i) {
    const float mi = std::fma(h.beta1, m[i], one_minus_b1 * g[i]);
    const float u = AdamDirection(h, mi, v[i], p[i]);
    m[i] = mi;
    p[i] = std::fma(-h.lr, u, p[i]);
    acc[i] = std::fma(-h.lr, u, acc[i]);
  }
}

void ZeroOneSyncPrepare(float eps, const float* v, float* acc, size_t n) {
  for (size_t i = 0; i < n; ++i) acc[i] = acc[i] * (std::sqrt(v[i]) + eps);
}

void ZeroOneSyncApply(float eps, float lrs, const float* v, const float* mask, const float* avg,
                      float* m, float* anchor, float* p, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    if (lrs != 0.0f) {
      float mi = -avg[i] / lrs;
      if (mask != nullptr) mi = mi * mask[i];
      m[i] = mi;
    }
    p[i] = anchor[i] + avg[i] / (std::sqrt(v[i]) + eps);
    anchor[i] = p[i];
  }
}

}  // namespace

const KernelTable& ScalarKernels() {
  static const KernelTable table = {
      "scalar",     Momentum,     WorkerInput,  ServerInput,           SignPack,
      DecodeBlock,  SumRows,      AdamWarmup,   FrozenUpdate, DecodeBlockFrozenUpdate, SumSquares,
      int8::WorkerInput, int8::ServerInput, int8::Quantize, int8::Decode,
      ZeroOneLocal, ZeroOneSyncPrepare, ZeroOneSyncApply,
  };
  return table;
}

}  // namespace onebit::kernels::cpu
