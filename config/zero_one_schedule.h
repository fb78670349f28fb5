// Which steps of 0/1 Adam communicate, and how (docs/algorithms.md, "0/1 Adam"). A pure function
// of the step number and the hyper-parameters, kept as a counter so that a step costs O(1):
// every worker that runs the same steps with the same var_freeze_step agrees on it without
// asking anyone, and a resumed worker rebuilds it from the step it resumes after.
//
//   steps 1..var_freeze_step   the variance stage. Step t updates the variance, from an
//                              exact allreduce of the gradients, when t % var_interval == 0;
//                              otherwise the gradients go through CompressedAllreduce and
//                              only the momentum moves. var_interval starts at 1 and doubles
//                              after every var_update_scaler variance updates.
//   steps > var_freeze_step    local steps. Step t is also a sync step (the accumulated
//                              update goes through CompressedAllreduce) when
//                              t % local_step_interval == 0. local_step_interval starts at 1
//                              and doubles after every local_step_scaler local steps, up to
//                              local_step_clipper.
//
// Each decision for step t uses the intervals as they stand after step t-1.
//
// Thread safety: a value type; one thread at a time.
#ifndef ONEBIT_CONFIG_ZERO_ONE_SCHEDULE_H_
#define ONEBIT_CONFIG_ZERO_ONE_SCHEDULE_H_

#include <cstdint>

#include "absl/status/status.h"

namespace onebit {

enum class ZeroOneStep {
  kVarianceUpdate,      // exact allreduce of the gradients; m and v move
  kCompressedGradient,  // CompressedAllreduce of the gradients; only m moves
  kLocal,               // no communication
  kSync,                // a local step, then CompressedAllreduce of the accumulated update
};
const char* ZeroOneStepName(ZeroOneStep kind);

struct ZeroOneScheduleParams {
  int64_t var_update_scaler = 16;     // kappa
  int64_t local_step_scaler = 32678;  // DeepSpeed's default, as given
  int64_t local_step_clipper = 16;    // H, the longest interval between syncs
};

// INVALID_ARGUMENT naming the parameter unless each is >= 1.
absl::Status ValidateZeroOneScheduleParams(const ZeroOneScheduleParams& params);

class ZeroOneSchedule {
 public:
  explicit ZeroOneSchedule(const ZeroOneScheduleParams& params) : params_(params) {}

  // The schedule after `steps` steps run with this var_freeze_step (for a resumed worker).
  static ZeroOneSchedule After(const ZeroOneScheduleParams& params, int64_t steps,
                               int64_t var_freeze_step);

  // The kind of the next step, steps() + 1.
  ZeroOneStep Next(int64_t var_freeze_step) const;
  // Records the next step as run.
  void Advance(int64_t var_freeze_step);

  int64_t steps() const { return steps_; }
  int64_t var_interval() const { return var_interval_; }
  int64_t local_step_interval() const { return local_interval_; }
  // Variance updates run so far.
  int64_t variance_updates() const { return var_updates_; }

 private:
  ZeroOneScheduleParams params_;
  int64_t steps_ = 0;
  int64_t var_interval_ = 1;
  int64_t var_updates_ = 0;  // variance updates run so far
  int64_t local_interval_ = 1;
  int64_t local_steps_ = 0;  // local steps run so far
};

}  // namespace onebit

#endif  // ONEBIT_CONFIG_ZERO_ONE_SCHEDULE_H_
