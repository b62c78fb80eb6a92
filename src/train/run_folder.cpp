// Run folders: the config a resume goes on with, and the check that keeps two runs apart.
#include "train/run_folder.h"

#include <algorithm>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/error.h"
#include "train/checkpoint.h"

namespace shardtrain::train {
namespace {

namespace fs = std::filesystem;

// Keys a resumed run may not change: the model it holds, and the data it goes on reading in
// the same order. Prefixes end with '.'.
constexpr const char* kFixed[] = {
    "model.hf", "model.vocab_size", "model.dim", "model.n_layers", "model.n_heads", "model.n_kv_heads",
    "model.head_dim", "model.ffn_dim", "model.max_seq_len", "model.norm_eps", "model.rope_", "model.tie_embeddings",
    "model.attention_bias", "model.qk_norm", "model.qk_norm_whole", "model.post_norms", "model.no_rope_every",
    "model.embedding_multiplier", "model.residual_multiplier", "model.attention_multiplier", "model.logits_scaling",
    "model.norm_weight_offset", "model.sandwich_norms", "model.mlp_activation", "model.scale_embeddings",
    "model.attn_logit_softcapping", "model.final_logit_softcapping", "model.extend_context",
    "model.sliding_window", "model.full_attention_every", "data.source",
    "data.format", "data.text_field", "data.prompt_field", "data.response_field", "data.messages_field",
    "data.train_on_prompt", "data.packing", "data.document_mask", "data.tokenizer", "data.val_fraction", "data.mix",
    "training.seq_len", "training.seed"};

std::string shell_quote(const std::string& s) {
  if (!s.empty() && s.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-./=:+,") ==
                        std::string::npos)
    return s;
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

}  // namespace

std::string checkpoint_root(const JobConfig& config) {
  return config.checkpoint.dir.empty() ? (fs::path(config.run.output_dir) / "checkpoints").string()
                                       : config.checkpoint.dir;
}

bool fixed_on_resume(const std::string& key) {
  for (const char* f : kFixed) {
    const std::string fixed = f;
    if (fixed.back() == '_' ? key.rfind(fixed, 0) == 0 : key == fixed) return true;
  }
  return false;
}

ResumedConfig resolve_resume(const LoadedConfig& command) {
  ResumedConfig r;
  r.loaded = command;
  const std::string& spec = command.config.checkpoint.resume;
  if (spec.empty()) return r;
  const std::string dir = resolve_checkpoint(spec, checkpoint_root(command.config));
  if (dir.empty()) return r;  // auto, and nothing saved yet: a fresh start
  const fs::path saved = fs::path(dir) / kRunConfigFile;
  if (!fs::is_regular_file(saved)) return r;  // saved by a build that kept no config
  LoadedConfig base;
  try {
    base = load_config(saved.string(), {});
  } catch (const Error& e) {
    ST_THROW("checkpoint `", dir, "`: its config does not load: ", e.what(),
             "; resume from another checkpoint, or start a new run");
  }
  r.checkpoint = dir;
  r.loaded = layer_config(base, command);
  std::vector<std::string> refused;
  for (const KeyChange& c : changed_keys(base.config, r.loaded.config)) {
    if (c.key == "checkpoint.resume") continue;
    if (fixed_on_resume(c.key))
      refused.push_back(fmt::format("`{}` = {} (the checkpoint's: {})", c.key, c.after, c.before));
    else
      r.changes.push_back(c);
  }
  ST_CHECK(refused.empty(), "checkpoint `", dir, "` was trained with other settings that a resumed run may not change: ",
           fmt::format("{}", fmt::join(refused, ", ")), ". A resumed run goes on with the checkpoint's model and its "
           "data in the same order: leave these keys out (the checkpoint's ", kRunConfigFile, " holds them), or "
           "start a new run in another run.output_dir (a fine-tune of this one: export it, then model.hf)");
  return r;
}

std::vector<std::string> earlier_run(const JobConfig& config) {
  std::vector<std::string> found;
  std::error_code ec;
  const fs::path latest = fs::path(checkpoint_root(config)) / "latest";
  if (fs::exists(latest, ec)) {
    std::ifstream in(latest);
    std::string step;
    std::getline(in, step);
    found.push_back(fmt::format("checkpoints up to {} in {}", step, checkpoint_root(config)));
  }
  if (!config.logging.tensorboard_dir.empty()) {
    const fs::path tb = fs::path(config.run.output_dir) / config.logging.tensorboard_dir;
    if (fs::is_directory(tb, ec))
      for (const fs::directory_entry& e : fs::directory_iterator(tb, ec))
        if (e.path().filename().string().rfind("events.out.tfevents", 0) == 0) {
          found.push_back("TensorBoard events in " + tb.string());
          break;
        }
  }
  return found;
}

std::vector<std::string> remove_earlier_run(const JobConfig& config) {
  std::vector<std::string> removed;
  auto remove = [&](const fs::path& p) {
    std::error_code ec;
    if (fs::exists(p, ec) && fs::remove_all(p, ec) > 0 && !ec) removed.push_back(p.string());
  };
  const fs::path root(checkpoint_root(config));
  std::error_code ec;
  if (fs::is_directory(root, ec)) {
    std::vector<fs::path> steps;
    for (const fs::directory_entry& e : fs::directory_iterator(root, ec))
      if (e.is_directory() && e.path().filename().string().rfind("step_", 0) == 0) steps.push_back(e.path());
    std::sort(steps.begin(), steps.end());
    for (const fs::path& s : steps) remove(s);
    remove(root / "latest");
  }
  const fs::path out(config.run.output_dir);
  if (!config.logging.metrics_file.empty()) remove(out / config.logging.metrics_file);
  if (!config.logging.tensorboard_dir.empty()) {
    const fs::path tb = out / config.logging.tensorboard_dir;
    if (fs::is_directory(tb, ec))
      for (const fs::directory_entry& e : fs::directory_iterator(tb, ec))
        if (e.path().filename().string().rfind("events.out.tfevents", 0) == 0) remove(e.path());
  }
  for (const char* f : {kRunConfigFile, kRunLogFile, kRunSampleFile}) remove(out / f);
  return removed;
}

std::string resume_command(const JobConfig& config) {
  std::string c = "shardtrain train --run.output_dir=" + shell_quote(config.run.output_dir);
  if (!config.checkpoint.dir.empty()) c += " --checkpoint.dir=" + shell_quote(config.checkpoint.dir);
  return c + " --checkpoint.resume=auto";
}

}  // namespace shardtrain::train
