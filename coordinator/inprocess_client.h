// A CoordinatorClient that calls a CoordinatorHandler directly, without a network: the
// fake for tests of code that talks to the coordinator (workers, servers, the gloo store),
// and a way to run a whole job in one process. Sessions run on a thread of their own, as
// with gRPC. Nothing is retried: there is nothing to be unavailable.
#ifndef ONEBIT_COORDINATOR_INPROCESS_CLIENT_H_
#define ONEBIT_COORDINATOR_INPROCESS_CLIENT_H_

#include <memory>

#include "coordinator/coordinator_client.h"
#include "coordinator/coordinator_handler.h"

namespace onebit {

// `handler` is not owned and must outlive the client and its sessions.
std::unique_ptr<CoordinatorClient> NewInProcessCoordinatorClient(CoordinatorHandler* handler);

}  // namespace onebit

#endif  // ONEBIT_COORDINATOR_INPROCESS_CLIENT_H_
