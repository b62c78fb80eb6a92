// Subcommand implementations: argument splitting, then the modules do the work.
#include "cli/commands.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <thread>

#include <fmt/format.h>

#include <iostream>

#include "cli/args.h"
#include "core/allocator.h"
#include "core/build_info.h"
#include "core/host.h"
#include "core/error.h"
#ifdef SHARDTRAIN_WITH_CUDA
#include "core/cuda/device.h"
#include "dist/nccl_communicator.h"
#include "ops/library_versions.h"
#endif
#include "data/bpe_tokenizer.h"
#include "data/corpus.h"
#include "data/byte_tokenizer.h"
#include "data/sft.h"
#include "data/tokenize_file.h"
#include "dist/bootstrap.h"
#include "core/log.h"
#include "core/profile.h"
#include "train/config.h"
#include "train/export.h"
#include "train/generate.h"
#include "io/input_file.h"
#include "io/parquet.h"
#include "train/inspect.h"
#include "train/open_model.h"
#include "train/plan.h"
#include "train/run_folder.h"
#include "train/step_model.h"
#include "train/trainer.h"

namespace shardtrain::cli {

int run_tokenize(const std::vector<std::string>& args) {
  std::string tokenizer_path, format, field = "text";
  bool print_ids = false, skip_existing = false;
  int threads = 0, files_at_once = 0;
  std::vector<std::string> files;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    auto value = [&]() -> const std::string& {
      ST_CHECK(i + 1 < args.size(), "tokenize: ", a, " needs a value");
      return args[++i];
    };
    if (a == "--tokenizer") tokenizer_path = value();
    else if (a == "--print-ids") print_ids = true;
    else if (a == "--skip-existing") skip_existing = true;
    else if (a == "--format") format = value();
    else if (a == "--field") field = value();
    else if (a == "--threads") threads = static_cast<int>(integer_flag(a, value(), "tokenize"));
    else if (a == "--files") files_at_once = static_cast<int>(integer_flag(a, value(), "tokenize"));
    else if (a.rfind("--", 0) == 0) unknown_option("tokenize", a);
    else files.push_back(a);
  }
  ST_CHECK(!tokenizer_path.empty(), "tokenize: --tokenizer PATH is required (a tokenizer.json, its folder, or `byte`)");
  const std::unique_ptr<data::Tokenizer> tok =
      data::load_tokenizer(tokenizer_path, "tokenize --tokenizer", "a tokenizer.json, its folder, or `byte`");
  if (print_ids) {
    ST_CHECK(files.empty(), "tokenize --print-ids reads standard input; unexpected argument `", files.front(), "`");
    std::string line, out;
    while (std::getline(std::cin, line)) {
      out.clear();
      const std::vector<int32_t> ids = tok->encode(line);
      for (size_t k = 0; k < ids.size(); ++k) {
        if (k) out += ' ';
        out += std::to_string(ids[k]);
      }
      out += '\n';
      std::fputs(out.c_str(), stdout);
    }
    return 0;
  }
  ST_CHECK(files.size() == 2, "tokenize: expected INPUT and OUTPUT, found ", files.size(), " arguments");
  data::TokenizeFileOptions o;
  o.jsonl_field = field;
  o.num_threads = threads;
  std::optional<data::TextFormat> given;
  if (format == "lines") given = data::TextFormat::kLines;
  else if (format == "parquet") given = data::TextFormat::kParquet;
  else if (format == "jsonl") given = data::TextFormat::kJsonl;
  else if (format == "whole") given = data::TextFormat::kWholeFile;
  else ST_CHECK(format.empty(), "tokenize: --format must be lines, jsonl, parquet or whole; found `", format, "`");
  if (!std::filesystem::is_directory(files[0]) && !data::is_source_pattern(files[0])) {
    data::tokenize_file_logged(*tok, files[0], files[1], o, given);
    return 0;
  }
  // a folder's data files (others, such as a dataset card, skipped) or a pattern's matches,
  // each into OUTPUT/<its name>.tok
  std::vector<std::string> inputs;
  for (const std::string& f : data::source_files(files[0])) {
    if (data::is_source_pattern(files[0]) || io::is_parquet_file(f) || data::is_jsonl_name(f) || data::is_text_name(f))
      inputs.push_back(f);
  }
  ST_CHECK(!inputs.empty(), "tokenize: `", files[0], "` holds no .parquet, .jsonl, .json or .txt files");
  data::TokenizeFilesOptions many;
  many.file = o;
  many.format = given;
  many.files_at_once = files_at_once;
  many.skip_existing = skip_existing;
  const data::TokenizeFilesStats st = data::tokenize_files(*tok, inputs, files[1], many);
  log::info(fmt::format("tokenize: {} files{}, {} documents, {} tokens in {:.1f} s -> {} (train with --data.source={})",
                        st.files, st.skipped > 0 ? fmt::format(" ({} already there)", st.skipped) : std::string(),
                        st.documents, st.tokens, st.seconds, files[1], files[1]));
  return 0;
}

