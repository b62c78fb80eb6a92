// `shardtrain bench`: a job's training step timed on random tokens, once or over a sweep of
// settings (train::BenchMode does the run; this file parses, reports and tabulates).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <optional>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/args.h"
#include "cli/commands.h"
#include "core/allocator.h"
#ifdef SHARDTRAIN_WITH_CUDA
#include "core/cuda/device.h"
#endif
#include "core/error.h"
#include "core/gpu_monitor.h"
#include "core/log.h"
#include "dist/world.h"
#include "train/config.h"
#include "train/launch_defaults.h"
#include "train/plan.h"
#include "train/step_model.h"
#include "train/trainer.h"

namespace shardtrain::cli {

namespace {

// One bench run's figures, for the report, the sweep's table and --json.
struct BenchRow {
  std::string settings;  // the sweep's key=value pairs ("" without a sweep)
  std::string error;     // the run failed (out of memory, a bad setting): its message
  std::string model, device;
  int rank = 0, world = 1, data_parallel = 1, context_parallel = 1;
  int64_t batch_size = 0, seq_len = 0, accum = 0;
  double tokens_per_second = 0;
  train::TimedSteps t;
  std::string gpu;  // plan's name of the run's GPU ("" on the CPU or for a GPU outside plan's table)
};

BenchRow run_one_bench(const train::JobConfig& c, int64_t warmup, const std::string& settings) {
  BenchRow row;
  row.settings = settings;
  row.batch_size = c.training.batch_size;
  row.seq_len = c.training.seq_len;
  row.accum = c.training.grad_accum_steps;
  train::Trainer trainer(c, nullptr, train::BenchMode{warmup});
  if (trainer.device().is_cuda()) allocator_for(trainer.device()).reset_peak();  // this run's peak alone
  const train::TrainSummary s = trainer.run();
  if (row.seq_len == 0) row.seq_len = train::auto_seq_len(trainer.model().config().max_seq_len).seq_len;  // auto
  row.model = trainer.model().config().summary();
  row.device = trainer.device().str();
  row.rank = trainer.comm().rank();
  row.world = trainer.comm().world_size();
  // the mesh's data-parallel ranks include a context group's, which hold parts of the same sequences
  row.context_parallel = std::max<int>(1, static_cast<int>(c.parallel.context_parallel));
  row.data_parallel = trainer.mesh().shape().data_parallel / row.context_parallel;
  row.tokens_per_second = s.tokens_per_second;
  row.t = s.timed;
#ifdef SHARDTRAIN_WITH_CUDA
  if (trainer.device().is_cuda())
    if (const train::GpuSpec* g = train::gpu_spec_for_device(cuda::device_name(trainer.device().index))) row.gpu = g->name;
#endif
  return row;
}

std::string bench_report(const BenchRow& r, int64_t warmup) {
  const train::TimedSteps& t = r.t;
  const int world = r.world;
  const double n = static_cast<double>(t.steps);
  const double ms = 1e3 / n;
  std::string out = fmt::format("\nbench: {} on {}{}\n", r.model, world > 1 ? fmt::format("{} ranks, ", world) : std::string(),
                                r.device);
  if (!r.settings.empty()) out += fmt::format("  settings     {}\n", r.settings);
  out += fmt::format("  batch        {} tokens per step ({} x {} tokens x {} micro-batch{}{})\n", t.tokens_per_step,
                     r.batch_size, r.seq_len, r.accum, r.accum == 1 ? "" : "es",
                     world > 1 ? fmt::format(" x {} data-parallel rank{}{}", r.data_parallel, r.data_parallel == 1 ? "" : "s",
                                             r.context_parallel > 1
                                                 ? fmt::format(", each sequence over {} context-parallel ranks",
                                                               r.context_parallel)
                                                 : std::string())
                               : std::string());
  out += fmt::format("  throughput   {:.0f} tokens/s{}, {:.1f} ms per step (mean of {} steps after {} warm-up)\n",
                     r.tokens_per_second,
                     world > 1 ? fmt::format(" ({:.0f} per rank)", r.tokens_per_second / world) : std::string(),
                     t.seconds * ms, t.steps, warmup);
  if (t.peak_flops > 0)
    out += fmt::format("  MFU          {:.1f} % of {:.0f} TFLOP/s dense bf16 per GPU ({:.2f} GFLOP per token: 6 x "
                       "non-embedding parameters + 12 x layers x width x sequence); `shardtrain plan --mfu {:.2f}` "
                       "estimates a job's time with it\n",
                       100 * t.mfu, t.peak_flops / 1e12, t.flops_per_token / 1e9, t.mfu);
  if (t.fp8_peak_flops > 0)
    out += fmt::format("  FP8          training.fp8 = {}: the blocks' linears{} in FP8; MFU {:.1f} % of {:.0f} TFLOP/s "
                       "dense FP8 per GPU (an FP8 FLOP counted as a bf16 one)\n",
                       t.fp8, t.fp8_head ? " and the head" : "", 100 * t.mfu * t.peak_flops / t.fp8_peak_flops, t.fp8_peak_flops / 1e12);
  out += fmt::format("  step         data {:.1f} ms, forward {:.1f}, backward {:.1f}, optimizer {:.1f}{}\n",
                     t.data_s * ms, t.forward_s * ms, t.backward_s * ms, t.optimizer_s * ms,
                     world > 1 ? fmt::format(" (compute waiting on communication {:.1f} ms)", t.comm_wait_s * ms)
                               : std::string());
  if (r.device.rfind("cuda", 0) == 0)
    out += fmt::format("  memory       peak {} of the GPU's {}{} (`shardtrain plan`: {})\n",
                       format_bytes(t.peak_device_bytes), format_bytes(t.device_total_bytes),
                       world > 1 ? " (rank 0)" : "", format_bytes(t.planned_peak_bytes));
  if (t.board.samples > 0 && std::isfinite(t.board.mean_power_w))
    out += fmt::format("  board        {}; {:.2f} mJ per token{}\n", format_activity(t.board),
                       1e3 * t.board.mean_power_w / (r.tokens_per_second / world), world > 1 ? " (rank 0)" : "");
  return out;
}

nlohmann::ordered_json bench_json(const BenchRow& r, int64_t warmup) {
  nlohmann::ordered_json j;
  if (!r.settings.empty()) j["settings"] = r.settings;
  if (!r.error.empty()) {
    j["error"] = r.error;
    return j;
  }
  const train::TimedSteps& t = r.t;
  const double n = static_cast<double>(t.steps);
  j["model"] = r.model;
  j["device"] = r.device;
  j["ranks"] = r.world;
  j["batch_size"] = r.batch_size;
  j["seq_len"] = r.seq_len;
  j["grad_accum_steps"] = r.accum;
  j["tokens_per_step"] = t.tokens_per_step;
  j["warmup_steps"] = warmup;
  j["timed_steps"] = t.steps;
  j["tokens_per_second"] = r.tokens_per_second;
  j["step_s"] = t.seconds / n;
  j["data_s"] = t.data_s / n;
  j["forward_s"] = t.forward_s / n;
  j["backward_s"] = t.backward_s / n;
  j["optimizer_s"] = t.optimizer_s / n;
  j["comm_wait_s"] = t.comm_wait_s / n;
  j["mfu"] = t.mfu;
  j["fp8"] = t.fp8;
  if (t.fp8_peak_flops > 0) j["mfu_fp8_peak"] = t.mfu * t.peak_flops / t.fp8_peak_flops;
  j["peak_device_bytes"] = t.peak_device_bytes;
  j["planned_peak_bytes"] = t.planned_peak_bytes;
  if (t.board.samples > 0 && std::isfinite(t.board.mean_power_w)) {
    j["gpu_power_w"] = t.board.mean_power_w;
    j["gpu_sm_mhz"] = t.board.mean_sm_mhz;
    j["gpu_power_capped"] = t.board.power_capped;
  }
  return j;
}

// --calibration FILE: the profiled steps' rates in the form `plan --calibration` reads.
void write_calibration(const std::string& path, const BenchRow& row, const train::JobConfig& c) {
  const std::string text =
      train::calibration_from_profile(row.t.ops, row.gpu, row.seq_len, c.training.fp8 != "off");
  std::ofstream f(path);
  f << text;
  f.close();
  ST_CHECK(f.good(), "bench: cannot write `", path, "` (--calibration)");
  log::info(fmt::format("bench: wrote the profiled rates to {}{} (`shardtrain plan JOB --calibration {}`; the "
                        "profile synchronises every op, so its rates are a little below an unprofiled step's)",
                        path, row.gpu.empty() ? " without a \"gpu\" (not a GPU of plan's table)" : "", path));
}

}  // namespace

int run_bench(const std::vector<std::string>& args) {
  int64_t steps = 10, warmup = 3;
  std::string json_path;
  std::string calibration_path;  // --calibration FILE: plan's rates from the profiled steps
  std::vector<std::string> rest;
  // --sweep key=v1,v2: each setting in turn (several --sweep: every combination)
  std::vector<std::pair<std::string, std::vector<std::string>>> sweeps;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    auto value = [&]() -> const std::string& {
      ST_CHECK(i + 1 < args.size(), "bench: ", a, " needs a value");
      return args[++i];
    };
    if (a == "--steps") steps = integer_flag(a, value(), "bench");
    else if (a == "--warmup") warmup = integer_flag(a, value(), "bench");
    else if (a == "--json") json_path = value();
    else if (a == "--calibration") calibration_path = value();
    else if (a == "--sweep") {
      const std::string& v = value();
      const size_t eq = v.find('=');
      ST_CHECK(eq != std::string::npos && eq > 0 && eq + 1 < v.size(), "bench: --sweep takes section.key=v1,v2,...; "
               "found `", v, "`");
      std::vector<std::string> values;
      for (size_t p = eq + 1; p <= v.size();) {
        const size_t comma = std::min(v.find(',', p), v.size());
        ST_CHECK(comma > p, "bench: --sweep `", v, "` has an empty value");
        values.push_back(v.substr(p, comma - p));
        p = comma + 1;
      }
      sweeps.emplace_back(v.substr(0, eq), std::move(values));
    } else {
      rest.push_back(a);
    }
  }
  ST_CHECK(steps >= 1, "bench: --steps must be at least 1, found ", steps);
  ST_CHECK(warmup >= 1, "bench: --warmup must be at least 1 (the first step builds plans, caches and the CUDA "
           "graph), found ", warmup);
  const JobArgs j = parse_job_args(rest, "bench");
  log::info(fmt::format("bench: {}, random tokens and weights, {} warm-up and {} timed steps",
                        j.config_file.empty() ? std::string("the built-in default job") : j.config_file, warmup,
                        steps));
  auto job_with = [&](const std::vector<std::string>& extra) {
    std::vector<std::string> overrides = j.overrides;
    overrides.insert(overrides.end(), extra.begin(), extra.end());
    train::JobConfig c = train::load_config(j.config_file, overrides).config;
    c.training.steps = warmup + steps;
    return c;
  };
  auto write_json = [&](const nlohmann::ordered_json& value) {
    if (json_path.empty()) return;
    std::ofstream f(json_path);
    f << value.dump(2) << "\n";
    f.close();
    ST_CHECK(f.good(), "bench: cannot write `", json_path, "` (--json)");
  };
  ST_CHECK(calibration_path.empty() || sweeps.empty(), "bench: --calibration profiles one job; give it without "
           "--sweep (one bench per setting)");
  if (!calibration_path.empty()) profile::enable();  // before the trainer, which then runs the steps eagerly
  if (sweeps.empty()) {
    const train::JobConfig c = job_with({});
    const BenchRow row = run_one_bench(c, warmup, "");
    if (row.rank != 0) return 0;  // rank 0 reports
    std::fputs(bench_report(row, warmup).c_str(), stdout);
    write_json(bench_json(row, warmup));
    if (!calibration_path.empty()) write_calibration(calibration_path, row, c);
    return 0;
  }
  ST_CHECK(!dist::launched_with_several_ranks(), "bench: --sweep runs its settings one after another in one process; launch one bench per "
           "setting on several ranks");
  // every combination, the last --sweep varying fastest; each setting checked before any runs
  std::vector<std::vector<std::string>> combos = {{}};
  for (const auto& [key, values] : sweeps) {
    std::vector<std::vector<std::string>> next;
    for (const std::vector<std::string>& c : combos)
      for (const std::string& v : values) {
        std::vector<std::string> more = c;
        more.push_back("--" + key + "=" + v);
        next.push_back(std::move(more));
      }
    combos = std::move(next);
  }
  for (const std::vector<std::string>& c : combos) (void)job_with(c);
  std::vector<BenchRow> rows;
  for (size_t k = 0; k < combos.size(); ++k) {
    std::string settings;
    for (const std::string& o : combos[k]) settings += (settings.empty() ? "" : " ") + o.substr(2);
    log::info(fmt::format("bench [{}/{}]: {}", k + 1, combos.size(), settings));
    try {
      rows.push_back(run_one_bench(job_with(combos[k]), warmup, settings));
      std::fputs(bench_report(rows.back(), warmup).c_str(), stdout);
    } catch (const std::exception& e) {  // out of memory, say: noted, and the next setting runs
      BenchRow failed;
      failed.settings = settings;
      failed.error = e.what();
      log::warn(fmt::format("bench [{}/{}]: {} failed: {}", k + 1, combos.size(), settings, failed.error));
      rows.push_back(std::move(failed));
    }
  }
  std::string table = "\n| settings | tokens/s | MFU | ms per step | fwd / bwd / optimizer ms | peak | plan |\n"
                      "|---|---|---|---|---|---|---|\n";
  nlohmann::ordered_json all = nlohmann::ordered_json::array();
  for (const BenchRow& r : rows) {
    all.push_back(bench_json(r, warmup));
    if (!r.error.empty()) {
      table += fmt::format("| {} | failed: {} | | | | | |\n", r.settings, r.error.substr(0, r.error.find('\n')));
      continue;
    }
    const double ms = 1e3 / static_cast<double>(r.t.steps);
    const bool gpu = r.device.rfind("cuda", 0) == 0;
    table += fmt::format("| {} | {:.0f} | {} | {:.1f} | {:.1f} / {:.1f} / {:.1f} | {} | {} |\n", r.settings,
                         r.tokens_per_second, r.t.peak_flops > 0 ? fmt::format("{:.1f} %", 100 * r.t.mfu) : "",
                         r.t.seconds * ms, r.t.forward_s * ms, r.t.backward_s * ms, r.t.optimizer_s * ms,
                         gpu ? format_bytes(r.t.peak_device_bytes) : "", gpu ? format_bytes(r.t.planned_peak_bytes) : "");
  }
  std::fputs(table.c_str(), stdout);
  write_json(all);
  return 0;
}

}  // namespace shardtrain::cli
