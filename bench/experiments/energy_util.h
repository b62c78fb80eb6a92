// Sustained runs on a board at its power limit: a workload called back to back for a few
// seconds while the GPU monitor (core/gpu_monitor.h) reads the board's energy counter and
// SM clock. Shared by the programs that measure joules per unit of work.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>

#include "core/device.h"
#include "core/gpu_monitor.h"

namespace shardtrain::bench {

struct SustainedRun {
  int64_t calls = 0;
  double seconds = 0;
  GpuActivity board;
};

// One untimed call, then calls in groups of ten until `seconds` have passed.
inline SustainedRun run_sustained(GpuMonitor& monitor, Device device, double seconds, const std::function<void()>& run) {
  using Clock = std::chrono::steady_clock;
  run();
  synchronize(device);
  (void)monitor.take();
  SustainedRun r;
  const Clock::time_point t0 = Clock::now();
  while (r.seconds < seconds) {
    for (int i = 0; i < 10; ++i) run();
    r.calls += 10;
    synchronize(device);
    r.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  }
  r.board = monitor.take();
  return r;
}

}  // namespace shardtrain::bench
