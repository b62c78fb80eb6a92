// One logger for the process: rank-prefixed lines on stderr, rank 0 only unless asked.
// Level from config or SHARDTRAIN_LOG_LEVEL (debug, info, warn, error).
#pragma once

#include <string>
#include <string_view>

namespace shardtrain::log {

enum class Level { kDebug, kInfo, kWarn, kError };

void set_level(Level level);
Level level();
Level parse_level(std::string_view name);  // throws Error on an unknown name
// rank < 0 means "not distributed": no prefix.
void set_rank(int rank, bool all_ranks);

// Also writes every line this process prints to `path` (appended, or the file started anew),
// flushed line by line; "" stops. Throws naming the file when it cannot be opened.
void set_file(const std::string& path, bool append);

void write(Level level, std::string_view message);
inline void debug(std::string_view m) { write(Level::kDebug, m); }
inline void info(std::string_view m) { write(Level::kInfo, m); }
inline void warn(std::string_view m) { write(Level::kWarn, m); }
inline void error(std::string_view m) { write(Level::kError, m); }
// A warning every rank reaches alike (one about the job's settings): rank 0 prints it, as it
// prints info lines, where warn prints on every rank.
void warn_shared(std::string_view message);

}  // namespace shardtrain::log
