#include "worker/workloads/fashion_mnist.h"

#include <sys/stat.h>
#include <zlib.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "worker/workloads/workload.h"

namespace onebit {
namespace {

// MNIST files are tens of MB; anything claiming more than this is corrupt, and refusing it
// keeps a bad header from making us allocate gigabytes.
constexpr uint64_t kMaxIdxBytes = uint64_t{1} << 31;
constexpr uint8_t kIdxTypeUnsignedByte = 0x08;
constexpr int kMaxIdxDims = 4;

struct GzCloser {
  void operator()(gzFile_s* f) const { gzclose(f); }
};
using GzFile = std::unique_ptr<gzFile_s, GzCloser>;

bool FileExists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

// Reads up to n bytes; fewer only at the end of the data. gzread transparently reads
// files that are not gzip.
absl::StatusOr<size_t> ReadUpTo(gzFile f, const std::string& path, void* buf, size_t n) {
  constexpr size_t kMaxRead = size_t{1} << 30;  // gzread takes an unsigned int
  size_t total = 0;
  while (total < n) {
    const unsigned want = static_cast<unsigned>(std::min(n - total, kMaxRead));
    const int got = gzread(f, static_cast<char*>(buf) + total, want);
    if (got < 0) {
      int errnum = 0;
      const char* message = gzerror(f, &errnum);
      return absl::DataLossError(absl::StrCat(path, ": corrupt gzip data: ", message));
    }
    if (got == 0) break;
    total += static_cast<size_t>(got);
  }
  // A gzip stream cut short reads as a short file plus a pending error.
  int errnum = Z_OK;
  const char* message = gzerror(f, &errnum);
  if (errnum != Z_OK && errnum != Z_STREAM_END) {
    return absl::DataLossError(absl::StrCat(path, ": corrupt or truncated gzip data: ", message));
  }
  return total;
}

uint32_t BigEndian32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | p[3];
}

// The first of `base` and `base`.gz that exists in dir, or "" if neither does.
std::string FindFile(const std::string& dir, const std::string& base) {
  for (const std::string& name : {base, base + ".gz"}) {
    std::string path = absl::StrCat(dir, "/", name);
    if (FileExists(path)) return path;
  }
  return "";
}

absl::StatusOr<LabeledImages> LoadSplit(const std::string& images_path,
                                        const std::string& labels_path) {
  ONEBIT_ASSIGN_OR_RETURN(IdxArray images, ReadIdxFile(images_path));
  ONEBIT_ASSIGN_OR_RETURN(IdxArray labels, ReadIdxFile(labels_path));
  if (images.dims.size() != 3 || images.dims[1] != 28 || images.dims[2] != 28) {
    return absl::InvalidArgumentError(absl::StrCat(images_path,
                                                   ": expected images of shape (N, 28, 28), got (",
                                                   absl::StrJoin(images.dims, ", "), ")"));
  }
  if (labels.dims.size() != 1) {
    return absl::InvalidArgumentError(absl::StrCat(labels_path, ": expected 1-D labels, got ",
                                                   labels.dims.size(), " dimensions"));
  }
  if (labels.dims[0] != images.dims[0]) {
    return absl::InvalidArgumentError(absl::StrCat(labels_path, ": ", labels.dims[0],
                                                   " labels for ", images.dims[0], " images in ",
                                                   images_path));
  }
  for (size_t i = 0; i < labels.data.size(); ++i) {
    if (labels.data[i] >= kFashionMnistClasses) {
      return absl::InvalidArgumentError(absl::StrCat(labels_path, ": label ", i, " is ",
                                                     int{labels.data[i]}, ", not in [0, ",
                                                     kFashionMnistClasses, ")"));
    }
  }
  LabeledImages split;
  split.count = images.dims[0];
  split.rows = static_cast<int>(images.dims[1]);
  split.cols = static_cast<int>(images.dims[2]);
  split.pixels = std::move(images.data);
  split.labels = std::move(labels.data);
  return split;
}

// A 4-round Feistel network on 2*half_bits bits: a keyed bijection of [0, 4^half_bits).
uint64_t Feistel(uint64_t x, uint64_t key, int half_bits) {
  const uint64_t mask = (uint64_t{1} << half_bits) - 1;
  uint64_t left = x >> half_bits;
  uint64_t right = x & mask;
  for (uint64_t round = 0; round < 4; ++round) {
    const uint64_t next = left ^ (HashCombine(key, (round << 40) ^ right) & mask);
    left = right;
    right = next;
  }
  return (left << half_bits) | right;
}

}  // namespace

