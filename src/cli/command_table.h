// The `shardtrain` commands in one table: each command's function and its help text, from which
// both the overview (`shardtrain help`) and a command's own help (`--help`) are made.
#pragma once

#include <string>
#include <vector>

namespace shardtrain::cli {

struct Command {
  const char* name;
  int (*run)(const std::vector<std::string>& args);  // the arguments after the name; the exit status
  const char* usage;    // "train [CONFIG.toml] [...]": one or more lines, without "shardtrain "
  const char* summary;  // one line for the overview
  const char* details;  // what it does, its options with their defaults, line by line
  const char* example;  // one command line
  bool takes_job = false;  // reads a job: CONFIG.toml and --section.key overrides
};

// Every command, in the order the overview lists them.
const std::vector<Command>& commands();

// The command called `name`, or nullptr.
const Command* find_command(const std::string& name);

// The command nearest to a mistyped `name` by edit distance, or nullptr when none is close.
const Command* nearest_command(const std::string& name);

// The options (`--name`) a command's usage and details name.
std::vector<std::string> command_options(const Command& command);

// "COMMAND: unknown option `--x`; did you mean `--y`? (`shardtrain COMMAND --help` lists its
// options)", the suggestion the nearest of the command's options, or the one other tools call
// `option` (`--max-new-tokens` for generate's `--tokens`). run_command_line turns a parser's
// cli::UnknownOption (cli/args.h) into this message.
std::string unknown_option_message(const std::string& command, const std::string& option);

// `shardtrain help`: every command's usage and summary.
std::string overview();

// `shardtrain COMMAND --help`: its usage, summary, details and example.
std::string command_help(const Command& command);

// True when `args` asks for help (-h or --help anywhere among them).
bool asks_for_help(const std::vector<std::string>& args);

// `shardtrain help [COMMAND | config]`.
int run_help(const std::vector<std::string>& args);

// The whole command line after the program's name; the exit status.
int run_command_line(const std::vector<std::string>& all);

}  // namespace shardtrain::cli
