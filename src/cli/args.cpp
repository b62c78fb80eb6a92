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

namespace {

// parse(text, &used) over all of `text`, else an error naming the flag, what it takes and the text.
template <typename T, typename Parse>
T parsed_flag(const std::string& flag, const std::string& text, const char* command, const char* takes, Parse parse) {
  size_t used = 0;
  T v{};
  try {
    v = parse(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  ST_CHECK(!text.empty() && used == text.size(), command, ": ", flag, " takes ", takes, ", found `", text, "`");
  return v;
}

}  // namespace

int64_t integer_flag(const std::string& flag, const std::string& text, const char* command) {
  return parsed_flag<int64_t>(flag, text, command, "an integer",
                              [](const std::string& t, size_t* used) { return std::stoll(t, used); });
}

double number_flag(const std::string& flag, const std::string& text, const char* command) {
  return parsed_flag<double>(flag, text, command, "a number",
                             [](const std::string& t, size_t* used) { return std::stod(t, used); });
}

}  // namespace shardtrain::cli
