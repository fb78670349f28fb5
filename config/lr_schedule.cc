#include "config/lr_schedule.h"

#include <algorithm>
#include <cmath>

namespace onebit {
namespace {

constexpr double kPi = 3.14159265358979323846;

// N, clamped as DeepSpeed clamps warmup_num_steps.
int64_t WarmupSteps(const SchedulerConfig& s) { return std::max<int64_t>(2, s.warmup_num_steps); }

// WarmupLR's gamma during the warmup (0 <= k < N).
double WarmupGamma(const SchedulerConfig& s, int64_t k) {
  const double n = static_cast<double>(WarmupSteps(s));
  if (s.warmup_type == "linear") return static_cast<double>(k) / n;
  return std::log(static_cast<double>(k) + 1) / std::log(n);
}

double CycleTotal(const SchedulerConfig& s) {
  const double first = static_cast<double>(s.cycle_first_step_size);
  const double second =
      s.cycle_second_step_size >= 0 ? static_cast<double>(s.cycle_second_step_size) : first;
  return first + second;
}

// OneCycle's scale factor at last_batch_iteration k (< T): 0 at the cycle's ends, 1 at its peak.
double CycleScale(const SchedulerConfig& s, int64_t k) {
  const double total = CycleTotal(s);
  const double ratio = static_cast<double>(s.cycle_first_step_size) / total;
  const double batch_iteration = static_cast<double>(k + 1);
  const double cycle = std::floor(1 + batch_iteration / total);
  const double x = 1 + batch_iteration / total - cycle;
  return x <= ratio ? x / ratio : (x - 1) / (ratio - 1);
}

}  // namespace

double LearningRate(const SchedulerConfig& s, double base_lr, int64_t step) {
  const int64_t k = step - 2;  // DeepSpeed's last_batch_iteration when step runs
  if (s.type == "WarmupLR" || s.type == "WarmupDecayLR") {
    if (k < 0) return s.warmup_min_lr;
    const int64_t n = WarmupSteps(s);
    double gamma = 1.0;
    if (k < n) {
      gamma = WarmupGamma(s, k);
    } else if (s.type == "WarmupDecayLR") {
      gamma = std::max(0.0, static_cast<double>(s.total_num_steps - k) /
                                std::max(1.0, static_cast<double>(s.total_num_steps - n)));
    }
    return s.warmup_min_lr + (s.warmup_max_lr - s.warmup_min_lr) * gamma;
  }
  if (s.type == "WarmupCosineLR") {
    if (k < 0) return 0.0;  // step 1 has lr 0, as in DeepSpeed
    const int64_t n = WarmupSteps(s);
    double ratio;
    if (k < n) {
      ratio = s.warmup_min_ratio + WarmupGamma(s, k) * (1 - s.warmup_min_ratio);
    } else {
      const double done = static_cast<double>(k - n + 1);
      const double total = static_cast<double>(s.total_num_steps - n);
      ratio = std::max(0.0, s.cos_min_ratio + (1 - s.cos_min_ratio) *
                                                  (1 + std::cos(kPi * done / total)) / 2);
    }
    return base_lr * ratio;
  }
  if (s.type == "OneCycle") {
    const double total = CycleTotal(s);
    if (static_cast<double>(k) < total) {
      return s.cycle_min_lr + (s.cycle_max_lr - s.cycle_min_lr) * CycleScale(s, k);
    }
    if (s.decay_step_size == 0 || s.decay_lr_rate == 0) return s.cycle_min_lr;
    const double decay_iteration = static_cast<double>(k) - total + 1;
    return s.cycle_min_lr /
           (1 + s.decay_lr_rate * decay_iteration / static_cast<double>(s.decay_step_size));
  }
  return base_lr;
}

Betas ScheduledBetas(const SchedulerConfig& s, Betas configured, int64_t step) {
  if (s.type != "OneCycle" || !s.cycle_momentum) return configured;
  constexpr double kBeta2 = 0.99;  // DeepSpeed's OneCycle pins beta2 to this
  const int64_t k = step - 2;
  if (k < 0) return {s.cycle_min_mom, kBeta2};  // what DeepSpeed's constructor sets
  const double total = CycleTotal(s);
  if (static_cast<double>(k) < total) {
    return {s.cycle_max_mom - (s.cycle_max_mom - s.cycle_min_mom) * CycleScale(s, k), kBeta2};
  }
  if (s.decay_step_size == 0 || s.decay_mom_rate == 0) return {s.cycle_max_mom, kBeta2};
  const double decay_iteration = static_cast<double>(k) - total + 1;
  return {s.cycle_max_mom *
              (1 + s.decay_mom_rate * decay_iteration / static_cast<double>(s.decay_step_size)),
          kBeta2};
}

}  // namespace onebit
