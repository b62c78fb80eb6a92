// Memory per rank from the engine's buffers; see plan.h for the two moments that bound it.
#include "train/plan.h"

#include <algorithm>
#include <filesystem>
#include <numeric>
#include <optional>

#include <unistd.h>

#include <fmt/format.h>

#include "core/allocator.h"
#include "model/hf_config.h"
#include "model/layout.h"
#include "model/presets.h"
#include "ops/attention.h"
#include "train/launch_defaults.h"
#include "train/model_shape.h"
#include "train/training_data.h"

namespace shardtrain::train {

int64_t auto_loss_chunk_tokens(bool gpu, int64_t vocab_size) {
  if (!gpu) return 256;
  // larger chunks make the head's GEMMs efficient and cut the passes over its f32 gradient
  const int64_t fit = (int64_t{2} << 30) / (2 * vocab_size);  // bf16 logits
  return std::clamp<int64_t>(fit / 256 * 256, 256, 8192);
}

int64_t auto_mlp_chunk_tokens(bool gpu, int64_t ffn_dim, int64_t tokens) {
  if (!gpu || ffn_dim <= 0 || tokens <= 0) return 0;
  const int64_t most = std::max<int64_t>(128, (int64_t{2} << 30) / (4 * ffn_dim * 2));
  if (tokens <= most) return 0;
  const int64_t pieces = (tokens + most - 1) / most;
  const int64_t piece = (tokens + pieces - 1) / pieces;
  return std::min((piece + 127) / 128 * 128, most / 128 * 128);
}

MemoryPlan plan_memory(const PlanInput& in) {
  const model::LlamaConfig& c = in.model;
  const int tp = in.tensor_parallel;
  ST_CHECK(tp >= 1 && in.world_size % tp == 0, "`parallel.tensor_parallel` (", tp, ") must divide the ",
           in.world_size, " ranks");
  const model::Mesh mesh = in.mesh();
  const model::ModelLayout layout = model::ModelLayout::llama(c, mesh, 0);
  const int64_t world = in.world_size;
  const int64_t cb = in.gpu ? 2 : 4;  // bytes of a compute-dtype element (bf16 / f32)
  // With tensor parallelism a rank computes N/tp query heads, M/tp kv heads and F/tp FFN
  // columns for every token, and holds the residual stream's rows for 1/tp of the tokens
  // (sequence parallelism): D, N, M, F below are a rank's share where a block splits them,
  // `D` itself where every row is gathered (the norms' outputs, the products' inputs).
  const int64_t D = c.dim, H = c.head_dim(), N = c.n_heads / tp, M = c.n_kv_heads / tp, F = c.ffn_dim / tp;
  const int64_t Q = N * H;  // a rank's query width (D without tensor parallelism, unless H is decoupled from D / N)
  const int64_t L = c.n_layers, V = c.vocab_size;

  MemoryPlan p;
  p.parameters = c.num_parameters();
  int64_t embed_numel = 0, head_numel = 0, block_numel = 0;
  for (const model::UnitLayout& u : layout.units()) {
    p.shard_elements += u.shard_numel();
    if (u.kind == model::UnitKind::kEmbedding) embed_numel = u.numel;
    if (u.kind == model::UnitKind::kHead) head_numel = u.numel;
    if (u.kind == model::UnitKind::kBlock) block_numel = std::max(block_numel, u.numel);
  }
  p.master = 4 * p.shard_elements;
  p.optimizer = 8 * p.shard_elements;
  p.grad_shards = 4 * p.shard_elements;
  const bool offload = in.offload && in.gpu;
  const bool grads_on_host = offload && in.offload_grads;
  p.grad_shards_on_gpu = offload && !in.offload_grads;
  // the CPU computes in the master dtype; fully offloaded, the bus carries bf16 copies
  const bool compute_shards = (in.compute_shards || grads_on_host) && in.gpu;
  if (compute_shards) p.compute_shards = 2 * p.shard_elements;
  if (p.grad_shards_on_gpu) {
    int64_t largest = 0;
    for (const model::UnitLayout& u : layout.units()) largest = std::max(largest, u.shard_numel());
    p.host_grad_staging = 2 * 4 * largest;
  }
  if (offload)
    p.host = p.master + p.optimizer + (grads_on_host ? p.grad_shards : 0) + p.compute_shards + p.host_grad_staging;
  // checkpoint saves copy the shards into host memory, but for synchronous saves of shards
  // already there (offload, CPU runs), which are written in place
  const bool shards_on_host = offload || !in.gpu;
  if (in.checkpoints && (!shards_on_host || in.async_checkpoints)) p.host_checkpoint = p.master + p.optimizer;

  // One rank whose compute dtype is the master's works on the shards themselves; otherwise
  // units are gathered (cast) into compute copies, and gradients land in full f32 unit
  // buffers until their reduce-scatter.
  // With compute shards on one GPU, units are used in place: nothing is gathered. So with
  // replicas of one rank each (DDP), where every unit is whole on every rank.
  // Offloaded, every unit comes up from the host and every gradient goes down to it.
  const bool params_aliased = mesh.replica_ranks() == 1 && (!in.gpu || compute_shards) && !offload;
  const bool grads_aliased = world == 1 && !grads_on_host;
  const int64_t head_weight_numel = c.tie_embeddings ? embed_numel + head_numel : head_numel;
  // the last block kept for its backward and the one prefetched; all of them without resharding
  const int64_t blocks_gathered = in.reshard_after_forward ? std::min<int64_t>(2, c.n_layers) : c.n_layers;
  if (!params_aliased) p.gathered_at_loss = cb * (head_weight_numel + blocks_gathered * block_numel);
  if (!grads_aliased) p.unit_grads_at_loss = 4 * (c.tie_embeddings ? embed_numel : head_numel);

  // What block_forward records per token (model/block.h): the norm outputs, q (after rope),
  // k, v, the attention output, the residual after attention, gate, up, their product and the
  // block output, in the compute dtype; the attention's f32 log-sum-exp rows and the norms'
  // f32 reciprocal rms. Per token of the micro-batch: the residual stream's tensors (x2, y,
  // rstd) count 1/tp of it under tensor parallelism.
  // QK-norm (model.qk_norm) keeps q and k as projected, before their norm, and the norm's f32
  // 1/rms of each head's row: what its backward reads, kept with q and k by every policy but
  // full recompute.
  // OLMo 2's QK-norm over the whole q and k (model.qk_norm_whole) keeps the same q and k, with
  // one 1/rms per token for each.
  const int64_t per_token_qk_norm = c.qk_norm         ? cb * (Q + M * H) + 4 * (N + M)
                                    : c.qk_norm_whole ? cb * (Q + M * H) + 4 * 2
                                                      : 0;
  // OLMo 2's norms after each sublayer (model.post_norms): the sublayers read x and x2 themselves
  // (no norm outputs) and the block keeps the attention's and the MLP's outputs before their
  // norms, two residual-stream tensors: the same per token as the norm outputs without
  // checkpointing, but kept where pointwise and selective checkpointing drop the norms'.
  const int64_t per_token_post_norms = c.post_norms ? cb * 2 * D : 0;
  // Gemma's norms before and after each sublayer (model.sandwich_norms): besides the input
  // norms' outputs, the attention's and the MLP's outputs before their norms and those norms'
  // f32 1/rms, kept by every policy but full recompute.
  const int64_t per_token_sandwich = c.sandwich_norms ? cb * 2 * D + 8 : 0;
  const int64_t per_token_block = cb * (2 * D + 2 * Q + 2 * M * H + 3 * F) + 4 * N + (cb * 2 * D + 8) / tp +
                                  per_token_qk_norm + per_token_sandwich;
  const int cp = in.context_parallel;
  ST_CHECK(cp >= 1 && in.world_size % cp == 0, "`parallel.context_parallel` (", cp, ") must divide the ",
           in.world_size, " ranks");
  const int64_t tokens = in.micro_batch * (in.seq_len / cp);  // a rank's chunks of its sequences
  p.tokens_per_micro_batch = tokens;
  const int64_t rows = tokens / tp;                      // the residual stream's rows on a rank
  const int64_t stream = rows * D * cb;                  // one residual-stream tensor
  const int64_t final_norm = stream + 4 * rows;          // the final norm's output and rstd
  using model::ActivationCheckpointing;
  // Selective checkpointing keeps each block's attention half (q, k, v, the attention output,
  // its f32 statistics and x2) beside the block inputs; the block backward then recomputes
  // both norms' outputs and statistics and the MLP's gate, up and h. Full recompute skips y.
  // Pointwise checkpointing drops both norms' outputs and statistics and h; the backward
  // recomputes the norms before the block and h inside the SwiGLU backward.
  const int64_t per_token_pointwise_recomputed = cb * (2 * D + F) + 8 / tp;
  const int64_t per_token_pointwise_kept = per_token_block - per_token_pointwise_recomputed + per_token_post_norms;
  const int64_t per_token_selective_kept =
      cb * (2 * Q + 2 * M * H) + cb * D / tp + 4 * N + per_token_qk_norm + per_token_post_norms + per_token_sandwich;
  const int64_t per_token_selective_recomputed = cb * (2 * D + 3 * F) + 8 / tp;
  const int64_t per_token_full_recomputed = per_token_block - cb * D / tp;
  switch (in.checkpointing) {
    case ActivationCheckpointing::kNone:
      p.activations_at_loss = tokens * L * per_token_block + stream + final_norm;
      break;
    case ActivationCheckpointing::kPointwise:
      p.activations_at_loss = tokens * L * per_token_pointwise_kept + stream + final_norm;
      break;
    case ActivationCheckpointing::kSelective:
      p.activations_at_loss = stream * (L + 1) + tokens * L * per_token_selective_kept + final_norm;
      break;
    case ActivationCheckpointing::kFull:
      p.activations_at_loss = stream * (L + 1) + final_norm;  // every block's input, the last output
      break;
  }
  if (in.offload_activations && in.gpu && L > model::ActivationOffload::kResidentBlocks) {
    // every block keeps the same (the last output and the final norm are not a block's)
    const int64_t per_block = (p.activations_at_loss - stream - final_norm) / L;
    p.offloaded_blocks = L - model::ActivationOffload::kResidentBlocks;
    if (in.offload_activation_blocks > 0) p.offloaded_blocks = std::min(p.offloaded_blocks, in.offload_activation_blocks);
    p.host_activations = p.offloaded_blocks * per_block;
    p.activations_at_loss -= p.host_activations;
  }
  p.loss_chunk_tokens = in.loss_chunk_tokens > 0 ? in.loss_chunk_tokens : auto_loss_chunk_tokens(in.gpu, V);
  const int64_t chunk = std::min(p.loss_chunk_tokens, rows);  // a rank's loss covers its rows
  p.loss_chunk = chunk * V * cb;  // logits in the compute dtype, overwritten by their gradient
  if (in.fp8 && in.fp8_head && in.gpu) p.loss_chunk_fp8 = chunk * (2 * V + D) + V * D;

  // Inside a block's backward, at its SwiGLU backward: the activations still kept (with
  // checkpointing, what the blocks keep plus the one block's recomputed part, h included),
  // the backward's temporaries (dy, dx and dh; gate's and up's gradients overwrite them), the
  // gathered blocks and up to three f32 block gradients in flight.
  // (offloaded: the two blocks on the GPU are the one in its backward and the next, coming up)
  // A chunked MLP (selective or full checkpointing with training.mlp_chunk_tokens) holds one
  // piece's gate, up, h and dh instead of every token's, and xn2's gradient for every token
  // from the first piece on.
  const bool mlp_recomputed = model::mlp_recomputed(in.checkpointing);
  const int64_t mlp_chunk = in.mlp_chunk_tokens > 0 ? in.mlp_chunk_tokens : auto_mlp_chunk_tokens(in.gpu, F, tokens);
  const int64_t piece = mlp_recomputed && mlp_chunk > 0 ? std::min(mlp_chunk, tokens) : 0;
  p.mlp_chunk_tokens = piece > 0 ? piece : tokens;
  const int64_t mlp_inner_recomputed = piece > 0 ? tokens * cb * 3 * F : 0;
  int64_t kept = p.activations_at_loss - final_norm;
  if (in.checkpointing == ActivationCheckpointing::kPointwise) kept += tokens * per_token_pointwise_recomputed;
  if (in.checkpointing == ActivationCheckpointing::kSelective)
    kept += tokens * per_token_selective_recomputed - mlp_inner_recomputed;
  if (in.checkpointing == ActivationCheckpointing::kFull)
    kept += tokens * per_token_full_recomputed - mlp_inner_recomputed;
  // (under tensor parallelism dy is gathered to every row, dx stays a rank's rows)
  const int64_t temporaries = piece > 0 ? tokens * cb * 3 * D + piece * cb * 4 * F : tokens * cb * (F + 2 * D);
  // the block being written and those still reducing (the CPU reduces each at once)
  const int64_t grads_alive = in.gpu ? 1 + in.reductions_in_flight : 1;
  const int64_t block_grads = grads_aliased ? 0 : grads_alive * 4 * block_numel;
  p.block_grads = block_grads;
  const int64_t blocks = params_aliased ? 0 : cb * blocks_gathered * block_numel;  // as at the loss
  // the ring's key/value blocks (in hand and arriving) and three of their gradients (f32 on a
  // GPU): this rank's share of the block in hand, the gradient arriving beside it and the one
  // leaving (model/context_parallel.h)
  if (cp > 1) p.ring_buffers = 2 * tokens * M * H * (2 * cb + 3 * (in.gpu ? 4 : cb));
  p.in_backward = kept + temporaries + block_grads + blocks;
  if (in.fp8 && in.gpu) {
    // at the gate|up product's backward dh is gone and the FP8 copies of its output gradient
    // (rows for dx, columns for the weight gradient) and of xn2's columns exist, one byte each
    const int64_t rows = piece > 0 ? piece : tokens;
    p.fp8_operands = rows * (4 * F + D);
    p.in_backward = std::max(p.in_backward, kept + temporaries - rows * cb * F + p.fp8_operands + block_grads + blocks);
  }
  // The block backward's other peak, at the attention backward (selective and full
  // checkpointing, where the MLP's tensors are gone by then): what the blocks keep, this
  // block's recomputed attention input half (full: xn1, q|k|v, the output and its statistics;
  // selective: xn1), dy, dx, x2's and the output's gradients, dq|dk|dv, and on a GPU cuDNN's
  // workspace (8 bytes per query element: 4.0 GiB measured at 131,072 tokens x 32 x 128). The
  // FP8 backward's (training.fp8_attention) asks for 12 (6.02 GiB measured at that size) and
  // adds one byte per element for the e4m3 codes of q, k, v, out, dout and dq, dk, dv.
  if (mlp_recomputed) {
    int64_t attention_half = tokens * cb * D;
    if (in.checkpointing == ActivationCheckpointing::kFull)
      attention_half = tokens * (cb * (D + 2 * Q + 2 * M * H) + 4 * N + 4 + per_token_qk_norm);
    const int64_t gradients = tokens * cb * (3 * D + 2 * Q + 2 * M * H);
    int64_t workspace = in.gpu ? tokens * 8 * N * H : 0;
    if (in.gpu && in.fp8_attention) workspace = tokens * (12 * N * H + 4 * N * H + 4 * M * H);
    p.in_attention_backward = (p.activations_at_loss - final_norm) + attention_half + gradients + workspace +
                              block_grads + blocks;
    p.in_backward = std::max(p.in_backward, p.in_attention_backward);
  }
  p.in_backward += p.ring_buffers;

  const int64_t at_loss =
      p.gathered_at_loss + p.unit_grads_at_loss + p.activations_at_loss + p.loss_chunk + p.loss_chunk_fp8;
  const int64_t shards = offload ? (p.grad_shards_on_gpu ? p.grad_shards : 0)
                                 : p.master + p.optimizer + p.grad_shards + p.compute_shards;
  p.peak = shards + std::max(at_loss, p.in_backward);
  p.flops_per_token = c.flops_per_token(in.seq_len);
  return p;
}

namespace {

// How the FLOPs formula counts sliding layers' attention, when the model has some.
std::string sliding_flops_note(const PlanInput& in) {
  const model::LlamaConfig& c = in.model;
  const int64_t sliding = c.sliding_layer_count();
  if (sliding == 0 || in.seq_len <= 0) return "";
  const double keys = model::sliding_keys_per_token(c.sliding_window, in.seq_len);
  return fmt::format("; on the {} sliding layers T is {:.1f}: T times the share of the causal (query, key) pairs "
                     "inside their window of {}", sliding, keys, c.sliding_window);
}

}  // namespace

std::string describe_plan(const PlanInput& in, const MemoryPlan& p) {
  const char* kept = "";
  switch (in.checkpointing) {
    case model::ActivationCheckpointing::kNone: break;
    case model::ActivationCheckpointing::kPointwise: kept = "  every product's output (pointwise)"; break;
    case model::ActivationCheckpointing::kSelective: kept = "  block inputs and attention halves (selective)"; break;
    case model::ActivationCheckpointing::kFull: kept = "  block inputs (checkpointed)"; break;
  }
  auto row = [](const std::string& what, int64_t bytes) { return fmt::format("  {:<46} {:>12}\n", what, format_bytes(bytes)); };
  std::string s;
  s += fmt::format("model: {}\n", in.model.summary());
  std::string shape = in.tensor_parallel > 1 ? fmt::format(" = {} data-parallel x {} tensor-parallel",
                                                           in.world_size / in.tensor_parallel, in.tensor_parallel)
                                             : std::string();
  if (in.context_parallel > 1)
    shape = fmt::format(" = {} data-parallel x {} context-parallel, every rank sharding the model",
                        in.world_size / in.context_parallel, in.context_parallel);
  if (in.replicate > 1)
    shape += fmt::format("{} {} replicas of {} ranks", shape.empty() ? "," : ";", in.replicate,
                         in.world_size / in.replicate);
  s += fmt::format("ranks: {}{} ({}: {} compute, f32 master weights, gradients and AdamW state)\n", in.world_size,
                   shape, in.gpu ? "GPUs" : "CPUs", in.gpu ? "bf16" : "f32");
  const std::string split =
      in.context_parallel > 1
          ? fmt::format(" (each sequence's {} split over {} ranks, ring attention)", in.seq_len, in.context_parallel)
          : std::string();
  s += fmt::format("micro-batch per rank: {} x {} tokens{}; activation checkpointing: {}; loss chunk: {} tokens\n",
                   in.micro_batch, in.seq_len / in.context_parallel, split, model::checkpointing_name(in.checkpointing),
                   p.loss_chunk_tokens);
  if (p.mlp_chunk_tokens < p.tokens_per_micro_batch)
    s += fmt::format("MLP in pieces of {} tokens (training.mlp_chunk_tokens)\n", p.mlp_chunk_tokens);
  s += fmt::format("memory per rank (estimate; {} parameters, {} padded elements per rank):\n",
                   fmt::group_digits(p.parameters), fmt::group_digits(p.shard_elements));
  if (p.host > 0 || p.host_activations > 0 || (p.host_checkpoint > 0 && in.gpu)) {
    s += row("in host memory, not on the GPU:", p.host + p.host_activations + p.host_checkpoint);
    if (p.host > 0) {
      s += row("  master weights (f32 shard, parallel.offload)", p.master);
      s += row("  AdamW m and v (f32 shards)", p.optimizer);
      if (!p.grad_shards_on_gpu) s += row("  gradient shards (f32)", p.grad_shards);
      if (p.compute_shards > 0) s += row("  compute shards (bf16, copied up to gather)", p.compute_shards);
      if (p.host_grad_staging > 0) s += row("  gradient buffers of the host update (2 units)", p.host_grad_staging);
    }
    if (p.host_activations > 0)
      s += row(fmt::format("  activations of {} blocks (offloaded)", p.offloaded_blocks), p.host_activations);
    if (p.host_checkpoint > 0) s += row("  checkpoint copies (master, AdamW)", p.host_checkpoint);
    s += "on the GPU:\n";
    if (p.grad_shards_on_gpu) s += row("gradient shards (f32, kept on the GPU)", p.grad_shards);
  }
  if (p.host == 0) {
    s += row("master weights (f32 shard)", p.master);
    s += row("AdamW m and v (f32 shards)", p.optimizer);
    s += row("gradient shards (f32)", p.grad_shards);
    if (p.compute_shards > 0)
      s += row(in.mesh().replica_ranks() == 1 ? "compute shards (bf16, used in place)" : "compute shards (bf16, gathered)",
               p.compute_shards);
    if (p.host_checkpoint > 0 && !in.gpu) s += row("checkpoint copies (master, AdamW)", p.host_checkpoint);
  }
  s += "  at the loss:\n";
  std::string kept_row = *kept ? std::string(kept) : fmt::format("  activations of {} blocks", in.model.n_layers);
  if (p.host_activations > 0) kept_row += fmt::format(", last {} blocks'", in.model.n_layers - p.offloaded_blocks);
  s += row(kept_row, p.activations_at_loss);
  s += row(in.reshard_after_forward ? "  gathered compute copies (head, 2 blocks)"
                                    : "  gathered compute copies (head, every block)",
           p.gathered_at_loss);
  if (p.unit_grads_at_loss > 0) s += row("  head gradient before its reduce-scatter", p.unit_grads_at_loss);
  s += row("  logit chunk (logits, then their gradient)", p.loss_chunk);
  if (p.loss_chunk_fp8 > 0) s += row("  the head's FP8 operands (training.fp8_head)", p.loss_chunk_fp8);
  s += row("inside a block's backward (all but the shards)", p.in_backward);
  if (p.fp8_operands > 0) s += row("  of it FP8 operands (training.fp8, at the gate|up backward)", p.fp8_operands);
  if (p.block_grads > 0)
    s += row(in.gpu ? fmt::format("  of it f32 block gradients, 1 + {} reducing", in.reductions_in_flight)
                    : std::string("  of it the block's f32 gradient"),
             p.block_grads);
  if (p.ring_buffers > 0) s += row("  of it the ring's kv blocks and gradients", p.ring_buffers);
  s += row(p.host > 0 ? "estimated GPU peak" : "estimated peak", p.peak);
  s += describe_checkpoint_memory(in, p);
  s += fmt::format("FLOPs per token: {:.3e} (6·N + 12·L·H·Q·T{}); per rank and micro-batch: {:.3e}\n",
                   p.flops_per_token, sliding_flops_note(in),
                   p.flops_per_token * static_cast<double>(p.tokens_per_micro_batch));
  s += "The estimate leaves out the CUDA context, cuBLAS workspaces and allocator slack (together about\n"
       "1-2 GiB on a GPU; cuDNN's attention workspace is in the block-backward moment).\n";
  return s;
}

int64_t host_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<int64_t>(pages) * page : 0;
}

