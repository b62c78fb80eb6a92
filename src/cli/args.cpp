// Argument helpers the subcommands share.
#include "cli/args.h"

#include "core/error.h"

namespace shardtrain::cli {

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

int64_t integer_flag(const std::string& flag, const std::string& text, const char* command) {
  size_t used = 0;
  int64_t v = 0;
  try {
    v = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  ST_CHECK(!text.empty() && used == text.size(), command, ": ", flag, " takes an integer, found `", text, "`");
  return v;
}
double number_flag(const std::string& flag, const std::string& text, const char* command) {
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  ST_CHECK(!text.empty() && used == text.size(), command, ": ", flag, " takes a number, found `", text, "`");
  return v;
}

}  // namespace shardtrain::cli
