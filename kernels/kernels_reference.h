// Float64 models of the kernels in kernels.h, written from docs/algorithms.md for tests. They
// share no code with the implementations, including an independent coder for the wire
// format, so a bit-layout mistake in either shows up as a disagreement.
#ifndef ONEBIT_KERNELS_KERNELS_REFERENCE_H_
#define ONEBIT_KERNELS_KERNELS_REFERENCE_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/kernels.h"

namespace onebit::kernels::reference {

// A 1-bit tensor: one scale per chunk and one sign (+1 or -1) per element.
struct SignTensor {
  std::vector<double> scales;  // one per chunk
  std::vector<int> signs;      // num_chunks * chunk entries
};

// The wire format of kernels.h, coded bit by bit.
std::vector<uint8_t> EncodeBlocks(const SignTensor& t, size_t chunk);
SignTensor DecodeBlocks(const uint8_t* blocks, size_t num_chunks, size_t chunk);

// m = b1*m + (1-b1)*g.
void Momentum(double beta1, const float* g, std::vector<double>* m);

// Worker compression of m (or of the momentum b1*m + (1-b1)*g when g is non-null) with
// error feedback; err has num_chunks*chunk entries and is updated.
SignTensor CompressWorker(const float* m, const float* g, double beta1, size_t n,
                          size_t num_chunks, size_t chunk, std::vector<double>* err);

// Server aggregation of one chunk: workers[j] is worker j's one-chunk tensor.
SignTensor ServerAggregate(const std::vector<SignTensor>& workers, std::vector<double>* err);

// Decoded values s_r * sign, first n elements.
std::vector<double> Decode(const SignTensor& t, size_t chunk, size_t n);

// INT8 (kernels.h, INT8 WIRE FORMAT): per chunk an offset lo = min, a scale
// (max - min) / 255 and a code q in 0..255 per element, decoding to lo + q * scale.
struct Int8Tensor {
  std::vector<double> scales;   // one per chunk
  std::vector<double> offsets;  // one per chunk
  std::vector<int> codes;       // num_chunks * chunk entries
};

// The int8 wire format, coded byte by byte (scale and offset rounded to float32).
std::vector<uint8_t> EncodeInt8Blocks(const Int8Tensor& t, size_t chunk);
Int8Tensor DecodeInt8Blocks(const uint8_t* blocks, size_t num_chunks, size_t chunk);

// Quantises x[begin, begin + count) as one chunk, appending to t; err[i] = x[i] - decoded.
void QuantizeInt8Chunk(const std::vector<double>& x, size_t begin, size_t count, Int8Tensor* t,
                       std::vector<double>* err);

// As CompressWorker/ServerAggregate, int8: a scale and offset per chunk.
Int8Tensor CompressWorkerInt8(const float* m, const float* g, double beta1, size_t n,
                              size_t num_chunks, size_t chunk, std::vector<double>* err);
Int8Tensor ServerAggregateInt8(const std::vector<Int8Tensor>& workers, std::vector<double>* err);
std::vector<double> DecodeInt8(const Int8Tensor& t, size_t chunk, size_t n);

// The value x takes in a wire format (wire_dtype.h), from the format's definition: round
// to nearest even with its significand bits, down to its smallest subnormal; past its
// largest finite value, +-inf. Infinities, NaN and zeros stay as they are.
double RoundToWire(WireDtype dtype, double x);

void AdamWarmup(const AdamHyper& h, const float* g, double grad_scale, std::vector<double>* m,
                std::vector<double>* v, std::vector<double>* p);

// m *= mask (if non-null), then p -= lr * (m / (sqrt(v) + eps) + wd * p).
void FrozenUpdate(const AdamHyper& h, const std::vector<double>& v, const float* mask,
                  std::vector<double>* m, std::vector<double>* p);

}  // namespace onebit::kernels::reference

#endif  // ONEBIT_KERNELS_KERNELS_REFERENCE_H_
