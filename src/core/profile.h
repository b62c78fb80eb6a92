// An opt-in per-op timer for finding where a step's time goes. With the environment
// variable SHARDTRAIN_PROFILE=1, each ScopedTimer synchronises the device before and after
// its scope and adds the host-clock time to its name's total (the synchronisation costs a
// little, so profiled steps are slower than real ones); otherwise it does nothing.
#pragma once

#include <chrono>
#include <string>

#include "core/device.h"

namespace shardtrain::profile {

bool enabled();

class ScopedTimer {
 public:
  ScopedTimer(const char* name, Device device);
  ~ScopedTimer();
  ScopedTimer(const ScopedTimer&) = delete;
  ScopedTimer& operator=(const ScopedTimer&) = delete;

 private:
  const char* name_;
  Device device_;
  bool on_;
  std::chrono::steady_clock::time_point start_;
};

// The totals so far as a table (name, calls, ms, share), sorted by time; then cleared.
std::string report_and_reset();

}  // namespace shardtrain::profile
