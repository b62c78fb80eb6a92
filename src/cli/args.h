// Argument helpers the subcommands share.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/error.h"

namespace shardtrain::cli {

struct JobArgs {
  std::string config_file;
  std::vector<std::string> overrides;  // each "--section.key=value"
};

// [CONFIG.toml | -c CONFIG.toml] [--section.key=value | --section.key value ...]; errors name
// `command`. In the spaced form the next argument is the value unless it starts with `--`; a
// boolean key may stand alone (true), and takes the next argument only if it is true or false,
// so `--training.deterministic job.toml` reads job.toml as the config file. An unknown key fails
// here, with the nearest valid one.
JobArgs parse_job_args(const std::vector<std::string>& args, const char* command);

// A command's parser met an option it does not know. run_command_line (cli/command_table.h)
// adds the nearest of the command's own options to the message.
class UnknownOption : public Error {
 public:
  UnknownOption(std::string command, std::string option);
  const std::string& command() const { return command_; }
  const std::string& option() const { return option_; }

 private:
  std::string command_, option_;
};
// Throws UnknownOption: "COMMAND: unknown option `--x` (`shardtrain COMMAND --help` lists its
// options)".
[[noreturn]] void unknown_option(const std::string& command, const std::string& option);

// The value of `flag` as an integer / a number, or an error naming the flag and the text.
int64_t integer_flag(const std::string& flag, const std::string& text, const char* command);
double number_flag(const std::string& flag, const std::string& text, const char* command);

// This process's rank and world size as its launcher (mpirun, srun, torchrun) set them in the
// environment; world 1 without one. Not validated: the trainer's bootstrap checks them.
struct LaunchedRank {
  int rank = 0;
  int world = 1;
};
LaunchedRank launched_rank();

// With several ranks launched, the log is rank-prefixed and rank 0's info lines alone are shown
// from the first line on (the communicator, which tells the trainer its rank, comes later).
void log_as_launched_rank();

}  // namespace shardtrain::cli
