// Internal to the CPU backend: the host-memory kernels as a table of functions, with a
// scalar table and (where compiled) an AVX2+FMA table. cpu_backend.cc picks one at run
// time. The element-wise formulas are the ones in kernels.h; both tables evaluate them in
// the same order, so they differ only in the summation order of sums of squares.
#ifndef ONEBIT_KERNELS_CPU_KERNELS_H_
#define ONEBIT_KERNELS_CPU_KERNELS_H_

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kernels/kernels.h"

namespace onebit::kernels::cpu {

// The int8 format (kernels.h, INT8 WIRE FORMAT): the scalar kernels (cpu_kernels_int8.cc),
// which the AVX2 ones reproduce bit for bit (int8 has no sum of squares).
namespace int8 {

// The running min and max of some values, NaN noted apart. Empty: lo > hi.
struct Range {
  float lo = INFINITY;
  float hi = -INFINITY;
  bool nan = false;
};
void Merge(const Range& from, Range* into);

// A chunk's scale, offset and 1/scale (0 where kernels.h says so).
struct Params {
  float scale = 0.0f, lo = 0.0f, inv = 0.0f;
};
Params ParamsFor(const Range& range);

// err[i] = x[i] for i < count (x = m' + err for i < n, err past n); tracks x into range.
void WorkerInput(const float* m, const float* g, float beta1, size_t n, size_t count, float* err,
                 Range* range);
// err[i] = y = fma(sum_j decode(block j)[first + i], 1/W, err[i]) for i < count, the W
// blocks `stride` bytes apart, `err` pointing at element `first`; tracks y into range.
void ServerInput(const uint8_t* blocks, size_t stride, int num_workers, size_t first,
                 size_t count, float* err, Range* range);
// codes[i] = q(err[i]); err[i] -= decode(q) for i < count.
void Quantize(const Params& p, size_t count, float* err, uint8_t* codes);
// out[i] = decode(block)[first + i] for i < count.
void Decode(const uint8_t* block, size_t first, size_t count, float* out);

}  // namespace int8

struct KernelTable {
  const char* name;
  // m = fma(b1, m, (1-b1)*g).
  void (*momentum)(float beta1, const float* g, float* m, size_t n);
  // Worker pass 1: err[i] = x[i] (see Backend::CompressWorker); returns sum of x^2.
  double (*worker_input)(const float* m, const float* g, float beta1, size_t n, size_t n_pad,
                         float* err);
  // Server pass 1 over elements [first, first + count) of W blocks `stride` bytes apart
  // (first and count multiples of 8): err[i] = fma(sum_j decode(block j)[first + i], 1/W,
  // err[i]) for i < count, `err` pointing at element `first`; returns sum of y^2.
  double (*server_input)(const uint8_t* blocks, size_t stride, int num_workers, size_t first,
                         size_t count, float* err);
  // Sign pass over one chunk of x held in err (chunk % 8 == 0): packed signs to `bits`,
  // err = x - s*sign(x).
  void (*sign_pack)(float* err, size_t chunk, float scale, uint8_t* bits);
  // out[i] = (bit i of bits ? s : -s) for i < count.
  void (*decode_block)(float scale, const uint8_t* bits, size_t count, float* out);
  // out[i] = sum over rows j in order, from 0.0f, of rows[j * stride + i], for i < count.
  void (*sum_rows)(const float* rows, size_t stride, int num_rows, size_t count, float* out);
  void (*adam_warmup)(const AdamHyper& h, const float* g, float grad_scale, float* m, float* v,
                      float* p, size_t n);
  // m *= mask (if any); p -= lr*u.
  void (*frozen_update)(const AdamHyper& h, const float* v, const float* mask, float* m,
                        float* p, size_t n);
  // m = decode(scale, bits)[0..count) * mask; p -= lr*u.
  void (*decode_block_frozen_update)(float scale, const uint8_t* bits, const AdamHyper& h,
                                     const float* v, const float* mask, float* m, float* p,
                                     size_t count);
  double (*sum_squares)(const float* x, size_t n);
  // int8: as int8::WorkerInput, ServerInput, Quantize and Decode.
  void (*int8_worker_input)(const float* m, const float* g, float beta1, size_t n, size_t count,
                            float* err, int8::Range* range);
  void (*int8_server_input)(const uint8_t* blocks, size_t stride, int num_workers, size_t first,
                            size_t count, float* err, int8::Range* range);
  void (*int8_quantize)(const int8::Params& p, size_t count, float* err, uint8_t* codes);
  void (*int8_decode)(const uint8_t* block, size_t first, size_t count, float* out);
  // 0/1 Adam, as Backend::ZeroOneLocalUpdate, ZeroOneSyncPrepare and ZeroOneSyncApply.
  void (*zero_one_local)(const AdamHyper& h, const float* g, const float* v, float* m, float* p,
                         float* acc, size_t n);
  void (*zero_one_sync_prepare)(float eps, const float* v, float* acc, size_t n);
  void (*zero_one_sync_apply)(float eps, float lrs, const float* v, const float* mask,
                              const float* avg, float* m, float* anchor, float* p, size_t n);
};

const KernelTable& ScalarKernels();
// Null when this build has no AVX2 code.
const KernelTable* Avx2Kernels();

// Shared scalar element formulas. `static` on purpose: the AVX2 file compiles its own
// copies with AVX2 enabled, and an inline (linkonce) copy from there must never be the
// one the scalar path runs on a CPU without AVX2.
static inline float BlockScale(const uint8_t* block) {
  float s;
  std::memcpy(&s, block, sizeof(s));
  return s;
}
static inline void SetBlockScale(uint8_t* block, float s) { std::memcpy(block, &s, sizeof(s)); }
static inline bool SignBit(const uint8_t* bits, size_t j) { return (bits[j >> 3] >> (j & 7)) & 1u; }

static inline float BlockOffset(const uint8_t* block) {
  float lo;
  std::memcpy(&lo, block + 4, sizeof(lo));
  return lo;
}
static inline void SetBlockOffset(uint8_t* block, float lo) {
  std::memcpy(block + 4, &lo, sizeof(lo));
}

static inline float AdamDirection(const AdamHyper& h, float m, float v, float p) {
  float u = m / (std::sqrt(v) + h.eps);
  if (h.update_clip > 0.0f) u = u > h.update_clip ? h.update_clip : u < -h.update_clip ? -h.update_clip : u;
  if (h.weight_decay > 0.0f) u = std::fma(h.weight_decay, p, u);
  return u;
}

}  // namespace onebit::kernels::cpu

#endif  // ONEBIT_KERNELS_CPU_KERNELS_H_
