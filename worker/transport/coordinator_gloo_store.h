// gloo's rendezvous store backed by the coordinator's key/value store, so that gloo ranks
// in different processes (or machines) find each other through the coordinator.
//
//   auto store = std::make_shared<CoordinatorGlooStore>(client, GlooStorePrefix(job_id, 0));
//   GlooTransport::Create(store, rank, world_size, options);   // worker/transport/gloo_transport.h
//
// Keys are written once (the coordinator's semantics, and gloo's HashStore's): a new
// communicator over the same job (after a failure, a new membership) must use a new
// generation, hence a new prefix. Errors are thrown as gloo expects: gloo::IoException,
// whose message for a timeout says "Wait timeout for key(s): ..." (the gloo transport maps
// such messages to DEADLINE_EXCEEDED). Thread-safe if the client is (ours are).
#ifndef ONEBIT_WORKER_TRANSPORT_COORDINATOR_GLOO_STORE_H_
#define ONEBIT_WORKER_TRANSPORT_COORDINATOR_GLOO_STORE_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "coordinator/coordinator_client.h"
#include "gloo/rendezvous/store.h"

namespace onebit {

// "gloo/<job_id>/<generation>/".
std::string GlooStorePrefix(const std::string& job_id, int64_t generation);

class CoordinatorGlooStore final : public gloo::rendezvous::Store {
 public:
  // `get` and the one-argument `wait` wait up to `timeout` (gloo's default: 30 s).
  CoordinatorGlooStore(std::shared_ptr<CoordinatorClient> client, std::string prefix,
                       std::chrono::milliseconds timeout = kDefaultTimeout);

  void set(const std::string& key, const std::vector<char>& data) override;
  // Waits for the key, as gloo's stores do.
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  // A zero timeout (gloo::kNoTimeout) waits without limit.
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

 private:
  // The value, once set; throws on timeout or error.
  std::string WaitFor(const std::string& key, std::chrono::milliseconds timeout);

  const std::shared_ptr<CoordinatorClient> client_;
  const std::string prefix_;
  const std::chrono::milliseconds timeout_;
};

}  // namespace onebit

#endif  // ONEBIT_WORKER_TRANSPORT_COORDINATOR_GLOO_STORE_H_
