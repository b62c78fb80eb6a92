// The logger's rank rules: info lines from rank 0 only, warnings from every rank, and a shared
// warning (one about the job's settings, which every rank reaches alike) from rank 0 only.
#include "core/log.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

namespace shardtrain::log {
namespace {

// What `say` logs as rank `rank` (all_ranks off), read back from the log file.
template <typename F>
std::string logged_as(int rank, F&& say) {
  const std::string path =
      (std::filesystem::temp_directory_path() / ("shardtrain_log_test_" + std::to_string(::getpid()))).string();
  set_rank(rank, false);
  set_file(path, false);
  say();
  set_file("", false);
  set_rank(-1, false);
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  std::filesystem::remove(path);
  return text.str();
}

TEST(Log, SharedWarningsComeFromRankZeroOnly) {
  const auto say = [] {
    info("an info line");
    warn("a rank's own warning");
    warn_shared("a warning about the job");
  };
  EXPECT_EQ(logged_as(0, say),
            "[rank 0] an info line\n[rank 0] warn: a rank's own warning\n[rank 0] warn: a warning about the job\n");
  EXPECT_EQ(logged_as(1, say), "[rank 1] warn: a rank's own warning\n");
}

}  // namespace
}  // namespace shardtrain::log
