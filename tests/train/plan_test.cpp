// The memory plan against peaks the engine reached on GPUs (the allocator's peak bytes,
// recorded in BENCHMARKS.md, 2026-11-23, commits 8eaba86 to 9e9c814: bf16 logits, 8192-token loss chunks;
// full recompute without the block's output product, selective and pointwise checkpointing,
// the MLP gradients written over gate and up), and the plan's bookkeeping on the CPU.
#include "train/plan.h"

#include <gtest/gtest.h>

#include "testing/model_shapes.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>

#include "model/hf_config.h"
#include "model/layout.h"
#include "testing/shared_data.h"
#include "train/config.h"

namespace shardtrain::train {
namespace {

using testing::llama_1b;
using testing::llama_8b;

struct Measured {
  const char* what;
  model::LlamaConfig model;
  int world;
  int64_t batch;
  model::ActivationCheckpointing ac;
  double peak_gib;  // measured by train_bench (allocator peak), seq 4096
  bool compute_shards = false;  // train_bench --compute-shards
};

TEST(Plan, MatchesThePeaksMeasuredOnGpus) {
  using enum model::ActivationCheckpointing;
  const Measured runs[] = {
      {"1B, H100, bs 4", llama_1b(), 1, 4, kNone, 39.9},   {"1B, H100, bs 8", llama_1b(), 1, 8, kNone, 58.7},
      // commit 9e9c814: gate's and up's gradients overwrite them in the backward (full, selective: -1 GiB)
      {"1B, H100, bs 8, full AC", llama_1b(), 1, 8, kFull, 23.9},
      {"1B, H100, bs 8, selective AC", llama_1b(), 1, 8, kSelective, 30.7},
      {"1B, H100, bs 4, pointwise AC", llama_1b(), 1, 4, kPointwise, 33.9},
      {"1B, H100, bs 8, pointwise AC", llama_1b(), 1, 8, kPointwise, 46.7},
      {"8B, 2 H200, bs 1", llama_8b(), 2, 1, kNone, 81.6}, {"8B, 2 H200, bs 2", llama_8b(), 2, 2, kNone, 99.7},
      {"8B, 2 H200, bs 3", llama_8b(), 2, 3, kNone, 116.9},
      // full AC's in-backward peak, re-measured after commit 9e9c814's in-place MLP gradients on the
      // one kind of machine lent then (the 2-H200 figure, 72.2 GiB at bs 4, predates them)
      {"8B, 1 H200, bs 2, full AC", llama_8b(), 1, 2, kFull, 125.5},
      {"8B, 1 H200, bs 4, full AC", llama_8b(), 1, 4, kFull, 127.8},
      // commit 558c319: the largest unchecked batch, and bf16 compute shards used in place
      {"1B, H100, bs 10", llama_1b(), 1, 10, kNone, 68.1},
      {"1B, H100, bs 4, shards", llama_1b(), 1, 4, kNone, 41.6, true},
      {"1B, H100, bs 8, shards", llama_1b(), 1, 8, kNone, 60.4, true},
      {"1B, H100, bs 10, shards", llama_1b(), 1, 10, kNone, 69.8, true},
      {"1B, H100, bs 4, pointwise, shards", llama_1b(), 1, 4, kPointwise, 35.6, true},
      {"1B, H100, bs 8, full AC, shards", llama_1b(), 1, 8, kFull, 26.0, true},
  };
  for (const Measured& m : runs) {
    PlanInput in;
    in.model = m.model;
    in.world_size = m.world;
    in.gpu = true;
    in.micro_batch = m.batch;
    in.seq_len = 4096;
    in.checkpointing = m.ac;
    in.compute_shards = m.compute_shards;
    const MemoryPlan p = plan_memory(in);
    const double gib = static_cast<double>(p.peak) / (1u << 30);
    // the plan sums the engine's large buffers; small ones (norm statistics, rope tables,
    // the allocator's rounding) are the few percent it may miss either way
    std::printf("%-34s planned %6.2f GiB, measured %6.2f GiB (%+.1f %%)\n", m.what, gib, m.peak_gib,
                100 * (gib - m.peak_gib) / m.peak_gib);
    EXPECT_NEAR(gib, m.peak_gib, 0.03 * m.peak_gib) << m.what << ": planned " << gib << " GiB";
  }
}

// FP8 products (2026-11-27, the 1B shape at batch 8 on an H100, FP8 tensorwise): the blocks'
// FP8 copies stay below the bf16 peak at the loss (60.43 GiB, as without FP8); the head's add
// its chunk's FP8 operands there (62.63 GiB measured).
TEST(Plan, Fp8HeadOperandsAreCountedAtTheLoss) {
  PlanInput in;
  in.model = llama_1b();
  in.gpu = true;
  in.micro_batch = 8;
  in.seq_len = 4096;
  in.compute_shards = true;  // what one GPU takes by default
  in.fp8 = true;
  const MemoryPlan blocks = plan_memory(in);
  in.fp8_head = true;
  const MemoryPlan head = plan_memory(in);
  const int64_t V = in.model.vocab_size, D = in.model.dim, chunk = head.loss_chunk_tokens;
  EXPECT_EQ(blocks.loss_chunk_fp8, 0);
  EXPECT_EQ(head.loss_chunk_fp8, chunk * (2 * V + D) + V * D);
  EXPECT_EQ(head.peak - blocks.peak, head.loss_chunk_fp8);  // the peak is at the loss
  for (auto [plan, measured] : {std::pair{blocks, 60.43}, std::pair{head, 62.63}}) {
    const double gib = static_cast<double>(plan.peak) / (1u << 30);
    EXPECT_NEAR(gib, measured, 0.03 * measured);
  }
  in.fp8 = false;  // the head's FP8 needs the blocks' recipe
  EXPECT_EQ(plan_memory(in).loss_chunk_fp8, 0);
}

// Heads of a width of their own (model.head_dim): the activations q, k, v, the attention
// output and their gradients are N·H and M·H wide, not D, and so are the FLOPs' attention term.
// Llama 3.1 8B's shape with heads of 160 instead of 128 (N·H = 5120 beside D = 4096).
TEST(Plan, ADecoupledHeadDimSizesTheAttentionsActivations) {
  PlanInput in;
  in.model = llama_8b();
  in.gpu = true;
  in.seq_len = 4096;
  const MemoryPlan coupled = plan_memory(in);
  in.model.head_dim_override = 160;
  ASSERT_TRUE(in.model.head_dim_decoupled());
  const MemoryPlan wide = plan_memory(in);
  const int64_t tokens = 4096, L = 32, N = 32, M = 8, dH = 160 - 128;
  // per token and block: q and the attention output (2 N·H), k and v (2 M·H), in bf16
  EXPECT_EQ(wide.activations_at_loss - coupled.activations_at_loss, tokens * L * 2 * (2 * N * dH + 2 * M * dH));
  EXPECT_EQ(wide.parameters - coupled.parameters, L * 4096 * (2 * N * dH + 2 * M * dH));
  EXPECT_DOUBLE_EQ(wide.flops_per_token - coupled.flops_per_token,
                   6.0 * static_cast<double>(wide.parameters - coupled.parameters) + 12.0 * L * N * dH * tokens);
  const std::string text = describe_plan(in, wide);
  EXPECT_NE(text.find("head dim 160, decoupled: attention width 32 x 160 = 5120"), std::string::npos) << text;
}

// Context parallelism (parallel.context_parallel = 4 of 8 ranks): a rank computes a quarter of
// each sequence, so its activations are those of a sequence of seq_len / 4 on the same mesh;
// the block backward adds the ring's two key/value blocks and three f32 gradients; the FLOPs
// per token stay the whole sequence's, the tokens per step count each token once, and the
// plan names the degree.
TEST(Plan, ContextParallelismPlansARanksShareOfEachSequence) {
  PlanInput in;
  in.model = llama_8b();
  in.gpu = true;
  in.world_size = 8;
  in.micro_batch = 1;
  in.seq_len = 4 * 4096;
  in.checkpointing = model::ActivationCheckpointing::kFull;
  in.context_parallel = 4;
  const MemoryPlan split = plan_memory(in);
  PlanInput quarter = in;
  quarter.context_parallel = 1;
  quarter.seq_len = 4096;
  const MemoryPlan local = plan_memory(quarter);
  const int64_t tokens = 4096, M = 8, H = 128;
  EXPECT_EQ(split.tokens_per_micro_batch, tokens);
  EXPECT_EQ(split.activations_at_loss, local.activations_at_loss);
  EXPECT_EQ(split.shard_elements, local.shard_elements) << "the units stay sharded over all 8 ranks";
  // two bf16 key/value blocks and three f32 gradients of one, each [2 (k, v), 2 (chunk), C, M, H]
  EXPECT_EQ(split.ring_buffers, 2 * tokens * M * H * (2 * 2 + 3 * 4));
  EXPECT_EQ(split.in_backward, local.in_backward + split.ring_buffers);
  EXPECT_EQ(local.ring_buffers, 0);
  EXPECT_DOUBLE_EQ(split.flops_per_token, in.model.flops_per_token(4 * 4096));
  const std::string text = describe_plan(in, split);
  EXPECT_NE(text.find("ranks: 8 = 2 data-parallel x 4 context-parallel"), std::string::npos) << text;
  EXPECT_NE(text.find("micro-batch per rank: 1 x 4096 tokens (each sequence's 16384 split over 4 ranks"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("of it the ring's kv blocks and gradients"), std::string::npos) << text;
  GpuSpec gpu;
  gpu.bf16_flops = 1e15;
  EXPECT_EQ(estimate_time(in, gpu, 0.5).tokens_per_step, 2 * 4 * 4096) << "2 data-parallel ranks' sequences";
  // the plan of a job reads the key
  JobConfig job = load_config("", {"--parallel.context_parallel=4", "--training.seq_len=128"}).config;
  EXPECT_EQ(plan_input(job, in.model, 8).context_parallel, 4);
}

// A sequence too long for one GPU: the 8B at 524,288 tokens fits no 80 GB GPU with any
// checkpointing or activation offload, and plan names the smallest context-parallel degree
// whose share of each sequence fits, with the offload it needs; no smaller degree fits with
// any policy or offload. On 8 ranks the degree divides them and the run keeps its 8. A job
// that more ranks alone make fit is offered no degree.
TEST(Plan, ContextParallelismSplitsASequenceTooLongForOneGpu) {
  PlanInput in;
  in.model = llama_8b();
  in.gpu = true;
  in.micro_batch = 1;
  in.seq_len = 524288;
  const int64_t gpu = static_cast<int64_t>(79.18 * (1 << 30));  // an H100 80GB as CUDA reports it
  const auto fits = [&](const MemoryPlan& p) { return p.peak + checkpointing_reserve(p.peak) <= gpu; };
  // the most one rank can drop: full checkpointing and every block but the last two offloaded
  const auto lightest = [](PlanInput t) {
    t.checkpointing = model::ActivationCheckpointing::kFull;
    return plan_memory(with_offloaded_blocks(t, t.model.n_layers - 2));
  };
  ASSERT_FALSE(fits(lightest(in)));
  for (const int world : {1, 8}) {
    SCOPED_TRACE("world " + std::to_string(world));
    in.world_size = world;
    const ContextParallelChoice c = choose_context_parallel(in, gpu, true);
    ASSERT_GE(c.degree, 2);
    EXPECT_EQ(c.input.context_parallel, c.degree);
    EXPECT_EQ(c.input.world_size, world == 1 ? c.degree : 8);
    EXPECT_EQ(c.plan.tokens_per_micro_batch, 524288 / c.degree);
    EXPECT_TRUE(fits(c.plan));
    EXPECT_EQ(plan_memory(c.input).peak, c.plan.peak) << "the plan of the input named";
    for (int d = 2; d < c.degree; d *= 2) {
      PlanInput smaller = in;
      smaller.context_parallel = d;
      smaller.world_size = std::max(world, d);
      EXPECT_FALSE(fits(lightest(smaller))) << "degree " << d << " fits too";
    }
    const std::string line = describe_context_parallel(in, c, true);
    std::printf("8B x 524,288 on %d rank(s) of 80 GB: %s\n", world, line.c_str());
    EXPECT_NE(line.find("fits with parallel.context_parallel = " + std::to_string(c.degree)), std::string::npos)
        << line;
    EXPECT_NE(line.find("training.activation_checkpointing = \"" +
                        std::string(model::checkpointing_name(c.input.checkpointing)) + "\""),
              std::string::npos)
        << line;
    EXPECT_EQ(line.find(" ranks") == std::string::npos, world == 8) << line;
    if (c.input.offload_activations) {
      EXPECT_NE(line.find("training.offload_activations = true (" + std::to_string(c.input.offload_activation_blocks) +
                          " of 32 blocks)"),
                std::string::npos)
          << line;
    }
  }
  // the job as given keeps its checkpointing when it is not "auto", and a job that cannot
  // split its sequences is offered none
  in.world_size = 1;
  in.checkpointing = model::ActivationCheckpointing::kSelective;
  const ContextParallelChoice selective = choose_context_parallel(in, gpu, false);
  ASSERT_GE(selective.degree, 2);
  EXPECT_EQ(selective.input.checkpointing, model::ActivationCheckpointing::kSelective);
  EXPECT_EQ(describe_context_parallel(in, selective, false).find("activation_checkpointing"), std::string::npos);
  // the 8B at 4096 tokens on one rank: its weights and AdamW state are what does not fit, and
  // more data-parallel ranks shard them as well as a split sequence would
  PlanInput short_sequence = in;
  short_sequence.seq_len = 4096;
  short_sequence.checkpointing = model::ActivationCheckpointing::kFull;
  ASSERT_FALSE(fits(plan_memory(short_sequence)));
  EXPECT_EQ(choose_context_parallel(short_sequence, gpu, true).degree, 0);
  PlanInput windowed = in;
  windowed.model.sliding_window = 4096;
  EXPECT_EQ(choose_context_parallel(windowed, gpu, true).degree, 0);
  PlanInput cpu = in;
  cpu.gpu = false;
  EXPECT_EQ(choose_context_parallel(cpu, gpu, true).degree, 0);
}

// Sliding-window layers: their attention FLOPs count T keys per token times the share of the
// causal (query, key) pairs inside the window (sum over i of min(i + 1, W) of T (T + 1) / 2);
// the plan says so, and the step time follows.
// Llama 3.1 8B's shape at T = 4096 with a window of 1024 on 24 of its 32 layers.
TEST(Plan, SlidingLayersCountTheKeysInsideTheirWindow) {
  PlanInput in;
  in.model = llama_8b();
  in.gpu = true;
  in.seq_len = 4096;
  const MemoryPlan full = plan_memory(in);
  in.model.sliding_window = 1024;
  in.model.sliding_layers.assign(32, true);
  for (int64_t l = 3; l < 32; l += 4) in.model.sliding_layers[static_cast<size_t>(l)] = false;  // 8 full layers
  const MemoryPlan sliding = plan_memory(in);
  const double T = 4096, W = 1024, pairs = W * (W + 1) / 2 + (T - W) * W;  // 3,670,528 of 16,777,216
  const double saved = 12.0 * 32 * 128 * 24 * (T - 2 * pairs / (T + 1));  // the difference of two 5e10 figures
  EXPECT_NEAR(full.flops_per_token - sliding.flops_per_token, saved, 1e-12 * full.flops_per_token);
  EXPECT_EQ(sliding.peak, full.peak) << "the memory is the same: the attention never forms T x T scores";
  const std::string text = describe_plan(in, sliding);
  EXPECT_NE(text.find("on the 24 sliding layers T is 1791.8: T times the share of the causal (query, key) pairs "
                      "inside their window of 1024"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("sliding window 1024 on 24 of 32 layers"), std::string::npos) << text;
  // model.sliding_window and model.full_attention_every on a preset's shape reach the plan
  JobConfig job;
  job.model.preset = "llama3.1-8b";
  job.model.sliding_window = 1024;
  job.model.full_attention_every = 4;
  const model::LlamaConfig planned = planned_model(job).config;
  EXPECT_EQ(planned.sliding_layer_count(), 24);
  EXPECT_DOUBLE_EQ(planned.flops_per_token(4096), in.model.flops_per_token(4096));
  EXPECT_LT(estimate_time(in, gpu_spec("h100-sxm"), 0.4).step_seconds,
            [&] {
              PlanInput f = in;
              f.model.sliding_window = 0;
              f.model.sliding_layers.clear();
              return estimate_time(f, gpu_spec("h100-sxm"), 0.4).step_seconds;
            }());
}

// The set-up the model-family tests compare with and without a feature: the 8B shape on 2
// CPU ranks (f32 activations), 2 sequences of 1,024 tokens each, checkpointed by `ac`, one of
// kEveryPolicy.
constexpr model::ActivationCheckpointing kEveryPolicy[] = {
    model::ActivationCheckpointing::kNone, model::ActivationCheckpointing::kPointwise,
    model::ActivationCheckpointing::kSelective, model::ActivationCheckpointing::kFull};

PlanInput cpu_8b_two_ranks(model::ActivationCheckpointing ac) {
  PlanInput in;
  in.model = llama_8b();
  in.gpu = false;
  in.world_size = 2;
  in.micro_batch = 2;
  in.seq_len = 1024;
  in.checkpointing = ac;
  return in;
}

// QK-norm (model.qk_norm): two [H] weights per block in the parameters and the sharded state,
// and per token and block q and k before their norm ([N·H] and [M·H] of a rank's heads, in
// the compute dtype) with their norm's f32 1/rms per head row, kept by every checkpointing
// policy but full recompute, which recomputes them inside the block's backward.
TEST(Plan, QkNormCountsItsWeightsAndTheActivationsItsBackwardReads) {
  using model::ActivationCheckpointing;
  for (const int tp : {1, 2}) {
    for (const model::ActivationCheckpointing ac : kEveryPolicy) {
      SCOPED_TRACE(std::string(model::checkpointing_name(ac)) + ", tensor parallel " + std::to_string(tp));
      PlanInput in = cpu_8b_two_ranks(ac);  // f32 activations, as QK-norm runs on the CPU
      in.tensor_parallel = tp;
      const MemoryPlan plain = plan_memory(in);
      in.model.qk_norm = true;
      const MemoryPlan qk = plan_memory(in);
      const int64_t L = 32, H = 128, N = 32 / tp, M = 8 / tp, tokens = 2 * 1024;
      EXPECT_EQ(qk.parameters - plain.parameters, L * 2 * H);
      // two ranks: data parallel shards (tp 1) or a tensor-parallel pair each holding them whole
      const int64_t shard = tp == 1 ? L * 2 * H / 2 : L * 2 * H;
      EXPECT_EQ(qk.shard_elements - plain.shard_elements, shard);
      EXPECT_EQ(qk.master - plain.master, 4 * shard);
      EXPECT_EQ(qk.optimizer - plain.optimizer, 8 * shard);
      EXPECT_EQ(qk.grad_shards - plain.grad_shards, 4 * shard);
      const int64_t per_token = 4 * (N * H + M * H) + 4 * (N + M);
      const int64_t kept = ac == ActivationCheckpointing::kFull ? 0 : tokens * L * per_token;
      EXPECT_EQ(qk.activations_at_loss - plain.activations_at_loss, kept);
      if (ac == ActivationCheckpointing::kFull) {
        // the one recomputed block holds them at its attention backward, beside its own
        // gathered weights and gradient (2 H more elements each)
        const int64_t block_numel = 2 * H;
        EXPECT_EQ(qk.in_attention_backward - plain.in_attention_backward,
                  tokens * per_token + (qk.block_grads - plain.block_grads) +
                      4 * 2 * block_numel);  // two blocks gathered (the one in its backward, the next)
      }
    }
  }
}

// OLMo 2 (model.post_norms, model.qk_norm_whole): q_norm [N·H] and k_norm [M·H] per block in
// the parameters, state and FLOPs; q and k before their norm with one f32 1/rms each per token
// kept by every policy but full recompute; and the attention's and MLP's outputs before their
// norms kept by pointwise and selective checkpointing (without checkpointing they take the
// place of the norms' outputs, which are x and x2 themselves).
TEST(Plan, Olmo2CountsItsNormsAndWhatItsBackwardReads) {
  using model::ActivationCheckpointing;
  for (const model::ActivationCheckpointing ac : kEveryPolicy) {
    SCOPED_TRACE(model::checkpointing_name(ac));
    PlanInput in = cpu_8b_two_ranks(ac);
    const MemoryPlan plain = plan_memory(in);
    in.model.qk_norm_whole = in.model.post_norms = true;
    const MemoryPlan olmo = plan_memory(in);
    const int64_t L = 32, D = 4096, Q = 32 * 128, K = 8 * 128, tokens = 2 * 1024;
    EXPECT_EQ(olmo.parameters - plain.parameters, L * (Q + K));
    EXPECT_EQ(olmo.shard_elements - plain.shard_elements, L * (Q + K) / 2);
    EXPECT_DOUBLE_EQ(olmo.flops_per_token - plain.flops_per_token, 6.0 * L * (Q + K));
    const int64_t qk = ac == ActivationCheckpointing::kFull ? 0 : 4 * (Q + K) + 4 * 2;
    const int64_t post =
        ac == ActivationCheckpointing::kPointwise || ac == ActivationCheckpointing::kSelective ? 4 * 2 * D : 0;
    EXPECT_EQ(olmo.activations_at_loss - plain.activations_at_loss, tokens * L * (qk + post));
  }
}

// Gemma 3 (model.sandwich_norms): two more norms of D per block in the parameters, and the
// attention's and the MLP's outputs before their norms with those norms' f32 1/rms kept per
// token by every policy but full recompute.
TEST(Plan, Gemma3CountsItsSandwichNorms) {
  using model::ActivationCheckpointing;
  for (const model::ActivationCheckpointing ac : kEveryPolicy) {
    SCOPED_TRACE(model::checkpointing_name(ac));
    PlanInput in = cpu_8b_two_ranks(ac);
    const MemoryPlan plain = plan_memory(in);
    in.model.sandwich_norms = true;
    const MemoryPlan gemma = plan_memory(in);
    const int64_t L = 32, D = 4096, tokens = 2 * 1024;
    EXPECT_EQ(gemma.parameters - plain.parameters, L * 2 * D);
    const int64_t kept = ac == ActivationCheckpointing::kFull ? 0 : 4 * 2 * D + 8;
    EXPECT_EQ(gemma.activations_at_loss - plain.activations_at_loss, tokens * L * kept);
  }
}

TEST(Plan, ShardedStateScalesWithRanks) {
  PlanInput in;
  in.model = llama_8b();
  in.gpu = true;
  in.world_size = 1;
  const MemoryPlan one = plan_memory(in);
  in.world_size = 8;
  const MemoryPlan eight = plan_memory(in);
  // 16 bytes per parameter (f32 master, m, v, gradient), split over the ranks; padding only
  // rounds each unit up to 128 x ranks elements
  EXPECT_NEAR(static_cast<double>(one.master + one.optimizer + one.grad_shards), 16.0 * one.parameters,
              16.0 * 128 * 35);
  EXPECT_NEAR(static_cast<double>(eight.master) * 8, static_cast<double>(one.master), 4.0 * 128 * 8 * 35);
  EXPECT_GT(eight.unit_grads_at_loss, 0);  // the head's full gradient waits for its reduce-scatter
  EXPECT_EQ(one.unit_grads_at_loss, 0);    // one rank accumulates straight into its shard
}

TEST(Plan, CheckpointingAndReshardingMoveMemoryTheRightWay) {
  PlanInput in;
  in.model = llama_1b();
  in.micro_batch = 8;
  const MemoryPlan none = plan_memory(in);
  in.checkpointing = model::ActivationCheckpointing::kFull;
  const MemoryPlan full = plan_memory(in);
  EXPECT_LT(full.activations_at_loss * 10, none.activations_at_loss);
  in.checkpointing = model::ActivationCheckpointing::kSelective;
  const MemoryPlan selective = plan_memory(in);
  // selective keeps the inputs and the attention halves: 18.6 of 75.9 KB per token and block
  // at this shape, 25 % of none's activations with the final norm's
  EXPECT_NEAR(static_cast<double>(selective.activations_at_loss) / static_cast<double>(none.activations_at_loss),
              0.25, 0.01);
  EXPECT_LT(selective.peak, none.peak);
  EXPECT_GT(selective.peak, full.peak);
  in.checkpointing = model::ActivationCheckpointing::kPointwise;
  const MemoryPlan pointwise = plan_memory(in);
  // pointwise drops both norm outputs, their statistics and h: 24.6 of 75.9 KB per token and block
  EXPECT_NEAR(static_cast<double>(pointwise.activations_at_loss) / static_cast<double>(none.activations_at_loss),
              0.68, 0.01);
  EXPECT_LT(pointwise.peak, none.peak);
  EXPECT_GT(pointwise.peak, selective.peak);
  in.checkpointing = model::ActivationCheckpointing::kNone;
  in.reshard_after_forward = false;
  const MemoryPlan kept = plan_memory(in);
  // without resharding every block's bf16 copy waits for its backward, not just two of them
  const int64_t block_numel = model::ModelLayout::llama(in.model, 1).units()[1].numel;
  EXPECT_EQ(kept.gathered_at_loss - none.gathered_at_loss, 2 * block_numel * (in.model.n_layers - 2));
  EXPECT_EQ(auto_loss_chunk_tokens(true, 128256), 8192);  // 8192 x 128256 bf16 logits: 1.96 GiB
  EXPECT_EQ(auto_loss_chunk_tokens(false, 128256), 256);
}

// Tensor parallelism: 8 ranks as 4 x 2 hold the same sharded state as 8 data-parallel ranks
// (a block's part sharded over 4, the embedding and head over 8), a block's gathered copy is
// half as large, and a rank's activations for the same micro-batch are well under its
// data-parallel twin's: the heads, FFN columns and residual rows split over the group.
TEST(Plan, TensorParallelismSplitsBlocksAndActivations) {
  PlanInput in;
  in.model = llama_8b();
  in.world_size = 8;
  in.micro_batch = 2;
  in.seq_len = 8192;
  const MemoryPlan dp = plan_memory(in);
  in.tensor_parallel = 2;
  const MemoryPlan tp = plan_memory(in);
  EXPECT_NEAR(static_cast<double>(tp.master), static_cast<double>(dp.master), 4.0 * 128 * 8 * 35);
  EXPECT_NEAR(static_cast<double>(tp.gathered_at_loss - dp.gathered_at_loss),
              -2.0 * 2 * static_cast<double>(model::ModelLayout::llama(in.model, 1).units()[1].numel) / 2, 2.0 * 1e6);
  // per token and block: bf16 2·D of gathered norm outputs, and half of the rest
  EXPECT_LT(static_cast<double>(tp.activations_at_loss), 0.6 * static_cast<double>(dp.activations_at_loss));
  EXPECT_GT(static_cast<double>(tp.activations_at_loss), 0.5 * static_cast<double>(dp.activations_at_loss));
  in.tensor_parallel = 3;
  EXPECT_THROW((void)plan_memory(in), Error);  // 3 does not divide 8 ranks
}

// Replicas (HSDP): 16 ranks in 2 replicas hold what 8 ranks without replicas hold; 8 replicas
// of one GPU each (DDP) hold the whole model and, with compute shards, gather nothing.
TEST(Plan, ReplicasShardOverTheirOwnRanks) {
  PlanInput in;
  in.model = llama_8b();
  in.micro_batch = 1;
  in.seq_len = 8192;
  in.world_size = 8;
  const MemoryPlan eight = plan_memory(in);
  in.world_size = 16;
  in.replicate = 2;
  const MemoryPlan replicas = plan_memory(in);
  EXPECT_EQ(replicas.shard_elements, eight.shard_elements);
  EXPECT_EQ(replicas.peak, eight.peak);
  in.world_size = 8;
  in.replicate = 8;
  in.compute_shards = true;
  const MemoryPlan ddp = plan_memory(in);
  EXPECT_GE(ddp.shard_elements, in.model.num_parameters());
  EXPECT_EQ(ddp.gathered_at_loss, 0);
  EXPECT_GT(ddp.peak, eight.peak);
  in.replicate = 3;
  EXPECT_THROW((void)plan_memory(in), Error);  // 3 does not divide 8 ranks
}

// "auto" checkpointing takes the lightest policy whose plan fits, with the reserve beside it.
TEST(Plan, AutoCheckpointingTakesTheLightestPolicyThatFits) {
  using enum model::ActivationCheckpointing;
  PlanInput in;
  in.model = llama_1b();
  in.micro_batch = 8;
  in.seq_len = 4096;
  auto needs = [&](model::ActivationCheckpointing ac) {
    PlanInput p = in;
    p.checkpointing = ac;
    const int64_t peak = plan_memory(p).peak;
    return peak + checkpointing_reserve(peak);
  };
  // an H100's 79.2 GiB holds bs 8 without checkpointing (58.7 GiB measured)
  EXPECT_EQ(choose_checkpointing(in, static_cast<int64_t>(79.2 * (1 << 30))).checkpointing, kNone);
  const model::ActivationCheckpointing order[] = {kNone, kPointwise, kSelective, kFull};
  for (size_t i = 0; i < 4; ++i) {
    const CheckpointingChoice at = choose_checkpointing(in, needs(order[i]));
    EXPECT_EQ(at.checkpointing, order[i]) << model::checkpointing_name(order[i]);
    EXPECT_TRUE(at.fits);
    if (i + 1 < 4) {
      EXPECT_EQ(choose_checkpointing(in, needs(order[i]) - 1).checkpointing, order[i + 1]);
    }
  }
  const CheckpointingChoice none_fits = choose_checkpointing(in, needs(kFull) - 1);
  EXPECT_EQ(none_fits.checkpointing, kFull);
  EXPECT_FALSE(none_fits.fits);
  EXPECT_EQ(checkpointing_reserve(int64_t{100} << 30), (int64_t{5} << 30));  // 2 GiB + 3 %
}

// Compute shards cost 2 bytes per shard element; on one GPU they replace the gathered copies,
// and "auto" keeps them exactly when the plan with them still fits beside the reserve.
TEST(Plan, ComputeShardsReplaceGatheredCopiesOnOneGpuAndAutoKeepsThemWhenTheyFit) {
  PlanInput in;
  in.model = llama_1b();
  in.micro_batch = 8;
  in.seq_len = 4096;
  const MemoryPlan off = plan_memory(in);
  in.compute_shards = true;
  const MemoryPlan on = plan_memory(in);
  EXPECT_EQ(on.compute_shards, 2 * on.shard_elements);
  EXPECT_EQ(on.gathered_at_loss, 0);
  EXPECT_GT(off.gathered_at_loss, 0);
  EXPECT_EQ(on.peak - off.peak, on.compute_shards - off.gathered_at_loss);
  const int64_t needs = on.peak + checkpointing_reserve(on.peak);
  EXPECT_TRUE(choose_compute_shards(in, needs));
  EXPECT_FALSE(choose_compute_shards(in, needs - 1));
  in.gpu = false;  // the CPU computes in the master dtype: nothing to copy
  EXPECT_FALSE(choose_compute_shards(in, needs * 100));
  EXPECT_EQ(plan_memory(in).compute_shards, 0);
  // several ranks still gather, from the copies: the gathered buffers stay in the plan; auto
  // leaves them off there (asked for with "on")
  in.gpu = true;
  in.world_size = 2;
  EXPECT_GT(plan_memory(in).gathered_at_loss, 0);
  EXPECT_FALSE(choose_compute_shards(in, needs * 100));
}


// parallel.offload: the sharded state (masters, AdamW, gradient shards, bf16 copies) moves to
// the host and leaves the GPU's peak; the GPU then gathers every unit and holds full
// gradients until they go down, as several ranks do.
TEST(Plan, OffloadMovesTheShardsToTheHost) {
  PlanInput in;
  in.model = llama_1b();
  in.micro_batch = 8;
  in.seq_len = 4096;
  in.compute_shards = true;
  const MemoryPlan resident = plan_memory(in);
  in.offload = true;
  const MemoryPlan off = plan_memory(in);
  EXPECT_EQ(resident.host, 0);
  EXPECT_EQ(off.host, (4 + 8 + 4 + 2) * off.shard_elements);
  EXPECT_GT(off.gathered_at_loss, 0);
  EXPECT_GT(off.unit_grads_at_loss, 0);
  const int64_t state = resident.master + resident.optimizer + resident.grad_shards + resident.compute_shards;
  EXPECT_GE(off.peak, resident.peak - state) << "the activations stay";
  EXPECT_LT(off.peak, resident.peak - state / 2) << "the shards leave (less the gathered units and gradients)";
  EXPECT_NE(describe_plan(in, off).find("host memory"), std::string::npos);
  EXPECT_TRUE(choose_compute_shards(in, 1)) << "offloaded, the copies are always kept (on the host)";
  in.compute_shards = false;
  EXPECT_EQ(plan_memory(in).compute_shards, off.compute_shards) << "offload keeps them without being asked";
}

// Checkpoint saves copy the master and AdamW shards into host memory kept for the run, except
// synchronous saves of shards already in host memory, which are written as they are.
TEST(Plan, CheckpointCopiesAreCountedInHostMemory) {
  PlanInput in;
  in.model = llama_1b();
  in.micro_batch = 8;
  in.seq_len = 4096;
  EXPECT_EQ(plan_memory(in).host_checkpoint, 0) << "no checkpoints";
  in.checkpoints = true;
  const MemoryPlan gpu = plan_memory(in);
  EXPECT_EQ(gpu.host_checkpoint, gpu.master + gpu.optimizer);
  PlanInput without = in;
  without.checkpoints = false;
  EXPECT_EQ(gpu.peak, plan_memory(without).peak) << "the GPU peak is unchanged";
  EXPECT_NE(describe_plan(in, gpu).find("checkpoint copies (master, AdamW)"), std::string::npos);
  in.offload = true;
  EXPECT_EQ(plan_memory(in).host_checkpoint, 0) << "synchronous saves write the offloaded shards in place";
  in.async_checkpoints = true;
  const MemoryPlan async_off = plan_memory(in);
  EXPECT_EQ(async_off.host_checkpoint, async_off.master + async_off.optimizer);
  const std::string problem = host_memory_problem(in, async_off, async_off.host + async_off.host_checkpoint / 2);
  EXPECT_NE(problem.find("for the copies checkpoints are written from (checkpoint.async = false"), std::string::npos)
      << problem;
}

// parallel.offload_gradients = false: the host keeps master weights and AdamW state (and two
// gradient buffers of the largest unit, the 8B's embedding), the GPU the f32 gradient shards;
// no bf16 copies on the host unless asked for.
TEST(Plan, OffloadWithTheGradientsOnTheGpu) {
  PlanInput in;
  in.model = llama_8b();
  in.micro_batch = 1;
  in.seq_len = 131072;
  in.checkpointing = model::ActivationCheckpointing::kFull;
  in.offload = true;
  const MemoryPlan full = plan_memory(in);
  in.offload_grads = false;
  const MemoryPlan kept = plan_memory(in);
  int64_t embed = 0;  // the largest unit's shard on one rank: the embedding (padded)
  const model::ModelLayout layout = model::ModelLayout::llama(in.model, 1);
  for (const model::UnitLayout& u : layout.units()) embed = std::max(embed, u.shard_numel());
  EXPECT_GE(embed, int64_t{128256} * 4096);
  EXPECT_EQ(kept.host_grad_staging, 2 * 4 * embed);
  EXPECT_EQ(kept.host, (4 + 8) * kept.shard_elements + 2 * 4 * embed);
  EXPECT_EQ(kept.compute_shards, 0);
  EXPECT_TRUE(kept.grad_shards_on_gpu);
  EXPECT_EQ(full.host, (4 + 8 + 4 + 2) * full.shard_elements);
  EXPECT_LT(kept.host, full.host * 7 / 10);
  // one rank: the backward writes the shards (no full f32 unit gradients besides them)
  EXPECT_EQ(kept.unit_grads_at_loss, 0);
  EXPECT_EQ(kept.peak - kept.grad_shards, std::max(kept.gathered_at_loss + kept.activations_at_loss + kept.loss_chunk,
                                                    kept.in_backward));
  EXPECT_NE(describe_plan(in, kept).find("kept on the GPU"), std::string::npos);
  EXPECT_FALSE(choose_compute_shards(in, int64_t{1} << 40)) << "not kept on the host unless asked for";
  in.compute_shards = true;
  EXPECT_TRUE(choose_compute_shards(in, 1));
  EXPECT_EQ(plan_memory(in).compute_shards, 2 * kept.shard_elements);
}

// parallel.reductions_in_flight: each block gradient still reducing beside the backward holds a
// whole block's f32 gradient on the GPU; the CPU reduces each at once. The 405B's width at 64
// ranks, where a block's gradient is 12 GiB.
TEST(Plan, EachReductionInFlightHoldsOneBlockGradient) {
  PlanInput in;
  in.model = testing::llama31_405b();
  in.world_size = 64;
  in.micro_batch = 1;
  in.seq_len = 4096;
  in.checkpointing = model::ActivationCheckpointing::kFull;
  in.offload = true;
  const model::ModelLayout layout = model::ModelLayout::llama(in.model, in.world_size);
  int64_t block = 0;
  for (const model::UnitLayout& u : layout.units())
    if (u.name.rfind("layers.", 0) == 0) block = std::max(block, u.numel);
  ASSERT_GT(block, int64_t{3000000000});  // 3.19e9 parameters a block
  std::vector<MemoryPlan> plans;
  for (int n : {0, 1, 2, 3}) {
    in.reductions_in_flight = n;
    plans.push_back(plan_memory(in));
  }
  for (int n = 0; n <= 3; ++n) EXPECT_EQ(plans[n].block_grads, (1 + n) * 4 * block) << n;
  in.reductions_in_flight = 1;
  EXPECT_NE(describe_plan(in, plans[1]).find("of it f32 block gradients, 1 + 1 reducing"), std::string::npos)
      << describe_plan(in, plans[1]);
  for (int n = 1; n <= 3; ++n) {
    EXPECT_EQ(plans[n].in_backward - plans[n - 1].in_backward, 4 * block) << n;
    EXPECT_EQ(plans[n].peak - plans[n - 1].peak, 4 * block) << n << ": the block backward is the peak";
  }
  // a plan that does not fit names the knob with what it saves, where the block backward is the peak
  in.reductions_in_flight = 2;
  const std::string advice = gpu_memory_advice(in);
  EXPECT_NE(advice.find("parallel.reductions_in_flight = 0, the backward then waiting for each block's reduce-scatter (" +
                        format_bytes(plans[2].peak - plans[0].peak) + " less)"),
            std::string::npos)
      << advice;
  EXPECT_EQ(advice.find("activation_checkpointing"), std::string::npos) << "full already: " << advice;
  EXPECT_EQ(advice.find("parallel.offload = true"), std::string::npos) << "offloaded already: " << advice;
  EXPECT_NE(advice.find("training.offload_activations = true ("), std::string::npos) << advice;
  in.reductions_in_flight = 0;
  EXPECT_EQ(gpu_memory_advice(in).find("reductions_in_flight"), std::string::npos) << "already 0";
  PlanInput one_gpu = in;  // one GPU, resident: the backward writes the shards, nothing reduces
  one_gpu.world_size = 1;
  one_gpu.offload = false;
  one_gpu.model = llama_1b();
  one_gpu.reductions_in_flight = 2;
  EXPECT_EQ(gpu_memory_advice(one_gpu).find("reductions_in_flight"), std::string::npos);
  one_gpu.checkpointing = model::ActivationCheckpointing::kNone;  // each key that helps, with its saving
  const MemoryPlan none = plan_memory(one_gpu);
  PlanInput full_ac = one_gpu;
  full_ac.checkpointing = model::ActivationCheckpointing::kFull;
  const std::string one_gpu_advice = gpu_memory_advice(one_gpu);
  EXPECT_NE(one_gpu_advice.find("training.activation_checkpointing = \"full\" (" +
                                format_bytes(none.peak - plan_memory(full_ac).peak) + " less)"),
            std::string::npos)
      << one_gpu_advice;
  EXPECT_NE(one_gpu_advice.find("parallel.offload = true ("), std::string::npos) << one_gpu_advice;
  in.gpu = false;  // the CPU's reductions are synchronous: the knob changes nothing
  in.offload = false;
  in.reductions_in_flight = 0;
  const MemoryPlan cpu0 = plan_memory(in);
  in.reductions_in_flight = 3;
  EXPECT_EQ(plan_memory(in).peak, cpu0.peak);
}

// The trainer refuses a plan whose host memory exceeds the machine's, naming what takes it and
// the keys that lower it: the 8B on one GPU against a 125 GiB host.
TEST(Plan, HostMemoryProblemNamesTheKeysThatHelp) {
  const int64_t host = int64_t{125} << 30;
  PlanInput in;
  in.model = llama_8b();
  in.micro_batch = 1;
  in.seq_len = 131072;
  in.checkpointing = model::ActivationCheckpointing::kFull;
  in.offload = true;  // 18 bytes per parameter: 134.6 GiB
  const std::string full = host_memory_problem(in, plan_memory(in), host);
  EXPECT_NE(full.find("134.6"), std::string::npos) << full;
  EXPECT_NE(full.find("parallel.offload_gradients = false"), std::string::npos) << full;
  EXPECT_NE(full.find("93.66 GiB"), std::string::npos) << full;  // what the host then needs
  std::printf("%s\n", full.c_str());
  EXPECT_EQ(host_memory_problem(in, plan_memory(in), 0), "") << "an unknown host size says nothing";
  in.offload_grads = false;
  EXPECT_EQ(host_memory_problem(in, plan_memory(in), host), "");
  in.offload_activations = true;  // all but the last two blocks: 30 GiB more
  const std::string acts = host_memory_problem(in, plan_memory(in), host);
  EXPECT_NE(acts.find("training.offload_activations_blocks"), std::string::npos) << acts;
  EXPECT_EQ(acts.find("offload_gradients"), std::string::npos) << acts;
  std::printf("%s\n", acts.c_str());
  in.offload_activation_blocks = 12;  // the ready job's
  EXPECT_EQ(host_memory_problem(in, plan_memory(in), host), "");
}

// training.offload_activations_blocks = 0 (auto): the fewest blocks whose offload fits the
// GPU, none where everything fits, every block but the last two where nothing does.
TEST(Plan, AutoOffloadBlocksTakeTheFewestThatFit) {
  PlanInput in;
  in.model = llama_8b();  // 32 blocks, 1 GiB of checkpointed input each at this length
  in.micro_batch = 1;
  in.seq_len = 131072;
  in.checkpointing = model::ActivationCheckpointing::kFull;
  in.offload = true;
  in.offload_grads = false;
  in.offload_activations = true;
  const int64_t gpu = static_cast<int64_t>(79.18 * (1 << 30));  // an H100 80GB as CUDA reports it
  const OffloadBlocksChoice c = choose_offload_blocks(in, gpu);
  ASSERT_TRUE(c.fits);
  ASSERT_GT(c.blocks, 0);
  ASSERT_LT(c.blocks, 30);
  auto fits = [&](int64_t blocks) {
    const MemoryPlan p = plan_memory(with_offloaded_blocks(in, blocks));
    return p.peak + checkpointing_reserve(p.peak) <= gpu;
  };
  EXPECT_TRUE(fits(c.blocks));
  EXPECT_FALSE(fits(c.blocks - 1)) << "one block fewer would fit too";
  EXPECT_EQ(c.plan.offloaded_blocks, c.blocks);
  EXPECT_EQ(c.plan.host_activations, c.blocks * (int64_t{1} << 30));
  std::printf("8B x 131,072 on an 80 GB H100: %lld blocks, peak %.2f GiB\n", static_cast<long long>(c.blocks),
              static_cast<double>(c.plan.peak) / (1u << 30));
  // measured on the H100 (commit d6a5e3b, allocator peaks): the trainer's auto choice, 2 blocks,
  // 74.89 GiB; train_bench with 12 blocks offloaded, 64.89 GiB
  auto gib = [](int64_t bytes) { return static_cast<double>(bytes) / (1u << 30); };
  EXPECT_EQ(c.blocks, 2);
  EXPECT_NEAR(gib(c.plan.peak), 74.89, 0.03 * 74.89);
  EXPECT_NEAR(gib(plan_memory(with_offloaded_blocks(in, 12)).peak), 64.89, 0.03 * 64.89);
  // a GPU that holds everything: nothing offloaded, and the plan says the offload is off
  const OffloadBlocksChoice big = choose_offload_blocks(in, int64_t{141} << 30);
  EXPECT_TRUE(big.fits);
  EXPECT_EQ(big.blocks, 0);
  EXPECT_EQ(big.plan.host_activations, 0);
  EXPECT_FALSE(with_offloaded_blocks(in, 0).offload_activations);
  // one too small for any count: every block but the last two, said not to fit
  const OffloadBlocksChoice small = choose_offload_blocks(in, int64_t{24} << 30);
  EXPECT_FALSE(small.fits);
  EXPECT_EQ(small.blocks, 30);
  const std::string text = describe_auto_offload_blocks(in);
  EXPECT_NE(text.find("an 80 GB H100 (79.18 GiB): " + std::to_string(c.blocks) + " of 32 blocks"), std::string::npos)
      << text;
  EXPECT_NE(text.find("a 141 GiB GPU: none"), std::string::npos) << text;
  EXPECT_NE(text.find("a  24 GiB GPU: does not fit"), std::string::npos) << text;
}

// A chunked MLP (training.mlp_chunk_tokens) under full checkpointing: the block backward holds
// one piece's gate, up, h and dh instead of every token's. The automatic piece keeps those
// within 2 GiB in bf16 and leaves micro-batches that fit whole.
TEST(Plan, ChunkedMlpBoundsTheBlockBackward) {
  EXPECT_EQ(auto_mlp_chunk_tokens(true, 14336, 131072), 16384);  // 8 pieces
  EXPECT_EQ(auto_mlp_chunk_tokens(true, 14336, 16384), 0);
  EXPECT_EQ(auto_mlp_chunk_tokens(true, 8192, 32768), 0);       // the 1B benchmark: unchanged
  EXPECT_EQ(auto_mlp_chunk_tokens(true, 8192, 65536), 32768);
  EXPECT_EQ(auto_mlp_chunk_tokens(false, 14336, 131072), 0);    // the CPU: at once
  const int64_t rounded = auto_mlp_chunk_tokens(true, 14336, 100000);
  EXPECT_EQ(rounded % 128, 0);
  EXPECT_LE(rounded * 4 * 14336 * 2, int64_t{2} << 30);
  PlanInput in;
  in.model = llama_8b();
  in.micro_batch = 1;
  in.seq_len = 131072;
  in.checkpointing = model::ActivationCheckpointing::kFull;
  const MemoryPlan pieces = plan_memory(in);
  EXPECT_EQ(pieces.mlp_chunk_tokens, 16384);
  in.mlp_chunk_tokens = 131072;  // one piece of every token
  const MemoryPlan whole = plan_memory(in);
  const int64_t T = 131072;
  // one piece of every token: the SwiGLU backward's moment (gate, up, h and dh of every
  // token) is the peak; in pieces it drops below the attention backward's, which is then the peak
  EXPECT_GT(whole.in_backward, whole.in_attention_backward);
  EXPECT_EQ(pieces.in_backward, pieces.in_attention_backward);
  EXPECT_EQ(pieces.in_attention_backward, whole.in_attention_backward);
  EXPECT_GT(whole.in_backward - pieces.in_backward, int64_t{9} << 30);
  // the attention moment: cuDNN's workspace of 8 bytes per query element is in it
  EXPECT_GT(pieces.in_attention_backward, pieces.activations_at_loss + T * 8 * 4096);
  EXPECT_NE(describe_plan(in, pieces).find("MLP in pieces"), std::string::npos);
  in.checkpointing = model::ActivationCheckpointing::kNone;  // the MLP's tensors are kept: no pieces
  in.mlp_chunk_tokens = 0;
  EXPECT_EQ(plan_memory(in).mlp_chunk_tokens, T);
}

// FP8 attention (training.fp8_attention): cuDNN's FP8 backward asks for a workspace of 12 bytes
// per query element (6.02 GiB measured at 131,072 tokens x 32 heads x 128) and holds the e4m3
// codes of q, k, v, out, dout, dq, dk and dv beside it, so the attention moment grows by that
// much over the bf16 backward's 8 bytes, and the automatic activation offload sees it.
TEST(Plan, Fp8AttentionCountsItsBackwardWorkspace) {
  PlanInput in;
  in.model = llama_8b();
  in.micro_batch = 1;
  in.seq_len = 131072;
  in.checkpointing = model::ActivationCheckpointing::kFull;
  const MemoryPlan bf16 = plan_memory(in);
  in.fp8_attention = true;
  const MemoryPlan fp8 = plan_memory(in);
  const int64_t T = 131072, q = T * 32 * 128, kv = T * 8 * 128;
  EXPECT_EQ(fp8.in_attention_backward - bf16.in_attention_backward, 12 * q + 4 * q + 4 * kv - 8 * q);
  EXPECT_GT(fp8.peak, bf16.peak);
  in.gpu = false;  // the CPU has no cuDNN workspace either way
  const MemoryPlan cpu = plan_memory(in);
  in.fp8_attention = false;
  EXPECT_EQ(cpu.in_attention_backward, plan_memory(in).in_attention_backward);
}

TEST(Plan, ActivationOffloadKeepsTwoBlocksOnTheGpu) {
  PlanInput in;
  in.model = llama_1b();  // 16 blocks
  in.micro_batch = 8;
  in.seq_len = 4096;
  in.checkpointing = model::ActivationCheckpointing::kFull;
  const MemoryPlan resident = plan_memory(in);
  in.offload_activations = true;
  const MemoryPlan off = plan_memory(in);
  const int64_t input = int64_t{8} * 4096 * 2048 * 2;  // one block's bf16 input
  EXPECT_EQ(resident.host_activations, 0);
  EXPECT_EQ(off.host_activations, 14 * input);
  EXPECT_EQ(off.activations_at_loss, resident.activations_at_loss - 14 * input);
  EXPECT_EQ(off.in_backward, resident.in_backward - 14 * input);
  EXPECT_EQ(off.peak, resident.peak - 14 * input) << "the peak is inside a block's backward with full checkpointing";
  const std::string text = describe_plan(in, off);
  EXPECT_NE(text.find("activations of 14 blocks (offloaded)"), std::string::npos) << text;
  // auto takes full with offload: only block inputs cross the bus
  const CheckpointingChoice c = choose_checkpointing(in, int64_t{80} << 30);
  EXPECT_EQ(c.checkpointing, model::ActivationCheckpointing::kFull);
  EXPECT_TRUE(c.fits);
  EXPECT_NE(describe_auto_checkpointing(in).find("takes full with training.offload_activations"), std::string::npos);
  // without checkpointing, every block's kept tensors but two leave (the same per block)
  in.checkpointing = model::ActivationCheckpointing::kNone;
  const MemoryPlan none = plan_memory(in);
  EXPECT_EQ(none.host_activations % 14, 0);
  EXPECT_EQ(none.activations_at_loss + none.host_activations, [&] {
    PlanInput r = in;
    r.offload_activations = false;
    return plan_memory(r).activations_at_loss;
  }());
  in.gpu = false;
  EXPECT_EQ(plan_memory(in).host_activations, 0) << "the CPU has nothing to offload";
}

// The multi-node jobs in configs/ cannot be run here (no machine at hand has 16 or 64 GPUs), so
// their first lines say what `shardtrain plan` gives them: "(planned: X GiB per GPU, Y GiB of
// host memory per rank". Those figures must stay what the plan gives (with the published
// model shapes), and the GPU's share must fit an 80 GB GPU (79.18 GiB to the allocator, as on
// the H100s measured) with the reserve the trainer keeps for the CUDA context and workspaces.
TEST(Plan, ShippedMultiNodeJobsFitAndSayWhatThePlanGives) {
  struct Job {
    const char* file;
    model::LlamaConfig model;
    int ranks;
  };
  const Job jobs[] = {{"llama2-70b-finetune-16gpus.toml", testing::llama2_70b(), 16},
                      {"llama3.1-405b-64gpus.toml", testing::llama31_405b(), 64}};
  const double gib = double{1u << 30};
  for (const Job& j : jobs) {
    const std::string path = testing::source_dir() + "/configs/" + j.file;
    std::ifstream f(path);
    ASSERT_TRUE(f) << path;
    std::stringstream text;
    text << f.rdbuf();
    std::smatch said;
    const std::string header = text.str();
    ASSERT_TRUE(std::regex_search(header, said,
                                  std::regex(R"(planned: ([0-9.]+) GiB per GPU, ([0-9.]+) GiB of host memory per rank)")))
        << path << " does not say its plan";
    const JobConfig job = load_config(path, {}).config;
    const MemoryPlan p = plan_memory(plan_input(job, j.model, j.ranks));
    const double gpu = static_cast<double>(p.peak) / gib;
    const double host = static_cast<double>(p.host + p.host_activations + p.host_checkpoint) / gib;
    std::printf("%-34s on %d ranks: %6.2f GiB per GPU, %6.2f GiB of host memory per rank\n", j.file, j.ranks, gpu, host);
    EXPECT_NEAR(gpu, std::stod(said[1]), 0.051) << path << " says " << said[1] << " GiB per GPU";
    EXPECT_NEAR(host, std::stod(said[2]), 0.051) << path << " says " << said[2] << " GiB of host memory per rank";
    EXPECT_LE(p.peak + checkpointing_reserve(p.peak), static_cast<int64_t>(79.18 * gib)) << path;
    if (std::string(j.file) != "llama3.1-405b-64gpus.toml") continue;
    // the 405B job's other settings, as its header gives them: smaller hosts, and 8192-token
    // sequences
    ASSERT_TRUE(std::regex_search(header, said, std::regex(R"(offload_activations = true then sends ([0-9]+) of the )"
                                                           R"(126\n# blocks' activations to the host to fit the GPU )"
                                                           R"(\(planned: ([0-9.]+) GiB per GPU, ([0-9.]+) GiB per rank)")))
        << path << " does not give its smaller-host plan";
    JobConfig small_host = job;
    small_host.parallel.offload_gradients = false;
    small_host.training.offload_activations = true;
    const OffloadBlocksChoice c =
        choose_offload_blocks(plan_input(small_host, j.model, j.ranks), static_cast<int64_t>(79.18 * gib));
    EXPECT_TRUE(c.fits);
    EXPECT_EQ(c.blocks, std::stoll(said[1])) << path << " says " << said[1] << " blocks";
    EXPECT_NEAR(static_cast<double>(c.plan.peak) / gib, std::stod(said[2]), 0.051) << path;
    EXPECT_NEAR(static_cast<double>(c.plan.host + c.plan.host_activations) / gib, std::stod(said[3]), 0.051) << path;
    ASSERT_TRUE(std::regex_search(header, said, std::regex(R"(Sequences of 8192 tokens fit as they are \(planned: )"
                                                           R"(([0-9.]+) GiB per GPU\))")))
        << path << " does not give its 8192-token plan";
    JobConfig long_seq = job;
    long_seq.training.seq_len = 8192;
    const MemoryPlan q = plan_memory(plan_input(long_seq, j.model, j.ranks));
    EXPECT_NEAR(static_cast<double>(q.peak) / gib, std::stod(said[1]), 0.051) << path;
    EXPECT_LE(q.peak + checkpointing_reserve(q.peak), static_cast<int64_t>(79.18 * gib)) << path;
  }
}

// Step time = a step's FLOPs / (ranks x peak x MFU), worked by hand for the 8B shape: 6 x
// 7,504,924,672 non-embedding parameters + 12 x 32 layers x 128 x 32 heads x 4096 tokens =
// 51,471,998,976 FLOPs per token.
TEST(PlanTime, StepTimeIsFlopsOverRanksPeakAndMfu) {
  PlanInput in;
  in.model = llama_8b();
  in.world_size = 8;
  in.micro_batch = 2;
  in.seq_len = 4096;
  in.grad_accum_steps = 2;
  in.steps = 2000;
  const TimeEstimate t = estimate_time(in, gpu_spec("h100-sxm"), 0.4);
  EXPECT_EQ(t.tokens_per_step, 2 * 4096 * 2 * 8);
  EXPECT_DOUBLE_EQ(in.model.flops_per_token(4096), 51'471'998'976.0);
  const double step = 51'471'998'976.0 * 131'072 / (8 * 989e12 * 0.4);  // 2.1317 s
  EXPECT_NEAR(t.step_seconds, step, 1e-12 * step);
  EXPECT_NEAR(t.step_seconds, 2.1317, 1e-4);
  EXPECT_NEAR(t.tokens_per_second_per_gpu, 131'072 / step / 8, 1e-9);
  EXPECT_NEAR(t.job_seconds, 2000 * step, 1e-9 * step);
  EXPECT_EQ(t.peak_flops, 989e12);
  // the MFU and the peak divide; more ranks at the same per-rank batch leave the step time alone
  EXPECT_NEAR(estimate_time(in, gpu_spec("h100-sxm"), 0.2).step_seconds, 2 * step, 1e-9);
  EXPECT_NEAR(estimate_time(in, gpu_spec("a100"), 0.4).step_seconds, step * 989 / 312, 1e-9);
  PlanInput more = in;
  more.world_size = 16;
  EXPECT_NEAR(estimate_time(more, gpu_spec("h100-sxm"), 0.4).step_seconds, step, 1e-9);
  // a tensor-parallel group shares its micro-batch: 8 ranks in groups of 2 are 4 data-parallel ranks
  PlanInput tp = in;
  tp.tensor_parallel = 2;
  EXPECT_EQ(estimate_time(tp, gpu_spec("h100-sxm"), 0.4).tokens_per_step, 2 * 4096 * 2 * 4);
  EXPECT_NEAR(estimate_time(tp, gpu_spec("h100-sxm"), 0.4).step_seconds, step / 2, 1e-9);
  // FP8 doubles Hopper's peak, not the A100's (which has no FP8)
  PlanInput fp8 = in;
  fp8.fp8 = true;
  EXPECT_EQ(estimate_time(fp8, gpu_spec("h200"), 0.4).peak_flops, 2 * 989e12);
  EXPECT_NEAR(estimate_time(fp8, gpu_spec("h200"), 0.4).step_seconds, step / 2, 1e-9);
  EXPECT_EQ(estimate_time(fp8, gpu_spec("a100"), 0.4).peak_flops, 312e12);
  EXPECT_NE(describe_time(fp8, gpu_spec("a100"), 0.4, "", "assumed").find("which the A100 lacks"), std::string::npos);
  EXPECT_THROW(estimate_time(in, gpu_spec("h100-sxm"), 0), Error);
}

TEST(PlanTime, TheTextSaysWhatItAssumes) {
  PlanInput in;
  in.model = llama_8b();
  in.world_size = 8;
  in.micro_batch = 2;
  in.seq_len = 4096;
  in.grad_accum_steps = 2;
  in.steps = 2000;
  in.checkpointing = model::ActivationCheckpointing::kFull;
  const std::string s = describe_time(in, gpu_spec("h100-sxm"), kAssumedMfu, "no GPU visible: assumed", "assumed");
  for (const char* said : {"communication is not modelled", "131,072 (2 x 4096 tokens x 2 micro-batches x 8 data-parallel ranks)",
                           "989 TFLOP/s dense bf16 per GPU (H100 SXM; no GPU visible: assumed), 8 GPUs",
                           "40 % (assumed)", "2.13 s per step, 7,686 tokens/s per GPU", "1 h 11 min for 2,000 steps",
                           "recomputation (activation checkpointing) is not in the FLOPs", "`shardtrain bench` measures"})
    EXPECT_NE(s.find(said), std::string::npos) << said << " in\n" << s;
}

TEST(PlanTime, GpusByNameAndByDevice) {
  EXPECT_EQ(gpu_spec("h100-pcie").bf16_flops, 756e12);
  EXPECT_EQ(gpu_spec("h200").bf16_flops, 989e12);
  try {
    gpu_spec("b200");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("plan: --gpu `b200` is not a GPU plan knows; use one of h100-sxm, h100-pcie, "
                                         "h200, a100"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(gpu_spec_for_device("NVIDIA H100 80GB HBM3")->name, "h100-sxm");
  EXPECT_EQ(gpu_spec_for_device("NVIDIA H100 PCIe")->name, "h100-pcie");
  EXPECT_EQ(gpu_spec_for_device("NVIDIA H200")->name, "h200");
  EXPECT_EQ(gpu_spec_for_device("NVIDIA A100-SXM4-80GB")->name, "a100");
  EXPECT_EQ(gpu_spec_for_device("NVIDIA L4"), nullptr);
  EXPECT_EQ(format_job_duration(2.1317), "2.13 s");
  EXPECT_EQ(format_job_duration(600), "10 min 00 s");
  EXPECT_EQ(format_job_duration(119.5), "2 min 00 s");
  EXPECT_EQ(format_job_duration(3599.4), "59 min 59 s");
  EXPECT_EQ(format_job_duration(4263.4), "1 h 11 min");
  EXPECT_EQ(format_job_duration(3 * 86400 + 5 * 3600 + 100), "3 d 05 h");
}

TEST(Plan, CheckpointMemoryIsSaidPlainly) {
  PlanInput in;
  in.model = llama_1b();
  in.seq_len = 4096;
  in.checkpoints = true;
  in.checkpoint_interval = 250;
  in.async_checkpoints = true;
  MemoryPlan p = plan_memory(in);
  std::string s = describe_checkpoint_memory(in, p);
  EXPECT_NE(s.find("checkpoints every 250 steps (checkpoint.async): each save copies this rank's f32 master weights "
                   "and AdamW m and v (" + format_bytes(p.master + p.optimizer) + ") into page-locked host memory kept "
                   "from save to save (counted above)"),
            std::string::npos)
      << s;
  EXPECT_NE(describe_plan(in, p).find(s), std::string::npos);
  in.offload = true;
  in.async_checkpoints = false;
  s = describe_checkpoint_memory(in, plan_memory(in));
  EXPECT_NE(s.find("written from the f32 shards where they are, in host memory (no copy)"), std::string::npos) << s;
  // no interval: a signal's save still needs the copies, which the plan does not count
  in = PlanInput{};
  in.model = llama_1b();
  in.checkpoint_on_signal = true;
  p = plan_memory(in);
  EXPECT_EQ(p.host_checkpoint, 0);
  s = describe_checkpoint_memory(in, p);
  EXPECT_NE(s.find("a save on a signal (checkpoint.on_signal) copies this rank's f32 master weights and AdamW m and v (" +
                   format_bytes(p.master + p.optimizer) + ") into page-locked host memory then, not counted above"),
            std::string::npos)
      << s;
  in.checkpoint_on_signal = false;
  EXPECT_NE(describe_checkpoint_memory(in, p).find("no host memory for saves"), std::string::npos);
}

// The shipped jobs of published models plan without their folders: model.hf names a folder
// that is not there (paths are relative to where plan runs), whose name gives the preset.
TEST(Plan, ShippedJobsPlanWithoutTheirModelFolders) {
  const std::pair<const char*, int64_t> jobs[] = {{"llama3.1-8b-finetune.toml", 8'030'261'248},
                                                  {"llama3.1-8b-128k-one-gpu.toml", 8'030'261'248},
                                                  {"llama3.1-8b-512k-4gpus.toml", 8'030'261'248},
                                                  {"llama3.1-405b-64gpus.toml", 405'853'388'800},
                                                  {"llama2-70b-finetune-16gpus.toml", 68'976'648'192},
                                                  {"llama3.2-1b-finetune.toml", 1'235'814'400}};
  for (const auto& [file, parameters] : jobs) {
    const JobConfig job = load_config(testing::source_dir() + "/configs/" + file, {}).config;
    ASSERT_FALSE(std::filesystem::exists(job.model.hf)) << job.model.hf << " is here: the test needs it absent";
    const PlannedModel m = planned_model(job);
    EXPECT_EQ(m.config.num_parameters(), parameters) << file;
    EXPECT_NE(m.source.find("is not on this machine"), std::string::npos) << m.source;
  }
  // the 512k job extends the published shape's context and rotary base
  const PlannedModel extended =
      planned_model(load_config(testing::source_dir() + "/configs/llama3.1-8b-512k-4gpus.toml", {}).config);
  EXPECT_EQ(extended.config.max_seq_len, 524288);
  EXPECT_DOUBLE_EQ(extended.config.rope.theta, 2e6);
  JobConfig other = load_config(testing::source_dir() + "/configs/llama3.1-8b-finetune.toml", {}).config;
  other.model.hf = "models/my-finetune";
  try {
    planned_model(other);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("`model.hf` = `models/my-finetune` does not exist, and plan reads the model's "
                                         "shape from its config.json; download the model there, or plan with a "
                                         "built-in shape: --model.hf= --model.preset=NAME (NAME: llama3.2-1b, "),
              std::string::npos)
        << e.what();
  }
  other.model.hf = "";
  other.model.preset = "llama3.1-70b";
  const PlannedModel preset = planned_model(other);
  EXPECT_EQ(preset.config.num_parameters(), 70'553'706'496);
  EXPECT_EQ(preset.source, "model shape: preset llama3.1-70b, as meta-llama/Llama-3.1-70B publishes it");
  // a folder that is there is read, whatever its name
  other.model.preset = "";
  other.model.hf = testing::source_dir() + "/tests/model/hf_reference/gqa4_llama3_rope";
  EXPECT_EQ(planned_model(other).config.dim, model::load_hf_config(other.model.hf + "/config.json").dim);
}

}  // namespace
}  // namespace shardtrain::train
