// The training loop and its reporting.
#include "train/trainer.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <omp.h>

#include "core/allocator.h"
#include "core/build_info.h"
#include "core/crash_report.h"
#ifdef SHARDTRAIN_WITH_CUDA
#include "core/cuda/device.h"
#endif
#include "core/gpu_monitor.h"
#include "core/host.h"
#include "core/log.h"
#include "core/profile.h"
#include "data/byte_tokenizer.h"
#include "io/hf_folder.h"
#include "io/safetensors_writer.h"
#include "model/hf_config.h"
#include "dist/bootstrap.h"
#include "dist/world.h"
#include "model/captured_step.h"
#include "ops/attention.h"
#include "ops/linear.h"
#include "optim/clip.h"
#include "optim/schedule.h"
#include "train/checkpoint.h"
#include "train/export.h"
#include "train/run_folder.h"
#include "train/run_paths.h"
#include "train/generate.h"
#include "train/launch_defaults.h"
#include "train/metrics.h"
#include "train/model_shape.h"
#include "train/plot.h"
#include "train/nonfinite.h"
#include "train/plan.h"
#include "train/stop_signals.h"
#include "train/watchdog.h"
#include "train/training_data.h"

namespace shardtrain::train {
namespace {

using Clock = std::chrono::steady_clock;

// Where a launch's time goes, logged once it is ready: a large model's page-locked memory
// and weights take minutes, which a user should see named rather than wonder about.
// Phases under 0.05 s go unnamed, and a launch under a second is only timed.
class LaunchPhases {
 public:
  void done(const char* phase) {
    const Clock::time_point now = Clock::now();
    const double seconds = std::chrono::duration<double>(now - last_).count();
    if (seconds >= 0.05) text_ += fmt::format("{}{} {:.1f} s", text_.empty() ? "" : ", ", phase, seconds);
    last_ = now;
  }
  std::string summary() const {
    const double total = std::chrono::duration<double>(last_ - start_).count();
    return total < 1 || text_.empty() ? fmt::format("ready in {:.1f} s", total)
                                      : fmt::format("ready in {:.1f} s: {}", total, text_);
  }

 private:
  Clock::time_point start_ = Clock::now(), last_ = start_;
  std::string text_;
};

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// The process's peak resident set.
int64_t peak_resident_bytes() {
  rusage u{};
  return ::getrusage(RUSAGE_SELF, &u) == 0 ? static_cast<int64_t>(u.ru_maxrss) * 1024 : 0;  // ru_maxrss: KiB
}

std::string format_duration(double s) {
  const int64_t t = static_cast<int64_t>(s + 0.5);
  if (t >= 3600) return fmt::format("{}h{:02}m", t / 3600, (t / 60) % 60);
  if (t >= 60) return fmt::format("{}m{:02}s", t / 60, t % 60);
  return fmt::format("{}s", t);
}


// A one-line progress display on a terminal, redrawn in place.
class Progress {
 public:
  Progress(const std::string& mode, int64_t total) : total_(total) {
    enabled_ = mode == "on" || (mode == "auto" && isatty(STDERR_FILENO));
  }
  void update(int64_t step, double loss, double tps, double eta) {
    if (!enabled_) return;
    constexpr int kWidth = 30;
    const int filled = static_cast<int>(kWidth * step / total_);
    std::string bar(static_cast<size_t>(filled), '#');
    bar.resize(kWidth, '.');
    std::fprintf(stderr, "\r\033[K[%s] %lld/%lld loss %.4f  %.0f tok/s  ETA %s", bar.c_str(),
                 static_cast<long long>(step), static_cast<long long>(total_), loss, tps, format_duration(eta).c_str());
    std::fflush(stderr);
  }
  void clear() {
    if (enabled_) std::fprintf(stderr, "\r\033[K");
  }

