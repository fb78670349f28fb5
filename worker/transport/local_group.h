// Runs W ranks as threads of this process over a real transport: the harness behind the
// replay tool and the multi-rank tests. Each rank gets its own Transport (and makes its
// own Backend inside `body` if it needs one).
#ifndef ONEBIT_WORKER_TRANSPORT_LOCAL_GROUP_H_
#define ONEBIT_WORKER_TRANSPORT_LOCAL_GROUP_H_

#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "worker/transport/transport.h"

namespace onebit {

enum class TransportKind { kInproc, kGloo };

// "inproc" or "gloo".
absl::StatusOr<TransportKind> ParseTransportKind(absl::string_view name);
std::string TransportKindName(TransportKind kind);

// Connects `world_size` ranks over `kind` (gloo: TCP on 127.0.0.1) and runs body(transport)
// on one thread per rank. Returns OK when every rank returned OK, otherwise the error of
// the first rank to fail, prefixed with that rank. A failing rank's transport is closed at
// once so that the others fail too instead of waiting for it.
absl::Status RunLocalGroup(TransportKind kind, int world_size,
                           const std::function<absl::Status(Transport&)>& body);

// The same for a cluster of `nodes` x `local_size` workers as threads (the hierarchical
// exchange): worker w = node * local_size + l gets `intra`, a transport of its node's
// local_size workers (rank l), and `inter`, a transport of local rank l of every node
// (rank node). The first failure closes that worker's two transports.
absl::Status RunLocalNodes(TransportKind kind, int nodes, int local_size,
                           const std::function<absl::Status(Transport& intra, Transport& inter)>& body);

}  // namespace onebit

#endif  // ONEBIT_WORKER_TRANSPORT_LOCAL_GROUP_H_