int run_export(const std::vector<std::string>& args) {
  std::vector<std::string> paths;
  train::ExportOptions o;
  std::string dtype = "bf16";
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    auto value = [&]() -> const std::string& {
      ST_CHECK(i + 1 < args.size(), "export: ", a, " needs a value");
      return args[++i];
    };
    if (a == "--dtype") dtype = value();
    else if (a == "--max-shard-mb") o.max_shard_bytes = std::stoll(value()) * 1000 * 1000;
    else if (a == "--tokenizer") o.tokenizer_source = value();
    else if (a.rfind("--", 0) == 0) unknown_option("export", a);
    else paths.push_back(a);
  }
  ST_CHECK(paths.size() == 2, "export: expected CHECKPOINT and OUT, found ", paths.size(), " paths");
  ST_CHECK(dtype == "bf16" || dtype == "f16" || dtype == "f32", "export: --dtype must be bf16, f16 or f32; found `",
           dtype, "`");
  ST_CHECK(o.max_shard_bytes > 0, "export: --max-shard-mb must be positive");
  o.dtype = parse_dtype(dtype, "--dtype");
  o.folder = paths[1];
  o.folder_key = "export OUT";
  const std::string dir = train::export_checkpoint(paths[0], o);
  log::info(fmt::format("exported {} to {} ({})", dir, o.folder, dtype));
  return 0;
}

