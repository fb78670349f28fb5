// Network address spelling shared by the coordinator, the servers and the workers.
#ifndef ONEBIT_COMMON_NET_H_
#define ONEBIT_COMMON_NET_H_

#include <string>

#include "absl/strings/string_view.h"

namespace onebit {

// "host:port" as gRPC, civetweb and our address files take it: an IPv6 literal gets
// brackets ("::1" -> "[::1]:80"); a host already in brackets, an IPv4 address or a name
// is used as is.
std::string JoinHostPort(absl::string_view host, int port);

}  // namespace onebit

#endif  // ONEBIT_COMMON_NET_H_
