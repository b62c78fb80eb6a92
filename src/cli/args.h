// Argument helpers the subcommands share.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace shardtrain::cli {

struct JobArgs {
  std::string config_file;
  std::vector<std::string> overrides;
};

// [CONFIG.toml | -c CONFIG.toml] [--section.key=value ...]; errors name `command`.
JobArgs parse_job_args(const std::vector<std::string>& args, const char* command);

// The value of `flag` as an integer / a number, or an error naming the flag and the text.
int64_t integer_flag(const std::string& flag, const std::string& text, const char* command);
double number_flag(const std::string& flag, const std::string& text, const char* command);

}  // namespace shardtrain::cli
