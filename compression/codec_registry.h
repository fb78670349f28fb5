// Every Codec the exchanges know, by the name a job config gives (exchange.compressor).
// The codecs live for the whole process; the functions are thread safe.
#ifndef ONEBIT_COMPRESSION_CODEC_REGISTRY_H_
#define ONEBIT_COMPRESSION_CODEC_REGISTRY_H_

#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "compression/codec.h"

namespace onebit {

// The 1-bit format (scale and signs): the default of every exchange.
const Codec& OnebitCodec();
// The int8 format (scale, offset and one code per element).
const Codec& Int8Codec();
// The fp8 e4m3 format (a power-of-two scale per 32 elements and one code per element):
// compression/fp8/, its kernels with it.
const Codec& Fp8Codec();

// Every registered codec, the default (1 bit) first.
std::vector<const Codec*> AllCodecs();

// The codec named `name`; INVALID_ARGUMENT naming the registered ones otherwise.
absl::StatusOr<const Codec*> FindCodec(absl::string_view name);

}  // namespace onebit

#endif  // ONEBIT_COMPRESSION_CODEC_REGISTRY_H_
