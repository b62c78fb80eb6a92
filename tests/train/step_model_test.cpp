// The step-time model against the runs measured on GPUs (BENCHMARKS.md and
// docs/benchmarks/history.md, the entry of each named beside it), with the default rates only:
// nothing here is fitted per case. A case the model misses by more than the tolerance is kept
// in the table with the reason, and only the others are asserted.
#include "train/step_model.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "core/error.h"
#include "testing/shared_data.h"
#include "train/config.h"

namespace shardtrain::train {
namespace {

// The shapes as the benchmarks gave them by keys (Llama 3.2 1B with its tied head, Llama 3.1 8B)
#define ST_1B                                                                                             \
  "--model.dim=2048 --model.n_layers=16 --model.n_heads=32 --model.n_kv_heads=8 --model.ffn_dim=8192 "    \
  "--model.vocab_size=128256 --model.max_seq_len=4096 --model.rope_theta=500000 --training.seq_len=4096 " \
  "--model.tie_embeddings=true"
#define ST_8B                                                                                                  \
  "--model.dim=4096 --model.n_layers=32 --model.n_heads=32 --model.n_kv_heads=8 --model.ffn_dim=14336 "        \
  "--model.vocab_size=128256 --model.max_seq_len=4096 --model.rope_theta=500000 --model.tie_embeddings=false " \
  "--training.seq_len=4096"
// configs/llama3.1-8b-128k-one-gpu.toml with the 8B shape by keys
#define ST_8B_128K                                                                                           \
  "--model.hf= --model.dim=4096 --model.n_layers=32 --model.n_heads=32 --model.n_kv_heads=8 "                \
  "--model.ffn_dim=14336 --model.vocab_size=128256 --model.tie_embeddings=false --model.max_seq_len=131072 " \
  "--model.rope_theta=500000"
// the 405B's width with 2 blocks under ZeRO-3 offload
#define ST_405B_2                                                                                              \
  "--model.dim=16384 --model.n_layers=2 --model.n_heads=128 --model.n_kv_heads=8 --model.ffn_dim=53248 "       \
  "--model.vocab_size=128256 --model.max_seq_len=4096 --model.rope_theta=500000 --model.tie_embeddings=false " \
  "--training.seq_len=4096 --training.batch_size=1 --training.activation_checkpointing=full "                  \
  "--parallel.offload=true --parallel.offload_gradients=true"

struct Measured {
  const char* what;
  const char* config;  // a file under configs/, or "" for the default job
  const char* keys;
  const char* gpu;
  int ranks;
  double tokens_per_s_per_gpu;
  const char* entry;           // docs/benchmarks/history.md
  double host_gbps = 0;        // the host's AdamW bandwidth where the entry measured it (0: the default)
  const char* miss = nullptr;  // why the model misses this one by more than the tolerance
};

constexpr double kTolerance = 0.10;

const std::vector<Measured>& measured_runs() {
  static const std::vector<Measured> runs = {
      // ---- one GPU, the 1B shape
      {"1B bf16, batch 8", "", ST_1B " --training.batch_size=8", "h100-sxm", 1, 66859,
       "One H100: the one-GPU engine at the head beside its peers (2026-11-26)"},
      {"1B bf16, full AC, batch 24", "", ST_1B " --training.batch_size=24 --training.activation_checkpointing=full",
       "h100-sxm", 1, 56681, "One H100: the one-GPU engine at the head beside its peers (2026-11-26)"},
      {"1B FP8 tensorwise, batch 8", "", ST_1B " --training.batch_size=8 --training.fp8=tensorwise", "h100-sxm", 1,
       79997, "H100s: the head in FP8 too (2026-11-27)"},
      {"1B FP8 tensorwise + head, batch 8", "",
       ST_1B " --training.batch_size=8 --training.fp8=tensorwise --training.fp8_head=true", "h100-sxm", 1, 83922,
       "H100s: the head in FP8 too (2026-11-27)"},
      {"1B FP8 tensorwise, full AC, batch 24", "",
       ST_1B " --training.batch_size=24 --training.activation_checkpointing=full --training.fp8=tensorwise", "h100-sxm",
       1, 67170, "H100s: the head in FP8 too (2026-11-27)"},
      {"1B FP8 tensorwise + head, full AC, batch 24", "",
       ST_1B " --training.batch_size=24 --training.activation_checkpointing=full --training.fp8=tensorwise "
             "--training.fp8_head=true",
       "h100-sxm", 1, 69759, "H100s: the head in FP8 too (2026-11-27)"},
      {"1B bf16, batch 8, H200", "", ST_1B " --training.batch_size=8", "h200", 1, 68247,
       "One H200: sliding-window attention against full attention (2026-11-28)"},
      {"1B bf16, batch 8, window 1024 on every layer, H200", "",
       ST_1B " --training.batch_size=8 --model.sliding_window=1024", "h200", 1, 73399,
       "One H200: sliding-window attention against full attention (2026-11-28)"},
      // ---- one GPU, ZeRO-3 offload (the host's AdamW measured at 125 GB/s by host_optimizer_bench)
      {"1B offload, batch 4", "", ST_1B " --training.batch_size=4 --parallel.offload=true", "h100-sxm", 1, 33996,
       "One H100: the offloaded step with the host AdamW beside the next forward (2026-11-23)", 125},
      {"1B offload, batch 8", "", ST_1B " --training.batch_size=8 --parallel.offload=true", "h100-sxm", 1, 49573,
       "One H100: the offloaded step with the host AdamW beside the next forward (2026-11-23)", 125},
      {"1B offload, full AC, batch 8", "",
       ST_1B " --training.batch_size=8 --parallel.offload=true --training.activation_checkpointing=full", "h100-sxm", 1,
       43314, "One H100: the offloaded step with the host AdamW beside the next forward (2026-11-23)", 125},
      // ---- one GPU, the 8B on one 131,072-token sequence (offload, 2 blocks' activations offloaded)
      {"8B @ 131,072 bf16, H100", "llama3.1-8b-128k-one-gpu.toml",
       ST_8B_128K " --training.offload_activations_blocks=2", "h100-sxm", 1, 2631,
       "H100s: the head in FP8 too (2026-11-27)", 125},
      {"8B @ 131,072 FP8 tensorwise, H100", "llama3.1-8b-128k-one-gpu.toml",
       ST_8B_128K " --training.offload_activations_blocks=2 --training.fp8=tensorwise", "h100-sxm", 1, 2827,
       "H100s: the head in FP8 too (2026-11-27)", 125},
      {"8B @ 131,072 bf16, H200", "llama3.1-8b-128k-one-gpu.toml",
       ST_8B_128K " --training.offload_activations_blocks=2", "h200", 1, 2675,
       "One H200: FP8 attention, forward and backward, at 131,072 tokens (2026-11-28)"},
      {"8B @ 131,072 FP8 tensorwise, H200", "llama3.1-8b-128k-one-gpu.toml",
       ST_8B_128K " --training.offload_activations_blocks=2 --training.fp8=tensorwise", "h200", 1, 2899,
       "One H200: FP8 attention, forward and backward, at 131,072 tokens (2026-11-28)"},
      {"8B @ 131,072 FP8 tensorwise + FP8 attention, H200", "llama3.1-8b-128k-one-gpu.toml",
       ST_8B_128K " --training.offload_activations_blocks=7 --training.fp8=tensorwise --training.fp8_attention=true",
       "h200", 1, 3645, "One H200: FP8 attention, forward and backward, at 131,072 tokens (2026-11-28)", 0,
       "the FP8 attention backward has no per-op measurement; its default rate (bf16 backward x the FP8 forward's 1.6x "
       "gain) is too high: a calibration with its measured rate is needed"},
      // ---- the 8B shape on 2 and 4 GPUs
      {"8B bf16, full AC, batch 2, 2 H100", "",
       ST_8B " --training.batch_size=2 --training.activation_checkpointing=full", "h100-sxm", 2, 8810,
       "H100s: the head in FP8 too (2026-11-27)"},
      {"8B FP8 tensorwise, full AC, batch 2, 2 H100", "",
       ST_8B " --training.batch_size=2 --training.activation_checkpointing=full --training.fp8=tensorwise", "h100-sxm",
       2, 11151, "H100s: the head in FP8 too (2026-11-27)"},
      {"8B FP8 tensorwise + head, full AC, batch 6, 2 H100", "",
       ST_8B " --training.batch_size=6 --training.activation_checkpointing=full --training.fp8=tensorwise "
             "--training.fp8_head=true",
       "h100-sxm", 2, 12592, "H100s: the head in FP8 too (2026-11-27)"},
      {"8B bf16, full AC, batch 2, 2 H200", "",
       ST_8B " --training.batch_size=2 --training.activation_checkpointing=full", "h200", 2, 8759,
       "Two H200s: block gradients reducing beside the backward (2026-11-26)"},
      {"8B bf16, batch 1, 2 H200", "", ST_8B " --training.batch_size=1", "h200", 2, 8837,
       "Two H200s: the Llama-3.1-8B shape, sharded (2026-11-23)", 0,
       "one 4,096-token sequence per rank: the measured backward (302 ms) is 40 % above the model's, which hides the "
       "block's gathers and reduce-scatters behind compute this short"},
      {"8B bf16, batch 3, 2 H200", "", ST_8B " --training.batch_size=3", "h200", 2, 10867,
       "Two H200s: the Llama-3.1-8B shape, sharded (2026-11-23)"},
      {"8B bf16, full AC, batch 4, 2 H200", "",
       ST_8B " --training.batch_size=4 --training.activation_checkpointing=full", "h200", 2, 8640,
       "Two H200s: the Llama-3.1-8B shape, sharded (2026-11-23)"},
      {"8B bf16, batch 1, 4 H200", "", ST_8B " --training.batch_size=1", "h200", 4, 9779,
       "Four H200s: the Llama-3.1-8B shape sharded over 4 GPUs (2026-11-26)", 0,
       "as at batch 1 on 2 GPUs: the model's overlap is too optimistic when a block's compute is this short"},
      {"8B bf16, batch 4, 4 H200", "", ST_8B " --training.batch_size=4", "h200", 4, 11601,
       "Four H200s: the Llama-3.1-8B shape sharded over 4 GPUs (2026-11-26)"},
      {"8B bf16, full AC, batch 4, 4 H200", "",
       ST_8B " --training.batch_size=4 --training.activation_checkpointing=full", "h200", 4, 9560,
       "Four H200s: the Llama-3.1-8B shape sharded over 4 GPUs (2026-11-26)"},
      // ---- the 1B shape on 2 GPUs: FSDP, replicas, tensor parallelism
      {"1B FSDP, batch 4 per GPU, 2 H200", "", ST_1B " --training.batch_size=4", "h200", 2, 61662,
       "Two H200s: hybrid sharding (HSDP) and DDP (2026-11-25)"},
      {"1B 2 replicas (DDP), batch 4 per GPU, 2 H200", "", ST_1B " --training.batch_size=4 --parallel.replicate=2",
       "h200", 2, 59767, "Two H200s: hybrid sharding (HSDP) and DDP (2026-11-25)"},
      {"1B FSDP, batch 4 per GPU, 2 H100", "", ST_1B " --training.batch_size=4", "h100-sxm", 2, 60192,
       "Two H100s: tensor parallelism with sequence parallelism (2026-11-25)"},
      {"1B FSDP, full AC, batch 8 per GPU, 2 H100", "",
       ST_1B " --training.batch_size=8 --training.activation_checkpointing=full", "h100-sxm", 2, 53331,
       "Two H100s: tensor parallelism with sequence parallelism (2026-11-25)"},
      {"1B TP2, batch 8 per group, 2 H100", "", ST_1B " --training.batch_size=8 --parallel.tensor_parallel=2",
       "h100-sxm", 2, 54409, "Two H100s: tensor parallelism with sequence parallelism (2026-11-25)"},
      {"1B TP2, full AC, batch 8 per group, 2 H100", "",
       ST_1B " --training.batch_size=8 --parallel.tensor_parallel=2 --training.activation_checkpointing=full",
       "h100-sxm", 2, 44782, "Two H100s: tensor parallelism with sequence parallelism (2026-11-25)"},
      {"1B TP2, full AC, batch 16 per group, 2 H100", "",
       ST_1B " --training.batch_size=16 --parallel.tensor_parallel=2 --training.activation_checkpointing=full",
       "h100-sxm", 2, 46428, "Two H100s: tensor parallelism with sequence parallelism (2026-11-25)"},
      {"1B TP2, batch 8 per group, 2 H200 (copy engines)", "",
       ST_1B " --training.batch_size=8 --parallel.tensor_parallel=2", "h200", 2, 58185,
       "Two H200s: the tensor-parallel group's rows moved by pieces and by the copy engines (2026-11-26)"},
      // ---- the 405B's width, 2 blocks, ZeRO-3 offload, 4 GPUs of one 64-core host
      {"405B width, 2 blocks, offload, 4 H200", "", ST_405B_2, "h200", 4, 2015,
       "Four H200s: the 405B's block width under ZeRO-3 CPU offload (2026-11-26)", 0,
       "host-bound, and that host's memory bandwidth was not measured: the run implies ~210 GB/s for its 4 ranks' "
       "AdamW against the default 100 GB/s per node"},
  };
  return runs;
}

std::vector<std::string> split_keys(const std::string& keys) {
  std::vector<std::string> out;
  std::istringstream s(keys);
  for (std::string k; s >> k;) out.push_back(k);
  return out;
}

PlanInput input_of(const std::string& config, const std::string& keys, int ranks) {
  const std::string path = config.empty() ? std::string() : testing::source_dir() + "/configs/" + config;
  const JobConfig job = load_config(path, split_keys(keys)).config;
  return plan_input(job, planned_model(job).config, ranks);
}

StepTime predict(const Measured& m) {
  const PlanInput in = input_of(m.config, m.keys, m.ranks);
  const StepRates rates = default_step_rates(gpu_spec(m.gpu), in.model.head_dim());
  MachineSpec machine;
  if (m.host_gbps > 0) machine.host_memory_bytes = m.host_gbps * 1e9;
  return model_step_time(in, rates, machine);
}

TEST(StepModel, PredictsTheMeasuredRunsWithinTenPercent) {
  std::string table =
      "| run | GPU | ranks | measured | predicted | error | asserted |\n|---|---|---|---|---|---|---|\n";
  int asserted = 0;
  for (const Measured& m : measured_runs()) {
    const StepTime t = predict(m);
    const double error = t.tokens_per_second_per_gpu / m.tokens_per_s_per_gpu - 1;
    table += fmt::format("| {} | {} | {} | {:.0f} | {:.0f} | {:+.1f} % | {} |\n", m.what, m.gpu, m.ranks,
                         m.tokens_per_s_per_gpu, t.tokens_per_second_per_gpu, 100 * error,
                         m.miss ? std::string("no: ") + m.miss : "yes");
    if (m.miss) continue;
    ++asserted;
    EXPECT_LT(std::abs(error), kTolerance) << m.what << " (" << m.entry << "): measured " << m.tokens_per_s_per_gpu
                                           << " tokens/s per GPU, predicted " << t.tokens_per_second_per_gpu;
  }
  std::fputs(table.c_str(), stdout);
  EXPECT_GE(asserted, 25);
}

TEST(StepModelDebug, Print) {
  const char* which = std::getenv("ST_CASE");
  if (!which) return;
  for (const auto& m : measured_runs())
    if (std::string(m.what) == which) {
      const PlanInput in = input_of(m.config, m.keys, m.ranks);
      MachineSpec machine;
      if (m.host_gbps > 0) machine.host_memory_bytes = m.host_gbps * 1e9;
      std::fputs(describe_step_time(in, default_step_rates(gpu_spec(m.gpu), in.model.head_dim()), machine, "").c_str(),
                 stdout);
    }
}

}  // namespace
}  // namespace shardtrain::train
