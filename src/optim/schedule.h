// Learning-rate schedules: linear warmup, then cosine, linear or constant decay.
#pragma once

#include <cstdint>
#include <string_view>

namespace shardtrain::optim {

enum class ScheduleType { kCosine, kLinear, kConstant };

ScheduleType parse_schedule(std::string_view name, std::string_view key);

struct ScheduleConfig {
  ScheduleType type = ScheduleType::kCosine;
  double peak_lr = 1e-3;
  int64_t warmup_steps = 0;
  int64_t total_steps = 1;
  double min_lr_ratio = 0.1;  // the decay ends at peak_lr * min_lr_ratio
};

// Learning rate for optimizer step `step` (1-based, 1..total_steps):
//   step <= warmup:  peak * step / warmup
//   after:           p = (step - warmup) / (total - warmup) in (0, 1];
//                    cosine: min + (peak - min) (1 + cos(pi p)) / 2; linear: peak - (peak - min) p
//                    constant: peak
double learning_rate(const ScheduleConfig& config, int64_t step);

}  // namespace shardtrain::optim
