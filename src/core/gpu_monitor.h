// Power, SM clock and clock-limit readings of one NVIDIA GPU, for the training log and the
// benchmarks: a step that runs at the board's power limit is bounded by energy, not by idle
// units, and these readings show it. NVML (the driver's management library) is loaded at run
// time, so neither the build nor a machine without the driver needs it: the monitor then says
// why it is unavailable and reports nothing.
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <string>

namespace shardtrain {

// Clock event reason bits as NVML reports them (nvmlClocksEventReason*).
inline constexpr uint64_t kClockReasonSwPowerCap = 0x4;
inline constexpr uint64_t kClockReasonHwSlowdown = 0x8;
inline constexpr uint64_t kClockReasonSwThermal = 0x20;
inline constexpr uint64_t kClockReasonHwThermal = 0x40;
inline constexpr uint64_t kClockReasonHwPowerBrake = 0x80;

// The board's energy counter advances in steps (about every 0.1 s on an H100), so the mean
// power of a shorter interval than this is not given (NaN): 2 s keeps its error within ~5 %.
// Energies of short intervals still add up exactly over a longer one (accumulate below). The
// same rule holds where a board without the counter has its energy from sampled powers.
inline constexpr double kMinPowerSeconds = 2.0;

// What the board did over an interval.
struct GpuActivity {
  double seconds = 0;        // length of the interval
  double energy_j = 0;       // from the board's energy counter
  double mean_power_w = 0;   // energy_j / seconds; NaN for an interval under kMinPowerSeconds
  double power_limit_w = 0;  // the enforced power limit at the interval's end
  double mean_sm_mhz = 0;    // SM clock, mean over the samples
  double max_sm_mhz = 0;     // the board's highest SM clock
  double power_capped = 0;   // share of samples in which the software power cap held the clock down
  double thermal = 0;        // share with a thermal, hardware or power-brake slowdown
  int64_t samples = 0;       // clock samples taken
};

// Folds clock samples and the energy counter's reading into a GpuActivity (the monitor's
// arithmetic, apart so that it can be tested without a GPU).
class ActivityAccumulator {
 public:
  // `power_w`: the board's power at the sample, needed only where it has no energy counter.
  void add_sample(double sm_mhz, uint64_t reasons, double power_w = std::numeric_limits<double>::quiet_NaN());
  // The interval is over: `energy_mj` the counter's growth in it, in millijoules (NaN without
  // an energy counter: the mean of the sampled powers stands in).
  GpuActivity finish(double seconds, double energy_mj, double power_limit_w, double max_sm_mhz);

 private:
  int64_t samples_ = 0, capped_ = 0, thermal_ = 0, power_samples_ = 0;
  double sm_mhz_sum_ = 0, power_w_sum_ = 0;
};

// Adds `part` (a later interval) to `total`: times and energy add, the clock and the shares
// are weighted by samples, the limits are the later interval's.
void accumulate(GpuActivity& total, const GpuActivity& part);

// "692 W of 700, SM 1484 MHz of 1980, power-capped 99 %" (with ", thermal slowdown N %" when
// any sample had one; without the power where it is NaN); "no samples" for an empty interval.
std::string format_activity(const GpuActivity& a);

class GpuMonitor {
 public:
  // An unavailable monitor.
  GpuMonitor();
  // Watches the GPU at `pci_bus_id` ("0000:00:06.0", as cudaDeviceGetPCIBusId gives it):
  // a background thread reads the SM clock and the clock event reasons every `period_s`
  // seconds. Never throws: without NVML, or when NVML does not know the device, the monitor
  // is unavailable and why_unavailable() says why.
  static GpuMonitor open(const std::string& pci_bus_id, double period_s = 0.05);
  GpuMonitor(GpuMonitor&&) noexcept;
  GpuMonitor& operator=(GpuMonitor&&) noexcept;
  ~GpuMonitor();

  bool available() const;
  const std::string& why_unavailable() const { return why_; }
  // The activity since the previous take() (or since open), and starts the next interval.
  // Empty (samples 0, seconds 0) when unavailable.
  GpuActivity take();

 private:
  struct State;
  std::unique_ptr<State> state_;
  std::string why_;
};

}  // namespace shardtrain
