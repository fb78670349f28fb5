// The learning rate (and OneCycle's betas) of an optimizer step under DeepSpeed's
// "scheduler" block (config/job_config.h SchedulerConfig), as DeepSpeed's
// deepspeed/runtime/lr_schedules.py computes them (lr_schedule.cc has each type's formula):
// pure functions of the step, so a resumed job continues its schedule without state.
#ifndef ONEBIT_CONFIG_LR_SCHEDULE_H_
#define ONEBIT_CONFIG_LR_SCHEDULE_H_

#include <cstdint>

#include "config/job_config.h"

namespace onebit {

// The learning rate of optimizer step `step` (>= 1; DeepSpeed's sequence counts only the
// steps applied, not those skipped for an fp16 overflow). `base_lr` is optimizer.params.lr:
// returned as is when schedule.type is empty; of the types only WarmupCosineLR reads it
// (DeepSpeed overwrites it). Step t is DeepSpeed's get_lr() at last_batch_iteration
// t - 2: DeepSpeed sets step 1's lr when it builds the scheduler (at -1), then calls
// scheduler.step() after every applied step. So a warmup of warmup_num_steps = N reaches
// warmup_max_lr at step N + 2, as in DeepSpeed. Expects a schedule ParseJobConfig accepted.
double LearningRate(const SchedulerConfig& schedule, double base_lr, int64_t step);

struct Betas {
  double beta1;
  double beta2;
};

// The betas of step `step` (>= 1): `configured` unless the schedule is OneCycle with
// cycle_momentum, then DeepSpeed's: step 1 (its constructor) (cycle_min_mom, 0.99); then
// for k = step - 2 < T beta1 = cycle_max_mom - (cycle_max_mom - cycle_min_mom) * scale
// (inverse to the lr), after the cycle cycle_max_mom * (1 + decay_mom_rate * d /
// decay_step_size) (or cycle_max_mom without decay); beta2 is always 0.99. The trainer sets
// them before every step (TrainerOptions::betas).
Betas ScheduledBetas(const SchedulerConfig& schedule, Betas configured, int64_t step);

}  // namespace onebit

#endif  // ONEBIT_CONFIG_LR_SCHEDULE_H_
