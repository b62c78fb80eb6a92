// What a run reports: each step's log line and metrics record (loss, rate, MFU, memory, the
// GPU board's power and clock), the terminal's progress line, and the end's summary. The
// figures cover the timed steps: all but the first (plans, caches, a graph's capture), or all
// but a bench's warm-up.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/device.h"
#include "core/gpu_monitor.h"
#include "core/profile.h"
#include "train/metrics.h"

namespace shardtrain::train {

struct StepRecord {
  int64_t step = 0;
  double loss = 0;  // mean over the step's counted tokens
  double lr = 0;
  double grad_norm = 0;  // before clipping
  double tokens_per_second = 0;
  bool skipped_nonfinite = false;  // the loss or gradient norm was NaN or inf: no update (training.nonfinite_skips)
};

// The steps a run's rate covers (all but the first; with BenchMode all but its warm-up): their
// totals, for `shardtrain bench`'s report.
struct TimedSteps {
  int64_t steps = 0;
  double seconds = 0;                                                 // their total
  double data_s = 0, forward_s = 0, backward_s = 0, optimizer_s = 0;  // the phases (as the step log splits them)
  double comm_wait_s = 0;      // the compute stream waiting on gathers and reductions (several GPUs)
  double tokens_per_step = 0;  // the global batch
  double mfu = 0;              // 0: the device's peak is unknown (or the CPU)
  double flops_per_token = 0;  // torchtitan's, as MFU counts them
  double peak_flops = 0;       // the device's dense bf16 peak
  std::string fp8;             // training.fp8's recipe ("off": bf16 products)
  bool fp8_head = false;       // training.fp8_head in effect: the head's products in FP8 too
  double fp8_peak_flops = 0;   // with an FP8 recipe: the device's dense FP8 peak (0: unknown)
  int64_t peak_device_bytes = 0, device_total_bytes = 0;  // this rank's GPU (0 on the CPU)
  int64_t planned_peak_bytes = 0;  // what `shardtrain plan` says of the run's GPU peak (0 on the CPU)
  GpuActivity board;               // this rank's GPU over the timed steps (samples 0: no readings)
  std::vector<profile::OpTotal> ops;  // SHARDTRAIN_PROFILE=1: the per-op totals of the timed steps (else empty)
};

struct TrainSummary {
  TimedSteps timed;
  int stopped_by_signal = 0;  // checkpoint.on_signal: the signal the run stopped for (saved, not finished), or 0
  bool stopped_by_time_limit = false;  // training.time_limit: stopped and saved before the last step
  std::vector<StepRecord> steps;
  int64_t skipped_nonfinite = 0;  // steps skipped for a NaN or inf loss or gradient norm (training.nonfinite_skips)
  std::vector<std::pair<int64_t, double>> evals;                // (step, held-out loss)
  std::vector<std::pair<std::string, double>> last_eval_parts;  // the last evaluation's per-source losses (data.mix)
  double seconds = 0;
  double tokens_per_second = 0;  // over the whole run, evaluation excluded
  std::string sample;
  // checkpoint.resume found every step of training.steps done already: that checkpoint's step
  // (nothing was trained or evaluated; the export is written again only when export.folder is
  // missing or older than that checkpoint); -1 otherwise
  int64_t already_complete_at = -1;
};

// "42s", "3m05s", "2h07m".
std::string format_duration(double seconds);
// The process's peak resident set.
int64_t peak_resident_bytes();

// A one-line progress display on a terminal (logging.progress), redrawn in place.
class Progress {
 public:
  Progress(const std::string& mode, int64_t total);
  void update(int64_t step, double loss, double tokens_per_second, double eta_seconds);
  void clear();

