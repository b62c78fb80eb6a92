// The Trainer's construction, phase by phase: the communicator (dist/world.h), the run
// folder, the mesh, the tokenizer and model shape, a resumed checkpoint, the data, the
// device and the launch's automatic choices (job.h, trainer_choices.cpp), the shards, the
// weights, the model and the optimizer. Nothing is trained here (trainer.cpp).
#include <algorithm>
#include <filesystem>
#include <optional>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <omp.h>

#include "core/allocator.h"
#include "core/build_info.h"
#include "core/crash_report.h"
#include "core/host.h"
#include "core/log.h"
#include "dist/bootstrap.h"
#include "dist/world.h"
#include "io/hf_folder.h"
#include "io/safetensors_writer.h"
#include "model/hf_config.h"
#include "ops/linear.h"
#include "train/checkpoint.h"
#include "train/run_folder.h"
#include "train/run_paths.h"
#include "train/trainer.h"
#include "train/training_data.h"
#include "train/watchdog.h"

namespace shardtrain::train {

Trainer::Trainer(const JobConfig& config, dist::Communicator* comm, std::optional<BenchMode> bench)
    : config_(bench ? bench_job(config, *bench) : config), bench_(bench), comm_(comm) {
  validate(config_);
  log::set_level(log::parse_level(config_.logging.level));
  log::info(fmt::format("shardtrain {} ({})", build_commit(), build_options()));
  LaunchPhases phases;
  if (comm_ == nullptr) open_communicator();
  if (comm_->world_size() > 1) {
    log::set_rank(comm_->rank(), false);
    crash_report::set_rank(comm_->rank());
  }
  phases.done("communicator");
  if (!bench_) prepare_output_folders();  // a bench writes no files
  mesh_ = make_mesh(config_, comm_);
  // parallel.context_parallel: consecutive ranks split each sequence; the units stay sharded
  // over every rank (the mesh's data-parallel ranks hold data x context), and the groups'
  // places draw different sequences
  if (config_.parallel.context_parallel > 1)
    cp_groups_ = fsdp::split_context_groups(*comm_, static_cast<int>(config_.parallel.context_parallel));
  const int dp_size = data_ranks();
  set_host_threads(config_, *comm_);
  ops::set_gemm_selection(config_.training.gemm_selection == "heuristic" ? ops::GemmSelection::kHeuristic
                                                                         : ops::GemmSelection::kTimed);
  JobModel job = open_job_model(config_, bench_.has_value(), comm_->rank());
  tokenizer_ = std::move(job.tokenizer);
  const model::LlamaConfig& mc = job.config;
  // checkpoint.resume, read before the data and the model: a run whose checkpoint has done all
  // its steps (a requeue after the end) builds nothing more and ends with success
  std::string resume_dir;
  const std::optional<CheckpointInfo> resume_from = find_resume_checkpoint(mc, &resume_dir);
  if (resume_from && config_.training.epochs == 0 && already_complete(resume_from, resume_dir))
    return;  // with epochs, known once the data is read
  open_data(mc, dp_size);
  phases.done("data");
  if (config_.training.epochs > 0 && already_complete(resume_from, resume_dir)) return;
  resolve_data_options();
  if (comm_->name() != "nccl") device_ = resolve_device(config_.training.device);
  ST_CHECK(device_.is_cpu() || comm_->world_size() == 1 || comm_->name() == "nccl", "training on ", comm_->world_size(),
           " GPUs needs the NCCL communicator, not `", comm_->name(), "`");
  const DType dtype = resolve_dtype(config_.model.dtype, device_);
  check_documents_with_capped_scores(config_, document_mask_, device_, dtype, mc);
  // Mixed precision: compute in `dtype`; master weights, gradients and optimizer state in f32.
  const DType master = dtype == DType::kF64 ? DType::kF64 : DType::kF32;
  layout_ = std::make_unique<model::ModelLayout>(model::ModelLayout::llama(mc, mesh_->shape(), mesh_->tp_rank()));
  const fsdp::ShardingOptions sharding = sharding_options(config_, device_, dtype, master);
  // The launch's automatic choices, once, before any page-locked memory is taken: a host too
  // small for what they put there fails here, naming the keys that help, not inside the driver
  // or the kernel's out-of-memory killer.
  model_config_ = mc;
  fp8_ = fp8_choice();
  checkpointing_ = checkpointing();
  compute_shards_ = compute_shards(checkpointing_);
  if (config_.training.offload_activations)
    offload_blocks_ = offload_activation_blocks(checkpointing_, compute_shards_);
  if (device_.is_cuda() && (config_.parallel.offload || offload_blocks_ > 0)) {
    const PlanInput in = chosen_plan_input();
    const int64_t local_ranks = std::max(1, dist::local_ranks_from_env());  // ranks sharing this machine's memory
    const std::string problem = host_memory_problem(in, plan_memory(in), host_memory_bytes() / local_ranks);
    ST_CHECK(problem.empty(), "host memory",
             local_ranks > 1 ? fmt::format(" ({} ranks on this machine)", local_ranks) : std::string(), ": ", problem);
  }
  store_ = std::make_unique<fsdp::ShardedUnitStore>(*layout_, *mesh_, sharding, device_);
  phases.done(store_->offloaded() ? "shards (page-locked host memory)" : "shards");
  load_weights(job.hf_weights.get());
  phases.done(!config_.model.hf.empty() && !bench_ ? "weights read" : "weights initialised");
  build_model(dtype);
  optimizer_ = std::make_unique<optim::AdamW>(
      *layout_, comm_->rank(), adamw_config(config_.optimizer, store_->offloaded()), master, store_->shard_device());
  if (store_->offloaded())
    log::info(fmt::format(
        "parallel.offload: shards in {} of page-locked host memory, AdamW state in {} more{}; "
        "AdamW runs on the host ({} threads)",
        format_bytes(store_->pinned_bytes()), format_bytes(8 * layout_->total_numel() / mesh_->shape().replica_ranks()),
        config_.parallel.offload_gradients ? "" : "; gradient shards on the GPU", omp_get_max_threads()));
  log::info(fmt::format("model: {} ({} compute, {} master weights, on {})", mc.summary(), dtype_name(dtype),
                        dtype_name(master), device_.str()));
  if (mc.rope.scaling.type == ops::RopeScalingType::kLongRope)
    log::info(fmt::format("LongRoPE: training.seq_len {} {} original_max_position_embeddings {}: its {} factors",
                          config_.training.seq_len, mc.rope_long(config_.training.seq_len) ? ">" : "<=",
                          mc.rope.scaling.original_max_positions,
                          mc.rope_long(config_.training.seq_len) ? "long" : "short"));
  phases.done("model and optimizer");
  if (resume_from) {
    const CheckpointInfo& info = *resume_from;
    load_checkpoint(info, *store_, optimizer_.get());
    start_step_ = info.step + 1;
    log::info(fmt::format("resumed from {} (step {}, written by {} rank{})", info.path, info.step, info.world_size,
                          info.world_size == 1 ? "" : "s"));
    phases.done("checkpoint read");
  }
  if (comm_->world_size() > 1) log_sharding();
  log::info(phases.summary());
}

void Trainer::open_communicator() {
  dist::WorldOptions world_options;
  world_options.use_gpus = config_.training.device != "cpu";
  world_options.init_timeout_s = config_.parallel.init_timeout_s;
  dist::World world = dist::make_world(world_options);
  owned_comm_ = std::move(world.comm);
  if (world.gpu_index >= 0) device_ = Device::cuda(world.gpu_index);
  comm_ = owned_comm_.get();
}

std::optional<CheckpointInfo> Trainer::find_resume_checkpoint(const model::LlamaConfig& shape,
                                                              std::string* dir_found) const {
  if (config_.checkpoint.resume.empty()) return std::nullopt;
  const std::string dir = resolve_checkpoint(config_.checkpoint.resume, checkpoint_root());
  if (dir.empty()) {
    log::info(fmt::format("checkpoint.resume = auto: no checkpoint under {}; starting fresh", checkpoint_root()));
    return std::nullopt;
  }
  CheckpointInfo info = read_checkpoint_info(dir);
  *dir_found = dir;
  ST_CHECK(model::to_hf_config(info.config, "float32") == model::to_hf_config(shape, "float32"), "checkpoint `", dir,
           "` holds a different model (", info.config.summary(), ") than this job (", shape.summary(), ")");
  return info;
}

bool Trainer::already_complete(const std::optional<CheckpointInfo>& resume_from, const std::string& dir) {
  if (!resume_from || resume_from->step < config_.training.steps) return false;
  complete_at_step_ = resume_from->step;
  complete_checkpoint_ = dir;
  log::info(fmt::format("the run is already complete at step {}: checkpoint `{}` has done all `training.steps` "
                        "= {}; nothing to train",
                        resume_from->step, dir, config_.training.steps));
  return true;
}

void Trainer::open_data(const model::LlamaConfig& shape, int dp_size) {
  AutoSeqLen seq_len;
  seq_len.model_max_seq_len = shape.max_seq_len;
  data_ = open_training_data(config_, *tokenizer_, shape.vocab_size, dp_size, comm_, local_rank(), &seq_len);
  log::info("data: " + data_->summary());
  resolve_run_shape(seq_len);
}

void Trainer::resolve_data_options() {
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
    const auto& defaulted = config_.fine_tuning_defaults;
    if (data_->eval_batches(B, T) < 1 &&
        std::find(defaulted.begin(), defaulted.end(), "eval.enabled") != defaulted.end()) {
      config_.eval.enabled = false;
      log::warn_shared(
          "the held-out split has " + data_->held_out_size() +
          ": evaluation is off (fine-tuning with eval.enabled not given); raise `data.val_fraction` or give "
          "`data.eval_source` to evaluate");
      return;
    }
    ST_CHECK(data_->eval_batches(B, T) >= 1, "the held-out split has ", data_->held_out_size(),
             ", fewer than one evaluation batch (`training.batch_size` ", B, " sequences of `training.seq_len` ", T,
             " + 1 tokens); evaluation runs at least at the end of training: raise `data.val_fraction`, use more "
             "data, or set `eval.enabled` = false");
  }
}

