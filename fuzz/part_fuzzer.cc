// checkpoint/part.h DecodePart on arbitrary bytes, twice per input: as a whole file, and as
// the body of a file whose length and CRC-32 the harness fixes up (else nearly every input
// would stop at the checksum and the body decoder would go unexplored).
//
// A decode that succeeds must describe itself: every tensor's shape multiplies out to its
// element count, and encoding the part again decodes to the same part.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "absl/strings/string_view.h"
#include "checkpoint/part.h"
#include "fuzz/fuzz_support.h"

namespace onebit::checkpoint {
namespace {

std::string WithHeaderAndCrc(absl::string_view body) {
  std::string out(kPartMagic, 8);
  const uint32_t version = kPartVersion;
  const uint64_t length = body.size();
  out.append(reinterpret_cast<const char*>(&version), sizeof(version));
  out.append(reinterpret_cast<const char*>(&length), sizeof(length));
  out.append(body.data(), body.size());
  const uint32_t crc = Crc32(out);
  out.append(reinterpret_cast<const char*>(&crc), sizeof(crc));
  return out;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

void Check(absl::string_view bytes) {
  absl::StatusOr<Part> part = DecodePart(bytes);
  fuzz::Say("DecodePart", part.status());
  if (!part.ok()) {
    ONEBIT_FUZZ_CHECK(!part.status().message().empty());
    return;
  }
  for (const auto& [name, tensor] : part->tensors) {
    uint64_t elements = 1;
    for (uint64_t d : tensor.shape) elements *= d;
    ONEBIT_FUZZ_CHECK(elements == tensor.data.size());
  }
  absl::StatusOr<Part> again = DecodePart(EncodePart(*part));
  ONEBIT_FUZZ_CHECK(again.ok());
  ONEBIT_FUZZ_CHECK(again->meta == part->meta);
  ONEBIT_FUZZ_CHECK(again->tensors.size() == part->tensors.size());
  for (const auto& [name, tensor] : part->tensors) {
    auto it = again->tensors.find(name);
    ONEBIT_FUZZ_CHECK(it != again->tensors.end());
    ONEBIT_FUZZ_CHECK(it->second.shape == tensor.shape);
    ONEBIT_FUZZ_CHECK(SameBits(it->second.data, tensor.data));
  }
}

}  // namespace
}  // namespace onebit::checkpoint

extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  onebit::fuzz::HeapBudget::Install();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  onebit::fuzz::HeapBudget::Begin();
  onebit::fuzz::Canary(data, size);
  const absl::string_view bytes(reinterpret_cast<const char*>(data), size);
  onebit::checkpoint::Check(bytes);
  onebit::checkpoint::Check(onebit::checkpoint::WithHeaderAndCrc(bytes));
  // The part, its re-encoding and their decodes: a few copies of the input at most.
  onebit::fuzz::HeapBudget::End(size, 8, 16 << 10);
  return 0;
}
