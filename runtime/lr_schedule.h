// Learning-rate schedule shared by the multi-rank engine and the single-process reference
// trainer (runtime/torch/reference.h), so both apply exactly the same rate at every step.
// Header-only and free of LibTorch.
//
// Rate at 0-based `step`:
//   * warm-up (step < warmup_steps): base_lr * (step + 1) / warmup_steps
//   * cosine decay (warmup_steps <= step, decay_end_step > warmup_steps):
//       progress = min(1, (step - warmup_steps) / (decay_end_step - warmup_steps))
//       min_lr + 0.5 * (base_lr - min_lr) * (1 + cos(pi * progress))
//   * otherwise base_lr (no decay configured).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace tandem::runtime {

struct LrSchedule {
  double base_lr = 1e-3;
  int64_t warmup_steps = 0;
  // Step at which the cosine decay reaches min_lr; <= warmup_steps disables decay.
  int64_t decay_end_step = 0;
  double min_lr = 0;
};

inline double LearningRateAt(const LrSchedule& schedule, int64_t step) {
  if (step < schedule.warmup_steps) {
    return schedule.base_lr * static_cast<double>(step + 1) /
           static_cast<double>(schedule.warmup_steps);
  }
  if (schedule.decay_end_step <= schedule.warmup_steps) return schedule.base_lr;
  constexpr double kPi = 3.14159265358979323846;
  const double progress =
      std::min(1.0, static_cast<double>(step - schedule.warmup_steps) /
                        static_cast<double>(schedule.decay_end_step - schedule.warmup_steps));
  return schedule.min_lr +
         0.5 * (schedule.base_lr - schedule.min_lr) * (1.0 + std::cos(kPi * progress));
}

}  // namespace tandem::runtime