int run_generate(const std::vector<std::string>& args) {
  const char* cmd = "generate";
  std::vector<std::string> paths;
  std::optional<std::string> prompt, conversation;
  std::string tokenizer, device = "auto", system;
  bool chat = false;
  train::SampleOptions o;
  int64_t seed = static_cast<int64_t>(o.seed);
  o.context_limit = train::ContextLimit::kStop;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    auto value = [&]() -> const std::string& {
      ST_CHECK(i + 1 < args.size(), cmd, ": ", a, " needs a value");
      return args[++i];
    };
    if (a == "--prompt") prompt = value();
    else if (a == "--tokens") o.tokens = integer_flag(a, value(), cmd);
    else if (a == "--temperature") o.temperature = number_flag(a, value(), cmd);
    else if (a == "--top-k") o.top_k = integer_flag(a, value(), cmd);
    else if (a == "--top-p") o.top_p = number_flag(a, value(), cmd);
    else if (a == "--seed") seed = integer_flag(a, value(), cmd);
    else if (a == "--tokenizer") tokenizer = value();
    else if (a == "--recompute") o.kv_cache = false;
    else if (a == "--eager") o.cuda_graph = false;
    else if (a == "--device") device = value();
    else if (a == "--chat") chat = true;
    else if (a == "--system") system = value();
    else if (a == "--conversation") conversation = value();
    else if (a.rfind("--", 0) == 0) unknown_option(cmd, a);
    else paths.push_back(a);
  }
  ST_CHECK(paths.size() == 1, cmd, ": expected one MODEL (a Hugging Face folder or a training checkpoint), found ",
           paths.size(), paths.size() > 1 ? " (`" + paths[1] + "` is extra)" : std::string());
  ST_CHECK(!(prompt && conversation), cmd, ": give --prompt or --conversation, not both");
  ST_CHECK(!(conversation && !system.empty()), cmd, ": --system goes with --prompt; a --conversation file holds "
           "its own system message");
  ST_CHECK(prompt.has_value() || conversation.has_value(), cmd, ": --prompt TEXT is required (`--prompt -` reads "
           "standard input, `--prompt \"\"` starts from BOS alone), or --conversation FILE");
  if (conversation) chat = true;
  ST_CHECK(seed >= 0, cmd, ": --seed must be >= 0, found ", seed);
  o.seed = static_cast<uint64_t>(seed);
  train::check_sample_options(o, "generate");
  ST_CHECK(chat || system.empty(), cmd, ": --system needs --chat");
  std::optional<data::ChatConversation> turns;
  if (conversation) {
    std::string text;
    if (*conversation == "-") {
      text = std::string(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
    } else {
      std::ifstream in(*conversation, std::ios::binary);
      ST_CHECK(in.good(), cmd, ": cannot open `", *conversation, "` (--conversation)");
      text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    }
    turns = data::parse_conversation(text, "`" + *conversation + "` (--conversation)");
  } else {
    if (*prompt == "-") prompt = std::string(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
    o.prompt = *prompt;
  }

  const Device dev = train::generation_device(device);
  const train::OpenedModel m = train::open_model(paths[0], dev.is_cpu() ? DType::kF32 : DType::kBF16, dev);
  const std::unique_ptr<data::Tokenizer> tok = train::open_tokenizer(tokenizer, m);
  log::info(fmt::format("model: {} from {} ({} on {})", m.model->config().summary(), m.describe(),
                        dev.is_cpu() ? "f32" : "bf16", dev.str()));
  if (chat) {  // the prompt is the user's message; only the assistant's reply is printed
    train::ChatPrompt p = turns ? train::chat_prompt(*tok, turns->messages, turns->tools)
                                : train::chat_prompt(*tok, system, o.prompt);
    o.prompt = std::move(p.text);
    o.stop_ids = std::move(p.stop_ids);
    o.add_bos = false;
  } else {
    std::fputs(o.prompt.c_str(), stdout);
  }
  std::fflush(stdout);
  const train::SampleResult r = train::sample(*m.model, *tok, o, [](std::string_view piece) {
    std::fwrite(piece.data(), 1, piece.size(), stdout);
    std::fflush(stdout);
  });
  std::fputs("\n", stdout);
  std::fflush(stdout);
  const double total = r.first_token_s + r.rest_s;
  const int64_t n = static_cast<int64_t>(r.ids.size());
  std::string stop;
  if (r.stop == train::StopReason::kEos) stop = chat ? "; stopped at the end of the turn" : "; stopped at EOS";
  if (r.stop == train::StopReason::kContextFull)
    stop = fmt::format("; stopped: the context is full (max_seq_len = {} tokens)", m.model->config().max_seq_len);
  log::info(fmt::format("generate: {} tokens in {:.3f} s, {:.1f} tokens/s (prompt {} tokens, first token after "
                        "{:.3f} s, then {:.1f} tokens/s; {}){}",
                        n, total, total > 0 ? static_cast<double>(n) / total : 0.0, r.prompt_tokens, r.first_token_s,
                        n > 1 && r.rest_s > 0 ? static_cast<double>(n - 1) / r.rest_s : 0.0,
                        r.used_kv_cache ? "KV cache" : "recomputed every token", stop));
  if (profile::enabled()) log::info("time by op (SHARDTRAIN_PROFILE=1):\n" + profile::report_and_reset());
  return 0;
}

int run_inspect(const std::vector<std::string>& args) {
  std::vector<std::string> paths;
  bool verify = false;
  for (const std::string& a : args) {
    if (a == "--verify") verify = true;
    else if (a.rfind("--", 0) == 0) unknown_option("inspect", a);
    else paths.push_back(a);
  }
  ST_CHECK(paths.size() == 1, "inspect: expected one PATH (a .safetensors file, a Hugging Face folder, a checkpoint "
           "or a .parquet file), found ", paths.size());
  const train::InspectReport r = verify ? train::verify_report(paths[0]) : train::inspect_report(paths[0]);
  std::fputs(r.text.c_str(), stdout);
  if (r.problems == 0) return 0;
  // a script checking a checkpoint or a folder before a run must see the failure
  std::fflush(stdout);
  std::fprintf(stderr, "error: `%s`: %d problem%s (named above); it cannot be loaded as it is\n", paths[0].c_str(),
               r.problems, r.problems == 1 ? "" : "s");
  return 1;
}

int run_print_config(const std::vector<std::string>& args) {
  const JobArgs j = parse_job_args(args, "print-config");
  const train::LoadedConfig loaded = train::load_config(j.config_file, j.overrides);
  std::fputs(train::describe(loaded).c_str(), stdout);
  return 0;
}

namespace {

// `plan`'s time options.
struct PlanTimeOptions {
  std::string gpu;          // --gpu NAME ("": the calibration's, else the visible GPU, else h100-sxm)
  double mfu = 0;           // --mfu X: the FLOPs / (ranks x peak x MFU) estimate instead of the model
  std::string calibration;  // --calibration FILE
  train::MachineSpec machine;
};

// `plan`'s time: the step-time model, or with --mfu X the FLOPs-over-peak estimate. The GPU:
// --gpu NAME, else the calibration file's, else the visible GPU when it is in the table, else
// an H100 SXM. Each default says so.
std::string plan_time(const train::PlanInput& in, const PlanTimeOptions& o) {
  if (!in.gpu) return "time: not estimated for CPU runs (`shardtrain bench` measures a step)\n";
  std::string gpu_name = o.gpu;
  std::string gpu_note = gpu_name.empty() ? std::string() : std::string("--gpu");
  if (gpu_name.empty() && !o.calibration.empty()) {
    gpu_name = train::calibration_gpu(o.calibration);
    if (!gpu_name.empty()) gpu_note = "the calibration's";
  }
  const train::GpuSpec* gpu = gpu_name.empty() ? nullptr : &train::gpu_spec(gpu_name);
#ifdef SHARDTRAIN_WITH_CUDA
  if (!gpu && cuda::device_count() > 0) {
    const std::string name = cuda::device_name(0);
    gpu = train::gpu_spec_for_device(name);
    gpu_note = gpu ? "the visible GPU" : "GPU 0, " + name + ", is not in plan's table: assumed; --gpu NAME names one";
  }
#endif
  if (!gpu) {
    gpu = &train::gpu_spec("h100-sxm");
    if (gpu_note.empty()) gpu_note = "no GPU visible: assumed; --gpu NAME names another";
  }
  if (o.mfu > 0)
    return train::describe_time(in, *gpu, o.mfu, gpu_note, "--mfu") +
           "  (without --mfu, plan predicts the step from its op families, communication and offload)\n";
  train::StepRates rates = train::default_step_rates(*gpu, in.model.head_dim());
  if (!o.calibration.empty()) rates = train::read_calibration(o.calibration, rates);
  return train::describe_step_time(in, rates, o.machine, gpu_note);
}

}  // namespace

int run_plan(const std::vector<std::string>& args) {
  std::vector<std::string> rest;
  int ranks = 0, per_machine = 0;
  PlanTimeOptions time_options;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    auto value = [&]() -> const std::string& {
      ST_CHECK(i + 1 < args.size(), "plan: ", a, " needs a value");
      return args[++i];
    };
    // a bandwidth flag: a positive number in `unit`, kept in bytes/s
    auto rate = [&](double* target, double bytes_per_unit, const char* unit) {
      const std::string& v = value();
      const double x = number_flag(a, v, "plan");
      ST_CHECK(x > 0 && std::isfinite(x), "plan: ", a, " must be a positive number of ", unit, ", found ", v);
      *target = x * bytes_per_unit;
    };
    if (a == "--gpu") {
      time_options.gpu = value();
      train::gpu_spec(time_options.gpu);  // an unknown name fails before any work
    } else if (a == "--mfu") {
      const std::string& v = value();
      time_options.mfu = number_flag(a, v, "plan");
      ST_CHECK(time_options.mfu > 0 && time_options.mfu <= 1, "plan: --mfu must be in (0, 1], found ", v,
               " (a fraction of the peak: 0.4 is 40 %)");
    } else if (a == "--calibration") {
      time_options.calibration = value();
    } else if (a == "--gpus-per-node") {
      const std::string& v = value();
      const int64_t g = integer_flag(a, v, "plan");
      ST_CHECK(g >= 1 && g <= 1024, "plan: --gpus-per-node must be in [1, 1024], found ", v);
      time_options.machine.gpus_per_node = static_cast<int>(g);
    } else if (a == "--inter-node-gbps") {
      rate(&time_options.machine.inter_node_bytes, 1e9 / 8, "Gb/s per node");
    } else if (a == "--nvlink-gbps") {
      rate(&time_options.machine.nvlink_bytes, 1e9, "GB/s per GPU");
    } else if (a == "--host-gbps") {
      rate(&time_options.machine.host_memory_bytes, 1e9, "GB/s per node");
    } else if (a == "--pcie-gbps") {
      rate(&time_options.machine.pcie_bytes, 1e9, "GB/s per GPU");
    } else if (args[i] == "--ranks" || args[i] == "--ranks-per-machine") {
      ST_CHECK(i + 1 < args.size(), "plan: ", args[i], " needs a number");
      const int64_t v = integer_flag(args[i], args[i + 1], "plan");
      ST_CHECK(v >= 1 && v <= (1 << 20), "plan: ", args[i], " must be in [1, 1048576], found ", v);
      (args[i] == "--ranks" ? ranks : per_machine) = static_cast<int>(v);
      ++i;
    } else {
      rest.push_back(args[i]);
    }
  }
  const JobArgs j = parse_job_args(rest, "plan");
  const train::LoadedConfig loaded = train::load_config(j.config_file, j.overrides);
  const train::JobConfig& job = loaded.config;
  if (ranks == 0) {  // as launched: the torchrun/Slurm world size, else one rank
    const std::optional<dist::LaunchEnv> env = dist::launch_from_env();
    ranks = env ? env->world_size : 1;
  }
  if (per_machine == 0) per_machine = std::min(ranks, std::max(1, dist::local_ranks_from_env()));  // as launched
  ST_CHECK(per_machine <= ranks, "plan: --ranks-per-machine (", per_machine, ") exceeds the ", ranks, " ranks");
  const train::PlannedModel planned = train::planned_model(job);
  train::PlanInput in = train::plan_input(job, planned.config, ranks);
  if (!planned.source.empty()) std::fputs((planned.source + "\n").c_str(), stdout);
  const std::string time = plan_time(in, time_options);
  // an 80 GB H100 as CUDA counts it
  const int64_t h100 = static_cast<int64_t>(79.18 * (1 << 30));
  const bool auto_checkpointing = job.training.activation_checkpointing == "auto";
  // a sequence too long for one GPU: the context parallelism that splits it enough
  const auto context_parallel_advice = [&] {
    const train::ContextParallelChoice c = train::choose_context_parallel(in, h100, auto_checkpointing);
    if (c.degree > 0)
      std::fputs(fmt::format("on 80 GB H100s (79.18 GiB) the job {}\n",
                             train::describe_context_parallel(in, c, auto_checkpointing))
                     .c_str(),
                 stdout);
  };
  if (auto_checkpointing && in.gpu) {
    std::fputs(train::describe_auto_checkpointing(in).c_str(), stdout);  // decided at launch, by the GPU
    if (!train::choose_checkpointing(in, h100).fits) context_parallel_advice();
    std::fputs(time.c_str(), stdout);
    return 0;
  }
  const train::MemoryPlan plan = train::plan_memory(in);
  std::fputs(train::describe_plan(in, plan).c_str(), stdout);
  if (in.gpu) {
    // the trainer's own margin for its automatic choices; an 80 GB H100 as CUDA counts it
    const int64_t needs = plan.peak + train::checkpointing_reserve(plan.peak);
    std::fputs(fmt::format("needs a GPU of at least {} (the peak, 2 GiB and 3 % to spare){}\n", format_bytes(needs),
                           needs > h100 ? "; more than an 80 GB H100 holds (79.18 GiB): " + train::gpu_memory_advice(in)
                                        : std::string())
                   .c_str(),
               stdout);
    if (needs > h100) context_parallel_advice();
  }
  if (const int64_t host = plan.host + plan.host_activations + plan.host_checkpoint; host > 0 && per_machine > 1)
    std::fputs(fmt::format("host memory per machine of {} ranks: {} (this machine has {})\n", per_machine,
                           format_bytes(host * per_machine), format_bytes(train::host_memory_bytes()))
                   .c_str(),
               stdout);
  if (in.offload_activations && in.gpu && job.training.offload_activations_blocks == 0)
    std::fputs(train::describe_auto_offload_blocks(in).c_str(), stdout);
  if (job.parallel.compute_shards == "auto" && in.gpu && ranks == 1 && !in.offload) {
    train::PlanInput with = in;
    with.compute_shards = true;
    const int64_t peak = train::plan_memory(with).peak;
    std::fputs(fmt::format("parallel.compute_shards = auto: with bf16 copies of the weights used in place (no "
                           "casts, no gathers) the peak is {}; they are kept on a GPU of at least {}\n",
                           format_bytes(peak), format_bytes(peak + train::checkpointing_reserve(peak)))
                   .c_str(),
               stdout);
  }
  std::fputs(time.c_str(), stdout);
  if (job.training.device == "auto")
    std::fputs("(training.device = auto: planned for GPUs; --training.device=cpu plans a CPU run)\n", stdout);
  return 0;
}