void Trainer::load_weights(const io::HfWeights* hf_weights) {
  if (config_.model.hf.empty() || bench_) {
    store_->init_random(config_.training.seed, model_config_.init_std);
    return;
  }
  // each rank reads only the element ranges of its own shards, or rank 0 reads everything
  const io::HfWeights* w = hf_weights;
  const fsdp::ShardedUnitStore::ParamReader read = [&](const model::ParamSpec& p, int64_t first, Tensor& out) {
    const io::TensorInfo& t = w->get(p.name);
    ST_CHECK(Shape(t.shape.begin(), t.shape.end()) == p.full_shape, "`", config_.model.hf, "`: tensor `", p.name,
             "` has shape ", Shape(t.shape.begin(), t.shape.end()).str(), ", config.json implies ", p.full_shape.str());
    w->read_range(p.name, first, out);
  };
  if (config_.parallel.hf_load == "rank0")
    store_->load_from_rank0(read);
  else
    store_->load(read);
  size_t tensors = 0;
  for (const model::UnitLayout& unit : layout_->units()) tensors += unit.params.size();
  log::info(
      fmt::format("loaded {} tensors from {} ({})", tensors, config_.model.hf,
                  config_.parallel.hf_load == "rank0" ? "read by rank 0, sent unit by unit" : "each rank its ranges"));
}