absl::StatusOr<IdxArray> ReadIdxFile(const std::string& path) {
  if (!FileExists(path)) {
    return absl::NotFoundError(absl::StrCat(path, ": no such file"));
  }
  GzFile file(gzopen(path.c_str(), "rb"));
  if (file == nullptr) {
    const int error = errno;
    return absl::Status(absl::ErrnoToStatusCode(error),
                        absl::StrCat(path, ": cannot open: ", std::strerror(error)));
  }
  gzbuffer(file.get(), 1 << 20);

  std::array<uint8_t, 4> magic;
  ONEBIT_ASSIGN_OR_RETURN(size_t got, ReadUpTo(file.get(), path, magic.data(), magic.size()));
  if (got < magic.size() || magic[0] != 0 || magic[1] != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(path,
                     ": not an IDX file (it must start with two zero bytes, a type and a "
                     "number of dimensions)"));
  }
  if (magic[2] != kIdxTypeUnsignedByte) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": IDX element type 0x", absl::Hex(magic[2]), " is not unsigned byte (0x08)"));
  }
  const int ndims = magic[3];
  if (ndims < 1 || ndims > kMaxIdxDims) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": IDX file with ", ndims, " dimensions (expected 1 to ", kMaxIdxDims, ")"));
  }

  std::array<uint8_t, 4 * kMaxIdxDims> header;
  ONEBIT_ASSIGN_OR_RETURN(got, ReadUpTo(file.get(), path, header.data(), 4 * ndims));
  if (got < static_cast<size_t>(4 * ndims)) {
    return absl::DataLossError(absl::StrCat(path, ": truncated IDX header"));
  }
  IdxArray array;
  uint64_t total = 1;
  for (int d = 0; d < ndims; ++d) {
    const uint32_t size = BigEndian32(&header[4 * d]);
    array.dims.push_back(size);
    total *= size;  // cannot overflow: checked against the cap at every step
    if (total > kMaxIdxBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": IDX dimensions (", absl::StrJoin(array.dims, ", "),
                       "...) exceed the limit of ", kMaxIdxBytes, " bytes: a corrupt header?"));
    }
  }

  array.data.resize(total);
  ONEBIT_ASSIGN_OR_RETURN(got, ReadUpTo(file.get(), path, array.data.data(), total));
  if (got < total) {
    return absl::DataLossError(absl::StrCat(path, ": truncated: the header promises ", total,
                                            " bytes of data (", absl::StrJoin(array.dims, " x "),
                                            "), the file holds ", got));
  }
  uint8_t extra;
  ONEBIT_ASSIGN_OR_RETURN(got, ReadUpTo(file.get(), path, &extra, 1));
  if (got != 0) {
    return absl::DataLossError(absl::StrCat(path, ": trailing bytes after the ", total,
                                            " bytes of data that the header promises"));
  }
  return array;
}

void LabeledImages::Gather(const int64_t* indices, int64_t n, float* out) const {
  // p / 255 in float, exactly as the GPU gather computes it.
  static const std::array<float, 256> kScaled = [] {
    std::array<float, 256> table;
    for (int p = 0; p < 256; ++p) table[p] = static_cast<float>(p) / 255.0f;
    return table;
  }();
  const int64_t size = pixels_per_image();
  for (int64_t j = 0; j < n; ++j) {
    const uint8_t* image = pixels.data() + indices[j] * size;
    float* column = out + j * size;
    for (int64_t k = 0; k < size; ++k) column[k] = kScaled[image[k]];
  }
}

absl::StatusOr<std::shared_ptr<const FashionMnist>> LoadFashionMnist(const std::string& dir) {
  const std::array<std::string, 4> bases = {"train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                                            "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"};
  std::array<std::string, 4> paths;
  std::vector<std::string> missing;
  for (size_t i = 0; i < bases.size(); ++i) {
    paths[i] = FindFile(dir, bases[i]);
    if (paths[i].empty()) missing.push_back(bases[i] + "[.gz]");
  }
  if (!missing.empty()) {
    return absl::NotFoundError(absl::StrCat(
        "Fashion-MNIST not found in ", dir,
        ": install Debian's dataset-fashion-mnist (apt-get install dataset-fashion-mnist); "
        "missing ",
        absl::StrJoin(missing, ", ")));
  }
  auto data = std::make_shared<FashionMnist>();
  ONEBIT_ASSIGN_OR_RETURN(data->train, LoadSplit(paths[0], paths[1]));
  ONEBIT_ASSIGN_OR_RETURN(data->test, LoadSplit(paths[2], paths[3]));
  return std::shared_ptr<const FashionMnist>(std::move(data));
}

BatchSampler::BatchSampler(int64_t num_examples, uint64_t seed, int rank, int world_size,
                           int64_t micro_batch)
    : num_examples_(num_examples),
      seed_(seed),
      rank_(rank),
      world_size_(world_size),
      micro_batch_(micro_batch) {
  int bits = 1;
  while (bits < 62 && (uint64_t{1} << bits) < static_cast<uint64_t>(num_examples_)) ++bits;
  half_bits_ = (bits + 1) / 2;
}

int64_t BatchSampler::Permute(uint64_t epoch, int64_t pos) const {
  const uint64_t key = HashCombine(HashCombine(seed_, 0x6261746368ULL /* "batch" */), epoch);
  // Cycle walking: the network permutes a power-of-4 range; following the cycle until it
  // re-enters [0, N) gives a permutation of [0, N). The range is < 4N, so few rounds.
  uint64_t x = static_cast<uint64_t>(pos);
  do {
    x = Feistel(x, key, half_bits_);
  } while (x >= static_cast<uint64_t>(num_examples_));
  return static_cast<int64_t>(x);
}

void BatchSampler::Indices(int64_t step, int64_t* out) const {
  const uint64_t n = static_cast<uint64_t>(num_examples_);
  const uint64_t first = static_cast<uint64_t>(step - 1) * world_size_ * micro_batch_ +
                         static_cast<uint64_t>(rank_) * micro_batch_;
  for (int64_t j = 0; j < micro_batch_; ++j) {
    const uint64_t k = first + j;
    out[j] = Permute(k / n, static_cast<int64_t>(k % n));
  }
}

}  // namespace onebit
