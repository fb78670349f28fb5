// The NCCL id's bytes (nccl_transport.h), in the builds with and without CUDA.
#include <cstring>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "worker/transport/nccl_transport.h"

namespace onebit {

std::string SerializeNcclUniqueId(const NcclUniqueId& id) {
  return std::string(id.data(), id.size());
}

absl::StatusOr<NcclUniqueId> ParseNcclUniqueId(absl::string_view bytes) {
  NcclUniqueId id;
  if (bytes.size() != id.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("an NCCL unique id has ", id.size(), " bytes, got ", bytes.size()));
  }
  std::memcpy(id.data(), bytes.data(), id.size());
  return id;
}

}  // namespace onebit
