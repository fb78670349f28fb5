// Fashion-MNIST from Debian's dataset-fashion-mnist: the IDX file reader, the data set in
// memory, and the sampler that decides which training examples a worker uses at a step.
#ifndef ONEBIT_WORKER_WORKLOADS_FASHION_MNIST_H_
#define ONEBIT_WORKER_WORKLOADS_FASHION_MNIST_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace onebit {

inline constexpr char kDefaultFashionMnistDir[] = "/usr/share/datasets/fashion-mnist";

// An IDX array of unsigned bytes (type code 0x08), the only type MNIST-style files use.
struct IdxArray {
  std::vector<int64_t> dims;
  std::vector<uint8_t> data;  // row-major, product(dims) bytes
};

// Reads an IDX file: a big-endian header (0x00 0x00 type ndims, then ndims uint32 sizes)
// and the data. Plain or gzip-compressed (detected from the content). Every problem is an
// error naming the file: missing (kNotFound), not IDX, wrong type, absurd sizes, truncated,
// trailing bytes, corrupt gzip (kDataLoss / kInvalidArgument).
absl::StatusOr<IdxArray> ReadIdxFile(const std::string& path);

// Labelled images, pixels as stored (0..255); Gather normalises them.
struct LabeledImages {
  int64_t count = 0;
  int rows = 0;
  int cols = 0;
  std::vector<uint8_t> pixels;  // count * rows * cols, one image after another
  std::vector<uint8_t> labels;  // count, each < kFashionMnistClasses

  int64_t pixels_per_image() const { return static_cast<int64_t>(rows) * cols; }
  // Writes the images `indices[0..n)` as the columns of a pixels_per_image() x n
  // column-major matrix (one image per column), pixels scaled to [0, 1] as p / 255.
  void Gather(const int64_t* indices, int64_t n, float* out) const;
};

inline constexpr int kFashionMnistClasses = 10;

struct FashionMnist {
  LabeledImages train;  // 60000 images
  LabeledImages test;   // 10000 images
};

// Loads the four files (train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-...) from
// `dir`, each plain or with .gz. Missing files give kNotFound with "Fashion-MNIST not found
// in DIR: install Debian's dataset-fashion-mnist (apt-get install dataset-fashion-mnist)".
// Shapes are checked: 3-D 28x28 images, 1-D labels of the same count, labels < 10.
absl::StatusOr<std::shared_ptr<const FashionMnist>> LoadFashionMnist(const std::string& dir);

// Which training examples a worker uses at a step. The global batch of step t is the
// W*B consecutive positions starting at (t-1)*W*B of an endless sequence of epochs, each a
// pseudo-random permutation of the examples (keyed by seed and epoch); rank r takes
// positions [r*B, (r+1)*B) of it. So every epoch visits each example once, workers never
// share an example within a step, and nothing depends on state: any step can be computed
// first (resume) and every run with the same seed sees the same samples.
class BatchSampler {
 public:
  BatchSampler(int64_t num_examples, uint64_t seed, int rank, int world_size, int64_t micro_batch);

  int64_t micro_batch() const { return micro_batch_; }
  // Writes micro_batch() example indices for `step` (>= 1).
  void Indices(int64_t step, int64_t* out) const;
  // Position `pos` of epoch `epoch`'s permutation: a bijection of [0, num_examples).
  int64_t Permute(uint64_t epoch, int64_t pos) const;

 private:
  int64_t num_examples_;
  uint64_t seed_;
  int rank_;
  int world_size_;
  int64_t micro_batch_;
  int half_bits_;  // the Feistel network permutes [0, 4^half_bits_) >= num_examples_
};

}  // namespace onebit

#endif  // ONEBIT_WORKER_WORKLOADS_FASHION_MNIST_H_
