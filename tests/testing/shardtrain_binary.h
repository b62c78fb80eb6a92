// The shardtrain program for tests that launch it: beside the test binary (a bundle carried to
// a GPU machine), else in the build tree (SHARDTRAIN_BINARY_DIR, defined for every test); and
// running it, or any command line, for its exit status and output.
#pragma once

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <string>

namespace shardtrain::testing {

inline std::string shardtrain_binary() {
  const std::filesystem::path here = std::filesystem::read_symlink("/proc/self/exe").parent_path() / "shardtrain";
  if (std::filesystem::exists(here)) return here.string();
  return std::string(SHARDTRAIN_BINARY_DIR) + "/shardtrain";
}

struct CommandResult {
  int status;          // the exit status; -1 when the command did not exit normally
  std::string output;  // what it wrote to standard output
};

// Runs `command_line` with the shell and waits for it.
inline CommandResult run_command(const std::string& command_line) {
  FILE* p = popen(command_line.c_str(), "r");
  if (p == nullptr) return {-1, "popen failed for: " + command_line};
  std::string out;
  std::array<char, 4096> buf;
  while (size_t n = fread(buf.data(), 1, buf.size(), p)) out.append(buf.data(), n);
  const int st = pclose(p);
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, out};
}

// `shardtrain ARGS` with its standard error in the output, after the environment assignments
// `env` ("NAME=value ..."), if any.
inline CommandResult run_shardtrain(const std::string& args, const std::string& env = "") {
  return run_command((env.empty() ? "" : env + " ") + shardtrain_binary() + " " + args + " 2>&1");
}

}  // namespace shardtrain::testing
