// The launch's data-dependent choices: the automatic sequence length, epochs as steps and the
// warm-up as a share of them, with the lines that log them.
#include "train/launch_defaults.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "core/error.h"

namespace shardtrain::train {
namespace {

// ceil(x), where x is a quotient that should be exact (2 x 100 / 8 = 25) but may carry a
// rounding error upwards (0.1 x 30 / 3 = 1.0000000000000002): such an error does not add a step.
int64_t ceil_of(double x) { return static_cast<int64_t>(std::ceil(x - 1e-9 * std::max(1.0, x))); }

bool defaulted(const JobConfig& c, const char* key) {
  return std::find(c.fine_tuning_defaults.begin(), c.fine_tuning_defaults.end(), key) != c.fine_tuning_defaults.end();
}

}  // namespace

SeqLenChoice auto_seq_len(int64_t model_max_seq_len, int64_t longest_example) {
  ST_CHECK(model_max_seq_len > 0, "training.seq_len = 0 (auto) needs the model's context, found ", model_max_seq_len);
  const int64_t cap = std::min(model_max_seq_len, kAutoSeqLenCap);
  const std::string context = fmt::format("the model's context of {} tokens", model_max_seq_len);
  if (longest_example > 0) {
    const int64_t rounded = (longest_example + kAutoSeqLenMultiple - 1) / kAutoSeqLenMultiple * kAutoSeqLenMultiple;
    if (rounded < cap)
      return {rounded, fmt::format("the longest example, {} tokens, rounded up to a multiple of {}; within {}",
                                   longest_example, kAutoSeqLenMultiple, context)};
  }
  std::string why = context;
  if (model_max_seq_len > kAutoSeqLenCap) why += fmt::format(", capped at {}", kAutoSeqLenCap);
  if (longest_example > 0) why += fmt::format("; the longest example has {} tokens", longest_example);
  return {cap, why};
}

int64_t steps_for_epochs(double epochs, const data::EpochSize& size, int64_t sequences_per_step, int64_t seq_len) {
  ST_CHECK(epochs > 0, "`training.epochs` must be > 0 here, found ", epochs);
  ST_CHECK(size.count > 0, "`training.epochs` = ", epochs, " counts passes over the training split, which is empty; "
           "lower `data.val_fraction` or set `training.steps`");
  ST_ASSERT(sequences_per_step > 0 && seq_len > 0);
  const double per_step = size.unit == data::EpochSize::Unit::kSequences
                              ? static_cast<double>(sequences_per_step)
                              : static_cast<double>(sequences_per_step) * static_cast<double>(seq_len);
  return std::max<int64_t>(1, ceil_of(epochs * static_cast<double>(size.count) / per_step));
}

int64_t warmup_steps_for(double fraction, int64_t steps) {
  if (fraction <= 0 || steps <= 0) return 0;
  return ceil_of(fraction * static_cast<double>(steps));
}

std::vector<std::string> launch_choice_lines(const JobConfig& c, const LaunchChoices& choices) {
  std::vector<std::string> defaults, lines;
  if (defaulted(c, "optimizer.lr"))
    defaults.push_back(fmt::format("lr {:g} (optimizer.lr not given)", c.optimizer.lr));
  if (c.schedule.warmup_fraction > 0) {
    if (defaulted(c, "schedule.warmup_fraction"))
      defaults.push_back(fmt::format("warm-up {:g} % of the steps = {} step{} (schedule.warmup_steps not given)",
                                     100 * c.schedule.warmup_fraction, c.schedule.warmup_steps,
                                     c.schedule.warmup_steps == 1 ? "" : "s"));
    else
      lines.push_back(fmt::format("schedule.warmup_fraction = {:g}: {} warm-up steps of {}", c.schedule.warmup_fraction,
                                  c.schedule.warmup_steps, c.training.steps));
  }
  if (choices.seq_len_auto) {
    if (defaulted(c, "training.seq_len"))
      defaults.push_back(fmt::format("seq_len {} ({}; training.seq_len not given)", c.training.seq_len,
                                     choices.seq_len.why));
    else
      lines.push_back(fmt::format("training.seq_len = 0 (auto): {} ({})", c.training.seq_len, choices.seq_len.why));
  }
  if (c.training.epochs > 0) {
    const bool sequences = choices.epoch.unit == data::EpochSize::Unit::kSequences;
    const std::string how =
        sequences ? fmt::format("{} training sequences, {} per step; a partial last step is filled from the start of "
                                "the next epoch's order",
                                choices.epoch.count, choices.sequences_per_step)
                  : fmt::format("{} training tokens, {} per step, in random windows", choices.epoch.count,
                                choices.sequences_per_step * c.training.seq_len);
    if (defaulted(c, "training.epochs"))
      defaults.push_back(fmt::format("{:g} epoch{} = {} steps ({}; training.steps not given)", c.training.epochs,
                                     c.training.epochs == 1 ? "" : "s", c.training.steps, how));
    else
      lines.push_back(fmt::format("training.epochs = {:g}: {} steps ({})", c.training.epochs, c.training.steps, how));
  }
  if (!defaults.empty()) {
    std::string line = "fine-tuning defaults (model.hf set; keys given in a config file or on the command line win): ";
    for (size_t i = 0; i < defaults.size(); ++i) line += (i == 0 ? "" : ", ") + defaults[i];
    lines.insert(lines.begin(), line);
  }
  return lines;
}

optim::ScheduleConfig schedule_config(const JobConfig& config) {
  optim::ScheduleConfig sc;
  sc.type = optim::parse_schedule(config.schedule.type, "schedule.type");
  sc.peak_lr = config.optimizer.lr;
  sc.warmup_steps = config.schedule.warmup_steps;
  sc.total_steps = config.training.steps;
  sc.min_lr_ratio = config.schedule.min_lr_ratio;
  sc.decay_fraction = config.schedule.decay_fraction;
  return sc;
}

}  // namespace shardtrain::train
