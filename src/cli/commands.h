// The `shardtrain` subcommands. Each takes the arguments after its name and returns the
// process exit status; errors propagate as shardtrain::Error to main(). Their help texts live in
// cli/command_table.cpp.
#pragma once

#include <string>
#include <vector>

namespace shardtrain::cli {

int run_train(const std::vector<std::string>& args);
int run_plan(const std::vector<std::string>& args);
int run_print_config(const std::vector<std::string>& args);
int run_tokenize(const std::vector<std::string>& args);
int run_inspect(const std::vector<std::string>& args);
int run_export(const std::vector<std::string>& args);
int run_generate(const std::vector<std::string>& args);
int run_cache(const std::vector<std::string>& args);
int run_bench(const std::vector<std::string>& args);
int run_version(const std::vector<std::string>& args);
int run_plot(const std::vector<std::string>& args);
// the token batches a job trains and evaluates on, written to a safetensors file
int run_batches(const std::vector<std::string>& args);

}  // namespace shardtrain::cli
