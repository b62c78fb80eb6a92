// Locating ../shared/data (real test data beside the checkout in CI and on developer machines;
// absent on a user's fresh machine, where tests that need it skip with a message).
#pragma once

#include <string>

#include <gtest/gtest.h>

namespace shardtrain::testing {

// The shared data folder (SHARDTRAIN_SHARED_DATA overrides), or "" when it does not exist.
std::string shared_data_dir();
// The repository root (for committed reference files under tests/); the environment
// variable SHARDTRAIN_SOURCE_DIR overrides it.
std::string source_dir();

}  // namespace shardtrain::testing

// Skips the current test when ../shared/data is absent, saying so.
#define ST_REQUIRE_SHARED_DATA(dir_var)                                                      \
  const std::string dir_var = ::shardtrain::testing::shared_data_dir();                      \
  if (dir_var.empty()) GTEST_SKIP() << "../shared/data not found (set SHARDTRAIN_SHARED_DATA)"
