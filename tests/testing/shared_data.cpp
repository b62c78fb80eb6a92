// Paths to test data, fixed at configure time and overridable from the environment.
#include "testing/shared_data.h"

#include <cstdlib>
#include <filesystem>

namespace shardtrain::testing {

std::string shared_data_dir() {
  std::string dir = SHARDTRAIN_SHARED_DATA_DIR;
  if (const char* env = std::getenv("SHARDTRAIN_SHARED_DATA")) dir = env;
  std::error_code ec;
  return std::filesystem::is_directory(dir, ec) ? dir : std::string();
}

std::string source_dir() {
  // SHARDTRAIN_SOURCE_DIR: for test binaries run from another checkout (the GPU machine)
  if (const char* env = std::getenv("SHARDTRAIN_SOURCE_DIR")) return env;
  return SHARDTRAIN_SOURCE_DIR;
}

}  // namespace shardtrain::testing