std::string host_memory_problem(const PlanInput& in, const MemoryPlan& p, int64_t host_bytes) {
  // a tenth stays for the system, the process's own memory and the data
  const int64_t need = p.host + p.host_activations + p.host_checkpoint, usable = host_bytes / 10 * 9;
  if (host_bytes <= 0 || need <= usable) return "";
  std::string s = fmt::format("this rank needs {} of host memory, more than 90 % of this machine's {}: ",
                              format_bytes(need), format_bytes(host_bytes));
  if (p.host > 0) {
    s += fmt::format("{} for the offloaded shards and AdamW state (parallel.offload)", format_bytes(p.host));
    if (!p.grad_shards_on_gpu) {
      PlanInput kept = in;
      kept.offload_grads = false;
      kept.compute_shards = false;
      s += fmt::format("; parallel.offload_gradients = false keeps the gradients on the GPU and the host's part at {}",
                       format_bytes(plan_memory(kept).host));
    }
  }
  if (p.host_activations > 0)
    s += fmt::format("{}{} for {} blocks' activations (training.offload_activations; "
                     "training.offload_activations_blocks offloads fewer)",
                     p.host > 0 ? "; " : "", format_bytes(p.host_activations), p.offloaded_blocks);
  if (p.host_checkpoint > 0)
    s += fmt::format("{}{} for the copies checkpoints are written from{}", p.host + p.host_activations > 0 ? "; " : "",
                     format_bytes(p.host_checkpoint),
                     in.async_checkpoints && (in.offload || !in.gpu) ? " (checkpoint.async = false writes offloaded shards "
                                                                       "as they are)"
                                                                     : "");
  return s + "; more ranks (GPUs) divide the sharded state";
}

