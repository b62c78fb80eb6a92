// Totals of the opt-in per-op timer.
#include "core/profile.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <vector>

namespace shardtrain::profile {
namespace {

struct Total {
  int64_t calls = 0;
  double seconds = 0;
  Cost cost;
};

std::mutex g_mutex;
double g_peak_flops = 0, g_peak_bytes_per_s = 0;
thread_local int t_depth = 0;  // only the outermost timer of a thread records (no double counting)
std::map<std::string, Total>& totals() {
  static std::map<std::string, Total> t;
  return t;
}

}  // namespace

bool enabled() {
  static const bool on = [] {
    const char* v = std::getenv("SHARDTRAIN_PROFILE");
    return v != nullptr && std::string(v) != "0" && std::string(v) != "";
  }();
  return on;
}

void set_roofline(double peak_flops, double peak_bytes_per_s) {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_peak_flops = peak_flops;
  g_peak_bytes_per_s = peak_bytes_per_s;
}

ScopedTimer::ScopedTimer(const char* name, Device device, Cost cost)
    : name_(name), device_(device), cost_(cost), on_(enabled()) {
  if (!on_) return;
  if (t_depth > 0) {  // nested: already inside a timed scope, which counts this time
    on_ = false;
    return;
  }
  ++t_depth;
  synchronize(device_);
  start_ = std::chrono::steady_clock::now();
}

ScopedTimer::~ScopedTimer() {
  if (!on_) return;
  --t_depth;
  synchronize(device_);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  std::lock_guard<std::mutex> lock(g_mutex);
  Total& t = totals()[name_];
  ++t.calls;
  t.seconds += s;
  t.cost.flops += cost_.flops;
  t.cost.bytes += cost_.bytes;
}

std::string report_and_reset() {
  std::lock_guard<std::mutex> lock(g_mutex);
  std::vector<std::pair<std::string, Total>> rows(totals().begin(), totals().end());
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.seconds > b.second.seconds; });
  double all = 0;
  for (const auto& r : rows) all += r.second.seconds;
  std::string out = "| op | calls | ms | share | TFLOP/s | GB/s | roofline |\n|---|---|---|---|---|---|---|\n";
  char line[320];
  for (const auto& [name, t] : rows) {
    char rates[160] = "|  |  | ";
    if (t.seconds > 0 && (t.cost.flops > 0 || t.cost.bytes > 0)) {
      const double floor_s = std::max(g_peak_flops > 0 ? t.cost.flops / g_peak_flops : 0.0,
                                      g_peak_bytes_per_s > 0 ? t.cost.bytes / g_peak_bytes_per_s : 0.0);
      char roof[32] = "";
      if (floor_s > 0) std::snprintf(roof, sizeof roof, "%.0f %%", 100 * floor_s / t.seconds);
      std::snprintf(rates, sizeof rates, "| %.1f | %.0f | %s", 1e-12 * t.cost.flops / t.seconds,
                    1e-9 * t.cost.bytes / t.seconds, roof);
    }
    std::snprintf(line, sizeof line, "| %s | %lld | %.2f | %.1f %% %s |\n", name.c_str(),
                  static_cast<long long>(t.calls), 1e3 * t.seconds, all > 0 ? 100 * t.seconds / all : 0.0, rates);
    out += line;
  }
  totals().clear();
  return out;
}

}  // namespace shardtrain::profile
