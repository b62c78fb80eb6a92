// A run's step log lines, metrics records, progress line and closing summary.
#include "train/report.h"

#include <sys/resource.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>

#include <fmt/format.h>

#include "core/allocator.h"
#ifdef SHARDTRAIN_WITH_CUDA
#include "core/cuda/device.h"
#endif
#include "core/log.h"
#include "core/profile.h"
#include "train/plot.h"

namespace shardtrain::train {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// A metrics file of rank 0 under run.output_dir; "" (no file) for an unset key or another rank.
std::string rank0_path(const RunReport::Setup& setup, const std::string& relative) {
  return relative.empty() || setup.rank != 0 ? std::string()
                                             : (std::filesystem::path(setup.output_dir) / relative).string();
}

}  // namespace

std::string format_duration(double s) {
  const int64_t t = static_cast<int64_t>(s + 0.5);
  if (t >= 3600) return fmt::format("{}h{:02}m", t / 3600, (t / 60) % 60);
  if (t >= 60) return fmt::format("{}m{:02}s", t / 60, t % 60);
  return fmt::format("{}s", t);
}

int64_t peak_resident_bytes() {
  rusage u{};
  return ::getrusage(RUSAGE_SELF, &u) == 0 ? static_cast<int64_t>(u.ru_maxrss) * 1024 : 0;  // ru_maxrss: KiB
}

Progress::Progress(const std::string& mode, int64_t total) : total_(total) {
  enabled_ = mode == "on" || (mode == "auto" && isatty(STDERR_FILENO));
}

void Progress::update(int64_t step, double loss, double tps, double eta) {
  if (!enabled_) return;
  constexpr int kWidth = 30;
  const int filled = static_cast<int>(kWidth * step / total_);
  std::string bar(static_cast<size_t>(filled), '#');
  bar.resize(kWidth, '.');
  std::fprintf(stderr, "\r\033[K[%s] %lld/%lld loss %.4f  %.0f tok/s  ETA %s", bar.c_str(),
               static_cast<long long>(step), static_cast<long long>(total_), loss, tps, format_duration(eta).c_str());
  std::fflush(stderr);
}

void Progress::clear() {
  if (enabled_) std::fprintf(stderr, "\r\033[K");
}

RunReport::RunReport(const Setup& setup)
    : setup_(setup),
      jsonl_(rank0_path(setup, setup.metrics_file), setup.first_step),
      tensorboard_(rank0_path(setup, setup.tensorboard_dir), setup.first_step),
      progress_(setup.progress, setup.total_steps),
      start_(Clock::now()) {
  if (!tensorboard_.path().empty()) log::info("logging.tensorboard_dir: writing `" + tensorboard_.path() + "`");
}

void RunReport::open_device() {
#ifdef SHARDTRAIN_WITH_CUDA
  if (setup_.device.is_cuda()) {
    peak_flops_ = cuda::dense_bf16_peak_flops(setup_.device.index);
    profile::set_roofline(peak_flops_, cuda::memory_bandwidth(setup_.device.index));
  }
#endif
#ifdef SHARDTRAIN_WITH_CUDA
  if (setup_.device.is_cuda() && setup_.gpu_power) {
    power_ = GpuMonitor::open(cuda::pci_bus_id(setup_.device.index));
    if (!power_.available()) log::info("GPU power readings off: " + power_.why_unavailable());
  }
#endif
}

void RunReport::start_clock() { start_ = Clock::now(); }

void RunReport::write_metrics(const nlohmann::json& record) {
  jsonl_.write(record);
  tensorboard_.write(record);
}

double RunReport::mfu(double tokens_per_second) const {
  return peak_flops_ > 0
             ? setup_.flops_per_token * tokens_per_second / static_cast<double>(setup_.world_size) / peak_flops_
             : 0.0;
}

int64_t RunReport::peak_device_bytes() const { return allocator_for(setup_.device).stats().peak_allocated_bytes; }

double RunReport::elapsed_seconds() const { return seconds_since(start_); }

double RunReport::seconds_per_step(int64_t step) const {
  const int64_t steps_run = step - setup_.first_step + 1;
  return timed_.steps > 0 ? timed_.seconds / static_cast<double>(timed_.steps)
                          : train_seconds_ / static_cast<double>(steps_run);
}

double RunReport::eta_seconds(int64_t step) const {
  return static_cast<double>(setup_.total_steps - step) * seconds_per_step(step);
}

void RunReport::update_progress(int64_t step, double loss) {
  progress_.update(step, loss, setup_.tokens_per_step / seconds_per_step(step), eta_seconds(step));
}

