// A run's folder (run.output_dir) remembers the run: its resolved config (config.toml), its log
// (train.log), its metrics and its final sample (sample.txt); each checkpoint holds the config it
// was trained with, so that `checkpoint.resume = auto` goes on with the same settings and no
// retyping. Two runs do not mix in one folder: a new run refuses a folder that holds another
// run's checkpoints unless it resumes it or starts over (run.overwrite).
#pragma once

#include <string>
#include <vector>

#include "train/config.h"

namespace shardtrain::train {

inline constexpr const char* kRunConfigFile = "config.toml";
inline constexpr const char* kRunLogFile = "train.log";
inline constexpr const char* kRunSampleFile = "sample.txt";

// checkpoint.dir, or run.output_dir/checkpoints when it is empty.
std::string checkpoint_root(const JobConfig& config);

// The config a run goes on with. Without checkpoint.resume, when `auto` finds no checkpoint,
// or when the checkpoint holds no config.toml (an older build's), the command's own. Otherwise
// the config the checkpoint was trained with, and on top of it every key the command set (in
// its file or on its command line); `changes` lists the keys whose values that changes
// (checkpoint.resume itself aside). A change of a key that fixes the model or the data a
// resumed run continues with (model shape and weights, the data and its order, seq_len,
// seed) is an error naming the key, both values and what to do instead.
struct ResumedConfig {
  LoadedConfig loaded;
  std::string checkpoint;  // the step directory its config came from ("" when none)
  std::vector<KeyChange> changes;
};
ResumedConfig resolve_resume(const LoadedConfig& command);

// Whether `key` may not change when a run resumes (see resolve_resume).
bool fixed_on_resume(const std::string& key);

// What in `config`'s folders belongs to a run that a new one would mix with: the checkpoint
// root's `latest` (a new run's checkpoints would sit beside it, and `keep` prune across both),
// TensorBoard event files (shown as one run). Empty when there is none. (A run that saved no
// checkpoint cannot be resumed: its metrics file is started anew.)
std::vector<std::string> earlier_run(const JobConfig& config);

// Removes earlier_run's files and the folder's config.toml, train.log and sample.txt (the
// checkpoint root's step_* directories and `latest`, the metrics file, the TensorBoard folder's
// event files); returns what it removed.
std::vector<std::string> remove_earlier_run(const JobConfig& config);

// The command that resumes this run with the config its checkpoints hold:
// shardtrain train --run.output_dir=DIR [--checkpoint.dir=DIR] --checkpoint.resume=auto
std::string resume_command(const JobConfig& config);

}  // namespace shardtrain::train
