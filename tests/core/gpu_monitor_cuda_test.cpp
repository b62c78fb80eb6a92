// The GPU monitor on a real board: NVML opens the CUDA device by its PCI bus id, the sampler
// thread reads the SM clock, and the energy counter gives a mean power within the board's
// limits while matrix products keep it busy for longer than kMinPowerSeconds. Skips without a device.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>

#include "core/cuda/device.h"
#include "core/gpu_monitor.h"
#include "ops/linear.h"
#include "testing/cuda_ops.h"

namespace shardtrain {
namespace {

TEST(GpuMonitorCuda, ReadsPowerAndClockWhileTheDeviceWorks) {
  ST_REQUIRE_CUDA();
  GpuMonitor m = GpuMonitor::open(cuda::pci_bus_id(0), 0.02);
  ASSERT_TRUE(m.available()) << m.why_unavailable();
  const Device dev = Device::cuda(0);
  Tensor x = testing::to_device(testing::random_input({4096, 4096}, DType::kBF16, 1).host);
  Tensor w = testing::to_device(testing::random_input({4096, 4096}, DType::kBF16, 2).host);
  Tensor y = Tensor::empty({4096, 4096}, DType::kBF16, dev, "y");
  synchronize(dev);
  (void)m.take();  // the interval starts with the products
  const auto start = std::chrono::steady_clock::now();
  double busy = 0;
  while (busy < 2.5) {  // ~2.5 s of products (0.14 TFLOP per call): over kMinPowerSeconds
    for (int i = 0; i < 20; ++i) ops::linear_forward(y, x, w, Tensor());
    synchronize(dev);
    busy = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  const GpuActivity a = m.take();
  EXPECT_GE(a.seconds, 2.5);
  EXPECT_LT(a.seconds, busy + 1.0);
  EXPECT_GE(a.samples, 50) << "a 20 ms sampler over more than 2.5 s";
  EXPECT_GT(a.power_limit_w, 50.0);
  EXPECT_GT(a.mean_power_w, 20.0) << format_activity(a);
  EXPECT_LT(a.mean_power_w, 1.3 * a.power_limit_w) << format_activity(a);
  EXPECT_NEAR(a.energy_j, a.mean_power_w * a.seconds, 1e-6 * a.energy_j + 1e-9);
  EXPECT_GT(a.max_sm_mhz, 500.0);
  EXPECT_GT(a.mean_sm_mhz, 100.0) << format_activity(a);
  EXPECT_LE(a.mean_sm_mhz, a.max_sm_mhz + 1.0) << format_activity(a);
  EXPECT_GE(a.power_capped, 0.0);
  EXPECT_LE(a.power_capped, 1.0);
  std::printf("# %s over %.2f s, %lld samples\n", format_activity(a).c_str(), a.seconds,
              static_cast<long long>(a.samples));
}

}  // namespace
}  // namespace shardtrain
