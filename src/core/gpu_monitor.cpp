// The GPU monitor: NVML loaded with dlopen, its few entry points declared here by their
// documented C signatures (no NVML header is needed to build), one sampling thread per
// monitor. NVML is initialised once per process and never shut down.
#include "core/gpu_monitor.h"

#include <dlfcn.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "core/error.h"

namespace shardtrain {
namespace {

using NvmlReturn = int;  // nvmlReturn_t: 0 is success
using NvmlDevice = struct NvmlDeviceOpaque*;
constexpr int kNvmlClockSm = 1;  // nvmlClockType_t NVML_CLOCK_SM

struct Nvml {
  std::string why;  // empty once every entry point resolved and nvmlInit succeeded
  NvmlReturn (*init)() = nullptr;
  const char* (*error_string)(NvmlReturn) = nullptr;
  NvmlReturn (*handle_by_pci_bus_id)(const char*, NvmlDevice*) = nullptr;
  NvmlReturn (*total_energy_mj)(NvmlDevice, unsigned long long*) = nullptr;
  NvmlReturn (*power_usage_mw)(NvmlDevice, unsigned int*) = nullptr;
  NvmlReturn (*enforced_power_limit_mw)(NvmlDevice, unsigned int*) = nullptr;
  NvmlReturn (*clock_mhz)(NvmlDevice, int, unsigned int*) = nullptr;
  NvmlReturn (*max_clock_mhz)(NvmlDevice, int, unsigned int*) = nullptr;
  NvmlReturn (*clock_reasons)(NvmlDevice, unsigned long long*) = nullptr;

  std::string error(NvmlReturn r) const {
    return error_string != nullptr ? detail::concat(error_string(r), " (NVML error ", r, ")")
                                   : detail::concat("NVML error ", r);
  }
};

template <typename F>
bool resolve(void* lib, F& fn, const char* name) {
  fn = reinterpret_cast<F>(dlsym(lib, name));
  return fn != nullptr;
}

const Nvml& nvml() {
  static const Nvml loaded = [] {
    Nvml n;
    void* lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      n.why = "libnvidia-ml.so.1 (the NVIDIA driver's NVML) could not be loaded";
      return n;
    }
    // the clock event reasons were called throttle reasons before driver 535
    const bool reasons = resolve(lib, n.clock_reasons, "nvmlDeviceGetCurrentClocksEventReasons") ||
                         resolve(lib, n.clock_reasons, "nvmlDeviceGetCurrentClocksThrottleReasons");
    const bool all = resolve(lib, n.init, "nvmlInit_v2") && resolve(lib, n.error_string, "nvmlErrorString") &&
                     resolve(lib, n.handle_by_pci_bus_id, "nvmlDeviceGetHandleByPciBusId_v2") &&
                     resolve(lib, n.total_energy_mj, "nvmlDeviceGetTotalEnergyConsumption") &&
                     resolve(lib, n.power_usage_mw, "nvmlDeviceGetPowerUsage") &&
                     resolve(lib, n.enforced_power_limit_mw, "nvmlDeviceGetEnforcedPowerLimit") &&
                     resolve(lib, n.clock_mhz, "nvmlDeviceGetClockInfo") &&
                     resolve(lib, n.max_clock_mhz, "nvmlDeviceGetMaxClockInfo") && reasons;
    if (!all) {
      n.why = "libnvidia-ml.so.1 lacks an entry point the monitor needs (driver too old)";
      return n;
    }
    if (const NvmlReturn r = n.init(); r != 0) n.why = "nvmlInit failed: " + n.error(r);
    return n;
  }();
  return loaded;
}

double seconds_between(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// The one rule for an interval's mean power, wherever its energy came from.
double mean_power(double energy_j, double seconds) { return seconds >= kMinPowerSeconds ? energy_j / seconds : NAN; }

}  // namespace

void ActivityAccumulator::add_sample(double sm_mhz, uint64_t reasons, double power_w) {
  ++samples_;
  sm_mhz_sum_ += sm_mhz;
  if (reasons & kClockReasonSwPowerCap) ++capped_;
  if (reasons & (kClockReasonHwSlowdown | kClockReasonSwThermal | kClockReasonHwThermal | kClockReasonHwPowerBrake))
    ++thermal_;
  if (std::isfinite(power_w)) {
    ++power_samples_;
    power_w_sum_ += power_w;
  }
}

GpuActivity ActivityAccumulator::finish(double seconds, double energy_mj, double power_limit_w, double max_sm_mhz) {
  GpuActivity a;
  a.seconds = seconds;
  a.power_limit_w = power_limit_w;
  a.max_sm_mhz = max_sm_mhz;
  a.samples = samples_;
  if (std::isfinite(energy_mj))
    a.energy_j = energy_mj / 1000.0;
  else if (power_samples_ > 0)  // no energy counter: the sampled power stands in
    a.energy_j = power_w_sum_ / static_cast<double>(power_samples_) * seconds;
  a.mean_power_w = mean_power(a.energy_j, seconds);
  if (samples_ > 0) {
    const double n = static_cast<double>(samples_);
    a.mean_sm_mhz = sm_mhz_sum_ / n;
    a.power_capped = static_cast<double>(capped_) / n;
    a.thermal = static_cast<double>(thermal_) / n;
  }
  *this = ActivityAccumulator();
  return a;
}

void accumulate(GpuActivity& total, const GpuActivity& part) {
  const double n = static_cast<double>(total.samples + part.samples);
  auto weighted = [&](double a, double b) {
    return n > 0 ? (a * static_cast<double>(total.samples) + b * static_cast<double>(part.samples)) / n : 0.0;
  };
  total.mean_sm_mhz = weighted(total.mean_sm_mhz, part.mean_sm_mhz);
  total.power_capped = weighted(total.power_capped, part.power_capped);
  total.thermal = weighted(total.thermal, part.thermal);
  total.samples += part.samples;
  total.seconds += part.seconds;
  total.energy_j += part.energy_j;
  total.mean_power_w = mean_power(total.energy_j, total.seconds);
  if (part.samples > 0 || part.seconds > 0) {
    total.power_limit_w = part.power_limit_w;
    total.max_sm_mhz = part.max_sm_mhz;
  }
}

std::string format_activity(const GpuActivity& a) {
  if (a.samples == 0) return "no samples";
  char buf[160];
  std::string s;
  if (std::isfinite(a.mean_power_w)) {
    std::snprintf(buf, sizeof buf, "%.0f W of %.0f, ", a.mean_power_w, a.power_limit_w);
    s = buf;
  }
  std::snprintf(buf, sizeof buf, "SM %.0f MHz of %.0f, power-capped %.0f %%", a.mean_sm_mhz, a.max_sm_mhz,
                100.0 * a.power_capped);
  s += buf;
  if (a.thermal > 0) {
    std::snprintf(buf, sizeof buf, ", thermal slowdown %.0f %%", 100.0 * a.thermal);
    s += buf;
  }
  return s;
}

struct GpuMonitor::State {
  NvmlDevice device = nullptr;
  bool has_energy = false;
  double max_sm_mhz = 0;
  std::chrono::duration<double> period{0.05};