int64_t checkpointing_reserve(int64_t planned_peak) { return (int64_t{2} << 30) + planned_peak * 3 / 100; }

CheckpointingChoice choose_checkpointing(PlanInput in, int64_t device_bytes) {
  CheckpointingChoice c;
  if (in.offload_activations && in.gpu) {
    in.checkpointing = model::ActivationCheckpointing::kFull;
    c.plan = plan_memory(in);
    c.fits = c.plan.peak + checkpointing_reserve(c.plan.peak) <= device_bytes;
    return c;
  }
  for (model::ActivationCheckpointing ac : model::kCheckpointingByMemory) {
    in.checkpointing = ac;
    c.checkpointing = ac;
    c.plan = plan_memory(in);
    c.fits = c.plan.peak + checkpointing_reserve(c.plan.peak) <= device_bytes;
    if (c.fits) break;
  }
  return c;
}

PlanInput with_offloaded_blocks(PlanInput in, int64_t blocks) {
  in.offload_activations = blocks > 0;
  in.offload_activation_blocks = blocks;
  return in;
}

OffloadBlocksChoice choose_offload_blocks(PlanInput in, int64_t device_bytes) {
  OffloadBlocksChoice c;
  const int64_t most = std::max<int64_t>(0, in.model.n_layers - model::ActivationOffload::kResidentBlocks);
  for (int64_t n = 0; n <= most; ++n) {
    c.blocks = n;
    c.plan = plan_memory(with_offloaded_blocks(in, n));
    c.fits = c.plan.peak + checkpointing_reserve(c.plan.peak) <= device_bytes;
    if (c.fits) break;
  }
  return c;
}

