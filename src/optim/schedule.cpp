// Learning-rate schedules.
#include "optim/schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "core/error.h"

namespace shardtrain::optim {

ScheduleType parse_schedule(std::string_view name, std::string_view key) {
  if (name == "cosine") return ScheduleType::kCosine;
  if (name == "linear") return ScheduleType::kLinear;
  if (name == "sqrt") return ScheduleType::kSqrt;
  if (name == "constant") return ScheduleType::kConstant;
  ST_THROW("`", key, "`: unknown schedule `", name, "`; expected cosine, linear, sqrt or constant");
}

double learning_rate(const ScheduleConfig& c, int64_t step) {
  if (c.warmup_steps > 0 && step <= c.warmup_steps)
    return c.peak_lr * static_cast<double>(step) / static_cast<double>(c.warmup_steps);
  if (c.type == ScheduleType::kConstant) return c.peak_lr;
  const int64_t after_warmup = std::max<int64_t>(0, c.total_steps - c.warmup_steps);
  const int64_t decay_steps =
      std::min<int64_t>(after_warmup, std::llround(c.decay_fraction * static_cast<double>(c.total_steps)));
  const int64_t decay_start = c.total_steps - decay_steps;  // the last stable step (or of warmup)
  if (step <= decay_start) return c.peak_lr;
  const double p = decay_steps > 0
                       ? std::min(1.0, static_cast<double>(step - decay_start) / static_cast<double>(decay_steps))
                       : 1.0;
  const double min_lr = c.peak_lr * c.min_lr_ratio;
  switch (c.type) {
    case ScheduleType::kLinear: return c.peak_lr - (c.peak_lr - min_lr) * p;
    case ScheduleType::kSqrt: return min_lr + (c.peak_lr - min_lr) * (1.0 - std::sqrt(p));
    case ScheduleType::kCosine: break;
    case ScheduleType::kConstant: return c.peak_lr;
  }
  return min_lr + (c.peak_lr - min_lr) * 0.5 * (1.0 + std::cos(std::numbers::pi * p));
}

}  // namespace shardtrain::optim