  std::mutex mutex;
  std::condition_variable wake;
  bool stop = false;
  ActivityAccumulator acc;
  std::chrono::steady_clock::time_point since;
  unsigned long long energy_since = 0;
  std::thread sampler;

  void sample() {
    const Nvml& n = nvml();
    unsigned int mhz = 0, mw = 0;
    unsigned long long reasons = 0;
    if (n.clock_mhz(device, kNvmlClockSm, &mhz) != 0) return;
    if (n.clock_reasons(device, &reasons) != 0) reasons = 0;
    const double power_w = !has_energy && n.power_usage_mw(device, &mw) == 0 ? mw / 1000.0 : NAN;
    std::lock_guard<std::mutex> lock(mutex);
    acc.add_sample(mhz, reasons, power_w);
  }

  void run() {
    std::unique_lock<std::mutex> lock(mutex);
    while (!stop) {
      lock.unlock();
      sample();
      lock.lock();
      wake.wait_for(lock, period, [this] { return stop; });
    }
  }
};

GpuMonitor::GpuMonitor() : why_("no GPU monitor was opened") {}
GpuMonitor::GpuMonitor(GpuMonitor&&) noexcept = default;
GpuMonitor& GpuMonitor::operator=(GpuMonitor&&) noexcept = default;

GpuMonitor::~GpuMonitor() {
  if (state_ == nullptr) return;
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->stop = true;
  }
  state_->wake.notify_all();
  if (state_->sampler.joinable()) state_->sampler.join();
}

GpuMonitor GpuMonitor::open(const std::string& pci_bus_id, double period_s) {
  GpuMonitor m;
  const Nvml& n = nvml();
  if (!n.why.empty()) {
    m.why_ = n.why;
    return m;
  }
  auto s = std::make_unique<State>();
  if (const NvmlReturn r = n.handle_by_pci_bus_id(pci_bus_id.c_str(), &s->device); r != 0) {
    m.why_ = detail::concat("NVML does not know the GPU at PCI bus id ", pci_bus_id, ": ", n.error(r));
    return m;
  }
  unsigned int max_mhz = 0;
  if (const NvmlReturn r = n.max_clock_mhz(s->device, kNvmlClockSm, &max_mhz); r != 0) {
    m.why_ = detail::concat("NVML gives no SM clock for the GPU at ", pci_bus_id, ": ", n.error(r));
    return m;
  }
  s->max_sm_mhz = max_mhz;
  s->has_energy = n.total_energy_mj(s->device, &s->energy_since) == 0;
  s->period = std::chrono::duration<double>(period_s > 0 ? period_s : 0.05);
  s->since = std::chrono::steady_clock::now();
  State* raw = s.get();
  s->sampler = std::thread([raw] { raw->run(); });
  m.state_ = std::move(s);
  m.why_.clear();
  return m;
}

bool GpuMonitor::available() const { return state_ != nullptr; }

GpuActivity GpuMonitor::take() {
  if (state_ == nullptr) return {};
  State& s = *state_;
  const Nvml& n = nvml();
  s.sample();  // an interval shorter than the period still gets a clock reading
  unsigned long long energy = 0;
  const bool energy_ok = s.has_energy && n.total_energy_mj(s.device, &energy) == 0;
  unsigned int limit_mw = 0;
  if (n.enforced_power_limit_mw(s.device, &limit_mw) != 0) limit_mw = 0;
  const auto now = std::chrono::steady_clock::now();
  std::lock_guard<std::mutex> lock(s.mutex);
  const double energy_mj = energy_ok ? static_cast<double>(energy - s.energy_since) : NAN;
  if (energy_ok) s.energy_since = energy;
  const double seconds = seconds_between(s.since, now);
  s.since = now;
  return s.acc.finish(seconds, energy_mj, limit_mw / 1000.0, s.max_sm_mhz);
}

}  // namespace shardtrain