std::string describe_auto_offload_blocks(const PlanInput& in) {
  std::string s = "training.offload_activations_blocks = auto: at launch, the fewest blocks whose offload fits the "
                  "GPU with 2 GiB and 3 % to spare:\n";
  // an 80 GB H100 as CUDA reports it, 79.18 GiB, where the trainer decides
  for (const double gib : {24.0, 40.0, 79.18, 94.0, 141.0}) {
    const OffloadBlocksChoice c = choose_offload_blocks(in, static_cast<int64_t>(gib * (1 << 30)));
    s += gib == 79.18 ? std::string("  an 80 GB H100 (79.18 GiB): ") : fmt::format("  a {:>3.0f} GiB GPU: ", gib);
    if (!c.fits)
      s += fmt::format("does not fit even with {} blocks offloaded (peak {})\n", c.blocks, format_bytes(c.plan.peak));
    else if (c.blocks == 0)
      s += fmt::format("none (peak {}; nothing offloaded)\n", format_bytes(c.plan.peak));
    else
      s += fmt::format("{} of {} blocks (peak {}, {} in host memory)\n", c.blocks, in.model.n_layers,
                       format_bytes(c.plan.peak), format_bytes(c.plan.host + c.plan.host_activations));
  }
  s += "(the breakdown above offloads every block but the last two; --training.offload_activations_blocks=N "
       "shows N)\n";
  return s;
}

