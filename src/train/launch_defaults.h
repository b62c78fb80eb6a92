// What a launch decides once the model and the data are known: training.seq_len = 0 (auto),
// training.epochs as a step count, schedule.warmup_fraction as warm-up steps, and the log lines
// that say what was chosen and why (the fine-tuning defaults' among them, config.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "optim/schedule.h"
#include "train/config.h"

namespace shardtrain::train {

// training.seq_len = 0: the model's context, capped at kAutoSeqLenCap, and for fine-tuning
// examples at most the longest one rounded up to a multiple of kAutoSeqLenMultiple.
constexpr int64_t kAutoSeqLenCap = 4096;
constexpr int64_t kAutoSeqLenMultiple = 64;

struct SeqLenChoice {
  int64_t seq_len = 0;
  std::string why;  // "the longest example, 301 tokens, rounded up to a multiple of 64"
};
// `longest_example`: tokens of the longest fine-tuning example (0: documents, not measured).
SeqLenChoice auto_seq_len(int64_t model_max_seq_len, int64_t longest_example = 0);

// training.epochs as steps: ceil(epochs x size.count / what one step takes), one step taking
// `sequences_per_step` sequences (training.batch_size x grad_accum_steps x data-parallel
// ranks), or that many x `seq_len` tokens for a token stream; at least 1.
int64_t steps_for_epochs(double epochs, const data::EpochSize& size, int64_t sequences_per_step, int64_t seq_len);

// schedule.warmup_fraction as steps: ceil(fraction x steps) (an exact product is not rounded
// up), 0 for fraction 0.
int64_t warmup_steps_for(double fraction, int64_t steps);

// What a launch resolved: `config` as resolved (its seq_len, steps and warmup_steps final);
// `seq_len` set where training.seq_len was 0; `epoch` the data's size where training.epochs
// was given or defaulted; `sequences_per_step` as for steps_for_epochs.
struct LaunchChoices {
  SeqLenChoice seq_len;
  bool seq_len_auto = false;
  data::EpochSize epoch;
  int64_t sequences_per_step = 0;
};
// The log lines: one "fine-tuning defaults: ..." line naming every key that took one and what
// it came to, and a line for each of training.seq_len = 0, training.epochs and
// schedule.warmup_fraction that was given rather than defaulted.
std::vector<std::string> launch_choice_lines(const JobConfig& config, const LaunchChoices& choices);

// The learning-rate schedule of a job whose training.steps and schedule.warmup_steps are
// decided (resolve_run_shape), as the trainer and `shardtrain batches` apply it.
optim::ScheduleConfig schedule_config(const JobConfig& config);

}  // namespace shardtrain::train
