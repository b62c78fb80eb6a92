// The opt-in per-op profile: totals per op name, only the outermost timer of a scope counts,
// and the achieved rates and the roofline share come from the costs the ops state.
#include "core/profile.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <thread>

namespace shardtrain::profile {
namespace {

TEST(Profile, ReportsRatesAndTheRooflineShareFromTheStatedCost) {
  ::setenv("SHARDTRAIN_PROFILE", "1", 1);  // read once, at the first timer: this test's
  ASSERT_TRUE(enabled());
  set_roofline(1e12, 1e11);  // 1 TFLOP/s, 100 GB/s
  for (int i = 0; i < 2; ++i) {
    // per call: 2 GFLOP and 1 GB, so a roofline floor of max(2 ms, 10 ms) = 10 ms
    ScopedTimer outer("op_a", Device::cpu(), {2e9, 1e9});
    { ScopedTimer inner("op_nested", Device::cpu(), {1e12, 1e12}); }  // inside a timed scope: not counted
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const std::string report = report_and_reset();
  EXPECT_EQ(report.find("op_nested"), std::string::npos) << report;
  std::istringstream lines(report);
  std::string line;
  bool found = false;
  while (std::getline(lines, line)) {
    long long calls = 0;
    double ms = 0, share = 0, tflops = 0, gbs = 0, roof = 0;
    if (std::sscanf(line.c_str(), "| op_a | %lld | %lf | %lf %% | %lf | %lf | %lf %% |", &calls, &ms, &share, &tflops,
                    &gbs, &roof) != 6)
      continue;
    found = true;
    EXPECT_EQ(calls, 2);
    EXPECT_GE(ms, 40.0);
    EXPECT_NEAR(share, 100.0, 1e-9);
    // the rates are the stated totals over the measured time, printed rounded
    EXPECT_NEAR(tflops, 4e9 / (ms * 1e-3) * 1e-12, 0.051);
    EXPECT_NEAR(gbs, 2e9 / (ms * 1e-3) * 1e-9, 0.51);
    EXPECT_NEAR(roof, 100 * 20.0 / ms, 0.51);
  }
  EXPECT_TRUE(found) << report;
  // the totals were cleared: only the header is left
  EXPECT_EQ(report_and_reset().find("op_a"), std::string::npos);
}

}  // namespace
}  // namespace shardtrain::profile