std::string gpu_memory_advice(const PlanInput& in) {
  std::string s = "lower training.batch_size or training.seq_len, or add ranks";
  if (!in.gpu) return s;
  const int64_t peak = plan_memory(in).peak;
  // each key on its own, with what it takes off the peak (listed where it lowers it)
  auto offer = [&](PlanInput changed, const std::string& what) {
    const int64_t saved = peak - plan_memory(changed).peak;
    if (saved > 0) s += fmt::format(", or {} ({} less)", what, format_bytes(saved));
  };
  if (in.checkpointing != model::ActivationCheckpointing::kFull) {
    PlanInput full = in;
    full.checkpointing = model::ActivationCheckpointing::kFull;
    offer(full, "training.activation_checkpointing = \"full\"");
  }
  if (!in.offload_activations)
    offer(with_offloaded_blocks(in, in.model.n_layers), "training.offload_activations = true");
  if (!in.offload) {
    PlanInput off = in;
    off.offload = true;
    offer(off, "parallel.offload = true");
  }
  if (in.reductions_in_flight > 0) {
    PlanInput waiting = in;
    waiting.reductions_in_flight = 0;
    offer(waiting, "parallel.reductions_in_flight = 0, the backward then waiting for each block's reduce-scatter");
  }
  return s;
}

