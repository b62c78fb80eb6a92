// An opt-in per-op timer for finding where a step's time goes. With the environment
// variable SHARDTRAIN_PROFILE=1, each ScopedTimer synchronises the device before and after
// its scope and adds the host-clock time to its name's total (the synchronisation costs a
// little, so profiled steps are slower than real ones); otherwise it does nothing. An op
// states its Cost (the FLOPs and bytes it cannot do without), so the report can hold each
// op's time against the device's roofline.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include <initializer_list>

#include "core/device.h"
#include "core/tensor.h"

namespace shardtrain::profile {

bool enabled();
// Turns the per-op timer on as SHARDTRAIN_PROFILE=1 does (`bench --calibration`); before the
// work it should time.
void enable();

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

// A named stretch of work around ops (a step, its forward, a block), for the trace only: with
// SHARDTRAIN_PROFILE_TRACE set it becomes a span enclosing the ops inside it; otherwise it does
// nothing. `index` >= 0 is appended to the name ("block" 3: "block 3").
class Region {
 public:
  explicit Region(const char* name, int64_t index = -1);
  ~Region();
  Region(const Region&) = delete;
  Region& operator=(const Region&) = delete;

 private:
  const char* name_;
  int64_t index_;
  bool on_;
  std::chrono::steady_clock::time_point start_;
};

// SHARDTRAIN_PROFILE_TRACE=FILE (which also turns the per-op timer on): every timed op and
// region goes into a timeline that write_trace() saves in the Chrome trace event format, which
// Perfetto (ui.perfetto.dev) and chrome://tracing open. The path it names ("" when unset).
const std::string& trace_path();
// Writes the timeline recorded so far to `path` (rank > 0: `path` with ".rank<r>" before its
// extension) as process `rank`, then clears it; the file's name. At most kMaxTraceEvents are
// kept (the first ones); the file says how many were left out.
constexpr size_t kMaxTraceEvents = 1000000;
std::string write_trace(const std::string& path, int rank);

// One op's totals so far: its calls, the time they took and their summed cost.
struct OpTotal {
  std::string name;
  int64_t calls = 0;
  double seconds = 0;
  Cost cost;
};
// The totals so far, by name, left as they are (`shardtrain bench --calibration` reads them).
std::vector<OpTotal> op_totals();

// The totals so far as a table, sorted by time, then cleared: name, calls, ms, share, and
// from the ops' costs the achieved TFLOP/s and GB/s and the roofline's share of the time
// (max(FLOPs / peak, bytes / bandwidth) over the measured time: 100 % is the hardware limit).
std::string report_and_reset();
// Clears the totals without a report: the trainer drops what the untimed first steps (plans,
// GEMM algorithm timing, warm-up) spent, so the table covers the steps its figures cover. The
// trace keeps every event.
void reset_totals();

}  // namespace shardtrain::profile
