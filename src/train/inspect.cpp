// The inspect report.
#include "train/inspect.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <memory>
#include <sstream>

#include <fmt/format.h>

#include "core/allocator.h"
#include "io/checksum.h"
#include "io/hf_folder.h"
#include "io/safetensors.h"
#include "io/parquet.h"
#include "model/hf_config.h"
#include "model/hf_names.h"
#include "model/layout.h"
#include "train/checkpoint.h"
#include "train/hf_fused.h"

namespace shardtrain::train {

namespace {

// A Parquet file: its rows, row groups, fields with their types, and the first row's values.
std::string parquet_report(const std::string& path) {
  const io::ParquetFile f(path);
  std::ostringstream r;
  r << fmt::format("{}  (Parquet, {} rows in {} row groups, {})\n\n", path, f.num_rows(), f.num_row_groups(),
                   format_bytes(static_cast<int64_t>(std::filesystem::file_size(path))));
  const std::vector<std::string> fields = f.field_names();
  for (const std::string& name : fields) r << fmt::format("  {:<24} {}\n", name, f.field_type(name));
  for (int g = 0; g < f.num_row_groups(); ++g) {
    if (f.row_group_rows(g) == 0) continue;
    std::string row = f.read_rows(g, fields).front().dump();
    if (row.size() > 600) row = row.substr(0, 600) + " ...";
    r << "\nfirst row: " << row << "\n";
    break;
  }
  return r.str();
}

// The safetensors files a path stands for: a checkpoint's rank files (a step directory, or
// the folder whose `latest` names one), a Hugging Face folder's shards, or one file.
std::vector<std::string> weight_files(const std::string& path) {
  namespace fs = std::filesystem;
  std::string dir = path;
  if (fs::is_regular_file(fs::path(path) / "latest") && !fs::is_regular_file(fs::path(path) / "metadata.json"))
    dir = resolve_checkpoint("auto", path);
  std::vector<std::string> files;
  if (fs::is_regular_file(fs::path(dir) / "metadata.json")) {
    (void)read_checkpoint_info(dir);  // checks the metadata names every rank file, each present
    for (const fs::directory_entry& e : fs::directory_iterator(dir))
      if (e.path().extension() == ".safetensors") files.push_back(e.path().string());
  } else if (fs::is_directory(path)) {
    for (const fs::directory_entry& e : fs::directory_iterator(path))
      if (e.is_regular_file() && e.path().extension() == ".safetensors") files.push_back(e.path().string());
    ST_CHECK(!files.empty(), "inspect --verify: `", path, "` holds no .safetensors files");
  } else {
    files.push_back(path);
  }
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace

InspectReport verify_report(const std::string& path) {
  ST_CHECK(!io::is_parquet_file(path), "inspect --verify checks weights (a .safetensors file, a Hugging Face folder "
           "or a checkpoint), not Parquet files: `", path, "`");
  InspectReport report = inspect_report(path);
  std::ostringstream r;
  r << "\nverify: every byte of every tensor against its checksum, every float for NaN and inf\n";
  const auto start = std::chrono::steady_clock::now();
  int64_t bytes = 0;
  int problems = 0;
  for (const std::string& file : weight_files(path)) {
    std::unique_ptr<io::SafetensorsFile> f;
    try {
      f = std::make_unique<io::SafetensorsFile>(file);
    } catch (const std::exception& e) {
      r << "  DAMAGED " << e.what() << "\n";
      ++problems;
      continue;
    }
    int bad_sums = 0, bad_values = 0;
    for (const io::TensorInfo& t : f->tensors()) {
      bytes += t.end - t.begin;
      if (!f->checksum_matches(t.name)) {
        ++bad_sums;
        r << fmt::format("  DAMAGED {}: tensor `{}` does not match its checksum (crc32c {} written, {} now)\n", file,
                         t.name, io::format_crc32c(*f->stored_checksum(t.name)),
                         io::format_crc32c(f->computed_checksum(t.name)));
      }
      const io::SafetensorsFile::NonFinite nf = f->nonfinite(t.name);
      if (nf.count > 0) {
        ++bad_values;
        r << fmt::format("  NOT FINITE {}: tensor `{}` holds {} NaN or inf value{} (the first is element {})\n", file,
                         t.name, nf.count, nf.count == 1 ? "" : "s", nf.first);
      }
    }
    problems += bad_sums + bad_values;
    const std::string sums = !f->has_checksums() ? "no checksums (written by another program)"
                             : bad_sums == 0     ? "checksums match"
                                                 : fmt::format("{} checksum{} differ", bad_sums, bad_sums == 1 ? "" : "s");
    r << fmt::format("  {} {}  {} tensors: {}, {}\n", bad_sums + bad_values == 0 ? "ok     " : "PROBLEM", file,
                     f->tensors().size(), sums,
                     bad_values == 0 ? std::string("all values finite")
                                     : fmt::format("{} tensor{} with NaN or inf", bad_values, bad_values == 1 ? "" : "s"));
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  r << fmt::format("  {} checked in {:.2f} s ({:.2f} GB/s){}\n", format_bytes(bytes), seconds,
                   seconds > 0 ? static_cast<double>(bytes) / seconds / 1e9 : 0.0,
                   problems == 0 ? "" : fmt::format("; {} problem{}", problems, problems == 1 ? "" : "s"));
  report.text += r.str();
  report.problems += problems;
  return report;
}

InspectReport inspect_report(const std::string& path) {
  namespace fs = std::filesystem;
  if (io::is_parquet_file(path)) return {parquet_report(path), 0};
  // a training checkpoint: a step directory, or the folder whose `latest` names one
  if (fs::is_regular_file(fs::path(path) / "metadata.json")) {
    const CheckpointReport c = checkpoint_report(path);
    return {c.text, c.problems};
  }
  if (fs::is_regular_file(fs::path(path) / "latest")) {
    std::vector<std::string> steps;
    for (const fs::directory_entry& e : fs::directory_iterator(path))
      if (e.is_directory() && e.path().filename().string().rfind("step_", 0) == 0) steps.push_back(e.path().filename());
    std::sort(steps.begin(), steps.end());
    std::string list;
    for (const std::string& s : steps) list += " " + s;
    const std::string latest = resolve_checkpoint("auto", path);
    const CheckpointReport c = checkpoint_report(latest);
    return {fmt::format("{}: checkpoints{}; `latest` is {}\n\n", path, list, fs::path(latest).filename().string()) +
                c.text,
            c.problems};
  }
  std::ostringstream r;
  io::HfWeights w(path);
  int64_t total_bytes = 0, total_elements = 0;
  int missing = 0;
  for (const auto& f : w.files()) {
    r << fmt::format("{}  ({} tensors, {})\n", f->path(), f->tensors().size(),
                     format_bytes(static_cast<int64_t>(fs::file_size(f->path()))));
    for (const auto& [k, v] : f->metadata())
      r << (k == io::kChecksumMetadataKey ? fmt::format("  metadata {} = (a CRC32C of each tensor)\n", k)
                                          : fmt::format("  metadata {} = {}\n", k, v));
  }
  r << fmt::format("\n{:<60} {:>6}  {:<22} {:>12}\n", "tensor", "dtype", "shape", "bytes");
  for (const std::string& name : w.names()) {
    const io::TensorInfo& t = w.get(name);
    r << fmt::format("{:<60} {:>6}  {:<22} {:>12}\n", name, t.dtype, Shape(t.shape.begin(), t.shape.end()).str(),
                     t.end - t.begin);
    total_bytes += t.end - t.begin;
    total_elements += t.numel;
  }
  r << fmt::format("\n{} tensors, {} elements, {}\n", w.names().size(), total_elements, format_bytes(total_bytes));
  const fs::path config = fs::is_directory(path) ? fs::path(path) / "config.json" : fs::path(path).parent_path() / "config.json";
  if (fs::exists(config)) {
    const model::LlamaConfig c = model::load_hf_config(config.string());
    r << "\nconfig.json: " << c.summary() << "\n";
    r << fmt::format("  rope theta {}{}, max positions {}, norm eps {}\n", c.rope.theta,
                     c.rope.scaling.type == ops::RopeScalingType::kLlama3     ? " with llama3 scaling"
                     : c.rope.scaling.type == ops::RopeScalingType::kLinear   ? " with linear scaling"
                     : c.rope.scaling.type == ops::RopeScalingType::kLongRope ? " with LongRoPE scaling"
                                                                              : "",
                     c.max_seq_len, c.norm_eps);
    if (c.rope.scaling.type == ops::RopeScalingType::kLongRope)
      r << fmt::format("  LongRoPE: short_factor for sequences of up to {} positions "
                       "(original_max_position_embeddings), long_factor past them, {} each; cos and sin x {:.6g}\n",
                       c.rope.scaling.original_max_positions, c.rotary_dim() / 2, c.rope.scaling.attention_factor);
    if (c.rope.partial_rotary != 1.0)
      r << fmt::format("  partial rotary: rope on the first {} of each head's {} dims (partial_rotary_factor {}), the "
                       "other {} passed through\n",
                       c.rotary_dim(), c.head_dim(), c.rope.partial_rotary, c.head_dim() - c.rotary_dim());
    if (c.fused_projections)
      r << fmt::format("  family phi3 (Phi-3, Phi-4-mini): q, k and v fused in {} [{}, {}], gate and up in "
                       "{} [{}, {}]; read as q_proj, k_proj, v_proj, gate_proj and up_proj\n",
                       model::phi3_fused_params()[0].suffix, c.q_dim() + 2 * c.kv_dim(), c.dim,
                       model::phi3_fused_params()[1].suffix, 2 * c.ffn_dim, c.dim);
    if (c.has_local_rope())
      r << fmt::format("  sliding layers' rope theta {} (unscaled); the full layers use the theta above\n",
                       c.rope_local_theta);
    if (c.qk_norm)
      r << fmt::format("  QK-norm: {} and {} [{}] in each block, before rope, eps {}\n",
                       model::block_param_suffix(model::BlockParam::kQNorm),
                       model::block_param_suffix(model::BlockParam::kKNorm), c.head_dim(), c.norm_eps);
    if (c.qk_norm_whole)
      r << fmt::format("  QK-norm over the whole q and k: {} [{}] and {} [{}] in each block, before rope, eps {}\n",
                       model::block_param_suffix(model::BlockParam::kQNorm), c.q_dim(),
                       model::block_param_suffix(model::BlockParam::kKNorm), c.kv_dim(), c.norm_eps);
    if (c.post_norms)
      r << "  norms after each sublayer: post_attention_layernorm on the attention's output and "
           "post_feedforward_layernorm on the MLP's, before their residual adds (no input_layernorm)\n";
    if (c.sandwich_norms)
      r << "  norms before and after each sublayer: input_layernorm and pre_feedforward_layernorm on the inputs, "
           "post_attention_layernorm and post_feedforward_layernorm on the outputs before their residual adds\n";
    if (c.norm_weight_offset != 0)
      r << fmt::format("  every norm scales by ({} + weight)\n", c.norm_weight_offset);
    if (c.mlp_activation == ops::GluActivation::kGeluTanh)
      r << "  MLP: GeGLU, gelu (tanh approximation) on gate_proj times up_proj\n";
    if (c.scale_embeddings) r << "  embeddings x sqrt(hidden_size) after the lookup\n";
    if (c.attn_logit_softcapping > 0)
      r << fmt::format("  attention scores soft-capped: {0} x tanh(s / {0}) before the softmax\n",
                       c.attn_logit_softcapping);
    if (c.final_logit_softcapping > 0)
      r << fmt::format("  logits soft-capped: {0} x tanh(z / {0})\n", c.final_logit_softcapping);
    if (c.nope_layer_count() > 0) {
      std::string layers;
      for (int64_t l = 0; l < c.n_layers; ++l)
        if (!c.uses_rope(l)) layers += (layers.empty() ? "" : ", ") + std::to_string(l);
      r << fmt::format("  no rope (NoPE) on layers {}: q and k attend unrotated there\n", layers);
    }
    if (c.gemma_features())
      r << fmt::format("  attention scale {:.6g} (query_pre_attn_scalar {:.6g})\n", c.attention_scale(),
                       1.0 / (c.attention_scale() * c.attention_scale()));
    else if (c.granite_scaled())
      r << fmt::format("  scalings: embeddings x {}, each sublayer's output x {} before its residual add, attention "
                       "scale {}{}, logits / {}\n",
                       c.embedding_multiplier, c.residual_multiplier, c.attention_scale(),
                       c.attention_multiplier > 0 ? "" : " (1 / sqrt(head dim))", c.logits_scaling);
    // every tensor the model needs is present with the right shape (Phi-3's fused ones split)
    try {
      expose_fused_tensors(w, c);
    } catch (const Error& e) {
      r << "  " << e.what() << "\n";
      ++missing;
    }
    const model::ModelLayout layout = model::ModelLayout::llama(c, 1);
    for (const model::UnitLayout& u : layout.units())
      for (const model::ParamSpec& p : u.params) {
        const io::TensorInfo* t = w.find(p.name);
        if (t == nullptr) {
          r << "  missing: " << p.name << "\n";
          ++missing;
        } else if (!(Shape(t->shape.begin(), t->shape.end()) == p.shape)) {
          r << "  wrong shape: " << p.name << " is " << Shape(t->shape.begin(), t->shape.end()).str() << ", expected "
            << p.shape.str() << "\n";
          ++missing;
        }
      }
    r << (missing == 0 ? "  every parameter present with the expected shape\n"
                       : fmt::format("  {} parameters missing or misshapen\n", missing));
  }
  return {r.str(), missing};
}

}  // namespace shardtrain::train
