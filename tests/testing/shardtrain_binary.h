// The shardtrain program for tests that launch it: beside the test binary (a bundle carried to
// a GPU machine), else in the build tree (SHARDTRAIN_BINARY_DIR, defined for every test).
#pragma once

#include <filesystem>
#include <string>

namespace shardtrain::testing {

inline std::string shardtrain_binary() {
  const std::filesystem::path here = std::filesystem::read_symlink("/proc/self/exe").parent_path() / "shardtrain";
  if (std::filesystem::exists(here)) return here.string();
  return std::string(SHARDTRAIN_BINARY_DIR) + "/shardtrain";
}

}  // namespace shardtrain::testing
