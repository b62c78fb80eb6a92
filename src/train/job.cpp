// A job's set-up before its first step, read from its config.
#include "train/job.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>

#include <fmt/format.h>
#include <omp.h>

#ifdef SHARDTRAIN_WITH_CUDA
#include "core/cuda/device.h"
#endif
#include "core/host.h"
#include "core/log.h"
#include "data/byte_tokenizer.h"
#include "dist/bootstrap.h"
#include "model/hf_config.h"
#include "train/hf_fused.h"
#include "train/model_shape.h"
#include "train/training_data.h"

namespace shardtrain::train {

JobConfig bench_job(JobConfig c, const BenchMode& bench) {
  ST_CHECK(bench.warmup_steps >= 1,
           "bench: at least one warm-up step (plans, caches, a graph's capture) comes "
           "before the timed ones; found ",
           bench.warmup_steps);
  c.data.source = "builtin:random";
  c.data.format = "auto";
  c.data.mix.clear();
  c.data.eval_source.clear();
  c.data.document_mask = "off";
  c.checkpoint.interval_steps = 0;
  c.checkpoint.resume.clear();
  c.checkpoint.on_signal = false;  // a bench stops at once
  c.training.time_limit.clear();
  c.export_.folder.clear();
  c.sample.tokens = 0;
  c.eval.interval_steps = 0;
  c.training.epochs = 0;  // the bench's own step count
  c.logging.metrics_file.clear();
  c.logging.tensorboard_dir.clear();
  c.logging.interval_steps = 1;  // and so the board is read at every step
  c.schedule.warmup_steps = std::min(c.schedule.warmup_steps, c.training.steps);  // the rate does not depend on it
  return c;
}

void LaunchPhases::done(const char* phase) {
  const std::chrono::steady_clock::time_point now = std::chrono::steady_clock::now();
  const double seconds = std::chrono::duration<double>(now - last_).count();
  if (seconds >= 0.05) text_ += fmt::format("{}{} {:.1f} s", text_.empty() ? "" : ", ", phase, seconds);
  last_ = now;
}

std::string LaunchPhases::summary() const {
  const double total = std::chrono::duration<double>(last_ - start_).count();
  return total < 1 || text_.empty() ? fmt::format("ready in {:.1f} s", total)
                                    : fmt::format("ready in {:.1f} s: {}", total, text_);
}

int local_rank() {
  for (const char* v : {"LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID"})
    if (const char* s = std::getenv(v)) return std::atoi(s);
  return 0;
}

Device resolve_device(const std::string& wanted) {
  if (wanted == "cpu") return Device::cpu();
#ifdef SHARDTRAIN_WITH_CUDA
  const int n = cuda::device_count();
  ST_CHECK(wanted != "cuda" || n > 0, "`training.device` = cuda, but no usable CUDA device is visible");
  if (n > 0) {
    const int index = local_rank() % n;
    cuda::init_device(index);
    return Device::cuda(index);
  }
#else
  ST_CHECK(wanted != "cuda", "`training.device` = cuda, but this build has no CUDA backend (rebuild with nvcc)");
#endif
  return Device::cpu();
}

DType resolve_dtype(const std::string& wanted, Device device) {
  if (wanted == "auto") return device.is_cpu() ? DType::kF32 : DType::kBF16;
  const DType t = parse_dtype(wanted, "model.dtype");
  ST_CHECK(!(device.is_cpu() && (t == DType::kBF16 || t == DType::kF16)), "`model.dtype` = ", wanted,
           " needs a GPU (`training.device`); the CPU engine computes in f32 or f64");
  ST_CHECK(!(device.is_cuda() && t == DType::kF64), "`model.dtype` = f64 is for CPU checks; use bf16 or f32 on a GPU");
  return t;
}

void check_documents_with_capped_scores(const JobConfig& config, bool document_mask, Device device, DType dtype,
                                        const model::LlamaConfig& model) {
  ST_CHECK(!document_mask || device.is_cpu() || dtype == DType::kF32 || model.attn_logit_softcapping == 0,
           "`data.document_mask` (", config.data.document_mask, ": packed documents attend only to themselves) with "
           "attention scores soft-capped at ", model.attn_logit_softcapping, " (Gemma 2) in ", dtype_name(dtype),
           " on a GPU: cuDNN's attention takes packed documents only without a cap; train one example per "
           "sequence (data.packing = false), or set data.document_mask = off, model.dtype = f32 or "
           "training.device = cpu");
}

std::unique_ptr<fsdp::DeviceMesh> make_mesh(const JobConfig& config, dist::Communicator* world_comm) {
  const int world = world_comm->world_size(), tp = static_cast<int>(config.parallel.tensor_parallel);
  const int replicate = static_cast<int>(config.parallel.replicate);
  ST_CHECK(world % tp == 0, "`parallel.tensor_parallel` (", tp, ") must divide the ", world, " ranks of this run");
  ST_CHECK((world / tp) % replicate == 0, "`parallel.replicate` (", replicate, ") must divide the ", world / tp,
           " data-parallel groups of this run (", world, " ranks / `parallel.tensor_parallel` ", tp, ")");
  return std::make_unique<fsdp::DeviceMesh>(world_comm, model::Mesh{world / tp, tp, replicate});
}

void set_host_threads(const JobConfig& config, const dist::Communicator& world) {
  if (config.training.threads > 0) {
    omp_set_num_threads(static_cast<int>(config.training.threads));
  } else {
#ifdef SHARDTRAIN_WITH_CUDA
    const int gpus = config.training.device == "cpu" ? 0 : cuda::device_count();
    if (world.name() == "nccl" || gpus > 0) {
      int local = dist::local_ranks_from_env();
      if (local == 0) local = std::min(world.world_size(), std::max(1, gpus));  // one rank per GPU
      omp_set_num_threads(host_threads_per_rank(affinity_cpus(), machine_cpus(), local));
    }
#else
    (void)world;
#endif
  }
}

JobModel open_job_model(const JobConfig& config, bool bench, int rank) {
  JobModel job;
  // a bench of a Hugging Face model reads only its config.json: its tokens are random and the
  // tokenizer unused
  const bool hf_shape_only = bench && !config.model.hf.empty();
  const TokenizerChoice tokenizer_choice = choose_tokenizer(config.data, config.model.hf);
  if (hf_shape_only) {
    job.tokenizer = std::make_unique<data::ByteTokenizer>();
  } else {
    log::info("tokenizer: " + tokenizer_choice.reason);
    job.tokenizer = load_chosen_tokenizer(tokenizer_choice);
  }
  model::LlamaConfig& mc = job.config;
  if (!config.model.hf.empty()) {
    mc = model::load_hf_config((std::filesystem::path(config.model.hf) / "config.json").string());
    extend_context(config.model, mc, fmt::format("`model.hf` = `{}`", config.model.hf));
    ST_CHECK(hf_shape_only || job.tokenizer->vocab_size() <= mc.vocab_size, "`model.hf` = `", config.model.hf,
             "` has a vocabulary of ", mc.vocab_size, ", fewer than the ", job.tokenizer->vocab_size(), " tokens of ",
             tokenizer_choice.reason, "; name the model's own tokenizer with `data.tokenizer`, which takes ",
             kDataTokenizerValues);
    ST_CHECK(config.training.seq_len <= mc.max_seq_len, "`training.seq_len` (", config.training.seq_len,
             ") exceeds the max_position_embeddings (", mc.max_seq_len, ") of `model.hf` = `", config.model.hf,
             "`; shorten sequences, or train past the model's context with `model.extend_context` (usually with "
             "`model.rope_theta_scale`)");
    if (bench)
      log::info(fmt::format("bench: the model's shape from `{}`, its weights random (not read)", config.model.hf));
    else if (config.parallel.hf_load == "ranges" || rank == 0) {  // rank0: the others never open it
      job.hf_weights = std::make_unique<io::HfWeights>(config.model.hf);
      expose_fused_tensors(*job.hf_weights, mc);  // Phi-3's qkv_proj and gate_up_proj, split
    }
  } else {
    mc = llama_config(config.model, job.tokenizer->vocab_size());
    if (!config.model.preset.empty())
      log::info(fmt::format("model: the shape of preset {} ({} parameters), its weights random", config.model.preset,
                            mc.num_parameters()));
  }
  return job;
}

fsdp::ShardingOptions sharding_options(const JobConfig& config, Device device, DType compute, DType master) {
  const ParallelSection& parallel = config.parallel;
  fsdp::ShardingOptions options;
  options.compute_dtype = compute;
  options.grad_dtype = options.master_dtype = options.reduce_dtype = master;
  if (parallel.reduce_dtype == "bf16") {
    ST_CHECK(device.is_cuda(), "`parallel.reduce_dtype` = bf16 needs GPUs (NCCL); MPI reduces f32");
    options.reduce_dtype = DType::kBF16;
  }
  options.reshard_after_forward = parallel.reshard_after_forward;
  options.reductions_in_flight = static_cast<int>(parallel.reductions_in_flight);
  options.keep_last_block_gathered = parallel.keep_last_block_gathered;
  if (parallel.offload) {
    ST_CHECK(device.is_cuda(),
             "`parallel.offload` = true moves each rank's shards and AdamW state from its GPU to "
             "host memory; this run trains on the CPU (`training.device` = `",
             config.training.device, "`), where they are in host memory already");
    options.offload = true;  // the store keeps the bf16 compute shards then (what travels up)
    options.offload_grads = parallel.offload_gradients;
  }
  ST_CHECK(parallel.offload_gradients || parallel.offload,
           "`parallel.offload_gradients` = false "
           "keeps the gradient shards on the GPU while `parallel.offload` moves the rest to host memory; without "
           "`parallel.offload` = true every shard is on the GPU already");
  ST_CHECK(!config.training.offload_activations || device.is_cuda(),
           "`training.offload_activations` = true moves "
           "activations from the GPU to host memory; this run trains on the CPU (`training.device` = `",
           config.training.device, "`), where they are in host memory already");
  return options;
}

optim::AdamWConfig adamw_config(const OptimizerSection& optimizer, bool host_f32) {
  optim::AdamWConfig adamw;
  adamw.beta1 = optimizer.beta1;
  adamw.beta2 = optimizer.beta2;
  adamw.eps = optimizer.eps;
  adamw.weight_decay = optimizer.weight_decay;
  adamw.decay_1d = optimizer.decay_1d;
  adamw.host_f32 = host_f32;
  return adamw;
}

ExportOptions export_options_of(const JobConfig& config, const std::string& tokenizer_source) {
  ExportOptions options;
  options.folder = config.export_.folder;
  options.dtype = parse_dtype(config.export_.dtype, "export.dtype");
  options.max_shard_bytes = config.export_.max_shard_mb * 1000 * 1000;
  options.tokenizer_source = tokenizer_source;
  return options;
}

SampleOptions sample_options_of(const SampleSection& sample, bool cuda_graph) {
  SampleOptions options;
  options.cuda_graph = cuda_graph;
  options.prompt = sample.prompt;
  options.tokens = sample.tokens;
  options.temperature = sample.temperature;
  options.top_k = sample.top_k;
  options.top_p = sample.top_p;
  options.seed = sample.seed;
  return options;
}

}  // namespace shardtrain::train
