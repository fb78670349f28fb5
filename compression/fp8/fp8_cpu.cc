#include "compression/fp8/fp8_cpu.h"

#include <algorithm>
#include <cmath>

#include "compression/fp8/fp8_e4m3.h"

namespace onebit::fp8::cpu {
namespace {

// DecodeUnit of every code, looked up rather than computed: the same floats, bit for bit.
struct UnitTable {
  float value[256];
  UnitTable() {
    for (int c = 0; c < 256; ++c) value[c] = DecodeUnit(static_cast<uint8_t>(c));
  }
};
const float* Unit() {
  static const UnitTable* const table = new UnitTable;
  return table->value;
}

// Encodes the `count` values x held in err into one sub-block (its scale byte and codes);
// err = x - decoded.
void EncodeSubBlock(size_t count, float* err, uint8_t* scale, uint8_t* codes) {
  uint32_t amax = 0;
  for (size_t j = 0; j < count; ++j) amax = std::max(amax, AbsBits(err[j]));
  const uint8_t s = ScaleByte(amax);
  *scale = s;
  if (s == kNanScale) {  // codes 0; every value decodes to NaN
    for (size_t j = 0; j < count; ++j) {
      codes[j] = 0;
      err[j] = err[j] - QuietNan();
    }
    return;
  }
  const int e = ScaleExponent(s);
  const float inv = Pow2(-e), pow2e = Pow2(e);
  const float* unit = Unit();
  for (size_t j = 0; j < count; ++j) codes[j] = EncodeWith(err[j], inv);
  for (size_t j = 0; j < count; ++j) err[j] = err[j] - unit[codes[j]] * pow2e;  // fp8::Decode
}

}  // namespace

void CompressWorker(const float* m, const float* g, float beta1, size_t n, size_t num_chunks,
                    size_t chunk, float* err, uint8_t* out) {
  const float omb1 = 1.0f - beta1;
  const size_t stride = BlockBytes(chunk), scales = ScaleBytes(chunk);
  for (size_t r = 0; r < num_chunks; ++r) {
    for (size_t k = 0; k < scales; ++k) {
      // x into err, a sub-block at a time; the padding's x is its err, already in place.
      const size_t first = r * chunk + k * kSubBlock;
      const size_t count = std::min(kSubBlock, chunk - k * kSubBlock);
      for (size_t i = first; i < std::min(first + count, n); ++i) {
        const float mi = g != nullptr ? std::fma(beta1, m[i], omb1 * g[i]) : m[i];
        err[i] = mi + err[i];
      }
      EncodeSubBlock(count, err + first, out + r * stride + k,
                     out + r * stride + scales + k * kSubBlock);
    }
  }
}

void ServerAggregate(const uint8_t* blocks, int num_workers, size_t chunk, float* err,
                     uint8_t* out) {
  const size_t stride = BlockBytes(chunk), scales = ScaleBytes(chunk);
  const float inv_w = 1.0f / static_cast<float>(num_workers);
  const float* unit = Unit();
  float acc[kSubBlock];
  for (size_t k = 0; k < scales; ++k) {
    const size_t first = k * kSubBlock, count = std::min(kSubBlock, chunk - first);
    // acc_j = sum over workers in rank order, from 0.0f, of fp8::Decode(code_j, scale).
    std::fill(acc, acc + count, 0.0f);
    for (int w = 0; w < num_workers; ++w) {
      const uint8_t* block = blocks + static_cast<size_t>(w) * stride;
      const uint8_t s = block[k];
      const uint8_t* codes = block + scales + first;
      if (s == kNanScale) {
        for (size_t j = 0; j < count; ++j) acc[j] += QuietNan();
        continue;
      }
      const float pow2e = Pow2(ScaleExponent(s));
      for (size_t j = 0; j < count; ++j) acc[j] += unit[codes[j]] * pow2e;
    }
    for (size_t j = 0; j < count; ++j) err[first + j] = std::fma(acc[j], inv_w, err[first + j]);
    EncodeSubBlock(count, err + first, out + k, out + scales + first);
  }
}

void Decode(const uint8_t* blocks, size_t num_chunks, size_t chunk, size_t n, float* out) {
  const size_t stride = BlockBytes(chunk), scales = ScaleBytes(chunk);
  const float* unit = Unit();
  for (size_t r = 0; r < num_chunks && r * chunk < n; ++r) {
    const uint8_t* block = blocks + r * stride;
    const size_t count = std::min(chunk, n - r * chunk);
    for (size_t first = 0; first < count; first += kSubBlock) {
      const uint8_t s = block[first / kSubBlock];
      const uint8_t* codes = block + scales + first;
      float* o = out + r * chunk + first;
      const size_t m = std::min(kSubBlock, count - first);
      if (s == kNanScale) {
        for (size_t j = 0; j < m; ++j) o[j] = QuietNan();
        continue;
      }
      const float pow2e = Pow2(ScaleExponent(s));
      for (size_t j = 0; j < m; ++j) o[j] = unit[codes[j]] * pow2e;  // fp8::Decode
    }
  }
}

}  // namespace onebit::fp8::cpu