int run_version(const std::vector<std::string>& args) {
  ST_CHECK(args.empty(), "version: unexpected argument `", args.empty() ? "" : args.front(), "`");
  std::string out = fmt::format("shardtrain {}\n", build_commit());
  std::string build = build_options();
#ifdef SHARDTRAIN_WITH_MPI
  build += ", MPI";
#endif
#ifdef SHARDTRAIN_WITH_CUDA
  build += ", " + dist::nccl_version();
#endif
  out += "  build: " + build + "\n";
#ifdef SHARDTRAIN_WITH_CUDA
  out += "  GPU libraries: " + ops::cuda::library_versions() + "\n";
  const int gpus = cuda::device_count();
  if (gpus == 0) out += "  GPUs: none visible\n";
  for (int g = 0; g < gpus; ++g)
    out += fmt::format("  GPU {}: {}, {}, {:.0f} TFLOP/s dense bf16\n", g, cuda::device_name(g),
                       format_bytes(cuda::total_memory_bytes(g)), cuda::dense_bf16_peak_flops(g) / 1e12);
#endif
  out += fmt::format("  host: {}, {} cores, {} of memory\n", host_name(), std::thread::hardware_concurrency(),
                     format_bytes(train::host_memory_bytes()));
  std::fputs(out.c_str(), stdout);
  return 0;
}

