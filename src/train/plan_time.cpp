// `plan --mfu X`'s step time and job duration: a step's FLOPs over ranks x peak x MFU, with the
// GPUs' datasheet peaks. Nothing here models communication; the MFU stands for all a step loses.
// Without --mfu, plan predicts the step with the model of step_model.h.
#include <cmath>

#include <fmt/format.h>

#include "core/error.h"
#include "train/plan.h"

namespace shardtrain::train {

const std::vector<GpuSpec>& gpu_specs() {
  // dense (no sparsity) bf16 tensor-core peaks as NVIDIA's datasheets give them; Hopper's FP8
  // is twice its bf16
  static const std::vector<GpuSpec> table = {
      {"h100-sxm", "H100 SXM", 989e12, true},
      {"h100-pcie", "H100 PCIe", 756e12, true},
      {"h200", "H200", 989e12, true},
      {"a100", "A100", 312e12, false},
  };
  return table;
}

const GpuSpec& gpu_spec(const std::string& name) {
  std::string names;
  for (const GpuSpec& g : gpu_specs()) {
    if (g.name == name) return g;
    names += (names.empty() ? "" : ", ") + g.name;
  }
  ST_THROW("plan: --gpu `", name, "` is not a GPU plan knows; use one of ", names);
}

const GpuSpec* gpu_spec_for_device(const std::string& device_name) {
  auto has = [&](const char* s) { return device_name.find(s) != std::string::npos; };
  if (has("H100")) return &gpu_spec(has("PCIe") ? "h100-pcie" : "h100-sxm");
  if (has("H200")) return &gpu_spec("h200");
  if (has("A100")) return &gpu_spec("a100");
  return nullptr;
}

TimeEstimate estimate_time(const PlanInput& in, const GpuSpec& gpu, double mfu) {
  ST_CHECK(mfu > 0 && mfu <= 1, "plan: --mfu must be in (0, 1], found ", mfu);
  TimeEstimate t;
  // a tensor-parallel group shares its micro-batch, a context group its sequences: only the
  // data-parallel ranks add tokens
  const int64_t data_parallel = in.world_size / (in.tensor_parallel * in.context_parallel);
  t.tokens_per_step = in.micro_batch * in.seq_len * in.grad_accum_steps * data_parallel;
  t.flops_per_step = in.model.flops_per_token(in.seq_len) * static_cast<double>(t.tokens_per_step);
  t.peak_flops = gpu.bf16_flops * (in.fp8 && gpu.fp8 ? 2.0 : 1.0);
  t.step_seconds = t.flops_per_step / (static_cast<double>(in.world_size) * t.peak_flops * mfu);
  t.tokens_per_second_per_gpu =
      static_cast<double>(t.tokens_per_step) / t.step_seconds / static_cast<double>(in.world_size);
  t.job_seconds = static_cast<double>(in.steps) * t.step_seconds;
  return t;
}

std::string format_job_duration(double seconds) {
  if (seconds < 59.5) return fmt::format("{:.3g} s", seconds);
  if (seconds < 3599.5) {
    const int64_t s = std::llround(seconds);
    return fmt::format("{} min {:02} s", s / 60, s % 60);
  }
  const int64_t minutes = std::llround(seconds / 60);
  if (minutes < 24 * 60) return fmt::format("{} h {:02} min", minutes / 60, minutes % 60);
  const int64_t hours = std::llround(seconds / 3600);
  return fmt::format("{} d {:02} h", hours / 24, hours % 24);
}

std::string describe_time(const PlanInput& in, const GpuSpec& gpu, double mfu, const std::string& gpu_note,
                          const std::string& mfu_note) {
  const TimeEstimate t = estimate_time(in, gpu, mfu);
  const int64_t data_parallel = in.world_size / (in.tensor_parallel * in.context_parallel);
  auto row = [](const std::string& what, const std::string& value) { return fmt::format("  {:<18} {}\n", what, value); };
  std::string s = "time (estimate: FLOPs / (ranks x peak x MFU); communication is not modelled):\n";
  s += row("tokens per step",
           fmt::format("{} ({} x {} tokens x {} micro-batch{} x {} data-parallel rank{})", fmt::group_digits(t.tokens_per_step),
                       in.micro_batch, in.seq_len, in.grad_accum_steps, in.grad_accum_steps == 1 ? "" : "es",
                       data_parallel, data_parallel == 1 ? "" : "s"));
  s += row("FLOPs per step", fmt::format("{:.3e} ({:.3e} per token)", t.flops_per_step, in.model.flops_per_token(in.seq_len)));
  const bool fp8_peak = in.fp8 && gpu.fp8;
  s += row("peak", fmt::format("{:.0f} TFLOP/s dense {} per GPU ({}{}), {} GPU{}", t.peak_flops / 1e12,
                               fp8_peak ? "FP8" : "bf16", gpu.label, gpu_note.empty() ? "" : "; " + gpu_note,
                               in.world_size, in.world_size == 1 ? "" : "s"));
  s += row("MFU", fmt::format("{:.0f} % ({})", 100 * mfu, mfu_note));
  s += row("step", fmt::format("{} per step, {} tokens/s per GPU", format_job_duration(t.step_seconds),
                               fmt::group_digits(std::llround(t.tokens_per_second_per_gpu))));
  s += row("job", fmt::format("{} for {} steps (the steps alone: no evaluation, saves, loading or start-up)",
                              format_job_duration(t.job_seconds), fmt::group_digits(in.steps)));
  if (in.fp8 && !gpu.fp8)
    s += fmt::format("  training.fp8 needs FP8 tensor cores (H100, H200), which the {} lacks: planned at its bf16 "
                     "peak\n",
                     gpu.label);
  else if (fp8_peak)
    s += "  training.fp8: against the FP8 peak, twice bf16's; attention, the head and the loss stay bf16, so an\n"
         "  FP8 run's MFU against it is lower than a bf16 run's against bf16's (`shardtrain bench` prints both)\n";
  if (in.checkpointing != model::ActivationCheckpointing::kNone)
    s += "  the backward's recomputation (activation checkpointing) is not in the FLOPs, as in MFU: it lowers MFU\n";
  s += "  Communication (gathers, reduce-scatters, the offload's copies) is not modelled: where it does not\n"
       "  overlap the compute, the MFU a run reaches is lower; `shardtrain bench` measures a job's MFU.\n";
  return s;
}

}  // namespace shardtrain::train
