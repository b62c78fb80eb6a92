// Launch-time checks of the folders a run writes, and removal of interrupted writes' leftovers.
#include "train/run_paths.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <regex>
#include <system_error>

#include <fmt/format.h>

#include "core/error.h"
#include "core/log.h"

namespace shardtrain::train {

namespace fs = std::filesystem;

namespace {

// Creates folder `path` and creates and removes a small file in it; errors start with `what`.
void probe_folder(const std::string& path, const std::string& what, int rank) {
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

// A trailing '/' would make the siblings' names children of the target.
fs::path export_path(const std::string& target) {
  fs::path p = fs::path(target).lexically_normal();
  if (!p.has_filename() && p.has_parent_path()) p = p.parent_path();
  return p;
}

fs::path parent_of(const fs::path& p) { return p.has_parent_path() ? p.parent_path() : fs::path("."); }

void fsync_path(const fs::path& p, bool folder) {
  const int fd = ::open(p.c_str(), (folder ? O_RDONLY | O_DIRECTORY : O_RDONLY) | O_CLOEXEC);
  ST_CHECK(fd >= 0, "opening `", p.string(), "` to fsync it: ", std::strerror(errno));
  const int r = ::fsync(fd);
  const int fsync_errno = errno;
  ::close(fd);
  ST_CHECK(r == 0, "fsync of `", p.string(), "` failed: ", std::strerror(fsync_errno));
}

bool all_digits(const std::string& s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

}  // namespace

void check_writable_folder(const std::string& path, const std::string& key, int rank) {
  probe_folder(path, fmt::format("`{}` = \"{}\" is not writable", key, path), rank);
}

bool is_export_file(const std::string& name) {
  static const std::regex written(
      R"((config\.json|generation_config\.json|tokenizer\.json|tokenizer_config\.json|special_tokens_map\.json|)"
      R"(tokenizer\.model|model\.safetensors\.index\.json|[^/]+\.safetensors)(\.tmp\.[0-9]+)?)");
  return std::regex_match(name, written) || name.rfind(".shardtrain_write_probe.", 0) == 0;
}

void check_export_target(const std::string& target, const std::string& key) {
  const fs::path p = export_path(target);
  const std::string what = fmt::format("`{}` = \"{}\"", key, target);
  std::error_code ec;
  const fs::file_status st = fs::symlink_status(p, ec);
  if (ec || st.type() == fs::file_type::not_found) return;  // absent: the export creates it
  ST_CHECK(st.type() != fs::file_type::symlink, what, " is a symbolic link; an export replaces its folder whole "
           "(written beside it, then renamed into place), so point `", key, "` at the real folder instead");
  ST_CHECK(st.type() == fs::file_type::directory, what, " exists and is not a folder; an export writes a folder "
           "there, so remove it or choose another path");
  for (const fs::directory_entry& e : fs::directory_iterator(p, ec)) {
    const std::string name = e.path().filename().string();
    const bool file = e.symlink_status(ec).type() == fs::file_type::regular;
    ST_CHECK(file && is_export_file(name), what, " holds `", name, "`, which an export does not write; an export "
             "replaces the folder whole and would delete it. Expected only config.json, generation_config.json, "
             "tokenizer files, *.safetensors and model.safetensors.index.json: move `", name,
             "` away or choose another folder");
  }
  ST_CHECK(!ec, "listing ", what, ": ", ec.message());
}

void check_export_location(const std::string& target, const std::string& key, int rank) {
  check_export_target(target, key);
  probe_folder(parent_of(export_path(target)).string(), fmt::format("`{}` = \"{}\" is not writable", key, target),
               rank);
}

std::string export_sibling(const std::string& target, const std::string& kind, long pid) {
  const fs::path p = export_path(target);
  return (parent_of(p) / (p.filename().string() + "." + kind + "." + std::to_string(pid))).string();
}

std::vector<std::string> remove_interrupted_exports(const std::string& target) {
  std::vector<std::string> removed;
  const fs::path p = export_path(target);
  const std::string base = p.filename().string();
  std::error_code ec;
  if (base.empty() || !fs::is_directory(parent_of(p), ec)) return removed;
  for (const fs::directory_entry& e : fs::directory_iterator(parent_of(p), ec)) {
    const std::string name = e.path().filename().string();
    bool leftover = false;
    for (const char* kind : {".tmp.", ".old."}) {
      const std::string prefix = base + kind;
      leftover = leftover || (name.rfind(prefix, 0) == 0 && all_digits(name.substr(prefix.size())));
    }
    if (!leftover) continue;
    fs::remove_all(e.path(), ec);
    ST_CHECK(!ec, "removing `", e.path().string(), "`, left by an interrupted export: ", ec.message());
    removed.push_back(name);
  }
  return removed;
}

void swap_in_export(const std::string& staged, const std::string& target, const std::string& key) {
  check_export_target(target, key);  // again: the folder may have changed since the launch
  const fs::path to = export_path(target);
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(staged, ec))
    if (e.is_regular_file(ec)) fsync_path(e.path(), false);
  ST_CHECK(!ec, "listing `", staged, "`: ", ec.message());
  fsync_path(staged, true);
  const bool replaces = fs::symlink_status(to, ec).type() == fs::file_type::directory;
  const fs::path old = export_sibling(target, "old", ::getpid());
  if (replaces) {
    fs::rename(to, old, ec);
    ST_CHECK(!ec, "moving the previous export `", to.string(), "` aside to `", old.string(), "`: ", ec.message());
  }
  fs::rename(staged, to, ec);
  if (ec) {
    std::error_code back;
    if (replaces) fs::rename(old, to, back);
    ST_THROW("renaming the new export `", staged, "` to `", to.string(), "`: ", ec.message());
  }
  fsync_path(parent_of(to), true);
  if (replaces) {
    fs::remove_all(old, ec);
    if (ec)
      log::warn(fmt::format("the previous export, moved aside to {}, could not be removed ({}); the next export to "
                            "{} removes it", old.string(), ec.message(), to.string()));
  }
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