 private:
  bool enabled_ = false;
  int64_t total_;
};

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

// training.time_limit counts from here: the process's start, as a job's wall-clock limit does
const Clock::time_point g_process_start = Clock::now();

// The job `shardtrain bench` runs instead of `config` (BenchMode).
JobConfig bench_job(JobConfig c, const BenchMode& bench) {
  ST_CHECK(bench.warmup_steps >= 1, "bench: at least one warm-up step (plans, caches, a graph's capture) comes "
           "before the timed ones; found ", bench.warmup_steps);
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

}  // namespace

Trainer::Trainer(const JobConfig& config, dist::Communicator* comm, std::optional<BenchMode> bench)
    : config_(bench ? bench_job(config, *bench) : config), bench_(bench), comm_(comm) {
  validate(config_);
  log::set_level(log::parse_level(config_.logging.level));
  log::info(fmt::format("shardtrain {} ({})", build_commit(), build_options()));
  LaunchPhases phases;
  if (comm_ == nullptr) {
    dist::WorldOptions world_options;
    world_options.use_gpus = config_.training.device != "cpu";
    world_options.init_timeout_s = config_.parallel.init_timeout_s;
    dist::World world = dist::make_world(world_options);
    owned_comm_ = std::move(world.comm);
    if (world.gpu_index >= 0) device_ = Device::cuda(world.gpu_index);
    comm_ = owned_comm_.get();
  }
  if (comm_->world_size() > 1) {
    log::set_rank(comm_->rank(), false);
    crash_report::set_rank(comm_->rank());
  }
  phases.done("communicator");
  if (!bench_) prepare_output_folders();  // a bench writes no files
  {
    const int world = comm_->world_size(), tp = static_cast<int>(config_.parallel.tensor_parallel);
    const int replicate = static_cast<int>(config_.parallel.replicate);
    ST_CHECK(world % tp == 0, "`parallel.tensor_parallel` (", tp, ") must divide the ", world, " ranks of this run");
    ST_CHECK((world / tp) % replicate == 0, "`parallel.replicate` (", replicate, ") must divide the ", world / tp,
             " data-parallel groups of this run (", world, " ranks / `parallel.tensor_parallel` ", tp, ")");
    mesh_ = std::make_unique<fsdp::DeviceMesh>(comm_, model::Mesh{world / tp, tp, replicate});
  }
  const int dp_size = mesh_->shape().data_parallel;
  // Host threads (data, the host AdamW of parallel.offload, CPU kernels): training.threads, or
  // on GPUs this machine's CPUs shared among its ranks. torchrun sets OMP_NUM_THREADS = 1 for
  // each rank, which would leave a 405B's host AdamW one core per GPU; on the CPU, OpenMP's
  // default (OMP_NUM_THREADS, else every core) as the MPI launch in docs/multi-gpu.md suggests.
  if (config_.training.threads > 0) {
    omp_set_num_threads(static_cast<int>(config_.training.threads));
  } else {
#ifdef SHARDTRAIN_WITH_CUDA
    const int gpus = config_.training.device == "cpu" ? 0 : cuda::device_count();
    if (comm_->name() == "nccl" || gpus > 0) {
      int local = dist::local_ranks_from_env();
      if (local == 0) local = std::min(comm_->world_size(), std::max(1, gpus));  // one rank per GPU
      omp_set_num_threads(host_threads_per_rank(affinity_cpus(), machine_cpus(), local));
    }
#endif
  }
  ops::set_gemm_selection(config_.training.gemm_selection == "heuristic" ? ops::GemmSelection::kHeuristic
                                                                          : ops::GemmSelection::kTimed);

  // a bench of a Hugging Face model reads only its config.json: its tokens are random and the
  // tokenizer unused
  const bool hf_shape_only = bench_ && !config_.model.hf.empty();
  const TokenizerChoice tokenizer_choice = choose_tokenizer(config_.data, config_.model.hf);
  if (hf_shape_only) {
    tokenizer_ = std::make_unique<data::ByteTokenizer>();
  } else {
    log::info("tokenizer: " + tokenizer_choice.reason);
    tokenizer_ = load_chosen_tokenizer(tokenizer_choice);
  }
  model::LlamaConfig mc;
  std::unique_ptr<io::HfWeights> hf_weights;
  if (!config_.model.hf.empty()) {
    mc = model::load_hf_config((std::filesystem::path(config_.model.hf) / "config.json").string());
    ST_CHECK(hf_shape_only || tokenizer_->vocab_size() <= mc.vocab_size, "`model.hf` = `", config_.model.hf,
             "` has a vocabulary of ", mc.vocab_size, ", fewer than the ", tokenizer_->vocab_size(), " tokens of ",
             tokenizer_choice.reason, "; name the model's own tokenizer with `data.tokenizer`, which takes ",
             kDataTokenizerValues);
    ST_CHECK(config_.training.seq_len <= mc.max_seq_len, "`training.seq_len` (", config_.training.seq_len,
             ") exceeds the max_position_embeddings (", mc.max_seq_len, ") of `model.hf`");
    if (bench_)
      log::info(fmt::format("bench: the model's shape from `{}`, its weights random (not read)", config_.model.hf));
    else if (config_.parallel.hf_load == "ranges" || comm_->rank() == 0)  // rank0: the others never open it
      hf_weights = std::make_unique<io::HfWeights>(config_.model.hf);
  } else {
    mc = llama_config(config_.model, tokenizer_->vocab_size());
    if (!config_.model.preset.empty())
      log::info(fmt::format("model: the shape of preset {} ({} parameters), its weights random", config_.model.preset,
                            mc.num_parameters()));
  }
  // checkpoint.resume, read before the data and the model: a run whose checkpoint has done all
  // its steps (a requeue after the end) builds nothing more and ends with success
  std::optional<CheckpointInfo> resume_from;
  const auto already_complete = [&](const std::string& dir) {
    if (!resume_from || resume_from->step < config_.training.steps) return false;
    complete_at_step_ = resume_from->step;
    complete_checkpoint_ = dir;
    log::info(fmt::format("the run is already complete at step {}: checkpoint `{}` has done all `training.steps` "
                          "= {}; nothing to train",
                          resume_from->step, dir, config_.training.steps));
    return true;
  };
  std::string resume_dir;
  if (!config_.checkpoint.resume.empty()) {
    const std::string dir = resolve_checkpoint(config_.checkpoint.resume, checkpoint_root());
    if (dir.empty()) {
      log::info(fmt::format("checkpoint.resume = auto: no checkpoint under {}; starting fresh", checkpoint_root()));
    } else {
      resume_from = read_checkpoint_info(dir);
      resume_dir = dir;
      ST_CHECK(model::to_hf_config(resume_from->config, "float32") == model::to_hf_config(mc, "float32"),
               "checkpoint `", dir, "` holds a different model (", resume_from->config.summary(), ") than this job (",
               mc.summary(), ")");
      if (config_.training.epochs == 0 && already_complete(dir)) return;  // with epochs, known once the data is read
    }
  }
  AutoSeqLen seq_len;
  seq_len.model_max_seq_len = mc.max_seq_len;
  data_ = open_training_data(config_, *tokenizer_, mc.vocab_size, dp_size, comm_, local_rank(), &seq_len);
  log::info("data: " + data_->summary());
  resolve_run_shape(seq_len);
  phases.done("data");
  if (config_.training.epochs > 0 && already_complete(resume_dir)) return;
  document_mask_ = resolve_document_mask(config_.data);
  ST_CHECK(!document_mask_ || tokenizer_->bos_id() >= 0,
           "`data.document_mask` finds documents by their BOS token, and the tokenizer (`data.tokenizer` = ",
           config_.data.tokenizer, ") has none; set data.document_mask = off");
  if (document_mask_)
    log::info("data.document_mask: each document (from a BOS token) attends only to itself, positions from 0");
  if (config_.eval.enabled) {
    // Evaluation runs at least once, at the end: a held-out split with no batch would otherwise
    // fail only after the whole run, before its last checkpoint. (Examples evaluate a partial
    // batch; ranks past the split's end evaluate rows that count nothing.)
    const int64_t B = config_.training.batch_size, T = config_.training.seq_len;
    ST_CHECK(data_->eval_batches(B, T) >= 1, "the held-out split has ", data_->held_out_size(),
             ", fewer than one evaluation batch (`training.batch_size` ", B, " sequences of `training.seq_len` ", T,
             " + 1 tokens); evaluation runs at least at the end of training: raise `data.val_fraction`, use more "
             "data, or set `eval.enabled` = false");
  }
  if (comm_->name() != "nccl") device_ = resolve_device(config_.training.device);
  ST_CHECK(device_.is_cpu() || comm_->world_size() == 1 || comm_->name() == "nccl", "training on ",
           comm_->world_size(), " GPUs needs the NCCL communicator, not `", comm_->name(), "`");
  const DType dtype = resolve_dtype(config_.model.dtype, device_);
  // Mixed precision: compute in `dtype`; master weights, gradients and optimizer state in f32.
  const DType master = dtype == DType::kF64 ? DType::kF64 : DType::kF32;
  layout_ = std::make_unique<model::ModelLayout>(model::ModelLayout::llama(mc, mesh_->shape(), mesh_->tp_rank()));
  fsdp::ShardingOptions so;
  so.compute_dtype = dtype;
  so.grad_dtype = so.master_dtype = so.reduce_dtype = master;
  if (config_.parallel.reduce_dtype == "bf16") {
    ST_CHECK(device_.is_cuda(), "`parallel.reduce_dtype` = bf16 needs GPUs (NCCL); MPI reduces f32");
    so.reduce_dtype = DType::kBF16;
  }
  so.reshard_after_forward = config_.parallel.reshard_after_forward;
  so.reductions_in_flight = static_cast<int>(config_.parallel.reductions_in_flight);
  so.keep_last_block_gathered = config_.parallel.keep_last_block_gathered;
  if (config_.parallel.offload) {
    ST_CHECK(device_.is_cuda(), "`parallel.offload` = true moves each rank's shards and AdamW state from its GPU to "
             "host memory; this run trains on the CPU (`training.device` = `", config_.training.device,
             "`), where they are in host memory already");
    so.offload = true;  // the store keeps the bf16 compute shards then (what travels up)
    so.offload_grads = config_.parallel.offload_gradients;
  }
  ST_CHECK(config_.parallel.offload_gradients || config_.parallel.offload, "`parallel.offload_gradients` = false "
           "keeps the gradient shards on the GPU while `parallel.offload` moves the rest to host memory; without "
           "`parallel.offload` = true every shard is on the GPU already");
  ST_CHECK(!config_.training.offload_activations || device_.is_cuda(), "`training.offload_activations` = true moves "
           "activations from the GPU to host memory; this run trains on the CPU (`training.device` = `",
           config_.training.device, "`), where they are in host memory already");
  // The launch's automatic choices, once, before any page-locked memory is taken: a host too
  // small for what they put there fails here, naming the keys that help, not inside the driver
  // or the kernel's out-of-memory killer.
  model_config_ = mc;
  fp8_ = fp8_choice();
  checkpointing_ = checkpointing();
  compute_shards_ = compute_shards(checkpointing_);
  if (config_.training.offload_activations) offload_blocks_ = offload_activation_blocks(checkpointing_, compute_shards_);
  if (device_.is_cuda() && (config_.parallel.offload || offload_blocks_ > 0)) {
    const PlanInput in = chosen_plan_input();
    const int64_t local_ranks = std::max(1, dist::local_ranks_from_env());  // ranks sharing this machine's memory
    const std::string problem = host_memory_problem(in, plan_memory(in), host_memory_bytes() / local_ranks);
    ST_CHECK(problem.empty(), "host memory", local_ranks > 1 ? fmt::format(" ({} ranks on this machine)", local_ranks)
                                                            : std::string(), ": ", problem);
  }
  store_ = std::make_unique<fsdp::ShardedUnitStore>(*layout_, *mesh_, so, device_);
  phases.done(store_->offloaded() ? "shards (page-locked host memory)" : "shards");
  if (!config_.model.hf.empty() && !bench_) {
    // each rank reads only the element ranges of its own shards, or rank 0 reads everything
    const io::HfWeights* w = hf_weights.get();
    const fsdp::ShardedUnitStore::ParamReader read = [&](const model::ParamSpec& p, int64_t first, Tensor& out) {
      const io::TensorInfo& t = w->get(p.name);
      ST_CHECK(Shape(t.shape.begin(), t.shape.end()) == p.full_shape, "`", config_.model.hf, "`: tensor `", p.name,
               "` has shape ", Shape(t.shape.begin(), t.shape.end()).str(), ", config.json implies ",
               p.full_shape.str());
      w->read_range(p.name, first, out);
    };
    if (config_.parallel.hf_load == "rank0")
      store_->load_from_rank0(read);
    else
      store_->load(read);
    size_t tensors = 0;
    for (const model::UnitLayout& unit : layout_->units()) tensors += unit.params.size();
    log::info(fmt::format("loaded {} tensors from {} ({})", tensors, config_.model.hf,
                          config_.parallel.hf_load == "rank0" ? "read by rank 0, sent unit by unit" : "each rank its ranges"));
  } else {
    store_->init_random(config_.training.seed, mc.init_std);
  }
  phases.done(!config_.model.hf.empty() && !bench_ ? "weights read" : "weights initialised");
  model_ = std::make_unique<model::Llama>(mc, *layout_, store_.get(), dtype, device_);
  if (mesh_->shape().tensor_parallel > 1) {
    tensor_parallel_ = fsdp::make_tensor_parallel(&mesh_->tensor_parallel());
    model_->set_tensor_parallel(tensor_parallel_.get());
  }
  model_->set_mlp_chunk_tokens(mlp_chunk_tokens());
  const ops::LinearFp8 head_fp8 = fp8_head_choice();
  model_->set_fp8(fp8_, head_fp8);
  if (fp8_attention_choice(dtype)) {
    model_->set_fp8_attention(true);
    log::info(std::string("training.fp8_attention = true: the attention forward's products in FP8 e4m3 (cuDNN)") +
              (mc.sliding_layer_count() > 0 ? "; the sliding-window layers attend in bf16" : ""));
  }
  auto format = [](const ops::LinearFp8& f) { return f.gradient_format == DType::kF8E4M3 ? "e4m3" : "e5m2"; };
  if (fp8_.on())
    log::info(fmt::format("training.fp8 = {}: the blocks' linears multiply in FP8 (x and weights e4m3, gradients {}){}{}",
                          ops::fp8_recipe_name(fp8_.recipe), format(fp8_),
                          head_fp8.on() ? fmt::format(", and the head (its gradient {})", format(head_fp8)) : "",
                          device_.is_cpu() ? "; emulated on the CPU, exact but no faster" : ""));
  optim::AdamWConfig oc;
  oc.beta1 = config_.optimizer.beta1;
  oc.beta2 = config_.optimizer.beta2;
  oc.eps = config_.optimizer.eps;
  oc.weight_decay = config_.optimizer.weight_decay;
  oc.decay_1d = config_.optimizer.decay_1d;
  oc.host_f32 = store_->offloaded();
  optimizer_ = std::make_unique<optim::AdamW>(*layout_, comm_->rank(), oc, master, store_->shard_device());
  if (store_->offloaded())
    log::info(fmt::format("parallel.offload: shards in {} of page-locked host memory, AdamW state in {} more{}; "
                          "AdamW runs on the host ({} threads)",
                          format_bytes(store_->pinned_bytes()),
                          format_bytes(8 * layout_->total_numel() / mesh_->shape().replica_ranks()),
                          config_.parallel.offload_gradients ? "" : "; gradient shards on the GPU",
                          omp_get_max_threads()));
  log::info(fmt::format("model: {} ({} compute, {} master weights, on {})", mc.summary(), dtype_name(dtype),
                        dtype_name(master), device_.str()));
  phases.done("model and optimizer");
  if (resume_from) {
    const CheckpointInfo& info = *resume_from;
    load_checkpoint(info, *store_, optimizer_.get());
    start_step_ = info.step + 1;
    log::info(fmt::format("resumed from {} (step {}, written by {} rank{})", info.path, info.step, info.world_size,
                          info.world_size == 1 ? "" : "s"));
    phases.done("checkpoint read");
  }
  if (comm_->world_size() > 1) {
    int64_t slots = 0;
    for (const model::UnitLayout& u : layout_->units()) slots += u.shard_numel();
    const model::Mesh& m = mesh_->shape();
    std::string shape;
    if (m.tensor_parallel > 1)
      shape = fmt::format(" as {} data-parallel x {} tensor-parallel (the group's rows moved by {})", m.data_parallel,
                          m.tensor_parallel, tensor_parallel_->exchange_route());
    if (m.replicate > 1)
      shape += fmt::format("{} {} replicas of {} rank{} (gradients summed between replicas)",
                           shape.empty() ? " as" : ",", m.replicate, m.replica_ranks(),
                           m.replica_ranks() == 1 ? "" : "s");
    log::info(fmt::format("sharded over {} ranks ({}){}: {} parameter slots per rank, of {} in the model",
                          comm_->world_size(), comm_->name(), shape, slots, model_config_.num_parameters()));
  }
  log::info(phases.summary());
}

void Trainer::prepare_output_folders() {
  const int rank = comm_->rank();
  const std::filesystem::path out_dir(config_.run.output_dir);
  // a save happens at checkpoint.interval_steps, or when a signal or the time limit stops the run
  const bool saves = config_.checkpoint.interval_steps > 0 || config_.checkpoint.on_signal ||
                     !config_.training.time_limit.empty();
  const std::string checkpoint_key = config_.checkpoint.dir.empty() ? "run.output_dir" : "checkpoint.dir";
  std::string error, overwritten;
  try {
    // another run's checkpoints or metrics here: resumed, started over, or refused
    if (config_.checkpoint.resume.empty()) {
      const std::vector<std::string> earlier = earlier_run(config_);
      ST_CHECK(earlier.empty() || config_.run.overwrite, "`run.output_dir` = \"", config_.run.output_dir,
               "\" holds another run (", fmt::format("{}", fmt::join(earlier, "; ")), "): resume it with "
               "--checkpoint.resume=auto, start over with --run.overwrite=true (removes its checkpoints, metrics and log), "
               "or choose another --run.output_dir");
      if (!earlier.empty() && rank == 0)
        overwritten = fmt::format("run.overwrite: removed the earlier run in {}: {}", config_.run.output_dir,
                                  fmt::join(remove_earlier_run(config_), ", "));
    }
    check_writable_folder(config_.run.output_dir, "run.output_dir", rank);
    if (saves) check_writable_folder(checkpoint_root(), checkpoint_key, rank);  // every rank writes its file there
    if (rank == 0) {
      if (!config_.logging.metrics_file.empty())
        check_writable_folder((out_dir / config_.logging.metrics_file).parent_path().string(), "logging.metrics_file",
                              rank);
      if (!config_.logging.tensorboard_dir.empty())
        check_writable_folder((out_dir / config_.logging.tensorboard_dir).string(), "logging.tensorboard_dir", rank);
      if (!config_.export_.folder.empty()) {
        // the export is written beside its folder and swapped in: the parent is probed, and the
        // folder itself is only checked for files an export would not write (run_paths.h)
        check_export_location(config_.export_.folder, "export.folder", rank);
        const std::vector<std::string> removed = remove_interrupted_exports(config_.export_.folder);
        if (!removed.empty())
          log::info(fmt::format("removed what interrupted exports left beside {}: {}", config_.export_.folder,
                                fmt::join(removed, ", ")));
      }
      // no save of this run has started: whatever temporaries are there were left by others
      for (const auto& [folder, checkpoints] :
           {std::pair<std::string, bool>(checkpoint_root(), true), {config_.export_.folder, false}}) {
        if (folder.empty()) continue;
        const std::vector<std::string> removed = remove_interrupted_writes(folder, checkpoints);
        std::string names;
        for (const std::string& n : removed) names += (names.empty() ? "" : ", ") + n;
        if (!removed.empty())
          log::info(fmt::format("removed what interrupted {} left in {}: {}", checkpoints ? "saves" : "exports",
                                folder, names));
      }
    }
  } catch (const Error& e) {
    error = e.what();
  }
  // the ranks agree, so that none waits in a collective for one that stopped here
  Tensor failed = Tensor::empty({1}, DType::kI64, Device::cpu(), "folder checks failed");
  failed.data<int64_t>()[0] = error.empty() ? 0 : 1;
  comm_->all_reduce(failed, dist::ReduceOp::kSum);
  ST_CHECK(error.empty(), error, "; every folder the run writes is checked before the first step");
  ST_CHECK(failed.data<int64_t>()[0] == 0, failed.data<int64_t>()[0], " rank(s) found a folder the run writes not "
           "writable (their error names it)");
  // the run folder remembers the run: its config, and its log from here on (appended when resumed)
  if (rank == 0) {
    io::write_file_atomic((out_dir / kRunConfigFile).string(), config_toml(config_));
    log::set_file((out_dir / kRunLogFile).string(), !config_.checkpoint.resume.empty());
    log_file_open_ = true;
    if (!overwritten.empty()) log::info(overwritten);
  }
}

// run() leaves no host update in flight, however it ends; the run folder's log is closed
Trainer::~Trainer() {
  if (log_file_open_) log::set_file("", false);
}

void Trainer::watch_io(std::string what) {
  if (!watchdog_) return;
  watchdog_->watch(std::move(what), config_.parallel.timeout_s,
                   fmt::format("parallel.timeout_s = {:g}", config_.parallel.timeout_s), true);
}

std::unique_ptr<Watchdog> Trainer::make_watchdog() const {
  // every communicator of the mesh, once each, for errors NCCL finds on its own
  const std::initializer_list<const dist::Communicator*> all = {
      comm_, &mesh_->world(), &mesh_->tensor_parallel(), &mesh_->data_parallel(), &mesh_->replica(),
      &mesh_->block_shards(), mesh_->across_replicas()};
  std::vector<const dist::Communicator*> comms;
  for (const dist::Communicator* c : all)
    if (c != nullptr && std::find(comms.begin(), comms.end(), c) == comms.end()) comms.push_back(c);
  return std::make_unique<Watchdog>([comms] {
    for (const dist::Communicator* c : comms)
      if (std::string error = c->async_error(); !error.empty()) return error;
    return std::string();
  });
}

Tensor Trainer::positions_of(const Tensor& ids_BT) const {
  return document_mask_ ? ops::document_positions(ids_BT, tokenizer_->bos_id()) : Tensor();
}

TrainSummary Trainer::run() {
  if (complete_at_step_ >= 0) {  // said when constructed
    TrainSummary done;
    done.already_complete_at = complete_at_step_;
    export_finished_run();
    return done;
  }
  const TrainingSection& tc = config_.training;
  const int64_t B = tc.batch_size, T = tc.seq_len, accum = tc.grad_accum_steps;
  if (!bench_) std::filesystem::create_directories(config_.run.output_dir);  // a bench writes no files
  const std::filesystem::path out_dir(config_.run.output_dir);
  const bool rank0 = comm_->rank() == 0;
  JsonlSink jsonl(config_.logging.metrics_file.empty() || !rank0 ? std::string()
                                                                  : (out_dir / config_.logging.metrics_file).string(),
                  start_step_);
  TensorBoardSink tensorboard(config_.logging.tensorboard_dir.empty() || !rank0
                                  ? std::string()
                                  : (out_dir / config_.logging.tensorboard_dir).string(),
                              start_step_);
  if (!tensorboard.path().empty()) log::info("logging.tensorboard_dir: writing `" + tensorboard.path() + "`");
  const auto write_metrics = [&](const nlohmann::json& record) {
    jsonl.write(record);
    tensorboard.write(record);
  };
  const optim::ScheduleConfig sc = schedule_config(config_);
  model::StepOptions so;
  so.checkpointing = checkpointing_;
  so.deterministic = tc.deterministic;
  store_->set_compute_shards(compute_shards_);
  so.offload_activations = offload_blocks_ > 0;  // a GPU's (checked at construction)
  so.offload_activation_blocks = offload_blocks_;
  so.loss_chunk_tokens = loss_chunk_tokens();
  if (const int64_t piece = model_->mlp_chunk_tokens();
      piece > 0 && piece < B * T && model::mlp_recomputed(so.checkpointing))
    log::info(fmt::format("training.mlp_chunk_tokens: each block's MLP runs {} of a micro-batch's {} tokens at a time",
                          piece, B * T));
  // One rank on a GPU: each micro-batch is a CUDA graph replay after the first step. The
  // per-op profile synchronises around every op, which a graph capture forbids: it runs eagerly.
  bool graphed = tc.cuda_graph && device_.is_cuda() && comm_->world_size() == 1;
  if (graphed && store_->offloaded()) {
    log::info("parallel.offload: the step runs eagerly, not as a CUDA graph (the host adds and clears gradients)");
    graphed = false;
  }
  if (graphed && document_mask_) {
    log::info("data.document_mask: the step runs eagerly, not as a CUDA graph (the documents differ per batch)");
    graphed = false;
  }
  if (graphed && profile::enabled()) {
    log::info("SHARDTRAIN_PROFILE=1: the step runs eagerly, not as a CUDA graph (training.cuda_graph)");
    graphed = false;
  }
  // The first micro-batch of a step writes the gradients over the last step's (no zero-fill),
  // unless one graph replays every micro-batch of several: then all of them add.
  const model::GradientWrites writes = model::gradient_writes(graphed, accum, store_->grads_in_shards());
  so.overwrite_grads = writes.overwrites(0);
  std::unique_ptr<model::CapturedStep> captured;
  if (graphed) captured = std::make_unique<model::CapturedStep>(*model_, B, T, so);

  std::vector<Tensor> ids, targets;
  for (int64_t m = 0; m < accum; ++m) {
    ids.push_back(Tensor::empty({B, T}, DType::kI32, Device::cpu(), "ids"));
    targets.push_back(Tensor::empty({B, T}, DType::kI32, Device::cpu(), "targets"));
  }
  const fsdp::ShardedUnitStore::OptimizerTargets targets_of_step = store_->optimizer_targets();
  const std::vector<const Tensor*>& cgrads = targets_of_step.grads;
  // An offloaded step's host update reads these targets on its own thread beside the next
  // step: however this function ends, the update is over before they go.
  struct HostUpdateFinisher {
    const fsdp::ShardedUnitStore& store;
    ~HostUpdateFinisher() {
      try {
        store.wait_for_host_update();
      } catch (...) {  // only when leaving by another error; the normal end waits below and rethrows
      }
    }
  } finish_host_update{*store_};
  const int64_t world = comm_->world_size(), rank = comm_->rank();
  // the batch is split over the data-parallel ranks; a tensor-parallel group shares its rows
  const int64_t dp = mesh_->shape().data_parallel, dp_rank = mesh_->dp_rank();
  // [0]: counted tokens, then the loss sum; [1..3]: ranks that received SIGTERM, SIGUSR1, SIGINT;
  // [4]: ranks whose clock says training.time_limit leaves no room for another step and a save;
  // [5]: ranks whose last update left NaN or inf in their master weights or AdamW's state
  Tensor reduce_buf = Tensor::zeros({6}, DType::kF64, Device::cpu(), "step totals");
  NonfiniteSkips nonfinite_skips(tc.nonfinite_skips);
  // The last update's NaN and inf, flagged in AdamW's own pass and read once it is done: right
  // after a step (parallel.offload: where the step waited for its host update, else at the next
  // step, whose forward took every unit from it). A step with several ranks agrees on them in
  // the next step's totals ([5]), or before a save or the export in a reduction of their own.
  int64_t updated_step = 0;  // the step of the last update this run (0: none yet)
  bool update_unread = false;
  std::vector<std::string> nonfinite_state;  // this rank's findings (optim::AdamW::nonfinite_parameters)
  const auto read_update = [&] {
    if (!update_unread) return;
    store_->wait_for_host_update();
    nonfinite_state = optimizer_->nonfinite_parameters();
    update_unread = false;
  };
  const auto stop_if_nonfinite_state = [&](double ranks) {
    if (ranks > 0)
      throw_nonfinite_update(updated_step, nonfinite_state, static_cast<int64_t>(ranks), world,
                             optim::learning_rate(sc, updated_step));
  };
  // before a save or the export: every rank reads and agrees now
  const auto agree_update_finite = [&] {
    read_update();
    Tensor found = Tensor::empty({1}, DType::kF64, Device::cpu(), "nonfinite state");
    found.data<double>()[0] = nonfinite_state.empty() ? 0.0 : 1.0;
    if (world > 1) comm_->all_reduce(found, dist::ReduceOp::kSum);
    stop_if_nonfinite_state(found.data<double>()[0]);
  };
  const double time_limit = parse_duration_seconds(config_.training.time_limit);
  double last_save_seconds = -1;  // the last checkpoint's save, for the time limit's margin

  std::string decay;  // warmup-stable-decay: where the decay starts
  if (config_.schedule.decay_fraction < 1.0 && sc.type != optim::ScheduleType::kConstant) {
    int64_t start = tc.steps;
    while (start > 0 && optim::learning_rate(sc, start) < sc.peak_lr) --start;
    decay = fmt::format(", stable until step {}, then decaying", start);
  }
  log::info(fmt::format("training: {} steps x {} sequences x {} tokens ({} tokens per step), lr {} {} with {} "
                        "warmup steps{}, {} thread{} per rank",
                        tc.steps, B * accum * dp, T, B * T * accum * dp, config_.optimizer.lr, config_.schedule.type,
                        config_.schedule.warmup_steps, decay, omp_get_max_threads(),
                        omp_get_max_threads() == 1 ? "" : "s"));
  if (config_.schedule.warmup_steps > tc.steps)
    log::warn(fmt::format("schedule.warmup_steps ({}) exceeds training.steps ({}): the learning rate never reaches "
                          "optimizer.lr",
                          config_.schedule.warmup_steps, tc.steps));
  // MFU: torchtitan's FLOPs per token against the device's dense bf16 peak (when known)
  double peak_flops = 0;
#ifdef SHARDTRAIN_WITH_CUDA
  if (device_.is_cuda()) {
    peak_flops = cuda::dense_bf16_peak_flops(device_.index);
    profile::set_roofline(peak_flops, cuda::memory_bandwidth(device_.index));
  }
#endif
  // the board's power and clock over each log window and the run (logging.gpu_power)
  GpuMonitor power;
#ifdef SHARDTRAIN_WITH_CUDA
  if (device_.is_cuda() && config_.logging.gpu_power) {
    power = GpuMonitor::open(cuda::pci_bus_id(device_.index));
    if (!power.available()) log::info("GPU power readings off: " + power.why_unavailable());
  }
#endif
  GpuActivity window_power, run_power;
  const double flops_per_token = model_->config().flops_per_token(T);
  auto mfu = [&](double tokens_per_second) {
    return peak_flops > 0 ? flops_per_token * tokens_per_second / static_cast<double>(world) / peak_flops : 0.0;
  };
  auto peak_device_bytes = [&] { return allocator_for(device_).stats().peak_allocated_bytes; };
  TrainSummary summary;
  // An evaluation: the log line, the metrics (a mix's sources' losses as eval_loss/<name>), the summary.
  const auto report_eval = [&](int64_t step, const StopSignals* stop) {
    Evaluation evaluation = evaluate(stop);
    if (evaluation.stop.signal != 0) return evaluation;
    const double e = evaluation.loss;
    summary.evals.emplace_back(step, e);
    nlohmann::json record = {{"step", step}, {"eval_loss", e}};
    std::string parts;
    for (const auto& [name, loss] : evaluation.parts) {
      record["eval_loss/" + name] = loss;
      parts += fmt::format("{}{} {:.4f}", parts.empty() ? "  (" : ", ", name, loss);
    }
    if (!parts.empty()) parts += ")";
    log::info(fmt::format("eval  step {:>5}  held-out loss {:.4f}  perplexity {:.2f}{}", step, e, std::exp(e), parts));
    write_metrics(record);
    summary.last_eval_parts = std::move(evaluation.parts);
    return evaluation;
  };
  // parallel.timeout_s: a step or evaluation batch of several ranks without progress for that long ends the run
  if (world > 1 && config_.parallel.timeout_s > 0) watchdog_ = make_watchdog();
  struct Unwatch {
    std::unique_ptr<Watchdog>& watchdog;
    ~Unwatch() { watchdog.reset(); }
  } unwatch{watchdog_};
  if (config_.eval.enabled && config_.eval.at_start && !bench_ && tc.steps > 0) {
    const profile::Region region("evaluation");
    report_eval(start_step_ - 1, nullptr);  // the loss the run starts from
  }
  Progress progress(comm_->rank() == 0 ? config_.logging.progress : "off", tc.steps);
  // checkpoint.on_signal: SIGTERM, SIGUSR1 or SIGINT at any rank stops every rank after the
  // same step, which then saves a checkpoint
  std::optional<StopSignals> stop_signals;
  if (config_.checkpoint.on_signal) stop_signals.emplace();
  int64_t last_step = start_step_ - 1;
  const Clock::time_point start = Clock::now();
  double train_seconds = 0;
  // Rates in the log cover the steps since the previous log line; the first step (plans,
  // caches, warm-up) is timed alone, and the ETA and the final rate leave it out.
  double window_seconds = 0, window_comm_wait = 0, window_offload_wait = 0;
  int64_t window_steps = 0;
  const double tokens_per_step = static_cast<double>(B * T * accum * dp);
  const int64_t first_step = start_step_;
  // the steps the run's figures cover: all but the first (plans, caches, the graph's capture),
  // or all but a bench's warm-up
  const int64_t timed_from = first_step + (bench_ ? bench_->warmup_steps : 1);
  TimedSteps& timed = summary.timed;
  for (int64_t step = first_step; step <= tc.steps; ++step) {
    if (step == timed_from && profile::enabled()) profile::reset_totals();  // the per-op table covers the timed steps
    std::optional<profile::Region> step_region(std::in_place, "step", step);  // the step's own work
    if (watchdog_) {
      // the first step of a launch also plans, times GEMM algorithms and fills caches
      const double limit = config_.parallel.timeout_s + (step == first_step ? config_.parallel.init_timeout_s : 0.0);
      watchdog_->watch(fmt::format("step {}", step), limit,
                       step == first_step ? fmt::format("parallel.timeout_s + parallel.init_timeout_s = {:g} s for the "
                                                        "first step", limit)
                                          : fmt::format("parallel.timeout_s = {:g}", limit));
    }
    const Clock::time_point t0 = Clock::now();
    // This rank draws sequences dp_rank*B .. dp_rank*B + B-1 of each micro-batch of the global
    // batch (the ranks of a tensor-parallel group draw the same ones).
    int64_t counted = 0;
    for (int64_t m = 0; m < accum; ++m) {
      data_->fill_train(ids[m], targets[m], step, m, dp_rank * B);
      const int32_t* t = targets[m].data<int32_t>();
      for (int64_t i = 0; i < B * T; ++i) counted += t[i] != so.ignore_index;
    }
    reduce_buf.data<double>()[0] = static_cast<double>(counted);
    mesh_->data_parallel().all_reduce(reduce_buf, dist::ReduceOp::kSum);  // a group's ranks share the batch
    const double global_counted = reduce_buf.data<double>()[0];
    const double t_data = seconds_since(t0);
    const Clock::time_point t1 = Clock::now();
    if (writes.zero_shards) store_->zero_grad_shards();
    so.grad_scale = 1.0 / global_counted;  // gradient of the mean loss over the global batch
    double loss_sum = 0, t_forward = 0, t_backward = 0;
    for (int64_t m = 0; m < accum; ++m) {
      so.overwrite_grads = writes.overwrites(m);
      store_->set_sync_replicas(m + 1 == accum);  // replicas exchange the step's gradients once
      loss_sum += captured ? captured->run(ids[m], targets[m], so.grad_scale).loss_sum
                           : model_->forward_backward(ids[m], targets[m], so, positions_of(ids[m])).loss_sum;
      t_forward += model_->last_phase_times().forward_s;
      t_backward += model_->last_phase_times().backward_s;
    }
    if (after_backward_) after_backward_(step);
    read_update();
    reduce_buf.data<double>()[0] = loss_sum;  // of this rank's token rows
    reduce_buf.data<double>()[5] = nonfinite_state.empty() ? 0.0 : 1.0;
    write_stop_flags(reduce_buf.data<double>() + 1, stop_signals ? stop_signals->received() : 0);
    if (time_limit > 0) {
      // this step so far, and the steps before (the first alone before there are more)
      const double step_estimate = std::max(seconds_since(t0), timed.steps > 0 ? timed.seconds / static_cast<double>(timed.steps)
                                                                                : train_seconds);
      const double save_estimate = last_save_seconds >= 0 ? last_save_seconds : step_estimate;
      reduce_buf.data<double>()[4] =
          seconds_since(g_process_start) + step_estimate + save_estimate > time_limit ? 1.0 : 0.0;
    }
    comm_->all_reduce(reduce_buf, dist::ReduceOp::kSum);
    stop_if_nonfinite_state(reduce_buf.data<double>()[5]);
    StopAgreement stop = agreed_stop(reduce_buf.data<double>() + 1);  // the signal every rank stops for
    const bool time_up = stop.signal == 0 && reduce_buf.data<double>()[4] > 0 && step < tc.steps;
    bool stopping = stop.signal != 0 || time_up;
    loss_sum = reduce_buf.data<double>()[0];
    const double t_fwd_bwd = seconds_since(t1);
    const Clock::time_point t2 = Clock::now();
    std::optional<profile::Region> optimizer_region(std::in_place, "optimizer");
    // offloaded with one micro-batch, the GPU summed the squares as the gradients went down
    const std::optional<double> landed = store_->landed_grad_sum_squares();
    double norm = 0;
    if (landed) {
      norm = optim::grad_norm_from_sum_squares(*landed, comm_);
    } else if (mesh_->shape().tensor_parallel > 1 || mesh_->shape().replicate > 1) {
      // a group's copies of its replicated parameters (the blocks' norms), and the replicas'
      // copies of every gradient, count once
      const std::vector<Tensor> parts = store_->grad_norm_parts();
      std::vector<const Tensor*> views;
      for (const Tensor& p : parts) views.push_back(&p);
      norm = optim::global_grad_norm(views, comm_);
    } else {
      norm = optim::global_grad_norm(cgrads, comm_);
    }
    const double lr = optim::learning_rate(sc, step);
    const double clip = optim::clip_coefficient(norm, tc.max_grad_norm);  // applied inside the update
    // the norm and the loss are all-reduced: every rank skips alike (training.nonfinite_skips)
    const bool skip = nonfinite_skips.skip(step, loss_sum / global_counted, norm);
    const bool eval_now = !bench_ && !stopping && config_.eval.enabled &&
                          ((config_.eval.interval_steps > 0 && step % config_.eval.interval_steps == 0) || step == tc.steps);
    const int64_t every = config_.checkpoint.interval_steps;
    bool checkpoint_now = (every > 0 && (step % every == 0 || step == tc.steps)) || stopping;
    if (skip && store_->offloaded()) {
      // no update, but the next forward takes each unit from this step's host update as ever
      const size_t units = targets_of_step.params.size();
      store_->run_host_update([units](const fsdp::ShardedUnitStore::UnitDone& done) {
        for (size_t u = 0; u < units; ++u) done(u);
      });
      if (eval_now || checkpoint_now) store_->wait_for_host_update();
    } else if (store_->offloaded()) {
      // on the host's cores beside the next step's forward, which takes each unit as it is
      // written; complete within this step where an evaluation, a checkpoint or the end follows
      store_->run_host_update([&, lr, clip](const fsdp::ShardedUnitStore::UnitDone& done) {
        optimizer_->step_units(targets_of_step.params, cgrads, lr, clip, targets_of_step.compute_copies, done);
      });
      if (eval_now || checkpoint_now) store_->wait_for_host_update();
    } else if (!skip) {
      optimizer_->step(targets_of_step.params, cgrads, lr, clip, targets_of_step.compute_copies);  // writes the compute shards
    }
    synchronize(device_);  // step times are host-clock times of finished device work
    if (!skip) {
      updated_step = step;
      update_unread = true;
      if (!store_->offloaded() || eval_now || checkpoint_now) read_update();  // done already
      if (world == 1) stop_if_nonfinite_state(nonfinite_state.empty() ? 0.0 : 1.0);
    }
    optimizer_region.reset();
    step_region.reset();
    const double t_optim = seconds_since(t2);
    const double step_seconds = seconds_since(t0);
    const double t_comm_wait = store_->take_comm_wait_seconds();  // GPU: compute stood waiting on transfers
    // GPU, activation offload: compute stood waiting on the activations' copies (eager steps)
    const double t_offload_wait = model_->activation_offload() ? model_->activation_offload()->take_wait_seconds() : 0;
    train_seconds += step_seconds;
    window_seconds += step_seconds;
    window_comm_wait += t_comm_wait;
    window_offload_wait += t_offload_wait;
    ++window_steps;
    if (step >= timed_from) {
      timed.seconds += step_seconds;
      ++timed.steps;
      timed.data_s += t_data;
      timed.forward_s += t_forward;
      timed.backward_s += t_backward;
      timed.optimizer_s += t_optim;
      timed.comm_wait_s += t_comm_wait;
    }

    StepRecord r;
    r.step = step;
    r.loss = loss_sum / global_counted;
    r.lr = lr;
    r.grad_norm = norm;
    r.tokens_per_second = tokens_per_step / step_seconds;
    r.skipped_nonfinite = skip;
    summary.steps.push_back(r);
    const int64_t steps_run = step - first_step + 1;
    const double window_tps = tokens_per_step * static_cast<double>(window_steps) / window_seconds;
    const double seconds_per_step =
        timed.steps > 0 ? timed.seconds / static_cast<double>(timed.steps) : train_seconds / static_cast<double>(steps_run);
    const double eta = static_cast<double>(tc.steps - step) * seconds_per_step;
    write_metrics({{"step", step}, {"loss", r.loss}, {"lr", lr}, {"grad_norm", norm},
                   {"tokens_per_second", r.tokens_per_second}, {"elapsed_s", seconds_since(start)},
                   {"time_data_s", t_data}, {"time_forward_s", t_forward}, {"time_backward_s", t_backward},
                   {"time_forward_backward_s", t_fwd_bwd}, {"time_optimizer_s", t_optim},
                   {"peak_host_bytes", allocator_for(Device::cpu()).stats().peak_allocated_bytes},
                   {"peak_resident_bytes", peak_resident_bytes()},
                   {"peak_device_bytes", device_.is_cpu() ? 0 : peak_device_bytes()},
                   {"time_comm_wait_s", t_comm_wait}, {"time_offload_wait_s", t_offload_wait},
                   {"mfu", mfu(r.tokens_per_second)}, {"skipped_nonfinite", skip ? 1 : 0},
                   {"skipped_nonfinite_total", nonfinite_skips.total()}});
    const bool log_now = step == 1 || step % config_.logging.interval_steps == 0 || step == tc.steps;
    if (log_now || step + 1 == timed_from) {
      // the board is read at log lines only (NVML calls stay off the other steps), and before
      // the timed steps, which the run's figures cover
      const GpuActivity part = power.take();
      accumulate(window_power, part);
      if (step >= timed_from) accumulate(run_power, part);
    }
    if (log_now) {
      progress.clear();
      std::string device_part;
      if (device_.is_cuda())
        device_part = fmt::format("  {}MFU {:.1f}%  peak mem {}{}", peak_flops > 0 ? "" : "(peak unknown) ",
                                  100.0 * mfu(window_tps), format_bytes(peak_device_bytes()),
                                  world > 1 ? fmt::format("  comm wait {:.1f}%", 100.0 * window_comm_wait / window_seconds)
                                            : std::string());
      if (so.offload_activations && !graphed)  // a graph's replays are not timed
        device_part += fmt::format("  offload wait {:.1f}%", 100.0 * window_offload_wait / window_seconds);
      if (window_power.samples > 0) {
        // the board over the window; its mean power only once the window is long enough
        const bool watts = std::isfinite(window_power.mean_power_w);
        const std::string w = watts ? fmt::format("{:.0f} W  ", window_power.mean_power_w) : std::string();
        device_part += fmt::format("  {}SM {:.0f} MHz{}", w, window_power.mean_sm_mhz,
                                   window_power.power_capped > 0
                                       ? fmt::format(" (power-capped {:.0f}%)", 100.0 * window_power.power_capped)
                                       : std::string());
        nlohmann::json board = {{"step", step},
                                {"gpu_window_s", window_power.seconds},
                                {"gpu_energy_j", window_power.energy_j},
                                {"gpu_sm_mhz", window_power.mean_sm_mhz},
                                {"gpu_power_capped", window_power.power_capped},
                                {"gpu_power_limit_w", window_power.power_limit_w}};
        if (watts) board["gpu_power_w"] = window_power.mean_power_w;
        write_metrics(board);
      }
      log::info(fmt::format("step {:>5}/{}  loss {:.4f}  lr {:.2e}  grad norm {:.3f}  {:.0f} tok/s{}  elapsed {}  ETA {}",
                            step, tc.steps, r.loss, lr, norm, window_tps, device_part,
                            format_duration(seconds_since(start)), format_duration(eta)));
      window_seconds = window_comm_wait = window_offload_wait = 0;
      window_steps = 0;
      window_power = GpuActivity();
    }
    if (step == first_step && so.offload_activations && model_->activation_offload())
      log::info(fmt::format("training.offload_activations: {} per micro-batch to host memory and back ({} "
                            "page-locked)", format_bytes(model_->activation_offload()->bytes_offloaded()),
                            format_bytes(model_->activation_offload()->host_bytes())));
    if (eval_now) {
      const profile::Region region("evaluation");
      progress.clear();
      if (const Evaluation e = report_eval(step, stop_signals ? &*stop_signals : nullptr); e.stop.signal != 0) {
        stop = e.stop;
        stopping = checkpoint_now = true;
        log::info(fmt::format("evaluation after step {} stopped before batch {} of {} by {}", step,
                              e.batches_done + 1, e.batches, stop_signal_name(stop.signal)));
      }
    }
    // a save, and the check of one being written while training goes on, are watched too,
    // with bytes written to files as progress: a rank stuck writing, or gone, would leave the
    // others in the save's collectives
    if (checkpoint_now)
      watch_io(fmt::format("the checkpoint of step {}", step));
    else if (pending_checkpoint_)
      watch_io(fmt::format("the check that the checkpoint of step {} is written", checkpoint_step_));
    else if (watchdog_)
      watchdog_->idle();
    std::optional<profile::Region> checkpoint_region;
    if (checkpoint_now) checkpoint_region.emplace("checkpoint");
    if (checkpoint_now) {
      agree_update_finite();  // a save never holds NaN or inf
      const SavedStep saved = save_step(step, config_.checkpoint.async && !stopping);
      if (saved.seconds >= 0) last_save_seconds = saved.seconds;
      progress.clear();
      log::info(saved.message);
    }
    checkpoint_region.reset();
    if (pending_checkpoint_ && step > checkpoint_step_ && all_ranks_wrote_checkpoint()) {
      progress.clear();
      commit_pending_checkpoint();
    }
    last_step = step;
    if (stopping) {
      progress.clear();
      std::string why;
      if (stop.signal != 0) {
        summary.stopped_by_signal = stop.signal;
        why = fmt::format("by {}{} (checkpoint.on_signal)", stop_signal_name(stop.signal),
                          world > 1 ? fmt::format(" at {} of the {} ranks", stop.ranks, world) : std::string());
      } else {
        summary.stopped_by_time_limit = true;
        const double elapsed = seconds_since(g_process_start);
        why = fmt::format("{} into training.time_limit = {}: another step and a save would not fit",
                          elapsed < 100 ? fmt::format("{:.1f} s", elapsed) : format_duration(elapsed),
                          config_.training.time_limit);
      }
      log::info(fmt::format("stopped after step {} of {} {}; resume with --checkpoint.resume=auto", step, tc.steps,
                            why));
      break;
    }
    progress.update(step, r.loss, tokens_per_step / seconds_per_step, eta);
  }
  stop_signals.reset();  // signals from here on (the evaluation, export, sample) end the process
  store_->wait_for_host_update();  // the last step's, where nothing after it waited (a bench run)
  summary.skipped_nonfinite = nonfinite_skips.total();
  agree_update_finite();  // before the export, the sample and the summary
  progress.clear();
  if (pending_checkpoint_) {
    watch_io(fmt::format("the commit of the checkpoint of step {}", checkpoint_step_));
    commit_pending_checkpoint();
  }
  if (watchdog_) watchdog_->idle();
  summary.seconds = seconds_since(start);
  const int64_t steps_done = last_step - first_step + 1;
  summary.tokens_per_second = timed.steps > 0 && timed.seconds > 0
                                  ? tokens_per_step * static_cast<double>(timed.steps) / timed.seconds
                              : train_seconds > 0 ? tokens_per_step * static_cast<double>(steps_done) / train_seconds
                                                  : 0.0;
  const std::string timed_part =
      timed.steps == 0 ? std::string()
      : bench_         ? fmt::format(" (after {} warm-up step{})", bench_->warmup_steps, bench_->warmup_steps == 1 ? "" : "s")
                       : std::string(" (after the first step)");
  timed.tokens_per_step = tokens_per_step;
  timed.mfu = mfu(summary.tokens_per_second);
  timed.flops_per_token = flops_per_token;
  timed.peak_flops = peak_flops;
  timed.fp8 = std::string(ops::fp8_recipe_name(fp8_.recipe));
  timed.fp8_head = model_->fp8_head();
#ifdef SHARDTRAIN_WITH_CUDA
  if (device_.is_cuda() && fp8_.on()) timed.fp8_peak_flops = cuda::dense_fp8_peak_flops(device_.index);
#endif
  timed.peak_device_bytes = device_.is_cpu() ? 0 : peak_device_bytes();
  timed.device_total_bytes = gpu_memory_bytes();
  if (device_.is_cuda()) {  // the plan at the launch's choices
    timed.planned_peak_bytes = plan_memory(chosen_plan_input()).peak;
  }
  timed.board = run_power;
  log::info(fmt::format("done: {} steps in {}, {:.0f} tokens/s{}, peak host memory {} in tensors ({} resident){}",
                        steps_done, format_duration(summary.seconds), summary.tokens_per_second, timed_part,
                        format_bytes(allocator_for(Device::cpu()).stats().peak_allocated_bytes),
                        format_bytes(peak_resident_bytes()),
                        device_.is_cpu() ? std::string()
                                         : fmt::format(", peak {} memory {}, MFU {:.1f}%", device_.str(),
                                                       format_bytes(peak_device_bytes()),
                                                       100.0 * mfu(summary.tokens_per_second))));
  if (!bench_) {  // the loss curve of this run's steps on the terminal (random tokens' is no news)
    std::vector<StepValue> losses;
    for (const StepRecord& r : summary.steps) losses.push_back({r.step, r.loss});
    if (const std::string curve = text_curve(losses); !curve.empty()) log::info(curve);
  }
  if (summary.skipped_nonfinite > 0)
    log::warn(fmt::format("{} of the {} steps skipped for a NaN or inf loss or gradient norm (training.nonfinite_skips)",
                          summary.skipped_nonfinite, steps_done));
  if (run_power.samples > 0 && std::isfinite(run_power.mean_power_w) && summary.tokens_per_second > 0)
    log::info(fmt::format("GPU{}: {}; {:.2f} mJ per token{}", world > 1 ? fmt::format(" of rank {}", rank) : std::string(),
                          format_activity(run_power),
                          1e3 * run_power.mean_power_w / (summary.tokens_per_second / static_cast<double>(world)),
                          timed_part));
  if (!device_.is_cpu())
    if (const std::string peak = describe_peak_breakdown(allocator_for(device_)); !peak.empty())
      log::info("SHARDTRAIN_MEMORY_PEAK_REPORT=1: " + peak);
  if (!profile::trace_path().empty())
    log::info("SHARDTRAIN_PROFILE_TRACE: the run's ops and regions (step, block forward and backward, head and loss, "
              "optimizer) in " + profile::write_trace(profile::trace_path(), comm_->rank()) +
              " (open it in ui.perfetto.dev)");
  if (profile::enabled() && comm_->rank() == 0)
    log::info(fmt::format("per-op time {} (SHARDTRAIN_PROFILE=1: synchronised per op, so slower; roofline: "
                          "max(FLOPs / dense bf16 peak, bytes / memory bandwidth) as a share of the op's time)\n",
                          timed.steps > 0 ? fmt::format("from step {} on, as the run's figures", timed_from)
                                          : std::string("over the run")) +
              profile::report_and_reset());
  if (tc.steps == 0 && !bench_ && config_.eval.enabled) report_eval(0, nullptr);
  if (summary.stopped_by_signal != 0 || summary.stopped_by_time_limit) return summary;  // saved; the export and sample wait for the end
  if (!config_.export_.folder.empty()) {
    ExportOptions eo;
    eo.folder = config_.export_.folder;
    eo.dtype = parse_dtype(config_.export_.dtype, "export.dtype");
    eo.max_shard_bytes = config_.export_.max_shard_mb * 1000 * 1000;
    eo.tokenizer_source = tokenizer_source();
    watch_io(fmt::format("the export to {}", eo.folder));
    export_hf(*store_, model_->config(), *comm_, eo, &mesh_->tensor_parallel());
    log::info(fmt::format("exported a Hugging Face folder to {} ({})", eo.folder, config_.export_.dtype));
  }
  watchdog_.reset();  // the sample is not timed
  if (config_.sample.tokens > 0) {
    SampleOptions o;
    // a graph of the decode step would capture the group's collectives: not with tensor parallelism
    o.cuda_graph = mesh_->shape().tensor_parallel == 1;
    o.prompt = config_.sample.prompt;
    o.tokens = config_.sample.tokens;
    o.temperature = config_.sample.temperature;
    o.top_k = config_.sample.top_k;
    o.top_p = config_.sample.top_p;
    o.seed = config_.sample.seed;
    summary.sample = generate(*model_, *tokenizer_, o);
    if (comm_->rank() == 0 && !bench_)
      io::write_file_atomic((std::filesystem::path(config_.run.output_dir) / kRunSampleFile).string(),
                            summary.sample + "\n");
  }
  return summary;
}

}  // namespace shardtrain::train
