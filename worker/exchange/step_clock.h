// The clock the step-time split reads (the trainer's compute / compress / exchange /
// update parts), injected so that tests can drive it. A few reads per step: the real one
// is std::chrono::steady_clock.
//
// On a GPU backend kernels run asynchronously: a part that only launched kernels would be
// timed as the launch, and the kernel time would show up in the next part that waits for
// the device (the transport, or the trainer's final synchronize, counted as update). So the
// compression parts end with FinishTimedDeviceWork, which waits for their kernels.
//
// Thread safety: Seconds() may be called from any thread.
#ifndef ONEBIT_WORKER_EXCHANGE_STEP_CLOCK_H_
#define ONEBIT_WORKER_EXCHANGE_STEP_CLOCK_H_

#include "absl/status/status.h"
#include "kernels/kernels.h"

namespace onebit {

class StepClock {
 public:
  virtual ~StepClock() = default;
  // Monotonic seconds from an arbitrary origin.
  virtual double Seconds() = 0;

  // steady_clock; process-wide, never deleted.
  static StepClock* Real();
};

// Adds the seconds from construction to destruction to *total (an accumulator). The clock
// may be null (nothing is measured).
class ScopedStepTime {
 public:
  ScopedStepTime(StepClock* clock, double* total)
      : clock_(clock), total_(total), start_(clock != nullptr ? clock->Seconds() : 0.0) {}
  ~ScopedStepTime() {
    if (clock_ != nullptr) *total_ += clock_->Seconds() - start_;
  }
  ScopedStepTime(const ScopedStepTime&) = delete;
  ScopedStepTime& operator=(const ScopedStepTime&) = delete;

 private:
  StepClock* clock_;
  double* total_;
  double start_;
};

// The last call of a timed section of device work (inside its ScopedStepTime): on a device
// backend it waits for the kernels the section queued (one stream synchronisation, a few
// microseconds, which the next part would have waited for anyway), so that their time is
// the section's; on the CPU backend, or with no clock, it does nothing.
inline absl::Status FinishTimedDeviceWork(StepClock* clock, kernels::Backend* backend) {
  if (clock == nullptr || backend->memory_space() == kernels::MemorySpace::kHost) {
    return absl::OkStatus();
  }
  return backend->Synchronize();
}

}  // namespace onebit

#endif  // ONEBIT_WORKER_EXCHANGE_STEP_CLOCK_H_
