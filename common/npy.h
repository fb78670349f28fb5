// NumPy .npy files of little-endian float32 in C order: the exchange format between the
// tools and Python. Format: https://numpy.org/doc/stable/reference/generated/numpy.lib.format.html
//
// Reading accepts format versions 1.0, 2.0 and 3.0 and validates everything (magic, version,
// header dict, dtype '<f4', C order, shape, exact data size); every error names the file.
// Writing produces version 1.0 (2.0 only when the header does not fit in 64 KiB) through a
// temporary file in the destination directory that is fsynced and renamed into place, so a
// failed write never leaves a partial file under the destination name.
//
// Thread safety: the functions are thread safe. A Float32Reader may be read from several
// threads at once (ReadElements uses pread).
#ifndef ONEBIT_COMMON_NPY_H_
#define ONEBIT_COMMON_NPY_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace onebit::npy {

// Dimension value in an expected shape that matches any size.
inline constexpr int64_t kAnyDim = -1;

// "(3, 4)", "(3,)", "()": Python's spelling of a shape.
std::string ShapeToString(const std::vector<int64_t>& shape);

// Number of elements of `shape` (1 for a scalar's empty shape).
int64_t NumElements(const std::vector<int64_t>& shape);

// Ok if `shape` has the rank of `expected` and equal sizes where expected is not kAnyDim;
// otherwise an InvalidArgument error naming `path` and both shapes.
absl::Status CheckShape(const std::string& path, const std::vector<int64_t>& shape,
                        const std::vector<int64_t>& expected);

struct Float32Array {
  std::vector<int64_t> shape;
  std::vector<float> data;  // NumElements(shape) values in C order
};

// Reads a whole file. With a non-empty `expected_shape` the shape is checked with
// CheckShape (pass {kAnyDim} for "any 1-D array").
absl::StatusOr<Float32Array> ReadFloat32(const std::string& path,
                                         const std::vector<int64_t>& expected_shape = {});

// Reads a whole file of float32 ('<f4'), bool ('|b1') or uint8 ('|u1'), validated like
// ReadFloat32, as float32 values (bool and uint8 exactly: 0, 1, ... 255); *descr (when not
// null) says which dtype the file had.
absl::StatusOr<Float32Array> ReadAsFloat32(const std::string& path, std::string* descr = nullptr);

// Writes `data` (NumElements(shape) values) atomically: temp file, fsync, rename.
absl::Status WriteFloat32(const std::string& path, const std::vector<int64_t>& shape,
                          const float* data);

// An open, fully validated file whose elements are read on demand, for arrays too large
// to hold twice. Open() checks the header and that the file size is exactly header plus
// data, so a truncated or overlong file fails before any element is read.
class Float32Reader {
 public:
  static absl::StatusOr<std::unique_ptr<Float32Reader>> Open(const std::string& path);
  ~Float32Reader();
  Float32Reader(const Float32Reader&) = delete;
  Float32Reader& operator=(const Float32Reader&) = delete;

  const std::string& path() const { return path_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  int64_t num_elements() const { return num_elements_; }

  // Copies elements [offset, offset + count) in C order into out.
  absl::Status ReadElements(int64_t offset, int64_t count, float* out) const;

 private:
  Float32Reader(std::string path, int fd, std::vector<int64_t> shape, int64_t num_elements,
                int64_t data_offset);

  std::string path_;
  int fd_;
  std::vector<int64_t> shape_;
  int64_t num_elements_;
  int64_t data_offset_;  // bytes from the start of the file to element 0
};

}  // namespace onebit::npy

#endif  // ONEBIT_COMMON_NPY_H_