 private:
  bool enabled_ = false;
  int64_t total_;
};

// Where one step's time went (host-clock seconds unless said).
struct StepTimes {
  double data_s = 0;     // drawing the batch and counting its tokens
  double forward_s = 0;  // model::PhaseTimes, summed over the micro-batches
  double backward_s = 0;
  double forward_backward_s = 0;  // the host's clock over both, with the step's reductions of totals
  double optimizer_s = 0;         // the norm and the update
  double step_s = 0;              // the whole step
  double comm_wait_s = 0;         // GPU: compute stood waiting on gathers and reductions
  double offload_wait_s = 0;      // GPU, activation offload: compute stood waiting on the copies
};

// The figures of one run, step by step: its metrics files (rank 0: logging.metrics_file and
// logging.tensorboard_dir under run.output_dir), the step log lines, the progress line, and the
// closing summary.
class RunReport {
 public:
  struct Setup {
    Device device;
    int world_size = 1, rank = 0;
    std::string output_dir;                  // run.output_dir
    std::string metrics_file;                // logging.metrics_file ("": none)
    std::string tensorboard_dir;             // logging.tensorboard_dir ("": none)
    std::string progress = "off";            // logging.progress (rank 0), "off" elsewhere
    bool gpu_power = false;                  // logging.gpu_power
    int64_t log_interval_steps = 1;          // logging.interval_steps
    int64_t total_steps = 0;                 // training.steps
    int64_t first_step = 1, timed_from = 2;  // the run's first step, and the first its figures cover
    double flops_per_token = 0;              // torchtitan's, for MFU
    double tokens_per_step = 0;              // the global batch
    bool show_offload_wait = false;          // set_offload_wait_shown
  };
  // Opens the metrics files (and logs TensorBoard's); nothing else is read yet.
  explicit RunReport(const Setup& setup);
  // The device's peak FLOPs (for MFU and the profile's roofline) and, with gpu_power, its board.
  void open_device();
  void start_clock();  // the run's elapsed time counts from here

  void write_metrics(const nlohmann::json& record);
  Progress& progress() { return progress_; }
  // The progress line after `step`: its loss, the rate of seconds_per_step, the ETA.
  void update_progress(int64_t step, double loss);
  // training.offload_activations on eager steps: the log line shows the wait for the copies
  // (a graph's replays are not timed)
  void set_offload_wait_shown(bool shown) { setup_.show_offload_wait = shown; }
  // MFU: torchtitan's FLOPs per token against the device's dense bf16 peak (0 when unknown)
  double mfu(double tokens_per_second) const;
  double peak_flops() const { return peak_flops_; }
  int64_t peak_device_bytes() const;
  const TimedSteps& timed() const { return timed_; }
  double train_seconds() const { return train_seconds_; }  // every step's so far, evaluation excluded
  double elapsed_seconds() const;                          // since the first step began

  // Adds a finished step: its times to the log window and the timed totals, its metrics
  // record, and at logging.interval_steps its log line. Returns its record.
  StepRecord add_step(int64_t step, const StepTimes& times, double loss, double lr, double grad_norm, bool skipped,
                      int64_t skipped_total);
  // Mean seconds per step (the timed steps', else all so far) and the estimate of the rest.
  double seconds_per_step(int64_t step) const;
  double eta_seconds(int64_t step) const;
  // The end: fills summary.timed and tokens_per_second from the steps taken, and logs the
  // summary lines (rate, memory, loss curve unless `bench`, skipped steps, energy, memory peaks,
  // profile). `timed_part` names which steps the figures cover.
  void finish(TrainSummary& summary, int64_t steps_done, const std::string& timed_part, bool bench);

 private:
  void read_board(int64_t step);
  void log_step(const StepRecord& record, double window_tokens_per_second);

  Setup setup_;
  JsonlSink jsonl_;
  TensorBoardSink tensorboard_;
  Progress progress_;
  double peak_flops_ = 0;
  GpuMonitor power_;  // the board's power and clock over each log window and the run (logging.gpu_power)
  GpuActivity window_power_, run_power_;
  std::chrono::steady_clock::time_point start_;
  double train_seconds_ = 0;
  // Rates in the log cover the steps since the previous log line; the first step (plans,
  // caches, warm-up) is timed alone, and the ETA and the final rate leave it out.
  double window_seconds_ = 0, window_comm_wait_ = 0, window_offload_wait_ = 0;
  int64_t window_steps_ = 0;
  TimedSteps timed_;
};

}  // namespace shardtrain::train
