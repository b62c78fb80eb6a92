// Subcommand implementations: argument splitting, then the modules do the work.
#include "cli/commands.h"

#include <cstdio>

#include <fmt/format.h>

#include "core/error.h"
#include "core/log.h"
#include "train/config.h"
#include "train/trainer.h"

namespace shardtrain::cli {
namespace {

struct JobArgs {
  std::string config_file;
  std::vector<std::string> overrides;
};

// [CONFIG.toml | -c CONFIG.toml] [--section.key=value ...]
JobArgs parse_job_args(const std::vector<std::string>& args, const char* command) {
  JobArgs j;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "-c" || a == "--config") {
      ST_CHECK(i + 1 < args.size(), command, ": ", a, " needs a file name");
      j.config_file = args[++i];
    } else if (a.rfind("--", 0) == 0) {
      j.overrides.push_back(a);
    } else if (j.config_file.empty()) {
      j.config_file = a;
    } else {
      ST_THROW(command, ": unexpected argument `", a, "` (overrides look like --section.key=value)");
    }
  }
  return j;
}

}  // namespace

std::string usage() {
  return "usage: shardtrain <command> [options]\n"
         "\n"
         "commands:\n"
         "  train [CONFIG.toml] [--section.key=value ...]   train a model (no arguments: the built-in\n"
         "                                                   default job on Debian's fortunes corpus)\n"
         "  print-config [CONFIG.toml] [--section.key=value ...]\n"
         "                                                   show every key's effective value and source\n"
         "  help                                             this text; `shardtrain help config` lists keys\n";
}

int run_print_config(const std::vector<std::string>& args) {
  const JobArgs j = parse_job_args(args, "print-config");
  const train::LoadedConfig loaded = train::load_config(j.config_file, j.overrides);
  std::fputs(train::describe(loaded).c_str(), stdout);
  return 0;
}

int run_train(const std::vector<std::string>& args) {
  const JobArgs j = parse_job_args(args, "train");
  const train::LoadedConfig loaded = train::load_config(j.config_file, j.overrides);
  log::info(j.config_file.empty() ? std::string("config: built-in default job")
                                  : fmt::format("config: {}", j.config_file));
  train::Trainer trainer(loaded.config);
  const train::TrainSummary s = trainer.run();
  if (!s.steps.empty()) {
    log::info(fmt::format("loss: first step {:.4f}, last step {:.4f}", s.steps.front().loss, s.steps.back().loss));
  }
  if (!s.sample.empty()) {
    std::printf("\n--- sample ---\n%s\n--------------\n", s.sample.c_str());
  }
  return 0;
}

}  // namespace shardtrain::cli
