// The Trainer's launch-time choices, apart from the loop: the run's length and sequence length
// once the data is read (train/launch_defaults.h), where checkpoints go, the loss and
// MLP chunk sizes, and the automatic settings (activation checkpointing, compute shards,
// offloaded blocks) that the memory plan (train/plan.h) decides against the GPU's memory.
#include <filesystem>

#include <fmt/format.h>

#include "core/allocator.h"
#ifdef SHARDTRAIN_WITH_CUDA
#include "core/cuda/device.h"
#endif
#include "core/log.h"
#include "train/launch_defaults.h"
#include "train/plan.h"
#include "train/trainer.h"
#include "train/run_folder.h"
#include "train/training_data.h"

namespace shardtrain::train {

std::string Trainer::checkpoint_root() const { return train::checkpoint_root(config_); }

int64_t Trainer::loss_chunk_tokens() const {
  if (config_.training.loss_chunk_tokens > 0) return config_.training.loss_chunk_tokens;
  return auto_loss_chunk_tokens(!device_.is_cpu(), model_config_.vocab_size);
}

int64_t Trainer::mlp_chunk_tokens() const {
  if (config_.training.mlp_chunk_tokens > 0) return config_.training.mlp_chunk_tokens;
  return auto_mlp_chunk_tokens(!device_.is_cpu(), model_config_.ffn_dim,
                               config_.training.batch_size * config_.training.seq_len);
}

ops::LinearFp8 Trainer::fp8_choice() const {
  ops::LinearFp8 fp8;
  fp8.recipe = ops::parse_fp8_recipe(config_.training.fp8, "training.fp8");
  ST_CHECK(fp8.on() || !config_.training.fp8_head, "`training.fp8_head` = true puts the head's products in FP8 "
           "with training.fp8's recipe, but `training.fp8` is \"off\"; choose a recipe or set `training.fp8_head` = "
           "false");
  if (!fp8.on()) return fp8;
  const std::string& g = config_.training.fp8_gradients;
  fp8.gradient_format = g == "e4m3" || (g == "auto" && fp8.recipe != ops::Fp8Recipe::kTensorwise) ? DType::kF8E4M3
                                                                                                   : DType::kF8E5M2;
#ifdef SHARDTRAIN_WITH_CUDA
  if (device_.is_cuda()) {
    const int cc = cuda::compute_capability(device_.index);
    ST_CHECK(cc / 10 == 9, "`training.fp8` = \"", config_.training.fp8, "\" needs a Hopper GPU (compute capability "
             "9.0: H100, H200), whose cuBLASLt scales FP8 products per tensor, row and block; ",
             cuda::device_name(device_.index), " has ", cc / 10, ".", cc % 10, ". Set `training.fp8` = \"off\"");
  }
#endif
  // every product's operands are rows of 16-byte multiples: the widths the block's linears
  // multiply over (and produce) on each rank of a tensor-parallel group
  const model::LlamaConfig& m = model_config_;
  const int64_t tp = config_.parallel.tensor_parallel;
  const std::pair<const char*, int64_t> widths[] = {
      {"model.dim", m.dim},
      {"model.ffn_dim / parallel.tensor_parallel", m.ffn_dim / tp},
      {"model.n_heads x head dim / parallel.tensor_parallel", m.n_heads * m.head_dim() / tp},
      {"model.n_kv_heads x head dim / parallel.tensor_parallel", m.n_kv_heads * m.head_dim() / tp}};
  if (config_.training.fp8_head)  // the head multiplies over the vocabulary too (the logits' gradient times the weight)
    ST_CHECK(m.vocab_size % 16 == 0, "`training.fp8_head` = true multiplies FP8 rows of 16-byte multiples, but "
             "model.vocab_size = ", m.vocab_size, " is not a multiple of 16; set `model.vocab_size` to a multiple of 16 (rows past the tokenizer's are "
             "never a target) or `training.fp8_head` = false");
  for (const auto& [name, width] : widths)
    ST_CHECK(width % 16 == 0, "`training.fp8` = \"", config_.training.fp8, "\" multiplies FP8 rows of 16-byte "
             "multiples, but ", name, " = ", width, " is not a multiple of 16; set `training.fp8` = \"off\"");
  return fp8;
}

ops::LinearFp8 Trainer::fp8_head_choice() const {
  if (!config_.training.fp8_head || !fp8_.on()) return {};
  ops::LinearFp8 head{.recipe = fp8_.recipe, .gradient_format = fp8_.gradient_format};
  if (config_.training.fp8_gradients == "auto")
    head.gradient_format = fp8_.recipe == ops::Fp8Recipe::kBlockwise ? DType::kF8E4M3 : DType::kF8E5M2;
  return head;
}

bool Trainer::fp8_attention_choice(DType compute) const {
  if (!config_.training.fp8_attention) return false;
  const char* key = "`training.fp8_attention` = true";
  ST_CHECK(device_.is_cuda(), key, " runs cuDNN's FP8 attention on a GPU, but this run trains on the CPU (`training.device` = `",
           config_.training.device, "`); set `training.fp8_attention` = false");
  ST_CHECK(compute == DType::kBF16, key, " takes bf16 activations, but the compute dtype is ", dtype_name(compute),
           "; set `model.dtype` = bf16 or `training.fp8_attention` = false");
#ifdef SHARDTRAIN_WITH_CUDA
  const int cc = cuda::compute_capability(device_.index);
  ST_CHECK(cc >= 90, key, " needs cuDNN's FP8 attention, on GPUs of compute capability 9.0 or more (H100, H200); ",
           cuda::device_name(device_.index), " has ", cc / 10, ".", cc % 10, ". Set `training.fp8_attention` = false");
#endif
  const int64_t H = model_config_.head_dim();
  ST_CHECK(H == 128, key, " takes a head dim of 128 (cuDNN's FP8 attention backward on Hopper), but the model's "
           "head dim is ", H, "; set `training.fp8_attention` = false");
  return true;
}

int64_t Trainer::gpu_memory_bytes() const {
#ifdef SHARDTRAIN_WITH_CUDA
  if (device_.is_cuda()) return cuda::total_memory_bytes(device_.index);
#endif
  return 0;
}

PlanInput Trainer::launch_plan_input() const {
  PlanInput in = plan_input(config_, model_config_, comm_->world_size());
  in.loss_chunk_tokens = loss_chunk_tokens();
  in.mlp_chunk_tokens = mlp_chunk_tokens();
  return in;
}

PlanInput Trainer::chosen_plan_input() const {
  PlanInput in = with_offloaded_blocks(launch_plan_input(), offload_blocks_);
  in.checkpointing = checkpointing_;
  in.compute_shards = compute_shards_;
  return in;
}

model::ActivationCheckpointing Trainer::checkpointing() const {
  const std::string& name = config_.training.activation_checkpointing;
  if (name != "auto") return model::parse_checkpointing(name, "training.activation_checkpointing");
  if (!device_.is_cuda()) {
    log::info("training.activation_checkpointing = auto: none (on the CPU)");
    return model::ActivationCheckpointing::kNone;
  }
  const int64_t device_bytes = gpu_memory_bytes();
  const CheckpointingChoice c = choose_checkpointing(launch_plan_input(), device_bytes);
  const std::string line =
      fmt::format("training.activation_checkpointing = auto: {} (planned peak {} per rank on a {} GPU)",
                  model::checkpointing_name(c.checkpointing), format_bytes(c.plan.peak), format_bytes(device_bytes));
  if (c.fits) {
    log::info(line);
  } else {
    PlanInput full = launch_plan_input();
    full.checkpointing = c.checkpointing;
    log::warn(line + "; even full checkpointing is planned above the GPU's memory less 2 GiB and 3 %: expect an "
                     "out-of-memory error, or " + gpu_memory_advice(full));
  }
  return c.checkpointing;
}

bool Trainer::compute_shards(model::ActivationCheckpointing checkpointing) const {
  const std::string& v = config_.parallel.compute_shards;
  if (!device_.is_cuda()) return false;  // the CPU computes in the master dtype: nothing to copy
  // fully offloaded, the host's bf16 copies are what travels up; with the gradients on the GPU
  // they are kept only when asked for (the host then holds master, m and v alone)
  if (config_.parallel.offload) return config_.parallel.offload_gradients || v == "on";
  if (v != "auto") return v == "on";
  if (mesh_->shape().replica_ranks() > 1) {  // DDP (replicas of one GPU) uses them in place, as one GPU does
    log::info("parallel.compute_shards = auto: off with several GPUs sharding the model (`on` keeps bf16 copies of "
              "the shards there)");
    return false;
  }
  const int64_t device_bytes = gpu_memory_bytes();
  PlanInput in = launch_plan_input();
  in.checkpointing = checkpointing;
  const bool on = choose_compute_shards(in, device_bytes);
  in.compute_shards = true;
  log::info(fmt::format("parallel.compute_shards = auto: {} (with them the planned peak is {} on a {} GPU)",
                        on ? "on" : "off", format_bytes(plan_memory(in).peak), format_bytes(device_bytes)));
  return on;
}

int64_t Trainer::offload_activation_blocks(model::ActivationCheckpointing checkpointing, bool compute_shards) const {
  const int64_t asked = config_.training.offload_activations_blocks;
  if (asked > 0) return asked;
  PlanInput in = launch_plan_input();
  in.checkpointing = checkpointing;
  in.compute_shards = compute_shards;
  const int64_t device_bytes = gpu_memory_bytes();
  const OffloadBlocksChoice c = choose_offload_blocks(in, device_bytes);
  const std::string line = fmt::format(
      "training.offload_activations_blocks = auto: {} of {} blocks (planned peak {} per rank on a {} GPU{})",
      c.blocks, model_config_.n_layers, format_bytes(c.plan.peak), format_bytes(device_bytes),
      c.blocks > 0 ? fmt::format(", {} of activations in host memory", format_bytes(c.plan.host_activations))
                   : std::string(": everything fits, the activations stay on the GPU"));
  if (c.fits) {
    log::info(line);
  } else {
    log::warn(line + "; even then the plan is above the GPU's memory less 2 GiB and 3 %: expect an out-of-memory "
                     "error, or " + gpu_memory_advice(with_offloaded_blocks(in, c.blocks)));
  }
  return c.blocks;
}

LaunchChoices resolve_run_shape(JobConfig& config, const AutoSeqLen& seq_len, const data::TrainingData& data,
                                int64_t data_parallel) {
  TrainingSection& t = config.training;
  LaunchChoices choices;
  if (t.seq_len == 0) {
    t.seq_len = seq_len.chosen.seq_len;
    choices.seq_len = seq_len.chosen;
    choices.seq_len_auto = true;
  }
  choices.sequences_per_step = t.batch_size * t.grad_accum_steps * data_parallel;
  if (t.epochs > 0) {
    const std::optional<data::EpochSize> size = data.epoch_size();
    ST_CHECK(size.has_value(), "`training.epochs` = ", t.epochs, " counts passes over the training data, but ",
             config.data.mix.empty() ? "`data.source` = `" + config.data.source + "` is random tokens, of no size"
                                     : std::string("`data.mix` draws from several sources by weight"),
             "; set `training.steps` instead");
    choices.epoch = *size;
    t.steps = steps_for_epochs(t.epochs, *size, choices.sequences_per_step, t.seq_len);
  }
  if (config.schedule.warmup_fraction > 0)
    config.schedule.warmup_steps = warmup_steps_for(config.schedule.warmup_fraction, t.steps);
  validate(config);  // the cross-key checks again, at the chosen length
  return choices;
}

void Trainer::resolve_run_shape(const AutoSeqLen& seq_len) {
  const LaunchChoices choices =
      train::resolve_run_shape(config_, seq_len, *data_, data_ranks());
  for (const std::string& line : launch_choice_lines(config_, choices)) log::info(line);
}

std::string Trainer::tokenizer_source() const {
  return choose_tokenizer(config_.data, config_.model.hf).source;
}

}  // namespace shardtrain::train
