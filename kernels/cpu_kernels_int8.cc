// The int8 format's CPU kernels (kernels.h, INT8 WIRE FORMAT): plain loops, the same on
// every CPU (the AVX2 and scalar backends both run them). They evaluate exactly the
// float32 expressions of kernels.h, which the CUDA kernels reproduce bit for bit.
#include <cmath>
#include <cstring>

#include "kernels/cpu_kernels.h"

namespace onebit::kernels::cpu::int8 {
namespace {

inline void Track(float x, Range* r) {
  if (x != x) {
    r->nan = true;
    return;
  }
  if (x < r->lo) r->lo = x;
  if (x > r->hi) r->hi = x;
}

inline float DecodeValue(uint8_t q, float scale, float lo) {
  return std::fma(static_cast<float>(q), scale, lo);
}

}  // namespace

void Merge(const Range& from, Range* into) {
  into->nan = into->nan || from.nan;
  if (from.lo < into->lo) into->lo = from.lo;
  if (from.hi > into->hi) into->hi = from.hi;
}

Params ParamsFor(const Range& range) {
  Params p;
  if (range.nan || range.lo > range.hi) {  // a NaN, or no element at all
    p.lo = range.nan ? std::nanf("") : 0.0f;
    p.scale = range.nan ? std::nanf("") : 0.0f;
    p.inv = 0.0f;
    return p;
  }
  p.lo = range.lo + 0.0f;
  const float hi = range.hi + 0.0f;
  p.scale = static_cast<float>((static_cast<double>(hi) - static_cast<double>(p.lo)) / 255.0);
  if (p.scale != p.scale) p.scale = std::nanf("");  // inf - inf: one NaN on every machine
  p.inv = 0.0f;
  if (p.scale > 0.0f && std::isfinite(p.scale)) {
    const float inv = 1.0f / p.scale;
    if (std::isfinite(inv)) p.inv = inv;
  }
  return p;
}

void WorkerInput(const float* m, const float* g, float beta1, size_t n, size_t count, float* err,
                 Range* range) {
  const float omb1 = 1.0f - beta1;
  for (size_t i = 0; i < n; ++i) {
    const float mi = g ? std::fma(beta1, m[i], omb1 * g[i]) : m[i];
    const float x = mi + err[i];
    err[i] = x;
    Track(x, range);
  }
  for (size_t i = n; i < count; ++i) Track(err[i], range);
}

void ServerInput(const uint8_t* blocks, size_t stride, int num_workers, size_t first,
                 size_t count, float* err, Range* range) {
  const float inv_w = 1.0f / static_cast<float>(num_workers);
  for (size_t i = 0; i < count; ++i) {
    float acc = 0.0f;
    for (int j = 0; j < num_workers; ++j) {
      const uint8_t* block = blocks + j * stride;
      acc += DecodeValue(block[8 + first + i], BlockScale(block), BlockOffset(block));
    }
    const float y = std::fma(acc, inv_w, err[i]);
    err[i] = y;
    Track(y, range);
  }
}

void Quantize(const Params& p, size_t count, float* err, uint8_t* codes) {
  for (size_t i = 0; i < count; ++i) {
    const float x = err[i];
    float r = (x - p.lo) * p.inv;
    r = r > 0.0f ? r : 0.0f;  // NaN -> 0
    r = r < 255.0f ? r : 255.0f;
    const uint8_t q = static_cast<uint8_t>(std::nearbyint(r));  // ties to even
    codes[i] = q;
    err[i] = x - DecodeValue(q, p.scale, p.lo);
  }
}

void Decode(const uint8_t* block, size_t first, size_t count, float* out) {
  const float scale = BlockScale(block), lo = BlockOffset(block);
  const uint8_t* codes = block + 8 + first;
  for (size_t i = 0; i < count; ++i) out[i] = DecodeValue(codes[i], scale, lo);
}

}  // namespace onebit::kernels::cpu::int8