namespace {

// 131072 as "131,072".
std::string with_thousands(int64_t n) {
  std::string digits = std::to_string(n), s;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0 && digits[i - 1] != '-') s += ',';
    s += digits[i];
  }
  return s;
}

}  // namespace

ContextParallelChoice choose_context_parallel(const PlanInput& in, int64_t device_bytes, bool auto_checkpointing) {
  ContextParallelChoice none;
  // what the ring attention does not take (the config refuses them with a degree above 1)
  if (!in.gpu || in.tensor_parallel > 1 || in.model.sliding_window > 0 || in.fp8_attention) return none;
  // t as the trainer would run it on `device_bytes`: the lightest checkpointing that fits
  // ("auto"), else full with the fewest offloaded blocks; t's own checkpointing otherwise
  const auto fitted = [&](PlanInput t) -> std::optional<ContextParallelChoice> {
    t = with_offloaded_blocks(t, 0);
    if (auto_checkpointing) {
      const CheckpointingChoice ac = choose_checkpointing(t, device_bytes);
      t.checkpointing = ac.checkpointing;
      if (ac.fits) return ContextParallelChoice{t.context_parallel, t, ac.plan};
      t.checkpointing = model::ActivationCheckpointing::kFull;  // the least to carry over the bus
    } else if (const MemoryPlan p = plan_memory(t); p.peak + checkpointing_reserve(p.peak) <= device_bytes) {
      return ContextParallelChoice{t.context_parallel, t, p};
    }
    t.offload_activations = true;
    if (const OffloadBlocksChoice o = choose_offload_blocks(t, device_bytes); o.fits)
      return ContextParallelChoice{t.context_parallel, with_offloaded_blocks(t, o.blocks), o.plan};
    return std::nullopt;
  };
  for (int d = in.context_parallel + 1; d <= kMaxContextParallel && 2 * d <= in.seq_len; ++d) {
    if (in.seq_len % (2 * d) != 0) continue;
    PlanInput t = in;
    t.context_parallel = d;
    t.world_size = std::lcm(in.world_size, d);  // the ranks themselves where d divides them
    // where as many ranks fit without splitting the sequences, they are the answer, not this
    PlanInput unsplit = t;
    unsplit.context_parallel = in.context_parallel;
    if (fitted(unsplit)) return none;
    if (std::optional<ContextParallelChoice> c = fitted(t)) return *c;
  }
  return none;
}

