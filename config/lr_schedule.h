// The learning rate (and OneCycle's betas) of an optimizer step under DeepSpeed's
// "scheduler" block (config/job_config.h SchedulerConfig), as DeepSpeed's
// deepspeed/runtime/lr_schedules.py computes them: pure functions of the step, so a resumed
// job continues its schedule without state.
//
// Step numbering. onebit numbers optimizer steps from 1 (as freeze_step does). DeepSpeed
// builds the scheduler with last_batch_iteration = -1, which sets the lr of the first
// optimizer step, and calls scheduler.step() after every applied optimizer step (not after
// an fp16 step skipped for overflow). So onebit's step t uses DeepSpeed's get_lr() at
// last_batch_iteration k = t - 2: step 1 uses k = -1 (for WarmupLR and WarmupDecayLR the
// warmup_min_lr, the same value as at k = 0; for WarmupCosineLR 0; for OneCycle
// cycle_min_lr), step 2 uses k = 0, step 3 uses k = 1. A warmup of warmup_num_steps = N
// therefore reaches warmup_max_lr at step N + 2, as in DeepSpeed. Steps skipped for an fp16
// overflow must not be counted in `step` if the trainer wants DeepSpeed's sequence.
//
// Formulas (N = max(2, warmup_num_steps), as DeepSpeed clamps it):
//   WarmupLR:       k < N: min + (max - min) * gamma, gamma = ln(k + 1) / ln(N) ("log") or
//                   k / N ("linear"); k >= N: max.
//   WarmupDecayLR:  the same warmup; k >= N: min + (max - min) *
//                   max(0, (total - k) / max(1, total - N)).
//   WarmupCosineLR: base_lr * ratio; k < N: ratio = min_ratio + (1 - min_ratio) * gamma;
//                   else ratio = max(0, cos_min + (1 - cos_min) * (1 + cos(pi * (k - N + 1) /
//                   (total - N))) / 2). Step 1 (k = -1) has lr 0, as in DeepSpeed.
//   OneCycle:       T = first + second step sizes, r = first / T. k < T: x = (k + 1) / T
//                   (one cycle), scale = x / r if x <= r else (x - 1) / (r - 1), lr =
//                   cycle_min + (cycle_max - cycle_min) * scale. k >= T: d = k - T + 1;
//                   lr = cycle_min / (1 + decay_lr_rate * d / decay_step_size), or cycle_min
//                   when decay_lr_rate or decay_step_size is 0.
// WarmupLR, WarmupDecayLR and OneCycle ignore optimizer.params.lr (DeepSpeed overwrites it).
#ifndef ONEBIT_CONFIG_LR_SCHEDULE_H_
#define ONEBIT_CONFIG_LR_SCHEDULE_H_

#include <cstdint>

#include "config/job_config.h"

namespace onebit {

// The learning rate of optimizer step `step` (>= 1); `base_lr` is optimizer.params.lr
// (returned as is when schedule.type is empty). Expects a schedule ParseJobConfig accepted.
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
