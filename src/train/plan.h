// `shardtrain plan`: what a job will hold in memory on each rank, before anything is
// allocated. The estimate follows the engine's own buffers (sharded f32 state, gathered
// compute copies, the activations each block keeps, the loss's logit chunk) and was checked
// against the peaks measured on an H100 and on 2 H200s (tests/train/plan_test.cpp).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/llama.h"
#include "train/config.h"

namespace shardtrain::train {

struct PlanInput {
  model::LlamaConfig model;
  int world_size = 1;
  int tensor_parallel = 1;         // parallel.tensor_parallel: ranks per group (dividing world_size)
  int replicate = 1;               // parallel.replicate: replicas of the sharded model (HSDP)
  // parallel.context_parallel: ranks splitting each sequence; a rank computes seq_len / this
  // many tokens of each (the units stay sharded over every rank)
  int context_parallel = 1;
  model::Mesh mesh() const { return {world_size / tensor_parallel, tensor_parallel, replicate}; }
  bool gpu = true;                 // compute dtype bf16 on a GPU, f32 on the CPU
  int64_t micro_batch = 1;         // sequences per rank and micro-batch (training.batch_size)
  int64_t seq_len = 4096;
  model::ActivationCheckpointing checkpointing = model::ActivationCheckpointing::kNone;
  int64_t loss_chunk_tokens = 0;   // 0: the trainer's automatic choice
  int64_t mlp_chunk_tokens = 0;    // 0: the trainer's automatic choice (training.mlp_chunk_tokens)
  bool reshard_after_forward = true;  // false: every block's compute copy stays until its backward
  bool compute_shards = false;        // parallel.compute_shards in effect (GPU: bf16 copies of the shards)
  bool offload = false;               // parallel.offload (GPU): the shards and AdamW state in host memory
  bool offload_grads = true;          // parallel.offload_gradients: with offload, the gradient shards too
  int reductions_in_flight = 1;       // parallel.reductions_in_flight: block gradients still reducing
  bool reduce_bf16 = false;           // parallel.reduce_dtype = "bf16": gradients reduce-scattered in bf16
  bool offload_activations = false;   // training.offload_activations (GPU): kept activations in host memory
  int64_t offload_activation_blocks = 0;  // training.offload_activations_blocks (0: all but the last two)
  bool fp8 = false;                   // training.fp8 on: the blocks' products quantise their operands
  bool fp8_head = false;              // training.fp8_head: the head's products too
  bool fp8_attention = false;         // training.fp8_attention: cuDNN's FP8 attention backward
  bool checkpoints = false;           // checkpoint.interval_steps > 0
  bool async_checkpoints = false;     // checkpoint.async
  int64_t checkpoint_interval = 0;    // checkpoint.interval_steps
  bool checkpoint_on_signal = false;  // checkpoint.on_signal: a save may come at any step
  int64_t grad_accum_steps = 1;       // training.grad_accum_steps: micro-batches per optimizer step
  int64_t steps = 0;                  // training.steps
};

// Bytes per rank, by what holds them. `peak` is the largest sum at any moment of a step:
// either at the loss (every block's activations alive, the head gathered, the logit chunk)
// or inside a block's backward (with full checkpointing: one recomputed block plus the
// backward's temporaries and the gradients still being reduced).
struct MemoryPlan {
  int64_t parameters = 0;            // unpadded, whole model
  int64_t shard_elements = 0;        // padded elements this rank owns, all units
  int64_t master = 0;                // f32 master weights
  int64_t optimizer = 0;             // AdamW m and v (f32)
  int64_t grad_shards = 0;           // f32 accumulated gradient shards
  int64_t compute_shards = 0;        // bf16 copies of the master shards (parallel.compute_shards)
  // parallel.offload: master, optimizer, grad_shards and compute_shards live in host memory
  // (their sum, page-locked but for the optimizer's); `peak` then leaves them out.
  // With parallel.offload_gradients = false the gradient shards stay on the GPU (and count in
  // `peak`), the compute shards are on the host only when asked for, and the host update's two
  // page-locked gradient buffers (the largest unit's shard each) join `host`.
  int64_t host = 0;
  int64_t host_grad_staging = 0;
  bool grad_shards_on_gpu = false;   // offloaded, with the gradient shards left on the GPU
  int64_t gathered_at_loss = 0;      // compute copies alive at the loss (head or tied embedding, blocks)
  int64_t unit_grads_at_loss = 0;    // the head's full f32 gradient before its reduce-scatter (N > 1)
  int64_t activations_at_loss = 0;   // what the blocks keep between forward and backward, on the GPU
  // training.offload_activations: what all but the last two blocks keep, in page-locked host
  // memory (and over the bus twice a micro-batch); activations_at_loss then holds two blocks'.
  int64_t host_activations = 0;
  int64_t offloaded_blocks = 0;      // blocks whose activations are in host_activations
  // Checkpoint saves: host copies of this rank's master and AdamW shards, kept for the run
  // (none where the shards are in host memory already and saves are synchronous).
  int64_t host_checkpoint = 0;
  int64_t loss_chunk = 0;            // one chunk's logits (overwritten by their gradient)
  // training.fp8_head: the FP8 operands of a chunk's backward (the logits' gradient as rows
  // and as columns, the weight's columns, the chunk's h^T): 2 V + D bytes a chunk row, V x D
  int64_t loss_chunk_fp8 = 0;
  int64_t in_backward = 0;           // the block-backward moment, beyond the sharded state (the larger of two)
  int64_t in_attention_backward = 0; // at the attention backward (selective and full checkpointing)
  // Of in_backward: whole f32 block gradients on the GPU, the one being written and those still
  // in their reduce-scatter (parallel.reductions_in_flight; none where the backward writes the shards).
  int64_t block_grads = 0;
  // Of in_backward, with context parallelism: the ring attention's key/value blocks (the one in
  // hand and the one arriving, M heads of a rank's tokens each) and three of their gradients
  // (f32 on a GPU): this rank's share, the one arriving beside it and the one leaving.
  int64_t ring_buffers = 0;
  // training.fp8: the FP8 operands alive at the backward's largest product, the MLP's gate|up
  // (its output gradient's rows and columns, and xn2's columns: 4 F + D bytes a token row)
  int64_t fp8_operands = 0;
  int64_t peak = 0;
  int64_t loss_chunk_tokens = 0;
  // Token rows per MLP piece in the block's backward (selective and full checkpointing);
  // the micro-batch's tokens when the MLP runs at once.
  int64_t mlp_chunk_tokens = 0;
  double flops_per_token = 0;
  int64_t tokens_per_micro_batch = 0;  // per rank
};

// The trainer's automatic logit chunk: as many tokens as keep one chunk's bf16 logits
// within 2 GiB on a GPU (256 to 8192, a multiple of 256); 256 on the CPU.
int64_t auto_loss_chunk_tokens(bool gpu, int64_t vocab_size);

// The trainer's automatic MLP piece (training.mlp_chunk_tokens = 0) for a micro-batch of
// `tokens`: on a GPU, when gate, up, h and dh of every token (4 x ffn_dim bf16 values each)
// would exceed 2 GiB, equal pieces (a multiple of 128 rows) that stay within it; otherwise 0,
// every token at once (and always on the CPU).
int64_t auto_mlp_chunk_tokens(bool gpu, int64_t ffn_dim, int64_t tokens);

MemoryPlan plan_memory(const PlanInput& in);

// The plan as text: the shape, the per-rank breakdown and the peak, and the FLOPs per token.
std::string describe_plan(const PlanInput& in, const MemoryPlan& plan);

// training.activation_checkpointing = "auto": the lightest policy (none, then pointwise,
// selective, full) whose planned peak, plus the reserve below, fits `device_bytes` of GPU
// memory; full when none does (`fits` then says so). `in.checkpointing` is ignored. With
// activation offload, full: the least to carry over the bus (block inputs only).
struct CheckpointingChoice {
  model::ActivationCheckpointing checkpointing = model::ActivationCheckpointing::kFull;
  MemoryPlan plan;
  bool fits = false;
};
CheckpointingChoice choose_checkpointing(PlanInput in, int64_t device_bytes);
// What "auto" keeps free beside a planned peak: the CUDA context, the cuBLAS and cuDNN
// workspaces and the allocator's slack, 2 GiB plus 3 % of the peak.
int64_t checkpointing_reserve(int64_t planned_peak);

// training.offload_activations_blocks = 0 (auto), with training.offload_activations on a GPU:
// the fewest blocks, counted from the first, whose offload brings the planned peak plus the
// reserve above within `device_bytes`; 0 when everything fits without offloading any (the
// offload is then off). When even every block but the last two does not fit, those (`fits`
// false). `in.offload_activation_blocks` is ignored; `in.checkpointing` is taken as given.
struct OffloadBlocksChoice {
  int64_t blocks = 0;
  MemoryPlan plan;
  bool fits = false;
};
OffloadBlocksChoice choose_offload_blocks(PlanInput in, int64_t device_bytes);
// The PlanInput that offloads exactly `blocks` blocks (0: none).
PlanInput with_offloaded_blocks(PlanInput in, int64_t blocks);
// For `plan` with the automatic count: what it takes on GPUs of common sizes.
std::string describe_auto_offload_blocks(const PlanInput& in);

// This machine's physical memory in bytes (0 where it cannot be read).
int64_t host_memory_bytes();
// Where a rank's planned host memory (offloaded shards and AdamW state, offloaded
// activations) exceeds 90 % of `host_bytes` (a machine's memory, the rest left to the system
// and the process; 0: unknown, nothing said): a message naming what takes it and the keys
// that lower it; empty otherwise.
std::string host_memory_problem(const PlanInput& in, const MemoryPlan& plan, int64_t host_bytes);

// What lowers the planned GPU peak of `in`, for a warning that it does not fit: the batch, the
// sequence, more ranks, then each of full checkpointing, activation offload, ZeRO-3 offload and
// parallel.reductions_in_flight = 0 not already in `in` that lowers the peak, with the bytes it
// takes off.
std::string gpu_memory_advice(const PlanInput& in);

// A job whose planned peak plus the reserve above exceeds `device_bytes`: the smallest
// context-parallel degree above in.context_parallel (at most kMaxContextParallel, cutting each
// sequence into 2 x degree chunks) with which it fits, each rank then holding seq_len / degree
// tokens of each sequence. With `auto_checkpointing` the lightest policy that fits (as
// choose_checkpointing), else in.checkpointing; where nothing fits without, the fewest blocks
// of activation offload that do (full checkpointing then, for "auto"). The degree runs on
// in.world_size ranks where it divides them, else on the least multiple of both. degree 0:
// none fits; or as many ranks fit without splitting the sequences (more data-parallel ranks
// are then the answer); or the job cannot split its sequences (the CPU, tensor parallelism,
// sliding windows, training.fp8_attention).
inline constexpr int kMaxContextParallel = 64;
struct ContextParallelChoice {
  int degree = 0;
  PlanInput input;  // the job with that degree, its ranks, checkpointing and offload
  MemoryPlan plan;
};
ContextParallelChoice choose_context_parallel(const PlanInput& in, int64_t device_bytes, bool auto_checkpointing);
// The choice in a line: "fits with parallel.context_parallel = 4 on 4 ranks and
// training.offload_activations = true (2 of 32 blocks) (each rank holds 131,072 tokens of each
// sequence's 524,288; peak ...)"; with `auto_checkpointing` the policy too. c.degree must be one.
std::string describe_context_parallel(const PlanInput& in, const ContextParallelChoice& c, bool auto_checkpointing);

// For `plan` with "auto" checkpointing: each policy's planned peak and the GPU memory it needs.
std::string describe_auto_checkpointing(PlanInput in);

// parallel.compute_shards = "auto": on for one GPU when, with them, the planned peak plus the
// reserve above still fits `device_bytes` (`in.compute_shards` is ignored); off on the CPU and
// on several ranks, where "on" asks for them.
bool choose_compute_shards(PlanInput in, int64_t device_bytes);

// The plan's input for `job` on `world_size` ranks, the model shape given (planned_model);
// "auto" checkpointing is left for choose_checkpointing (in.checkpointing: none), and
// "auto" compute shards for choose_compute_shards (in.compute_shards: false).
PlanInput plan_input(const JobConfig& job, const model::LlamaConfig& model, int world_size);

// The model shape a job trains: model.preset's, model.hf's config.json, or the model section
// with the tokenizer's vocabulary (loading tokenizer.json only to count it). Where model.hf is
// a folder not on this machine whose name is a preset's model ("models/Llama-3.1-8B"), that
// preset's shape, `source` saying so; another missing folder is an error naming model.preset.
struct PlannedModel {
  model::LlamaConfig config;
  std::string source;  // a line on where the shape comes from ("" for the model.* keys)
};
PlannedModel planned_model(const JobConfig& job);

// Step time and job duration (`plan --gpu NAME --mfu X`): the FLOPs of a step (the FLOPs per
// token above, recomputation not counted, times the tokens of all data-parallel ranks) over
// ranks x peak x MFU. Communication is not modelled: the MFU stands for all that a step loses.
struct GpuSpec {
  std::string name;      // the --gpu value: h100-sxm, h100-pcie, h200, a100
  std::string label;     // "H100 SXM"
  double bf16_flops = 0; // dense bf16 tensor-core peak (datasheet), FLOP/s
  bool fp8 = false;      // FP8 tensor cores (Hopper): training.fp8 doubles the peak
};
const std::vector<GpuSpec>& gpu_specs();
// The GPU named `name`; an unknown one throws naming --gpu and listing the names.
const GpuSpec& gpu_spec(const std::string& name);
// The entry for a device's name as CUDA reports it ("NVIDIA H100 80GB HBM3"), or nullptr.
const GpuSpec* gpu_spec_for_device(const std::string& device_name);
// The MFU `plan` assumes without --mfu.
inline constexpr double kAssumedMfu = 0.40;

struct TimeEstimate {
  int64_t tokens_per_step = 0;   // all ranks: micro-batch x sequence x accumulation x data-parallel ranks
  double flops_per_step = 0;
  double peak_flops = 0;         // per GPU: bf16's, or FP8's with training.fp8 on a GPU that has it
  double step_seconds = 0;
  double tokens_per_second_per_gpu = 0;
  double job_seconds = 0;        // training.steps x step_seconds
};
TimeEstimate estimate_time(const PlanInput& in, const GpuSpec& gpu, double mfu);
// The estimate as text; `gpu_note` and `mfu_note` say where the GPU and the MFU came from.
std::string describe_time(const PlanInput& in, const GpuSpec& gpu, double mfu, const std::string& gpu_note,
                          const std::string& mfu_note);
// "2.13 s", "12 min 05 s", "3 h 05 min", "2 d 04 h".
std::string format_job_duration(double seconds);

// What the plan's host memory holds for checkpoint saves, in a sentence.
std::string describe_checkpoint_memory(const PlanInput& in, const MemoryPlan& plan);

}  // namespace shardtrain::train
