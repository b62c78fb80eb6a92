// The `shardtrain` command: run the command line (cli/command_table.h), print any error chain once.
#include <exception>
#include <string>
#include <vector>

#include "cli/args.h"
#include "cli/command_table.h"
#include "core/crash_report.h"
#include "core/log.h"

int main(int argc, char** argv) {
  using namespace shardtrain;
  crash_report::install("shardtrain");
  try {
    cli::log_as_launched_rank();
    return cli::run_command_line(std::vector<std::string>(argv + 1, argv + argc));
  } catch (const std::exception& e) {  // shardtrain::Error and the rest: rank-prefixed with several ranks
    log::error(e.what());
    return 1;
  }
}