int run_train(const std::vector<std::string>& args) {
  const JobArgs j = parse_job_args(args, "train");
  // a resume goes on with the config its checkpoint holds, changed only by what this command sets
  const train::ResumedConfig resumed = train::resolve_resume(train::load_config(j.config_file, j.overrides));
  const train::JobConfig& config = resumed.loaded.config;
  log::info(j.config_file.empty() ? std::string("config: built-in default job")
                                  : fmt::format("config: {}", j.config_file));
  train::Trainer trainer(config);
  if (!resumed.checkpoint.empty() && trainer.comm().rank() == 0) {
    std::string changes;
    for (const train::KeyChange& c : resumed.changes)
      changes += fmt::format("{}{} {} -> {}", changes.empty() ? "" : ", ", c.key, c.before, c.after);
    log::info(fmt::format("resume: the config of `{}` ({}), {}", resumed.checkpoint, train::kRunConfigFile,
                          changes.empty() ? std::string("unchanged by this command")
                                          : "with this command's changes: " + changes));
  }
  const train::TrainSummary s = trainer.run();
  if (!s.steps.empty()) {
    log::info(fmt::format("loss: first step {:.4f}, last step {:.4f}", s.steps.front().loss, s.steps.back().loss));
  }
  if (!s.sample.empty() && trainer.comm().rank() == 0) {  // every rank samples (collectively); one prints
    std::printf("\n--- sample ---\n%s\n--------------\n", s.sample.c_str());
  }
  const bool saved = config.checkpoint.interval_steps > 0 || s.stopped_by_signal != 0 || s.stopped_by_time_limit;
  if (saved && trainer.comm().rank() == 0 && s.already_complete_at < 0)
    log::info(fmt::format("resume{} with: {}", s.stopped_by_signal != 0 || s.stopped_by_time_limit
                                                    ? std::string()
                                                    : " (with a larger --training.steps to train on)",
                          train::resume_command(config)));
  // stopped by a signal (checkpoint.on_signal): saved but not finished, the shell's status for it;
  // by training.time_limit: sysexits' EX_TEMPFAIL (75), to be resumed
  if (s.stopped_by_signal != 0) return 128 + s.stopped_by_signal;
  return s.stopped_by_time_limit ? 75 : 0;
}

}  // namespace shardtrain::cli
