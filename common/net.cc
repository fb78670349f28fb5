#include "common/net.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace onebit {

std::string JoinHostPort(absl::string_view host, int port) {
  // Only an IPv6 literal contains ':'; without brackets its last group would read as
  // the port.
  if (absl::StrContains(host, ':') && !absl::StartsWith(host, "[")) {
    return absl::StrCat("[", host, "]:", port);
  }
  return absl::StrCat(host, ":", port);
}

}  // namespace onebit
