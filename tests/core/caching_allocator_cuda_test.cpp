// The CUDA caching allocator: reuse without new driver allocations, statistics, and the
// out-of-memory message. Skips without a device.
#include <algorithm>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/cuda/device.h"
#include "core/tensor.h"

namespace shardtrain {
namespace {

// Before main, so before any allocator exists: the peak breakdown is on for this binary.
const bool kPeakReportOn = setenv("SHARDTRAIN_MEMORY_PEAK_REPORT", "1", 1) == 0;

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

// The breakdown is the named allocations alive at the peak, in 2 MiB-rounded sizes, largest
// first; what came after the peak without exceeding it is not in it.
TEST_F(CachingAllocatorTest, PeakBreakdownNamesWhatWasAliveAtThePeak) {
  ASSERT_TRUE(kPeakReportOn);
  Allocator& a = allocator_for(Device::cuda(0));
  a.reset_peak();
  {
    Tensor b = Tensor::empty({5 << 20}, DType::kU8, Device::cuda(0), "peak test b");
    {
      Tensor first = Tensor::empty({3 << 20}, DType::kU8, Device::cuda(0), "peak test a");
    }
    Tensor c = Tensor::empty({1 << 20}, DType::kU8, Device::cuda(0), "peak test c");
  }
  std::map<std::string, int64_t> at_peak;
  std::vector<int64_t> order;
  for (const auto& [what, bytes] : a.peak_breakdown()) {
    at_peak[what] = bytes;
    order.push_back(bytes);
  }
  EXPECT_EQ(at_peak["peak test b"], 6 << 20);
  EXPECT_EQ(at_peak["peak test a"], 4 << 20);
  EXPECT_EQ(at_peak.count("peak test c"), 0u);
  EXPECT_TRUE(std::is_sorted(order.rbegin(), order.rend()));
  const std::string text = describe_peak_breakdown(a);
  EXPECT_NE(text.find("peak test b"), std::string::npos) << text;
  EXPECT_NE(text.find("6.00 MiB"), std::string::npos) << text;
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

// The build's kernels run on this GPU (init_device checked it), and the error for a GPU they
// cannot run on says what the build has and how to build for it.
TEST(KernelImage, RunsHereAndTheMismatchSaysHowToRebuild) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  cuda::init_device(0);
  EXPECT_NO_THROW(cuda::check_kernel_image(0));
  const std::string m = cuda::no_kernel_image_message("90a", 8, 0, "NVIDIA A100-SXM4-80GB", 1);
  EXPECT_NE(m.find("CUDA kernels for sm_90a only, and cuda:1 (NVIDIA A100-SXM4-80GB) is compute capability 8.0"),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("-DCMAKE_CUDA_ARCHITECTURES=80 ...`"), std::string::npos) << m;
  EXPECT_NE(cuda::no_kernel_image_message("80", 9, 0, "H100", 0).find("ARCHITECTURES=90a ...`"), std::string::npos);
}

}  // namespace
}  // namespace shardtrain
