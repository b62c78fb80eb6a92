// The step-time model against the runs measured on GPUs (BENCHMARKS.md and
// docs/benchmarks/history.md, the entry of each named beside it), with the default rates only:
// nothing here is fitted per case. A case the model misses by more than the tolerance is kept
// in the table with the reason, and only the others are asserted.
#include "train/step_model.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "testing/shared_data.h"
#include "train/config.h"

namespace shardtrain::train {
namespace {

// The shapes as the benchmarks gave them by keys (Llama 3.2 1B with its tied head, Llama 3.1 8B)
const std::string k1B =
    "--model.dim=2048 --model.n_layers=16 --model.n_heads=32 --model.n_kv_heads=8 --model.ffn_dim=8192 "
    "--model.vocab_size=128256 --model.max_seq_len=4096 --model.rope_theta=500000 --training.seq_len=4096 "
    "--model.tie_embeddings=true";
const std::string k8B =
    "--model.dim=4096 --model.n_layers=32 --model.n_heads=32 --model.n_kv_heads=8 --model.ffn_dim=14336 "
    "--model.vocab_size=128256 --model.max_seq_len=4096 --model.rope_theta=500000 --model.tie_embeddings=false "
    "--training.seq_len=4096";
// configs/llama3.1-8b-128k-one-gpu.toml with the 8B shape by keys
const std::string k8B128k =
    "--model.hf= --model.dim=4096 --model.n_layers=32 --model.n_heads=32 --model.n_kv_heads=8 "
    "--model.ffn_dim=14336 --model.vocab_size=128256 --model.tie_embeddings=false --model.max_seq_len=131072 "
    "--model.rope_theta=500000";
// the context-parallel benchmark's model: the 1B's width, 4 blocks, bytes, one 32,768-token sequence
const std::string kCp4Blocks =
    "--model.dim=2048 --model.n_layers=4 --model.n_heads=16 --model.n_kv_heads=4 --model.ffn_dim=8192 "
    "--model.max_seq_len=32768 --training.seq_len=32768 --training.batch_size=1 "
    "--training.activation_checkpointing=full --training.device=cuda";
// the 405B's width with 2 blocks under ZeRO-3 offload
const std::string k405B2 =
    "--model.dim=16384 --model.n_layers=2 --model.n_heads=128 --model.n_kv_heads=8 --model.ffn_dim=53248 "
    "--model.vocab_size=128256 --model.max_seq_len=4096 --model.rope_theta=500000 --model.tie_embeddings=false "
    "--training.seq_len=4096 --training.batch_size=1 --training.activation_checkpointing=full "
    "--parallel.offload=true --parallel.offload_gradients=true";

struct Measured {
  const char* what;
  const char* config;  // a file under configs/, or "" for the default job
  std::string keys;
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
      {"1B bf16, batch 8", "", k1B + " --training.batch_size=8", "h100-sxm", 1, 66859,
       "One H100: the one-GPU engine at the head beside its peers (2026-11-26)"},
      {"1B bf16, full AC, batch 24", "", k1B + " --training.batch_size=24 --training.activation_checkpointing=full",
       "h100-sxm", 1, 56681, "One H100: the one-GPU engine at the head beside its peers (2026-11-26)"},
      {"1B FP8 tensorwise, batch 8", "", k1B + " --training.batch_size=8 --training.fp8=tensorwise", "h100-sxm", 1,
       79997, "H100s: the head in FP8 too (2026-11-27)"},
      {"1B FP8 tensorwise + head, batch 8", "",
       k1B + " --training.batch_size=8 --training.fp8=tensorwise --training.fp8_head=true", "h100-sxm", 1, 83922,
       "H100s: the head in FP8 too (2026-11-27)"},
      {"1B FP8 tensorwise, full AC, batch 24", "",
       k1B + " --training.batch_size=24 --training.activation_checkpointing=full --training.fp8=tensorwise", "h100-sxm",
       1, 67170, "H100s: the head in FP8 too (2026-11-27)"},
      {"1B FP8 tensorwise + head, full AC, batch 24", "",
       k1B + " --training.batch_size=24 --training.activation_checkpointing=full --training.fp8=tensorwise "
             "--training.fp8_head=true",
       "h100-sxm", 1, 69759, "H100s: the head in FP8 too (2026-11-27)"},
      {"1B bf16, batch 8, H200", "", k1B + " --training.batch_size=8", "h200", 1, 68247,
       "One H200: sliding-window attention against full attention (2026-11-28)"},
      {"1B bf16, batch 8, window 1024 on every layer, H200", "",
       k1B + " --training.batch_size=8 --model.sliding_window=1024", "h200", 1, 73399,
       "One H200: sliding-window attention against full attention (2026-11-28)"},
      // ---- one GPU, ZeRO-3 offload (the host's AdamW measured at 125 GB/s by host_optimizer_bench)
      {"1B offload, batch 4", "", k1B + " --training.batch_size=4 --parallel.offload=true", "h100-sxm", 1, 33996,
       "One H100: the offloaded step with the host AdamW beside the next forward (2026-11-23)", 125},
      {"1B offload, batch 8", "", k1B + " --training.batch_size=8 --parallel.offload=true", "h100-sxm", 1, 49573,
       "One H100: the offloaded step with the host AdamW beside the next forward (2026-11-23)", 125},
      {"1B offload, full AC, batch 8", "",
       k1B + " --training.batch_size=8 --parallel.offload=true --training.activation_checkpointing=full", "h100-sxm", 1,
       43314, "One H100: the offloaded step with the host AdamW beside the next forward (2026-11-23)", 125},
      // ---- one GPU, the 8B on one 131,072-token sequence (offload, 2 blocks' activations offloaded)
      {"8B @ 131,072 bf16, H100", "llama3.1-8b-128k-one-gpu.toml", k8B128k + " --training.offload_activations_blocks=2",
       "h100-sxm", 1, 2631, "H100s: the head in FP8 too (2026-11-27)", 125},
      {"8B @ 131,072 FP8 tensorwise, H100", "llama3.1-8b-128k-one-gpu.toml",
       k8B128k + " --training.offload_activations_blocks=2 --training.fp8=tensorwise", "h100-sxm", 1, 2827,
       "H100s: the head in FP8 too (2026-11-27)", 125},
      {"8B @ 131,072 bf16, H200", "llama3.1-8b-128k-one-gpu.toml", k8B128k + " --training.offload_activations_blocks=2",
       "h200", 1, 2675, "One H200: FP8 attention, forward and backward, at 131,072 tokens (2026-11-28)"},
      {"8B @ 131,072 FP8 tensorwise, H200", "llama3.1-8b-128k-one-gpu.toml",
       k8B128k + " --training.offload_activations_blocks=2 --training.fp8=tensorwise", "h200", 1, 2899,
       "One H200: FP8 attention, forward and backward, at 131,072 tokens (2026-11-28)"},
      {"8B @ 131,072 FP8 tensorwise + FP8 attention, H200", "llama3.1-8b-128k-one-gpu.toml",
       k8B128k + " --training.offload_activations_blocks=7 --training.fp8=tensorwise --training.fp8_attention=true",
       "h200", 1, 3645, "One H200: FP8 attention, forward and backward, at 131,072 tokens (2026-11-28)", 0,
       "the FP8 attention backward has no per-op measurement; its default rate (bf16 backward x the FP8 forward's 1.6x "
       "gain) is too high: a calibration with its measured rate is needed"},
      // ---- context parallelism: a 4-block model of the 1B's width, one 32,768-token sequence
      {"1B width, 4 blocks, full AC, 32,768 tokens, H200", "", kCp4Blocks, "h200", 1, 130001,
       "Two H200s: context parallelism of 2 against one GPU at 32,768 tokens (2026-11-28)"},
      {"1B width, 4 blocks, full AC, 32,768 tokens, context parallelism 2, 2 H200", "",
       kCp4Blocks + " --parallel.context_parallel=2", "h200", 2, 110008,
       "Two H200s: context parallelism of 2 against one GPU at 32,768 tokens (2026-11-28)"},
      // ---- context parallelism: the 8B shape on one long sequence
      {"8B @ 131,072, context parallelism 2, 2 H200", "llama3.1-8b-128k-one-gpu.toml",
       k8B128k + " --parallel.context_parallel=2", "h200", 2, 2453,
       "Two H200s: Llama 3.1 8B on one 131,072-token sequence with context parallelism of 2 (2026-11-28)"},
      {"8B @ 524,288, context parallelism 4, 4 H200", "llama3.1-8b-512k-4gpus.toml",
       "--model.hf= --model.preset=llama3.1-8b", "h200", 4, 820,
       "Four H200s: Llama 3.1 8B on one 524,288-token sequence with context parallelism of 4 (2026-11-28)", 0,
       "the model slows all compute by the 12.5 % measured beside FSDP's collectives on the 8B at 4,096 tokens, "
       "where they run through most of the step; here they take 0.1 % of it (130 ms of 160 s), and without that "
       "charge the model gives 819 tokens/s. Scaling the charge by the collectives' share of the step instead "
       "overshoots the FSDP runs at 4,096 tokens by up to 20 %: their contention is not proportional to link time"},
      {"8B @ 1,048,576, context parallelism 4, 4 H200 (the first step)", "llama3.1-8b-128k-one-gpu.toml",
       k8B128k + " --model.max_seq_len=1048576 --training.seq_len=1048576 --parallel.context_parallel=4", "h200", 4,
       413, "Four H200s: Llama 3.1 8B on one 1,048,576-token sequence with context parallelism of 4 (2026-11-28)"},
      // ---- the 8B shape on 2 and 4 GPUs
      {"8B bf16, full AC, batch 2, 2 H100", "",
       k8B + " --training.batch_size=2 --training.activation_checkpointing=full", "h100-sxm", 2, 8810,
       "H100s: the head in FP8 too (2026-11-27)"},
      {"8B FP8 tensorwise, full AC, batch 2, 2 H100", "",
       k8B + " --training.batch_size=2 --training.activation_checkpointing=full --training.fp8=tensorwise", "h100-sxm",
       2, 11151, "H100s: the head in FP8 too (2026-11-27)"},
      {"8B FP8 tensorwise + head, full AC, batch 6, 2 H100", "",
       k8B + " --training.batch_size=6 --training.activation_checkpointing=full --training.fp8=tensorwise "
             "--training.fp8_head=true",
       "h100-sxm", 2, 12592, "H100s: the head in FP8 too (2026-11-27)"},
      {"8B bf16, full AC, batch 2, 2 H200", "",
       k8B + " --training.batch_size=2 --training.activation_checkpointing=full", "h200", 2, 8759,
       "Two H200s: block gradients reducing beside the backward (2026-11-26)"},
      {"8B bf16, batch 1, 2 H200", "", k8B + " --training.batch_size=1", "h200", 2, 8837,
       "Two H200s: the Llama-3.1-8B shape, sharded (2026-11-23)", 0,
       "one 4,096-token sequence per rank: the measured backward (302 ms) is 40 % above the model's, which hides the "
       "block's gathers and reduce-scatters behind compute this short"},
      {"8B bf16, batch 3, 2 H200", "", k8B + " --training.batch_size=3", "h200", 2, 10867,
       "Two H200s: the Llama-3.1-8B shape, sharded (2026-11-23)"},
      {"8B bf16, full AC, batch 4, 2 H200", "",
       k8B + " --training.batch_size=4 --training.activation_checkpointing=full", "h200", 2, 8640,
       "Two H200s: the Llama-3.1-8B shape, sharded (2026-11-23)"},
      {"8B bf16, batch 1, 4 H200", "", k8B + " --training.batch_size=1", "h200", 4, 9779,
       "Four H200s: the Llama-3.1-8B shape sharded over 4 GPUs (2026-11-26)", 0,
       "as at batch 1 on 2 GPUs: the model's overlap is too optimistic when a block's compute is this short"},
      {"8B bf16, batch 4, 4 H200", "", k8B + " --training.batch_size=4", "h200", 4, 11601,
       "Four H200s: the Llama-3.1-8B shape sharded over 4 GPUs (2026-11-26)"},
      {"8B bf16, full AC, batch 4, 4 H200", "",
       k8B + " --training.batch_size=4 --training.activation_checkpointing=full", "h200", 4, 9560,
       "Four H200s: the Llama-3.1-8B shape sharded over 4 GPUs (2026-11-26)"},
      // ---- the 1B shape on 2 GPUs: FSDP, replicas, tensor parallelism
      {"1B FSDP, batch 4 per GPU, 2 H200", "", k1B + " --training.batch_size=4", "h200", 2, 61662,
       "Two H200s: hybrid sharding (HSDP) and DDP (2026-11-25)"},
      {"1B 2 replicas (DDP), batch 4 per GPU, 2 H200", "", k1B + " --training.batch_size=4 --parallel.replicate=2",
       "h200", 2, 59767, "Two H200s: hybrid sharding (HSDP) and DDP (2026-11-25)"},
      {"1B FSDP, batch 4 per GPU, 2 H100", "", k1B + " --training.batch_size=4", "h100-sxm", 2, 60192,
       "Two H100s: tensor parallelism with sequence parallelism (2026-11-25)"},
      {"1B FSDP, full AC, batch 8 per GPU, 2 H100", "",
       k1B + " --training.batch_size=8 --training.activation_checkpointing=full", "h100-sxm", 2, 53331,
       "Two H100s: tensor parallelism with sequence parallelism (2026-11-25)"},
      {"1B TP2, batch 8 per group, 2 H100", "", k1B + " --training.batch_size=8 --parallel.tensor_parallel=2",
       "h100-sxm", 2, 54409, "Two H100s: tensor parallelism with sequence parallelism (2026-11-25)"},
      {"1B TP2, full AC, batch 8 per group, 2 H100", "",
       k1B + " --training.batch_size=8 --parallel.tensor_parallel=2 --training.activation_checkpointing=full",
       "h100-sxm", 2, 44782, "Two H100s: tensor parallelism with sequence parallelism (2026-11-25)"},
      {"1B TP2, full AC, batch 16 per group, 2 H100", "",
       k1B + " --training.batch_size=16 --parallel.tensor_parallel=2 --training.activation_checkpointing=full",
       "h100-sxm", 2, 46428, "Two H100s: tensor parallelism with sequence parallelism (2026-11-25)"},
      {"1B TP2, batch 8 per group, 2 H200 (copy engines)", "",
       k1B + " --training.batch_size=8 --parallel.tensor_parallel=2", "h200", 2, 58185,
       "Two H200s: the tensor-parallel group's rows moved by pieces and by the copy engines (2026-11-26)"},
      // ---- the 405B's width, 2 blocks, ZeRO-3 offload, 4 GPUs of one 64-core host
      {"405B width, 2 blocks, offload, 4 H200", "", k405B2, "h200", 4, 2015,
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

// The shipped jobs of large models on their intended GPU counts: the prediction runs and is
// finite, printed beside the reference the 405B job is held against (a torchtitan-style 405B
// run on 64 H100s at about 30 s per step).
TEST(StepModel, PredictsTheShippedLargeJobs) {
  struct Job {
    const char* file;
    int ranks;
  };
  const Job jobs[] = {{"llama2-70b-finetune-16gpus.toml", 16}, {"llama3.1-405b-64gpus.toml", 64}};
  for (const Job& j : jobs)
    for (const char* gpu : {"h100-sxm", "h200"}) {
      const PlanInput in = input_of(j.file, "", j.ranks);
      const StepRates rates = default_step_rates(gpu_spec(gpu), in.model.head_dim());
      const StepTime t = model_step_time(in, rates, MachineSpec{});
      for (double x : {t.step_s, t.tokens_per_second_per_gpu, t.mfu, t.compute_s, t.comm_exposed_s, t.offload_exposed_s,
                       t.host_update_s})
        EXPECT_TRUE(std::isfinite(x) && x >= 0) << j.file << " on " << gpu << ": " << x;
      EXPECT_GT(t.step_s, 0) << j.file;
      EXPECT_GT(t.mfu, 0.05) << j.file;
      EXPECT_LT(t.mfu, 0.75) << j.file;
      std::printf("%s on %d x %s: %.1f s per step (%lld tokens), %.0f tokens/s per GPU, MFU %.1f %%; compute %.1f s, "
                  "communication exposed %.1f s, offload exposed %.1f s%s\n",
                  j.file, j.ranks, gpu, t.step_s, static_cast<long long>(t.tokens_per_step),
                  t.tokens_per_second_per_gpu, 100 * t.mfu, t.compute_s, t.comm_exposed_s, t.offload_exposed_s,
                  j.ranks == 64 && std::string(gpu) == "h100-sxm" ? " (reference: ~30 s per step)" : "");
    }
}

// What each part of the model answers to, on the 8B shape.
TEST(StepModel, EachPartMovesTheStepAsItShould) {
  auto step = [](const std::string& keys, int ranks, const char* gpu = "h100-sxm", MachineSpec machine = {}) {
    const PlanInput in = input_of("", k8B + " " + keys, ranks);
    return model_step_time(in, default_step_rates(gpu_spec(gpu), in.model.head_dim()), machine);
  };
  const StepTime bf16 = step("--training.batch_size=2", 1);
  EXPECT_EQ(bf16.comm_total_s, 0);  // one rank: nothing gathered
  EXPECT_GT(bf16.optimizer_s, 0);
  EXPECT_NEAR(bf16.step_s, bf16.compute_s + bf16.optimizer_s, 1e-9 * bf16.step_s);
  // FP8 products are faster; FP8 attention faster still
  const StepTime fp8 = step("--training.batch_size=2 --training.fp8=tensorwise", 1);
  EXPECT_LT(fp8.step_s, bf16.step_s);
  EXPECT_GT(fp8.matmul_fp8_s, 0);
  EXPECT_GT(fp8.fp8_quantize_s, 0);
  EXPECT_LT(step("--training.batch_size=2 --training.fp8=tensorwise --training.fp8_attention=true", 1).attention_s,
            fp8.attention_s);
  // each checkpointing policy recomputes more
  EXPECT_EQ(bf16.recompute_s, 0);
  double last = 0;
  for (const char* ac : {"pointwise", "selective", "full"}) {
    const StepTime t = step(std::string("--training.batch_size=2 --training.activation_checkpointing=") + ac, 1);
    EXPECT_GT(t.recompute_s, last) << ac;
    EXPECT_GT(t.step_s, bf16.step_s) << ac;
    last = t.recompute_s;
  }
  // a sliding window shortens attention
  EXPECT_LT(step("--training.batch_size=2 --model.sliding_window=1024", 1).attention_s, bf16.attention_s);
  // sharded: the collectives exist, and a slow network across nodes exposes them
  const StepTime two = step("--training.batch_size=2", 2);
  EXPECT_GT(two.comm_total_s, 0);
  EXPECT_GT(two.contention_s, 0);
  MachineSpec nodes;
  nodes.gpus_per_node = 1;
  nodes.inter_node_bytes = 100e9 / 8;  // 100 Gb/s per node
  const StepTime across = step("--training.batch_size=2", 2, "h100-sxm", nodes);
  EXPECT_GT(across.comm_exposed_s, two.comm_exposed_s + 0.1);
  EXPECT_GT(across.step_s, two.step_s + 0.1);
  // bf16 reduce-scatters move half the bytes
  EXPECT_LT(step("--training.batch_size=2 --parallel.reduce_dtype=bf16", 2).comm_total_s, two.comm_total_s);
  // replicas: an all-reduce of the shards
  EXPECT_GT(step("--training.batch_size=2 --parallel.replicate=2", 4).comm_total_s, 0);
  // tensor parallelism: the group's exchanges
  EXPECT_GT(step("--training.batch_size=2 --parallel.tensor_parallel=2", 2).tensor_parallel_s, 0);
  // offload: the host AdamW, at the host's bandwidth, beside the forward
  MachineSpec slow_host;
  slow_host.host_memory_bytes = 10e9;
  const StepTime off = step("--training.batch_size=2 --parallel.offload=true", 1);
  const StepTime off_slow = step("--training.batch_size=2 --parallel.offload=true", 1, "h100-sxm", slow_host);
  EXPECT_EQ(off.optimizer_s, 0);
  EXPECT_GT(off.host_update_s, 0);
  EXPECT_NEAR(off_slow.host_update_s, 10 * off.host_update_s, 1e-9 * off_slow.host_update_s);
  EXPECT_GT(off_slow.offload_exposed_s, off.offload_exposed_s);
  EXPECT_GT(off_slow.step_s, off_slow.host_update_s);
}

TEST(StepModel, CalibrationFileSetsTheRates) {
  const StepRates h100 = default_step_rates(gpu_spec("h100-sxm"), 128);
  const StepRates c = parse_calibration(
      R"({"gpu": "h100-sxm", "matmul_bf16_tflops": 600, "attention_forward_tflops": 300, "memory_gbps": 2000,
          "attention_seq_len": 8192})",
      "rates.json", h100);
  EXPECT_DOUBLE_EQ(c.matmul_bf16, 600e12);
  EXPECT_DOUBLE_EQ(c.attention_forward_bf16, 300e12);
  EXPECT_DOUBLE_EQ(c.memory_bytes, 2000e9);
  EXPECT_EQ(c.attention_seq_len, 8192);
  EXPECT_DOUBLE_EQ(c.matmul_fp8, h100.matmul_fp8);  // what the file leaves out stays the default
  EXPECT_NE(c.source.find("--calibration rates.json"), std::string::npos) << c.source;
  // slower products: a longer step
  const PlanInput in = input_of("", k8B + " --training.batch_size=2", 1);
  EXPECT_GT(model_step_time(in, c, {}).step_s, model_step_time(in, h100, {}).step_s);
  auto error_of = [&](const std::string& text) {
    try {
      parse_calibration(text, "rates.json", h100);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(error_of(R"({"matmul_tflops": 600})")
                .find("plan: --calibration `rates.json` has an unknown field \"matmul_tflops\"; the fields are gpu, "
                      "matmul_bf16_tflops, "),
            std::string::npos)
      << error_of(R"({"matmul_tflops": 600})");
  EXPECT_NE(error_of(R"({"memory_gbps": -1})")
                .find("plan: --calibration `rates.json`: \"memory_gbps\" must be a positive number, found -1"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"gpu": "h200"})")
                .find("plan: --calibration `rates.json` is for GPU \"h200\" but the plan is for h100-sxm; pass --gpu "
                      "h200"),
            std::string::npos);
  EXPECT_NE(error_of("[1, 2]").find("must hold a JSON object of rates"), std::string::npos);
  EXPECT_NE(error_of("{oops").find("plan: --calibration `rates.json` is not valid JSON"), std::string::npos);
  // a file on disk, and its GPU for plan to pick
  const std::string path = ::testing::TempDir() + "step_model_rates.json";
  {
    std::ofstream f(path);
    f << R"({"gpu": "h200", "matmul_bf16_tflops": 700})";
  }
  EXPECT_EQ(calibration_gpu(path), "h200");
  EXPECT_DOUBLE_EQ(read_calibration(path, default_step_rates(gpu_spec("h200"), 128)).matmul_bf16, 700e12);
  std::remove(path.c_str());
}

// Context parallelism: a sequence's tokens once per group (not once per rank), each rank 1/cp
// of the work, and the ring's exchanges counted beside the attention (a slow link shows them).
TEST(StepModel, ContextParallelismSplitsTheSequence) {
  const std::string job = "llama3.1-8b-128k-one-gpu.toml";
  const std::string keys = k8B128k + " --training.offload_activations_blocks=2";
  const StepRates h200 = default_step_rates(gpu_spec("h200"), 128);
  const StepTime one = model_step_time(input_of(job, keys, 1), h200, {});
  const PlanInput two_in = input_of(job, keys + " --parallel.context_parallel=2", 2);
  const StepTime two = model_step_time(two_in, h200, {});
  EXPECT_EQ(one.tokens_per_step, 131072);
  EXPECT_EQ(two.tokens_per_step, 131072) << "one sequence a step, split over the group";
  EXPECT_LT(two.step_s, 0.6 * one.step_s);
  EXPECT_GT(two.step_s, 0.4 * one.step_s);
  EXPECT_NEAR(two.attention_s, one.attention_s / 2, 0.15 * one.attention_s)
      << "each rank holds half the causal work (the kernels' shorter blocks run a little slower)";
  MachineSpec slow;
  slow.nvlink_bytes = 1e9;  // 1 GB/s: the ring's exchanges outlast the attention
  EXPECT_GT(model_step_time(two_in, h200, slow).attention_s, 2 * two.attention_s);
  EXPECT_NE(describe_step_time(two_in, h200, {}, "").find("131,072 (1 x 131072 tokens x 1 micro-batch x 1 "
                                                          "data-parallel rank)"),
            std::string::npos)
      << describe_step_time(two_in, h200, {}, "");
}

// A profiled run's per-op totals become a calibration file that plan reads back.
TEST(StepModel, CalibrationFromAProfile) {
  const StepRates h100 = default_step_rates(gpu_spec("h100-sxm"), 128);
  auto op = [](const char* name, double seconds, double flops, double bytes) {
    return profile::OpTotal{name, 10, seconds, {flops, bytes}};
  };
  const std::vector<profile::OpTotal> ops = {
      op("linear_backward", 2.0, 1416e12, 0),       // 708 TFLOP/s
      op("linear_forward", 1.0, 300e12, 0),         // not a calibration row
      op("attention_forward", 1.0, 393.4e12, 0),    // 393
      op("attention_backward", 2.0, 590e12, 0),     // 295
      op("swiglu_forward", 1.0, 0, 1000e9),         // the memory rows together:
      op("rmsnorm_backward", 1.0, 0, 2000e9),       // 3,000 GB over 2 s, 1,500 GB/s
      op("adamw_step_multi", 0.0, 0, 2400e9),       // (no time: left out)
      op("fp8_quantize", 1.0, 0, 2190e9),
  };
  const std::string text = calibration_from_profile(ops, "h100-sxm", 8192, false);
  EXPECT_EQ(nlohmann::json::parse(text),
            nlohmann::json::parse(R"({"gpu": "h100-sxm", "matmul_bf16_tflops": 708, "attention_forward_tflops": 393,
                                      "attention_backward_tflops": 295, "attention_seq_len": 8192,
                                      "memory_gbps": 1500, "fp8_quantize_gbps": 2190})"))
      << text;
  const StepRates c = parse_calibration(text, "profiled.json", h100);
  EXPECT_DOUBLE_EQ(c.matmul_bf16, 708e12);
  EXPECT_DOUBLE_EQ(c.attention_backward_bf16, 295e12);
  EXPECT_EQ(c.attention_seq_len, 8192);
  EXPECT_DOUBLE_EQ(c.matmul_fp8, h100.matmul_fp8);  // no fp8_product row: the default stays
  // with FP8 linears linear_backward mixes FP8 products: no bf16 rate from it; a CPU's rates
  // keep three significant digits; no GPU name, no "gpu"
  const std::string fp8 = calibration_from_profile(
      {op("linear_backward", 1.0, 1000e12, 0), op("fp8_product", 3.0, 0.0123456e12, 0)}, "", 4096, true);
  EXPECT_EQ(nlohmann::json::parse(fp8), nlohmann::json::parse(R"({"matmul_fp8_tflops": 0.00412})")) << fp8;
  try {
    calibration_from_profile({op("embedding_forward", 1.0, 0, 1e9)}, "h100-sxm", 4096, false);
    ADD_FAILURE() << "a profile without the calibration's rows must be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("the profile holds none of the ops a calibration is made from"),
              std::string::npos)
        << e.what();
  }
}

// The printout names every part and where the rates come from.
TEST(StepModel, DescribesTheStep) {
  const PlanInput in = input_of("",
                                k8B + " --training.batch_size=2 --training.activation_checkpointing=full "
                                      "--parallel.offload=true",
                                4);
  const std::string s = describe_step_time(in, default_step_rates(gpu_spec("h200"), 128), MachineSpec{}, "--gpu");
  for (const char* said : {"time (model: each op family at its measured rate",
                           "h200, 4 GPUs, 8 per node (--gpu); default rates of the H200", "tokens/s per GPU, MFU ",
                           "matmul bf16", "at 712 TFLOP/s", "attention", "memory-bound", "of which recompute",
                           "communication", "offload ", "host AdamW", "at 100 GB/s per node", "PCIe copies"})
    EXPECT_NE(s.find(said), std::string::npos) << said << " in\n" << s;
}

}  // namespace
}  // namespace shardtrain::train
