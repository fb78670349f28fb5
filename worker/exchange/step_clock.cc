#include "worker/exchange/step_clock.h"

#include <chrono>

namespace onebit {
namespace {

class SteadyStepClock final : public StepClock {
 public:
  double Seconds() override {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
};

}  // namespace

StepClock* StepClock::Real() {
  static StepClock* const clock = new SteadyStepClock();
  return clock;
}

}  // namespace onebit