StepRecord RunReport::add_step(int64_t step, const StepTimes& times, double loss, double lr, double grad_norm,
                               bool skipped, int64_t skipped_total) {
  train_seconds_ += times.step_s;
  window_seconds_ += times.step_s;
  window_comm_wait_ += times.comm_wait_s;
  window_offload_wait_ += times.offload_wait_s;
  ++window_steps_;
  if (step >= setup_.timed_from) {
    timed_.seconds += times.step_s;
    ++timed_.steps;
    timed_.data_s += times.data_s;
    timed_.forward_s += times.forward_s;
    timed_.backward_s += times.backward_s;
    timed_.optimizer_s += times.optimizer_s;
    timed_.comm_wait_s += times.comm_wait_s;
  }
  StepRecord record;
  record.step = step;
  record.loss = loss;
  record.lr = lr;
  record.grad_norm = grad_norm;
  record.tokens_per_second = setup_.tokens_per_step / times.step_s;
  record.skipped_nonfinite = skipped;
  const double window_tps = setup_.tokens_per_step * static_cast<double>(window_steps_) / window_seconds_;
  write_metrics({{"step", step},
                 {"loss", record.loss},
                 {"lr", lr},
                 {"grad_norm", grad_norm},
                 {"tokens_per_second", record.tokens_per_second},
                 {"elapsed_s", seconds_since(start_)},
                 {"time_data_s", times.data_s},
                 {"time_forward_s", times.forward_s},
                 {"time_backward_s", times.backward_s},
                 {"time_forward_backward_s", times.forward_backward_s},
                 {"time_optimizer_s", times.optimizer_s},
                 {"peak_host_bytes", allocator_for(Device::cpu()).stats().peak_allocated_bytes},
                 {"peak_resident_bytes", peak_resident_bytes()},
                 {"peak_device_bytes", setup_.device.is_cpu() ? 0 : peak_device_bytes()},
                 {"time_comm_wait_s", times.comm_wait_s},
                 {"time_offload_wait_s", times.offload_wait_s},
                 {"mfu", mfu(record.tokens_per_second)},
                 {"skipped_nonfinite", skipped ? 1 : 0},
                 {"skipped_nonfinite_total", skipped_total}});
  const bool log_now = step == 1 || step % setup_.log_interval_steps == 0 || step == setup_.total_steps;
  // the board is read at log lines only (NVML calls stay off the other steps), and before the
  // timed steps, which the run's figures cover
  if (log_now || step + 1 == setup_.timed_from) read_board(step);
  if (log_now) log_step(record, window_tps);
  return record;
}

void RunReport::read_board(int64_t step) {
  const GpuActivity part = power_.take();
  accumulate(window_power_, part);
  if (step >= setup_.timed_from) accumulate(run_power_, part);
}

void RunReport::log_step(const StepRecord& record, double window_tps) {
  progress_.clear();
  std::string device_part;
  if (setup_.device.is_cuda())
    device_part = fmt::format("  {}MFU {:.1f}%  peak mem {}{}", peak_flops_ > 0 ? "" : "(peak unknown) ",
                              100.0 * mfu(window_tps), format_bytes(peak_device_bytes()),
                              setup_.world_size > 1
                                  ? fmt::format("  comm wait {:.1f}%", 100.0 * window_comm_wait_ / window_seconds_)
                                  : std::string());
  if (setup_.show_offload_wait)
    device_part += fmt::format("  offload wait {:.1f}%", 100.0 * window_offload_wait_ / window_seconds_);
  if (window_power_.samples > 0) {
    // the board over the window; its mean power only once the window is long enough
    const bool watts = std::isfinite(window_power_.mean_power_w);
    const std::string w = watts ? fmt::format("{:.0f} W  ", window_power_.mean_power_w) : std::string();
    device_part += fmt::format("  {}SM {:.0f} MHz{}", w, window_power_.mean_sm_mhz,
                               window_power_.power_capped > 0
                                   ? fmt::format(" (power-capped {:.0f}%)", 100.0 * window_power_.power_capped)
                                   : std::string());
    nlohmann::json board = {{"step", record.step},
                            {"gpu_window_s", window_power_.seconds},
                            {"gpu_energy_j", window_power_.energy_j},
                            {"gpu_sm_mhz", window_power_.mean_sm_mhz},
                            {"gpu_power_capped", window_power_.power_capped},
                            {"gpu_power_limit_w", window_power_.power_limit_w}};
    if (watts) board["gpu_power_w"] = window_power_.mean_power_w;
    write_metrics(board);
  }
  log::info(fmt::format("step {:>5}/{}  loss {:.4f}  lr {:.2e}  grad norm {:.3f}  {:.0f} tok/s{}  elapsed {}  ETA {}",
                        record.step, setup_.total_steps, record.loss, record.lr, record.grad_norm, window_tps,
                        device_part, format_duration(seconds_since(start_)),
                        format_duration(eta_seconds(record.step))));
  window_seconds_ = window_comm_wait_ = window_offload_wait_ = 0;
  window_steps_ = 0;
  window_power_ = GpuActivity();
}

