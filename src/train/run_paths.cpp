// Launch-time checks of the folders a run writes, and removal of interrupted writes' leftovers.
#include "train/run_paths.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <regex>
#include <system_error>

#include <fmt/format.h>

#include "core/error.h"

namespace shardtrain::train {

namespace fs = std::filesystem;

void check_writable_folder(const std::string& path, const std::string& key, int rank) {
  const std::string what = fmt::format("`{}` = \"{}\" is not writable", key, path);
  std::error_code ec;
  fs::create_directories(path, ec);
  ST_CHECK(!ec, what, ": the folder cannot be created (", ec.message(), ")");
  ST_CHECK(fs::is_directory(path, ec), what, ": it is not a folder");
  const fs::path probe = fs::path(path) / fmt::format(".shardtrain_write_probe.{}.{}", rank, ::getpid());
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  ST_CHECK(fd >= 0, what, ": ", std::strerror(errno));
  const bool written = ::write(fd, "probe\n", 6) == 6;
  const int write_errno = errno;
  ::close(fd);
  ::unlink(probe.c_str());
  ST_CHECK(written, what, ": ", std::strerror(write_errno));
}

std::vector<std::string> remove_interrupted_writes(const std::string& folder, bool checkpoint_root) {
  std::vector<std::string> removed;
  std::error_code ec;
  if (!fs::is_directory(folder, ec)) return removed;
  static const std::regex temp_file(R"(.+\.tmp\.[0-9]+)");
  static const std::regex temp_step(R"(\.step_[0-9]+\.tmp)");
  static const std::regex partial_shard(R"(shard-[0-9]+\.partial\.safetensors)");
  for (const fs::directory_entry& e : fs::directory_iterator(folder, ec)) {
    const std::string name = e.path().filename().string();
    const bool dir = e.is_directory(ec);
    const bool leftover = dir ? checkpoint_root && std::regex_match(name, temp_step)
                              : std::regex_match(name, temp_file) ||
                                    (!checkpoint_root && std::regex_match(name, partial_shard));
    if (!leftover) continue;
    fs::remove_all(e.path(), ec);
    ST_CHECK(!ec, "removing `", e.path().string(), "`, left by an interrupted write: ", ec.message());
    removed.push_back(name);
  }
  return removed;
}

}  // namespace shardtrain::train
