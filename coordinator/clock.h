// The coordinator's view of wall-clock time, injected so that liveness (heartbeat timeouts)
// and timestamps can be tested without sleeping. Blocking waits (KvGet, session pushes) use
// real time regardless: they are bounded by real deadlines of real RPCs.
#ifndef ONEBIT_COORDINATOR_CLOCK_H_
#define ONEBIT_COORDINATOR_CLOCK_H_

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace onebit {

// Thread-safe.
class Clock {
 public:
  virtual ~Clock() = default;
  virtual absl::Time Now() const = 0;

  // The process-wide real clock; never deleted.
  static Clock* Real();
};

// A clock that moves only when told to. Thread-safe.
class FakeClock final : public Clock {
 public:
  explicit FakeClock(absl::Time start = absl::FromUnixSeconds(1700000000)) : now_(start) {}

  absl::Time Now() const override {
    absl::MutexLock lock(&mu_);
    return now_;
  }
  void Advance(absl::Duration d) {
    absl::MutexLock lock(&mu_);
    now_ += d;
  }

 private:
  mutable absl::Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_);
};

inline Clock* Clock::Real() {
  class RealClock final : public Clock {
   public:
    absl::Time Now() const override { return absl::Now(); }
  };
  static RealClock* clock = new RealClock();
  return clock;
}

}  // namespace onebit

#endif  // ONEBIT_COORDINATOR_CLOCK_H_