void RunReport::finish(TrainSummary& summary, int64_t steps_done, const std::string& timed_part, bool bench) {
  const Device device = setup_.device;
  const int world = setup_.world_size;
  summary.seconds = seconds_since(start_);
  summary.tokens_per_second = timed_.steps > 0 && timed_.seconds > 0
                                  ? setup_.tokens_per_step * static_cast<double>(timed_.steps) / timed_.seconds
                              : train_seconds_ > 0
                                  ? setup_.tokens_per_step * static_cast<double>(steps_done) / train_seconds_
                                  : 0.0;
  TimedSteps& timed = summary.timed;
  const TimedSteps totals = timed_;
  timed.steps = totals.steps;
  timed.seconds = totals.seconds;
  timed.data_s = totals.data_s;
  timed.forward_s = totals.forward_s;
  timed.backward_s = totals.backward_s;
  timed.optimizer_s = totals.optimizer_s;
  timed.comm_wait_s = totals.comm_wait_s;
  timed.tokens_per_step = setup_.tokens_per_step;
  timed.mfu = mfu(summary.tokens_per_second);
  timed.flops_per_token = setup_.flops_per_token;
  timed.peak_flops = peak_flops_;
  timed.peak_device_bytes = device.is_cpu() ? 0 : peak_device_bytes();
  timed.board = run_power_;
  log::info(fmt::format(
      "done: {} steps in {}, {:.0f} tokens/s{}, peak host memory {} in tensors ({} resident){}", steps_done,
      format_duration(summary.seconds), summary.tokens_per_second, timed_part,
      format_bytes(allocator_for(Device::cpu()).stats().peak_allocated_bytes), format_bytes(peak_resident_bytes()),
      device.is_cpu() ? std::string()
                      : fmt::format(", peak {} memory {}, MFU {:.1f}%", device.str(), format_bytes(peak_device_bytes()),
                                    100.0 * mfu(summary.tokens_per_second))));
  if (!bench) {  // the loss curve of this run's steps on the terminal (random tokens' is no news)
    std::vector<StepValue> losses;
    for (const StepRecord& r : summary.steps) losses.push_back({r.step, r.loss});
    if (const std::string curve = text_curve(losses); !curve.empty()) log::info(curve);
  }
  if (summary.skipped_nonfinite > 0)
    log::warn(
        fmt::format("{} of the {} steps skipped for a NaN or inf loss or gradient norm (training.nonfinite_skips)",
                    summary.skipped_nonfinite, steps_done));
  if (run_power_.samples > 0 && std::isfinite(run_power_.mean_power_w) && summary.tokens_per_second > 0)
    log::info(fmt::format(
        "GPU{}: {}; {:.2f} mJ per token{}", world > 1 ? fmt::format(" of rank {}", setup_.rank) : std::string(),
        format_activity(run_power_),
        1e3 * run_power_.mean_power_w / (summary.tokens_per_second / static_cast<double>(world)), timed_part));
  if (!device.is_cpu())
    if (const std::string peak = describe_peak_breakdown(allocator_for(device)); !peak.empty())
      log::info("SHARDTRAIN_MEMORY_PEAK_REPORT=1: " + peak);
  if (!profile::trace_path().empty())
    log::info("SHARDTRAIN_PROFILE_TRACE: the run's ops and regions (step, block forward and backward, head and loss, "
              "optimizer) in " +
              profile::write_trace(profile::trace_path(), setup_.rank) + " (open it in ui.perfetto.dev)");
  if (profile::enabled()) summary.timed.ops = profile::op_totals();
  if (profile::enabled() && setup_.rank == 0)
    log::info(fmt::format("per-op time {} (SHARDTRAIN_PROFILE=1: synchronised per op, so slower; roofline: "
                          "max(FLOPs / dense bf16 peak, bytes / memory bandwidth) as a share of the op's time)\n",
                          timed_.steps > 0 ? fmt::format("from step {} on, as the run's figures", setup_.timed_from)
                                           : std::string("over the run")) +
              profile::report_and_reset());
}

}  // namespace shardtrain::train
