// An opt-in per-op timer for finding where a step's time goes. With the environment
// variable SHARDTRAIN_PROFILE=1, each ScopedTimer synchronises the device before and after
// its scope and adds the host-clock time to its name's total (the synchronisation costs a
// little, so profiled steps are slower than real ones); otherwise it does nothing. An op
// states its Cost (the FLOPs and bytes it cannot do without), so the report can hold each
// op's time against the device's roofline.
#pragma once

#include <chrono>
#include <string>

#include <initializer_list>

#include "core/device.h"
#include "core/tensor.h"

namespace shardtrain::profile {

bool enabled();

// The least work of one op call: matrix-product FLOPs (2 per multiply-add) and the device
// memory it must read and write once each.
struct Cost {
  double flops = 0;
  double bytes = 0;
};

// Bytes of the defined tensors among `ts`.
inline double bytes_of(std::initializer_list<const Tensor*> ts) {
  double b = 0;
  for (const Tensor* t : ts)
    if (t->defined()) b += static_cast<double>(t->nbytes());
  return b;
}

// The device's dense bf16 peak (FLOP/s) and memory bandwidth (bytes/s) for the report's
// roofline column; without them (0) the column stays empty.
void set_roofline(double peak_flops, double peak_bytes_per_s);

class ScopedTimer {
 public:
  ScopedTimer(const char* name, Device device, Cost cost = {});
  ~ScopedTimer();
  ScopedTimer(const ScopedTimer&) = delete;
  ScopedTimer& operator=(const ScopedTimer&) = delete;

 private:
  const char* name_;
  Device device_;
  Cost cost_;
  bool on_;
  std::chrono::steady_clock::time_point start_;
};

// The totals so far as a table, sorted by time, then cleared: name, calls, ms, share, and
// from the ops' costs the achieved TFLOP/s and GB/s and the roofline's share of the time
// (max(FLOPs / peak, bytes / bandwidth) over the measured time: 100 % is the hardware limit).
std::string report_and_reset();

}  // namespace shardtrain::profile
