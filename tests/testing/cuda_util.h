// Host <-> device copies for CUDA tests, and the skip when no device is present.
#pragma once

#include <gtest/gtest.h>

#include "core/tensor.h"

namespace shardtrain::testing {

// True when a CUDA device is usable (device 0 is then initialised).
bool cuda_available();
Tensor to_device(const Tensor& host);  // contiguous copy on cuda:0
Tensor to_host(const Tensor& device);  // contiguous copy on the host (synchronises)

}  // namespace shardtrain::testing

#define ST_REQUIRE_CUDA() \
  if (!::shardtrain::testing::cuda_available()) GTEST_SKIP() << "no CUDA device"
