#include "compression/codec.h"

#include "absl/strings/str_cat.h"

namespace onebit {

absl::Status Codec::DecodeFrozenAdamUpdate(kernels::Backend& /*backend*/,
                                           const uint8_t* /*blocks*/, size_t /*num_chunks*/,
                                           size_t /*chunk*/, const kernels::AdamHyper& /*h*/,
                                           const float* /*v*/, const float* /*mask*/,
                                           float* /*m*/, float* /*p*/, size_t /*n*/) const {
  return absl::UnimplementedError(
      absl::StrCat("the ", name(), " codec has no fused frozen-Adam decode"));
}

}  // namespace onebit