std::string describe_context_parallel(const PlanInput& in, const ContextParallelChoice& c, bool auto_checkpointing) {
  ST_ASSERT(c.degree > 1, "describe_context_parallel: no degree chosen");
  const PlanInput& t = c.input;
  std::vector<std::string> keys;
  if (auto_checkpointing)
    keys.push_back(
        fmt::format("training.activation_checkpointing = \"{}\"", model::checkpointing_name(t.checkpointing)));
  if (t.offload_activations)
    keys.push_back(fmt::format("training.offload_activations = true ({} of {} blocks)", t.offload_activation_blocks,
                               t.model.n_layers));
  std::string s = fmt::format("fits with parallel.context_parallel = {}", c.degree);
  if (t.world_size != in.world_size) s += fmt::format(" on {} ranks", t.world_size);
  for (size_t i = 0; i < keys.size(); ++i) s += (i + 1 < keys.size() ? ", " : " and ") + keys[i];
  return s + fmt::format(" (each rank holds {} tokens of each sequence's {}; peak {})",
                         with_thousands(t.seq_len / c.degree), with_thousands(t.seq_len), format_bytes(c.plan.peak));
}

std::string describe_auto_checkpointing(PlanInput in) {
  std::string s = fmt::format("model: {}\nmicro-batch per rank: {} x {} tokens on {} GPU rank(s)\n", in.model.summary(),
                              in.micro_batch, in.seq_len, in.world_size);
  if (in.offload_activations && in.gpu)
    s += "training.activation_checkpointing = auto takes full with training.offload_activations (only block\n"
         "inputs cross the bus); each policy's peak with its activations offloaded:\n";
  else
    s += "training.activation_checkpointing = auto takes, at launch, the first of these whose peak fits the GPU\n"
         "with 2 GiB and 3 % to spare:\n";
  for (model::ActivationCheckpointing ac : model::kCheckpointingByMemory) {
    in.checkpointing = ac;
    const int64_t peak = plan_memory(in).peak;
    s += fmt::format("  {:<10} estimated peak {:>11}; needs a GPU of at least {}\n", model::checkpointing_name(ac),
                     format_bytes(peak), format_bytes(peak + checkpointing_reserve(peak)));
  }
  s += "(--training.activation_checkpointing=NAME shows that policy's breakdown)\n";
  return s;
}

PlanInput plan_input(const JobConfig& job, const model::LlamaConfig& model, int world_size) {
  PlanInput in;
  in.model = model;
  in.world_size = world_size;
  in.tensor_parallel = static_cast<int>(job.parallel.tensor_parallel);
  in.replicate = static_cast<int>(job.parallel.replicate);
  in.context_parallel = static_cast<int>(job.parallel.context_parallel);
  in.gpu = job.training.device != "cpu";
  in.micro_batch = job.training.batch_size;
  // 0 (auto): the longest a launch may choose (fine-tuning examples may make it shorter)
  in.seq_len = job.training.seq_len > 0 ? job.training.seq_len : auto_seq_len(model.max_seq_len).seq_len;
  if (job.training.activation_checkpointing != "auto")
    in.checkpointing =
        model::parse_checkpointing(job.training.activation_checkpointing, "training.activation_checkpointing");
  in.loss_chunk_tokens = job.training.loss_chunk_tokens;
  in.mlp_chunk_tokens = job.training.mlp_chunk_tokens;
  in.reshard_after_forward = job.parallel.reshard_after_forward;
  in.compute_shards = job.parallel.compute_shards == "on";
  in.offload = job.parallel.offload;
  in.offload_grads = job.parallel.offload_gradients;
  in.reductions_in_flight = static_cast<int>(job.parallel.reductions_in_flight);
  in.reduce_bf16 = job.parallel.reduce_dtype == "bf16";
  in.offload_activations = job.training.offload_activations;
  in.offload_activation_blocks = job.training.offload_activations_blocks;
  in.fp8 = job.training.fp8 != "off";
  in.fp8_head = job.training.fp8_head;
  in.fp8_attention = job.training.fp8_attention;
  in.checkpoints = job.checkpoint.interval_steps > 0;
  in.async_checkpoints = job.checkpoint.async;
  in.checkpoint_interval = job.checkpoint.interval_steps;
  in.checkpoint_on_signal = job.checkpoint.on_signal;
  in.grad_accum_steps = job.training.grad_accum_steps;
  in.steps = job.training.steps;
  return in;
}