void Trainer::build_model(DType dtype) {
  const model::LlamaConfig& mc = model_config_;
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
    log::info(
        std::string("training.fp8_attention = true: attention's products in FP8 e4m3, forward and backward (cuDNN)") +
        (mc.sliding_layer_count() > 0 ? "; the sliding-window layers attend in bf16" : ""));
  }
  if (cp_groups_.degree > 1) {
    context_parallel_ = fsdp::make_context_parallel(cp_groups_.group.get());
    model_->set_context_parallel(context_parallel_.get());
  }
  auto format = [](const ops::LinearFp8& f) { return f.gradient_format == DType::kF8E4M3 ? "e4m3" : "e5m2"; };
  if (fp8_.on())
    log::info(
        fmt::format("training.fp8 = {}: the blocks' linears multiply in FP8 (x and weights e4m3, gradients {}){}{}",
                    ops::fp8_recipe_name(fp8_.recipe), format(fp8_),
                    head_fp8.on() ? fmt::format(", and the head (its gradient {})", format(head_fp8)) : "",
                    device_.is_cpu() ? "; emulated on the CPU, exact but no faster" : ""));
}

void Trainer::log_sharding() const {
  int64_t slots = 0;
  for (const model::UnitLayout& u : layout_->units()) slots += u.shard_numel();
  const model::Mesh& m = mesh_->shape();
  std::string shape;
  if (m.tensor_parallel > 1)
    shape = fmt::format(" as {} data-parallel x {} tensor-parallel (the group's rows moved by {})", m.data_parallel,
                        m.tensor_parallel, tensor_parallel_->exchange_route());
  if (cp_groups_.degree > 1)
    shape = fmt::format(" as {} data-parallel x {} context-parallel (each sequence's {} tokens split over a group, "
                        "{} per rank)",
                        data_ranks(), cp_groups_.degree, config_.training.seq_len,
                        config_.training.seq_len / cp_groups_.degree);
  if (m.replicate > 1)
    shape += fmt::format("{} {} replicas of {} rank{} (gradients summed between replicas)", shape.empty() ? " as" : ",",
                         m.replicate, m.replica_ranks(), m.replica_ranks() == 1 ? "" : "s");
  log::info(fmt::format("sharded over {} ranks ({}){}: {} parameter slots per rank, of {} in the model",
                        comm_->world_size(), comm_->name(), shape, slots, model_config_.num_parameters()));
}

