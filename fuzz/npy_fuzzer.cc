// common/npy.h on a file holding arbitrary bytes: ReadFloat32, and Float32Reader's range
// checks on whatever opens. A successful read must agree with itself: the shape multiplies
// out to the element count, and the reader returns the same elements as the whole read.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "common/npy.h"
#include "fuzz/fuzz_support.h"

namespace {

const std::string& NpyPath() {
  static const std::string* path = new std::string(onebit::fuzz::ScratchDir() + "/input.npy");
  return *path;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  onebit::fuzz::HeapBudget::Install();
  (void)NpyPath();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace npy = onebit::npy;
  const std::string& path = NpyPath();
  onebit::fuzz::WriteFileOrDie(path, absl::string_view(reinterpret_cast<const char*>(data), size));
  onebit::fuzz::HeapBudget::Begin();
  onebit::fuzz::Canary(data, size);

  absl::StatusOr<npy::Float32Array> array = npy::ReadFloat32(path);
  absl::StatusOr<std::unique_ptr<npy::Float32Reader>> reader = npy::Float32Reader::Open(path);
  onebit::fuzz::Say("ReadFloat32", array.status());
  ONEBIT_FUZZ_CHECK(array.ok() == reader.ok());
  if (array.ok()) {
    const int64_t n = npy::NumElements(array->shape);
    ONEBIT_FUZZ_CHECK(n >= 0);
    ONEBIT_FUZZ_CHECK(static_cast<uint64_t>(n) == array->data.size());
    ONEBIT_FUZZ_CHECK((*reader)->shape() == array->shape);
    ONEBIT_FUZZ_CHECK((*reader)->num_elements() == n);
    // Header plus data cannot be more than the file.
    ONEBIT_FUZZ_CHECK(static_cast<uint64_t>(n) * 4 <= size);

    if (n > 0) {
      float last;
      ONEBIT_FUZZ_CHECK((*reader)->ReadElements(n - 1, 1, &last).ok());
      ONEBIT_FUZZ_CHECK(std::memcmp(&last, &array->data.back(), sizeof(float)) == 0);
    }
    float unused;
    ONEBIT_FUZZ_CHECK(!(*reader)->ReadElements(n, 1, &unused).ok());
    ONEBIT_FUZZ_CHECK(!(*reader)->ReadElements(-1, 1, &unused).ok());
    ONEBIT_FUZZ_CHECK(!(*reader)->ReadElements(0, -1, &unused).ok());
    ONEBIT_FUZZ_CHECK(!(*reader)->ReadElements(1, INT64_MAX, &unused).ok());

    ONEBIT_FUZZ_CHECK(npy::CheckShape(path, array->shape, array->shape).ok());
    std::vector<int64_t> any(array->shape.size(), npy::kAnyDim);
    ONEBIT_FUZZ_CHECK(npy::CheckShape(path, array->shape, any).ok());
    (void)npy::ShapeToString(array->shape);
  } else {
    ONEBIT_FUZZ_CHECK(!array.status().message().empty());
  }
  // The header, the array and the error messages: a few copies of the file at most.
  onebit::fuzz::HeapBudget::End(size, 4, 16 << 10);
  return 0;
}