bool choose_compute_shards(PlanInput in, int64_t device_bytes) {
  // one GPU only (or replicas of one GPU each, DDP: the copies are used in place there too):
  // measured there (+1-1.5 % tokens/s); sharded over several GPUs they are taken when asked ("on")
  if (!in.gpu || in.mesh().replica_ranks() != 1) return false;
  // offloaded they are in host memory: always kept with the gradients there, else when asked
  if (in.offload) return in.offload_grads || in.compute_shards;
  in.compute_shards = true;
  const MemoryPlan p = plan_memory(in);
  return p.peak + checkpointing_reserve(p.peak) <= device_bytes;
}

PlannedModel planned_model(const JobConfig& job) {
  const std::string& hf = job.model.hf;
  if (!job.model.preset.empty()) {
    const model::ModelPreset& p = *model::find_preset(job.model.preset);  // known: the config was validated
    model::LlamaConfig c = model::preset_config(p.name);
    set_sliding_window(job.model, c);
    extend_context(job.model, c, fmt::format("`model.preset` = \"{}\"", p.name));
    return {c, fmt::format("model shape: preset {}, as {} publishes it", p.name, p.hf_repo)};
  }
  if (!hf.empty()) {
    std::error_code ec;
    const std::string what = fmt::format("`model.hf` = `{}`", hf);
    if (std::filesystem::exists(hf, ec)) {
      model::LlamaConfig c = model::load_hf_config((std::filesystem::path(hf) / "config.json").string());
      extend_context(job.model, c, what);
      return {c, fmt::format("model shape: {}", (std::filesystem::path(hf) / "config.json").string())};
    }
    // planning comes before the download: a folder named as a published model has its shape
    std::filesystem::path path = std::filesystem::path(hf).lexically_normal();
    if (path.filename().empty()) path = path.parent_path();  // "models/Llama-3.1-8B/"
    const std::string folder = path.filename().string();
    const model::ModelPreset* p = model::preset_for_folder_name(folder);
    ST_CHECK(p != nullptr, "`model.hf` = `", hf, "` does not exist, and plan reads the model's shape from its "
             "config.json; download the model there, or plan with a built-in shape: --model.hf= "
             "--model.preset=NAME (NAME: ", model::preset_names(), ")");
    model::LlamaConfig c = model::preset_config(p->name);
    extend_context(job.model, c, what);
    return {c,
            fmt::format("model shape: preset {}, as {} publishes it: `model.hf` = `{}` is not on this machine, and "
                        "`{}` names that model (plan reads the folder's own config.json once it is there; train "
                        "needs the folder)",
                        p->name, p->hf_repo, hf, folder)};
  }
  const int64_t vocab = job.model.vocab_size > 0 ? job.model.vocab_size
                                                 : make_tokenizer(job.data, job.model.hf)->vocab_size();
  return {llama_config(job.model, vocab), ""};
}

std::string describe_checkpoint_memory(const PlanInput& in, const MemoryPlan& p) {
  const int64_t copies = p.master + p.optimizer;  // what a save copies: f32 master weights, AdamW m and v
  const char* where = in.gpu ? "page-locked host memory" : "host memory";
  if (in.checkpoint_interval > 0 && p.host_checkpoint > 0)
    return fmt::format("checkpoints every {} steps{}: each save copies this rank's f32 master weights and AdamW m and v "
                       "({}) into {} kept from save to save (counted above) and writes the files from there{}\n",
                       in.checkpoint_interval, in.async_checkpoints ? " (checkpoint.async)" : "",
                       format_bytes(p.host_checkpoint), where,
                       in.async_checkpoints ? " while training goes on" : "");
  if (in.checkpoint_interval > 0)
    return fmt::format("checkpoints every {} steps: written from the f32 shards where they are, in host memory (no "
                       "copy)\n",
                       in.checkpoint_interval);
  const bool in_place = (in.offload && in.gpu) || !in.gpu;  // synchronous saves of shards already on the host
  if (in.checkpoint_on_signal)
    return in_place ? std::string("checkpoints: none planned (checkpoint.interval_steps = 0); a save on a signal "
                                  "(checkpoint.on_signal) writes the shards from host memory where they are\n")
                    : fmt::format("checkpoints: none planned (checkpoint.interval_steps = 0); a save on a signal "
                                  "(checkpoint.on_signal) copies this rank's f32 master weights and AdamW m and v ({}) "
                                  "into {} then, not counted above\n",
                                  format_bytes(copies), where);
  return "checkpoints: none (checkpoint.interval_steps = 0, checkpoint.on_signal = false): no host memory for saves\n";
}

}  // namespace shardtrain::train
