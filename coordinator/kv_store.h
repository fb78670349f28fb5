// The rendezvous key/value store: NCCL's unique id, gloo's store. Thread-safe; Get may
// block (in real time) until a key is set.
//
// Semantics (those of gloo's HashStore, which the protocols built on it expect): a key is
// written once. Setting it again with the same value succeeds (a retry after a lost reply
// must be harmless); with a different value it is ALREADY_EXISTS and the first value stays.
// A new job generation uses new keys (the client prefixes them), so nothing is ever
// deleted. Limits keep a bad or hostile client from exhausting the coordinator: keys and
// values are bounded in size (INVALID_ARGUMENT), and so are the number of keys and the
// total bytes (RESOURCE_EXHAUSTED).
#ifndef ONEBIT_COORDINATOR_KV_STORE_H_
#define ONEBIT_COORDINATOR_KV_STORE_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace onebit {

struct KvLimits {
  size_t max_key_bytes = 512;
  size_t max_value_bytes = 1 << 20;
  size_t max_keys = 100000;
  size_t max_total_bytes = size_t{256} << 20;
  // A waiting Get returns DEADLINE_EXCEEDED after at most this long, whatever it asked for.
  absl::Duration max_wait = absl::Seconds(30);
};

class KvStore {
 public:
  explicit KvStore(const KvLimits& limits = KvLimits()) : limits_(limits) {}

  absl::Status Set(const std::string& key, const std::string& value) ABSL_LOCKS_EXCLUDED(mu_);

  // The value, or nullopt if the key is not set and `wait` is zero. With a positive
  // `wait` (capped at limits.max_wait), blocks until the key is set: DEADLINE_EXCEEDED if
  // that does not happen in time, UNAVAILABLE if the store shuts down meanwhile.
  absl::StatusOr<std::optional<std::string>> Get(const std::string& key, absl::Duration wait)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Wakes every waiting Get (they fail with UNAVAILABLE); later waits fail at once.
  void Shutdown() ABSL_LOCKS_EXCLUDED(mu_);

  size_t size() const ABSL_LOCKS_EXCLUDED(mu_);
  const KvLimits& limits() const { return limits_; }

 private:
  absl::Status CheckKey(const std::string& key) const;

  const KvLimits limits_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::string> map_ ABSL_GUARDED_BY(mu_);
  size_t total_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace onebit

#endif  // ONEBIT_COORDINATOR_KV_STORE_H_
