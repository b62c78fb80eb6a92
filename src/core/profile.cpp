// Totals of the opt-in per-op timer.
#include "core/profile.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace shardtrain::profile {
namespace {

struct Total {
  int64_t calls = 0;
  double seconds = 0;
  Cost cost;
};

struct TraceEvent {
  std::string name;
  bool op = true;  // an op (timed, with its cost) or a region
  double start_us = 0, duration_us = 0;
  Cost cost;
  int thread = 0;
};

std::mutex g_mutex;
std::vector<TraceEvent> g_trace;  // under g_mutex
size_t g_trace_dropped = 0;
const auto g_epoch = std::chrono::steady_clock::now();
std::atomic<int> g_next_thread{0};
thread_local int t_thread = g_next_thread++;

// An op (with its cost) or a region that ran from `start` to `end`, into the trace.
void record(std::string name, bool op, std::chrono::steady_clock::time_point start,
            std::chrono::steady_clock::time_point end, Cost cost = {}) {
  using us = std::chrono::duration<double, std::micro>;
  TraceEvent e{std::move(name), op, us(start - g_epoch).count(), us(end - start).count(), cost, t_thread};
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_trace.size() >= kMaxTraceEvents) {
    ++g_trace_dropped;
    return;
  }
  g_trace.push_back(std::move(e));
}
double g_peak_flops = 0, g_peak_bytes_per_s = 0;
thread_local int t_depth = 0;  // only the outermost timer of a thread records (no double counting)
std::map<std::string, Total>& totals() {
  static std::map<std::string, Total> t;
  return t;
}

}  // namespace

const std::string& trace_path() {
  static const std::string path = [] {
    const char* v = std::getenv("SHARDTRAIN_PROFILE_TRACE");
    return std::string(v == nullptr ? "" : v);
  }();
  return path;
}

std::atomic<bool> g_enabled_by_call{false};

bool enabled() {
  static const bool on = [] {
    const char* v = std::getenv("SHARDTRAIN_PROFILE");
    return (v != nullptr && std::string(v) != "0" && std::string(v) != "") || !trace_path().empty();
  }();
  return on || g_enabled_by_call.load(std::memory_order_relaxed);
}

void enable() { g_enabled_by_call.store(true, std::memory_order_relaxed); }

Region::Region(const char* name, int64_t index) : name_(name), index_(index), on_(!trace_path().empty()) {
  if (on_) start_ = std::chrono::steady_clock::now();
}

Region::~Region() {
  if (!on_) return;
  record(index_ >= 0 ? std::string(name_) + " " + std::to_string(index_) : std::string(name_), false, start_,
         std::chrono::steady_clock::now());
}

std::string write_trace(const std::string& path, int rank) {
  std::string file = path;
  if (rank > 0) {
    const size_t dot = file.rfind('.');
    const size_t slash = file.rfind('/');
    const std::string tag = ".rank" + std::to_string(rank);
    if (dot != std::string::npos && (slash == std::string::npos || dot > slash)) file.insert(dot, tag);
    else file += tag;
  }
  std::vector<TraceEvent> events;
  size_t dropped = 0;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    events.swap(g_trace);
    dropped = std::exchange(g_trace_dropped, 0);
  }
  nlohmann::json out;
  nlohmann::json list = nlohmann::json::array();
  list.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", rank}, {"args", {{"name", "rank " + std::to_string(rank)}}}});
  for (const TraceEvent& e : events) {
    nlohmann::json j = {{"name", e.name}, {"cat", e.op ? "op" : "region"}, {"ph", "X"},
                        {"ts", e.start_us},  {"dur", e.duration_us},          {"pid", rank},
                        {"tid", e.thread}};
    if (e.op && e.duration_us > 0 && (e.cost.flops > 0 || e.cost.bytes > 0)) {
      j["args"] = {{"TFLOP/s", 1e-6 * e.cost.flops / e.duration_us}, {"GB/s", 1e-3 * e.cost.bytes / e.duration_us},
                   {"FLOPs", e.cost.flops}, {"bytes", e.cost.bytes}};
    }
    list.push_back(std::move(j));
  }
  out["traceEvents"] = std::move(list);
  out["displayTimeUnit"] = "ms";
  out["otherData"] = {{"writer", "shardtrain (SHARDTRAIN_PROFILE_TRACE)"},
                      {"note", "every op synchronised before and after, so the ops run one at a time"},
                      {"events_left_out", dropped}};
  std::ofstream f(file);
  f << out.dump() << "\n";
  f.close();
  ST_CHECK(f.good(), "SHARDTRAIN_PROFILE_TRACE: cannot write `", file, "`");
  return file;
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
  const auto end = std::chrono::steady_clock::now();
  const double s = std::chrono::duration<double>(end - start_).count();
  if (!trace_path().empty()) record(name_, true, start_, end, cost_);
  std::lock_guard<std::mutex> lock(g_mutex);
  Total& t = totals()[name_];
  ++t.calls;
  t.seconds += s;
  t.cost.flops += cost_.flops;
  t.cost.bytes += cost_.bytes;
}

void reset_totals() {
  std::lock_guard<std::mutex> lock(g_mutex);
  totals().clear();
}

std::vector<OpTotal> op_totals() {
  std::lock_guard<std::mutex> lock(g_mutex);
  std::vector<OpTotal> out;
  for (const auto& [name, t] : totals()) out.push_back({name, t.calls, t.seconds, t.cost});
  return out;
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
