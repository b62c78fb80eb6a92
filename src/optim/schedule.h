// Learning-rate schedules: linear warmup, an optional stable phase at the peak, then cosine,
// linear, 1 - sqrt or no decay (warmup-stable-decay when the decay covers only the last steps).
#pragma once

#include <cstdint>
#include <string_view>

namespace shardtrain::optim {

enum class ScheduleType { kCosine, kLinear, kSqrt, kConstant };

ScheduleType parse_schedule(std::string_view name, std::string_view key);

struct ScheduleConfig {
  ScheduleType type = ScheduleType::kCosine;
  double peak_lr = 1e-3;
  int64_t warmup_steps = 0;
  int64_t total_steps = 1;
  double min_lr_ratio = 0.1;  // the decay ends at peak_lr * min_lr_ratio
  // The decay takes the last round(decay_fraction · total_steps) steps (at most those after
  // the warmup); the steps between warmup and decay stay at the peak. 1: decay right after warmup.
  double decay_fraction = 1.0;
};

// Learning rate for optimizer step `step` (1-based, 1..total_steps), with
// decay = min(round(decay_fraction · total), total - warmup) and stable = total - warmup - decay:
//   step <= warmup:           peak * step / warmup
//   step <= warmup + stable:  peak
//   after:                    p = (step - warmup - stable) / decay in (0, 1];
//                             cosine: min + (peak - min) (1 + cos(pi p)) / 2; linear: peak - (peak - min) p;
//                             sqrt: min + (peak - min) (1 - sqrt(p)); constant: peak
double learning_rate(const ScheduleConfig& config, int64_t step);

}  // namespace shardtrain::optim
