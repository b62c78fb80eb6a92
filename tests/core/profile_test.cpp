// The opt-in per-op profile: totals per op name, only the outermost timer of a scope counts,
// and the achieved rates and the roofline share come from the costs the ops state.
#include "core/profile.h"

#include <unistd.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace shardtrain::profile {
namespace {

// The trace's file, set before main() so that the first look at the variable (cached) sees it.
const std::string& trace_file() {
  static const std::string path = std::filesystem::temp_directory_path() /
                                  ("shardtrain_profile_trace_" + std::to_string(::getpid()) + ".json");
  return path;
}
const bool g_trace_set = [] { return ::setenv("SHARDTRAIN_PROFILE_TRACE", trace_file().c_str(), 1) == 0; }();

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

// reset_totals() drops what was timed so far (the trainer's untimed first steps): the next
// report holds only what came after it.
TEST(Profile, ResetTotalsLeavesOnlyWhatComesAfter) {
  ::setenv("SHARDTRAIN_PROFILE", "1", 1);
  ASSERT_TRUE(enabled());
  report_and_reset();
  { ScopedTimer before("op_before_reset", Device::cpu(), {1e6, 1e6}); }
  reset_totals();
  { ScopedTimer after("op_after_reset", Device::cpu(), {1e6, 1e6}); }
  const std::string report = report_and_reset();
  EXPECT_EQ(report.find("op_before_reset"), std::string::npos) << report;
  EXPECT_NE(report.find("| op_after_reset | 1 |"), std::string::npos) << report;
}

// SHARDTRAIN_PROFILE_TRACE: each timed op and region becomes a complete event of the Chrome
// trace format, ops inside the regions around them, with their rates; a rank's file is named
// apart; nested timers that the totals leave out are left out of the trace too.
TEST(Profile, TheTraceHoldsOpsInsideTheirRegions) {
  ASSERT_TRUE(g_trace_set);
  ASSERT_EQ(trace_path(), trace_file());
  ASSERT_TRUE(enabled()) << "a trace turns the op timers on";
  (void)write_trace(trace_file(), 0);  // what earlier tests recorded
  {
    const Region step("step", 7);
    for (int b = 0; b < 2; ++b) {
      const Region block("block forward", b);
      ScopedTimer op("op_b", Device::cpu(), {3e9, 2e9});
      { ScopedTimer inner("op_hidden", Device::cpu(), {1, 1}); }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  const std::string file = write_trace(trace_file(), 3);
  EXPECT_EQ(file, trace_file().substr(0, trace_file().size() - 5) + ".rank3.json");
  std::ifstream in(file);
  const nlohmann::json t = nlohmann::json::parse(in);
  std::vector<nlohmann::json> ops, regions;
  for (const nlohmann::json& e : t.at("traceEvents")) {
    if (e.value("ph", "") != "X") continue;
    EXPECT_EQ(e.at("pid"), 3);
    (e.at("cat") == "op" ? ops : regions).push_back(e);
  }
  ASSERT_EQ(ops.size(), 2u) << t.dump();  // op_hidden is inside a timed op: not recorded
  ASSERT_EQ(regions.size(), 3u) << t.dump();
  EXPECT_EQ(regions[0].at("name"), "block forward 0");
  EXPECT_EQ(regions[1].at("name"), "block forward 1");
  EXPECT_EQ(regions[2].at("name"), "step 7");
  auto inside = [](const nlohmann::json& a, const nlohmann::json& b) {
    return a.at("ts").get<double>() >= b.at("ts").get<double>() &&
           a.at("ts").get<double>() + a.at("dur").get<double>() <= b.at("ts").get<double>() + b.at("dur").get<double>();
  };
  for (int b = 0; b < 2; ++b) {
    EXPECT_EQ(ops[b].at("name"), "op_b");
    EXPECT_TRUE(inside(ops[b], regions[b])) << ops[b].dump() << " " << regions[b].dump();
    EXPECT_TRUE(inside(regions[b], regions[2]));
    EXPECT_GE(ops[b].at("dur").get<double>(), 5000.0);
    // 3 GFLOP over the op's time
    EXPECT_NEAR(ops[b].at("args").at("TFLOP/s").get<double>(), 3e9 / ops[b].at("dur").get<double>() * 1e-6, 1e-12);
  }
  EXPECT_EQ(t.at("otherData").at("events_left_out"), 0);
  std::filesystem::remove(file);
  std::filesystem::remove(trace_file());
  (void)report_and_reset();
}

}  // namespace
}  // namespace shardtrain::profile
