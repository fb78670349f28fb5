#include "compression/codec_registry.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace onebit {

std::vector<const Codec*> AllCodecs() { return {&OnebitCodec(), &Int8Codec(), &Fp8Codec()}; }

absl::StatusOr<const Codec*> FindCodec(absl::string_view name) {
  const std::vector<const Codec*> all = AllCodecs();
  std::string names;
  for (size_t i = 0; i < all.size(); ++i) {
    if (all[i]->name() == name) return all[i];
    absl::StrAppend(&names, i == 0 ? "" : (i + 1 == all.size() ? " or " : ", "), "\"",
                    all[i]->name(), "\"");
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown compressor \"", name, "\": must be ", names));
}

}  // namespace onebit
