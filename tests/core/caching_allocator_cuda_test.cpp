// The CUDA caching allocator: reuse without new driver allocations, statistics, and the
// out-of-memory message. Skips without a device.
#include <gtest/gtest.h>

#include "core/cuda/device.h"
#include "core/tensor.h"

namespace shardtrain {
namespace {

class CachingAllocatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
    cuda::init_device(0);
  }
};

TEST_F(CachingAllocatorTest, SecondStepReusesBlocks) {
  Allocator& a = allocator_for(Device::cuda(0));
  auto step = [] {
    Tensor x = Tensor::empty({1000, 37}, DType::kF32, Device::cuda(0), "x");
    Tensor y = Tensor::empty({3 << 20}, DType::kBF16, Device::cuda(0), "y");
  };
  step();
  const MemoryStats after_first = a.stats();
  step();
  const MemoryStats after_second = a.stats();
  EXPECT_EQ(after_second.num_system_allocs, after_first.num_system_allocs);
  EXPECT_EQ(after_second.allocated_bytes, after_first.allocated_bytes);
  EXPECT_GE(after_second.reserved_bytes, 1000 * 37 * 4 + (3 << 20) * 2);
  EXPECT_GE(after_second.peak_allocated_bytes, 1000 * 37 * 4 + (3 << 20) * 2);
}

TEST_F(CachingAllocatorTest, OutOfMemoryNamesTheRequest) {
  try {
    Tensor huge = Tensor::empty({int64_t{1} << 40}, DType::kF32, Device::cuda(0), "a deliberately huge buffer");
    FAIL() << "expected out of memory";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("out of memory"), std::string::npos) << m;
    EXPECT_NE(m.find("a deliberately huge buffer"), std::string::npos) << m;
    EXPECT_NE(m.find("4.00 TiB"), std::string::npos) << m;
  }
}

}  // namespace
}  // namespace shardtrain