void Trainer::prepare_output_folders() {
  const int rank = comm_->rank();
  const std::filesystem::path out_dir(config_.run.output_dir);
  // a save happens at checkpoint.interval_steps, or when a signal or the time limit stops the run
  const bool saves =
      config_.checkpoint.interval_steps > 0 || config_.checkpoint.on_signal || !config_.training.time_limit.empty();
  const std::string checkpoint_key = config_.checkpoint.dir.empty() ? "run.output_dir" : "checkpoint.dir";
  std::string error, overwritten;
  try {
    // another run's checkpoints or metrics here: resumed, started over, or refused
    if (config_.checkpoint.resume.empty()) {
      const std::vector<std::string> earlier = earlier_run(config_);
      ST_CHECK(
          earlier.empty() || config_.run.overwrite, "`run.output_dir` = \"", config_.run.output_dir,
          "\" holds another run (", fmt::format("{}", fmt::join(earlier, "; ")),
          "): resume it with "
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
          log::info(fmt::format("removed what interrupted {} left in {}: {}", checkpoints ? "saves" : "exports", folder,
                                names));
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
  ST_CHECK(failed.data<int64_t>()[0] == 0, failed.data<int64_t>()[0],
           " rank(s) found a folder the run writes not "
           "writable (their error names it)");
  // the run folder remembers the run: its config, and its log from here on (appended when resumed)
  if (rank == 0) {
    io::write_file_atomic((out_dir / kRunConfigFile).string(), config_toml(config_));
    log::set_file((out_dir / kRunLogFile).string(), !config_.checkpoint.resume.empty());
    log_file_open_ = true;
    if (!overwritten.empty()) log::info(overwritten);
  }
}

}  // namespace shardtrain::train
