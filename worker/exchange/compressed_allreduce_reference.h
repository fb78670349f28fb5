// CompressedAllreduce (docs/algorithms.md) in float64, written from the text for tests, sharing
// no code with the implementation: all W workers and servers live in one object.
#ifndef ONEBIT_WORKER_EXCHANGE_COMPRESSED_ALLREDUCE_REFERENCE_H_
#define ONEBIT_WORKER_EXCHANGE_COMPRESSED_ALLREDUCE_REFERENCE_H_

#include <cstddef>
#include <vector>

namespace onebit {

// N_pad for n elements over w workers in peer mode: a multiple of w * lcm(w, 8).
size_t ReferencePaddedSize(size_t n, int w);

// How an int8 result compares with the int8 model, element by element: a value the model
// puts within float rounding of a code boundary (k + 1/2) may get the neighbouring code,
// one step ((max - min)/255 of `want`) off, and error feedback carries that on (a flip
// of a chunk's min or max moves that chunk's offset, and a share of its codes with it);
// those "flips" are counted apart from the elements that agree to float rounding (1e-5 of
// the range). worst_steps: the largest difference of a flip, in steps.
struct Int8Comparison {
  size_t flips = 0;
  double worst_steps = 0;
};
Int8Comparison CompareInt8(const std::vector<float>& got, const std::vector<double>& want);

// CompressedAllreduce in float64 with its own error state (peer layout: W chunks).
class ReferenceCompressedAllreduce {
 public:
  // int8: per chunk an offset (the min) and a scale (max - min) / 255, codes rounded to
  // nearest (kernels/kernels.h, INT8 WIRE FORMAT); otherwise 1 bit.
  ReferenceCompressedAllreduce(int workers, size_t n, bool int8 = false);
  // inputs[i] is worker i's tensor (n values); returns the tensor every worker ends with.
  std::vector<double> Run(const std::vector<std::vector<double>>& inputs);

  // Every worker and server error back to zero (0/1 Adam's reset at var_freeze_step).
  void ResetErrors();

  const std::vector<std::vector<double>>& worker_errors() const { return worker_error_; }
  const std::vector<std::vector<double>>& server_errors() const { return server_error_; }

 private:
  // x[begin, end) quantised in place to what the chunk decodes to (int8_ decides how).
  void Quantize(std::vector<double>* x, size_t begin, size_t end) const;

  int w_;
  bool int8_;
  size_t n_, n_pad_, chunk_;
  std::vector<std::vector<double>> worker_error_;  // [w][n_pad]
  std::vector<std::vector<double>> server_error_;  // [w][chunk]
};

}  // namespace onebit

#endif  // ONEBIT_WORKER_EXCHANGE_COMPRESSED_ALLREDUCE_REFERENCE_H_
