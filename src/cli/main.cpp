// The `shardtrain` command: pick the subcommand, run it, print any error chain once.
#include <cstdio>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "core/crash_report.h"
#include "core/error.h"
#include "train/config.h"

int main(int argc, char** argv) {
  using namespace shardtrain;
  crash_report::install("shardtrain");
  const std::vector<std::string> all(argv + 1, argv + argc);
  const std::string command = all.empty() ? "help" : all[0];
  const std::vector<std::string> rest(all.begin() + (all.empty() ? 0 : 1), all.end());
  try {
    if (command == "train") return cli::run_train(rest);
    if (command == "print-config") return cli::run_print_config(rest);
    if (command == "plan") return cli::run_plan(rest);
    if (command == "tokenize") return cli::run_tokenize(rest);
    if (command == "inspect") return cli::run_inspect(rest);
    if (command == "export") return cli::run_export(rest);
    if (command == "generate") return cli::run_generate(rest);
    if (command == "cache") return cli::run_cache(rest);
    if (command == "bench") return cli::run_bench(rest);
    if (command == "version" || command == "--version") return cli::run_version(rest);
    if (command == "help" || command == "-h" || command == "--help") {
      if (!rest.empty() && rest[0] == "config") {
        const bool markdown = rest.size() > 1 && rest[1] == "--markdown";  // the page docs/configuration.md
        std::fputs((markdown ? train::reference_markdown() : train::reference_table()).c_str(), stdout);
      } else {
        std::fputs(cli::usage().c_str(), stdout);
      }
      return 0;
    }
    std::fprintf(stderr, "error: unknown command `%s`\n\n%s", command.c_str(), cli::usage().c_str());
    return 2;
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
