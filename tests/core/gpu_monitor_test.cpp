// The GPU monitor's arithmetic (mean clock, power-capped share, mean power from the energy
// counter or from power samples) and its behaviour without a usable NVML device: unavailable,
// with a reason, and never an exception.
#include "core/gpu_monitor.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>

namespace shardtrain {
namespace {

TEST(GpuMonitor, AccumulatesClockCapShareAndPowerFromTheEnergyCounter) {
  ActivityAccumulator acc;
  acc.add_sample(1400, kClockReasonSwPowerCap);
  acc.add_sample(1600, kClockReasonSwPowerCap | kClockReasonSwThermal);
  acc.add_sample(1980, 0);
  acc.add_sample(1500, kClockReasonHwPowerBrake);
  const GpuActivity a = acc.finish(2.0, 1'380'000.0, 700.0, 1980.0);  // 1,380 J over 2 s
  EXPECT_EQ(a.samples, 4);
  EXPECT_DOUBLE_EQ(a.seconds, 2.0);
  EXPECT_DOUBLE_EQ(a.energy_j, 1380.0);
  EXPECT_DOUBLE_EQ(a.mean_power_w, 690.0);
  EXPECT_DOUBLE_EQ(a.power_limit_w, 700.0);
  EXPECT_DOUBLE_EQ(a.mean_sm_mhz, (1400.0 + 1600 + 1980 + 1500) / 4);
  EXPECT_DOUBLE_EQ(a.max_sm_mhz, 1980.0);
  EXPECT_DOUBLE_EQ(a.power_capped, 0.5);
  EXPECT_DOUBLE_EQ(a.thermal, 0.5);
  // finish starts a new interval
  const GpuActivity empty = acc.finish(0.5, 0.0, 700.0, 1980.0);
  EXPECT_EQ(empty.samples, 0);
  EXPECT_EQ(empty.mean_sm_mhz, 0.0);
  EXPECT_EQ(empty.power_capped, 0.0);
  EXPECT_EQ(format_activity(empty), "no samples");
}

TEST(GpuMonitor, WithoutAnEnergyCounterTheSampledPowerStandsIn) {
  ActivityAccumulator acc;
  acc.add_sample(1500, 0, 600.0);
  acc.add_sample(1500, 0, 700.0);
  acc.add_sample(1500, 0);  // a sample whose power reading failed counts for the clock only
  const GpuActivity a = acc.finish(4.0, NAN, 700.0, 1980.0);
  EXPECT_EQ(a.samples, 3);
  EXPECT_DOUBLE_EQ(a.mean_power_w, 650.0);
  EXPECT_DOUBLE_EQ(a.energy_j, 2600.0);
}

TEST(GpuMonitor, IntervalsAddUpWeightedBySamples) {
  ActivityAccumulator acc;
  acc.add_sample(1500, kClockReasonSwPowerCap);
  const GpuActivity first = acc.finish(1.0, 600'000.0, 700.0, 1980.0);
  for (int i = 0; i < 3; ++i) acc.add_sample(1900, 0);
  const GpuActivity second = acc.finish(3.0, 900'000.0, 650.0, 1980.0);
  GpuActivity total;
  accumulate(total, first);
  accumulate(total, second);
  EXPECT_EQ(total.samples, 4);
  EXPECT_DOUBLE_EQ(total.seconds, 4.0);
  EXPECT_DOUBLE_EQ(total.energy_j, 1500.0);
  EXPECT_DOUBLE_EQ(total.mean_power_w, 375.0);
  EXPECT_DOUBLE_EQ(total.mean_sm_mhz, 1800.0);
  EXPECT_DOUBLE_EQ(total.power_capped, 0.25);
  EXPECT_DOUBLE_EQ(total.power_limit_w, 650.0);
  accumulate(total, GpuActivity());  // an unavailable monitor's empty interval changes nothing
  EXPECT_EQ(total.samples, 4);
  EXPECT_DOUBLE_EQ(total.mean_sm_mhz, 1800.0);
  EXPECT_DOUBLE_EQ(total.power_limit_w, 650.0);
}

TEST(GpuMonitor, FormatsTheInterval) {
  ActivityAccumulator acc;
  acc.add_sample(1484, kClockReasonSwPowerCap);
  acc.add_sample(1484, kClockReasonSwPowerCap | kClockReasonHwThermal);
  const GpuActivity a = acc.finish(2.0, 1'384'000.0, 700.0, 1980.0);
  EXPECT_EQ(format_activity(a), "692 W of 700, SM 1484 MHz of 1980, power-capped 100 %, thermal slowdown 50 %");
  acc.add_sample(1980, 0);
  const GpuActivity short_one = acc.finish(0.5, 100'000.0, 700.0, 1980.0);
  EXPECT_EQ(format_activity(short_one), "SM 1980 MHz of 1980, power-capped 0 %");
}

TEST(GpuMonitor, ShortIntervalsGiveNoPowerButTheirEnergiesAddUp) {
  // the counter advances in steps: a 10 ms interval may see none (0 J) or a whole step
  ActivityAccumulator acc;
  GpuActivity total;
  for (int i = 0; i < 300; ++i) {
    acc.add_sample(1500, 0);
    const GpuActivity step = acc.finish(0.01, i % 10 == 9 ? 70'000.0 : 0.0, 700.0, 1980.0);
    EXPECT_TRUE(std::isnan(step.mean_power_w)) << "a 10 ms interval has no mean power";
    accumulate(total, step);
    if (i == 100) {
      EXPECT_TRUE(std::isnan(total.mean_power_w)) << "1 s is still under kMinPowerSeconds";
    }
  }
  EXPECT_NEAR(total.seconds, 3.0, 1e-9);
  EXPECT_NEAR(total.energy_j, 2100.0, 1e-9);
  EXPECT_NEAR(total.mean_power_w, 700.0, 1e-9);
}

TEST(GpuMonitor, AnUnknownDeviceLeavesItUnavailableWithAReason) {
  // no such PCI address exists; on a machine without the driver NVML itself is missing
  GpuMonitor m = GpuMonitor::open("0000:FF:1F.7");
  EXPECT_FALSE(m.available());
  EXPECT_FALSE(m.why_unavailable().empty());
  const bool names_nvml = m.why_unavailable().find("NVML") != std::string::npos ||
                          m.why_unavailable().find("nvidia-ml") != std::string::npos;
  EXPECT_TRUE(names_nvml) << m.why_unavailable();
  const GpuActivity a = m.take();
  EXPECT_EQ(a.samples, 0);
  EXPECT_EQ(a.seconds, 0.0);
  GpuMonitor never_opened;
  EXPECT_FALSE(never_opened.available());
  EXPECT_FALSE(never_opened.why_unavailable().empty());
}

}  // namespace
}  // namespace shardtrain
