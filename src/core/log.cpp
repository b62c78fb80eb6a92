// The process logger. Lines are written whole under a mutex so threads do not interleave.
#include "core/log.h"

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>

#include "core/error.h"

namespace shardtrain::log {
namespace {

struct State {
  Level level = Level::kInfo;
  int rank = -1;
  bool all_ranks = false;
  std::FILE* file = nullptr;
  std::mutex mutex;
  State() {
    if (const char* env = std::getenv("SHARDTRAIN_LOG_LEVEL")) level = parse_level(env);
  }
};

State& state() {
  static State s;
  return s;
}

const char* level_tag(Level l) {
  switch (l) {
    case Level::kDebug: return "debug";
    case Level::kInfo: return "info";
    case Level::kWarn: return "warn";
    case Level::kError: return "error";
  }
  return "?";
}

}  // namespace

void set_level(Level l) { state().level = l; }
Level level() { return state().level; }

Level parse_level(std::string_view name) {
  if (name == "debug") return Level::kDebug;
  if (name == "info") return Level::kInfo;
  if (name == "warn") return Level::kWarn;
  if (name == "error") return Level::kError;
  ST_THROW("log level `", name, "` unknown; expected debug, info, warn or error");
}

void set_rank(int rank, bool all_ranks) {
  state().rank = rank;
  state().all_ranks = all_ranks;
}

void write(Level l, std::string_view message) {
  State& s = state();
  if (l < s.level) return;
  if (s.rank > 0 && !s.all_ranks && l < Level::kWarn) return;
  std::string line;
  if (s.rank >= 0) line += "[rank " + std::to_string(s.rank) + "] ";
  if (l != Level::kInfo) {
    line += level_tag(l);
    line += ": ";
  }
  line += message;
  line += '\n';
  std::lock_guard<std::mutex> lock(s.mutex);
  std::fputs(line.c_str(), stderr);
  if (s.file != nullptr) {
    std::fputs(line.c_str(), s.file);
    std::fflush(s.file);
  }
}

void warn_shared(std::string_view message) {
  const State& s = state();
  if (s.rank > 0 && !s.all_ranks) return;
  write(Level::kWarn, message);
}

void set_file(const std::string& path, bool append) {
  State& s = state();
  std::FILE* f = nullptr;
  if (!path.empty()) {
    f = std::fopen(path.c_str(), append ? "a" : "w");
    ST_CHECK(f != nullptr, "cannot open the log file `", path, "` for writing");
  }
  std::lock_guard<std::mutex> lock(s.mutex);
  if (s.file != nullptr) std::fclose(s.file);
  s.file = f;
}

}  // namespace shardtrain::log
