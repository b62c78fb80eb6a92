// Argument helpers the subcommands share.
#include "cli/args.h"

#include <cstdlib>
#include <optional>

#include "core/error.h"
#include "core/log.h"
#include "train/config_keys.h"

namespace shardtrain::cli {

JobArgs parse_job_args(const std::vector<std::string>& args, const char* command) {
  JobArgs j;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "-c" || a == "--config") {
      ST_CHECK(i + 1 < args.size(), command, ": ", a, " needs a file name");
      j.config_file = args[++i];
    } else if (a.rfind("--", 0) == 0 && a.find('=') != std::string::npos) {
      j.overrides.push_back(a);
    } else if (a.rfind("--", 0) == 0) {
      const std::string key = a.substr(2);
      const bool has_next = i + 1 < args.size() && args[i + 1].rfind("--", 0) != 0;
      if (train::is_boolean_key(key, std::string(command) + ": `" + a + "`: ")) {
        const bool value_next = has_next && (args[i + 1] == "true" || args[i + 1] == "false");
        j.overrides.push_back(a + "=" + (value_next ? args[++i] : std::string("true")));
      } else {
        ST_CHECK(has_next, command, ": `", a, "` needs a value (", a, "=VALUE or ", a, " VALUE), found ",
                 i + 1 < args.size() ? "the option `" + args[i + 1] + "` after it" : std::string("nothing after it"),
                 "; a value that starts with `--` needs the `=` form");
        j.overrides.push_back(a + "=" + args[++i]);
      }
    } else if (j.config_file.empty()) {
      j.config_file = a;
    } else {
      ST_THROW(command, ": unexpected argument `", a, "`: the config file is `", j.config_file,
               "` already (overrides look like --section.key=value or --section.key value)");
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

namespace {

std::optional<int> env_int(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == 0) return std::nullopt;
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);
  if (*end != 0 || n < 0 || n > (1 << 24)) return std::nullopt;
  return static_cast<int>(n);
}

}  // namespace

LaunchedRank launched_rank() {
  // Open MPI, then MPICH/Hydra, then torchrun, then Slurm's srun
  constexpr const char* kPairs[][2] = {{"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"},
                                       {"PMI_RANK", "PMI_SIZE"},
                                       {"RANK", "WORLD_SIZE"},
                                       {"SLURM_PROCID", "SLURM_NTASKS"}};
  for (const auto& [rank_var, world_var] : kPairs) {
    const std::optional<int> rank = env_int(rank_var), world = env_int(world_var);
    if (rank && world && *world >= 1 && *rank < *world) return {*rank, *world};
  }
  return {};
}

void log_as_launched_rank() {
  const LaunchedRank r = launched_rank();
  if (r.world > 1) log::set_rank(r.rank, false);
}

UnknownOption::UnknownOption(std::string command, std::string option)
    : Error(command + ": unknown option `" + option + "` (`shardtrain " + command + " --help` lists its options)"),
      command_(std::move(command)),
      option_(std::move(option)) {}

void unknown_option(const std::string& command, const std::string& option) { throw UnknownOption(command, option); }

}  // namespace shardtrain::cli
