// Export: gather each unit collectively, cast its parameters, stream them into shards.
#include "train/export.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/log.h"
#include "data/byte_tokenizer.h"
#include "io/safetensors_writer.h"
#include "model/hf_config.h"
#include "ops/elementwise.h"
#include "train/checkpoint.h"
#include "train/run_paths.h"

namespace shardtrain::train {
namespace {

namespace fs = std::filesystem;

// The tokenizer files of `o` into `staged`, and the BOS and EOS ids config.json carries:
// those of a copied generation_config.json, so that the two agree, else the tokenizer's.
void write_tokenizer(const ExportOptions& o, const model::LlamaConfig& config, const fs::path& staged,
                     nlohmann::json& hf_config) {
  const bool byte = o.tokenizer_source.empty() || o.tokenizer_source == "byte";
  const std::unique_ptr<data::Tokenizer> tokenizer =
      byte ? std::make_unique<data::ByteTokenizer>()
           : data::load_tokenizer(o.tokenizer_source, o.tokenizer_key,
                                  "a tokenizer.json or the folder holding one");
  ST_CHECK(tokenizer->vocab_size() <= config.vocab_size, "export: ",
           byte ? std::string("the byte-level tokenizer (the one built in)") : "`" + o.tokenizer_source + "`",
           " has ", tokenizer->vocab_size(), " tokens but the model's vocabulary is ", config.vocab_size,
           "; name the model's own tokenizer (shardtrain export --tokenizer FOLDER)");
  std::error_code ec;
  fs::path generation_config;
  if (byte) {
    for (const auto& [name, text] : data::byte_tokenizer_files())
      io::write_file_atomic((staged / name).string(), text);
    log::info("export: the byte-level tokenizer as tokenizer.json, tokenizer_config.json and special_tokens_map.json");
  } else {
    const bool folder = fs::is_directory(o.tokenizer_source, ec);
    const fs::path dir = folder ? fs::path(o.tokenizer_source) : fs::path(o.tokenizer_source).parent_path();
    fs::copy_file(folder ? dir / "tokenizer.json" : fs::path(o.tokenizer_source), staged / "tokenizer.json",
                  fs::copy_options::overwrite_existing);
    for (const char* f : {"tokenizer_config.json", "special_tokens_map.json", "generation_config.json",
                          "tokenizer.model"}) {
      if (fs::exists(dir / f, ec)) fs::copy_file(dir / f, staged / f, fs::copy_options::overwrite_existing);
    }
    if (fs::exists(dir / "generation_config.json", ec)) generation_config = dir / "generation_config.json";
    log::info(fmt::format("export: the tokenizer files of `{}`", o.tokenizer_source));
  }
  hf_config["bos_token_id"] = tokenizer->bos_id() >= 0 ? nlohmann::json(tokenizer->bos_id()) : nlohmann::json();
  hf_config["eos_token_id"] = tokenizer->eos_id() >= 0 ? nlohmann::json(tokenizer->eos_id()) : nlohmann::json();
  if (!generation_config.empty()) {
    nlohmann::json g;
    try {
      std::ifstream in(generation_config, std::ios::binary);
      g = nlohmann::json::parse(in);
    } catch (const nlohmann::json::exception& e) {
      ST_THROW("`", generation_config.string(), "`: malformed JSON (its bos_token_id and eos_token_id go into the "
               "export's config.json): ", e.what());
    }
    for (const char* key : {"bos_token_id", "eos_token_id"})
      if (g.is_object() && g.contains(key)) hf_config[key] = g[key];
  }
}

}  // namespace

void export_hf(fsdp::ShardedUnitStore& store, const model::LlamaConfig& config, dist::Communicator& comm,
               const ExportOptions& o, dist::Communicator* tp_comm) {
  const bool writer = comm.rank() == 0;
  // rank 0 writes the whole folder beside the target, then swaps it in (run_paths.h)
  const std::string staged = export_sibling(o.folder, "tmp", ::getpid());
  std::unique_ptr<io::ShardedWriter> shards;
  struct RemoveStaged {
    const std::string* path = nullptr;
    ~RemoveStaged() {
      std::error_code ec;
      if (path != nullptr) fs::remove_all(*path, ec);
    }
  } remove_staged;
  if (writer) {
    const std::vector<std::string> removed = remove_interrupted_exports(o.folder);
    if (!removed.empty())
      log::info(fmt::format("removed what interrupted exports left beside {}: {}", o.folder, fmt::join(removed, ", ")));
    remove_staged.path = &staged;
    shards = std::make_unique<io::ShardedWriter>(staged, o.max_shard_bytes);
  }
  const model::ModelLayout& layout = store.layout();
  const int tp = layout.mesh().tensor_parallel;
  ST_ASSERT(tp == 1 || (tp_comm != nullptr && tp_comm->world_size() == tp), "export of a ", tp,
            "-way tensor-parallel model without its group's communicator");
  // Phi-3's fused tensors: each part's rows go into its fused tensor, written once it is whole
  const std::vector<model::FusedTensor> fused = model::hf_fused_tensors(config);
  std::map<std::string, std::pair<size_t, size_t>> fused_part;  // part name -> (fused tensor, part)
  for (size_t f = 0; f < fused.size(); ++f)
    for (size_t i = 0; i < fused[f].parts.size(); ++i) fused_part[fused[f].parts[i]] = {f, i};
  std::map<size_t, std::pair<Tensor, size_t>> filling;  // fused tensor -> (its rows so far, parts in)
  for (size_t u = 0; u < layout.units().size(); ++u) {
    const model::UnitLayout& unit = layout.units()[u];
    Tensor full = store.acquire_params(u, model::Pass::kEval);  // collective: every rank joins
    // a block's tensor-parallel parts, side by side: [parts · numel]
    const int parts = unit.tp_part ? tp : 1;
    if (parts > 1) {
      Tensor all = Tensor::empty({parts * unit.numel}, full.dtype(), full.device(), "tensor-parallel parts");
      tp_comm->all_gather(all, full);
      full = all;
    }
    store.release_params(u, model::Pass::kEval);
    if (!writer) continue;
    Tensor host = full;
    if (!full.device().is_cpu()) {
      host = Tensor::empty(full.shape(), full.dtype(), Device::cpu(), "export staging");
      copy(host, full);
    }
    for (const model::ParamSpec& p : unit.params) {
      Tensor out = Tensor::empty(p.full_shape, o.dtype, Device::cpu(), "export");
      Tensor flat = out.view({p.full_numel()});
      // a whole parameter from the first part; a split one from each part's runs
      for (int t = 0; t < (p.split_dim >= 0 ? parts : 1); ++t) {
        const model::ParamSpec part = p.part(t);
        const Tensor src = host.flat_range(t * unit.numel + p.offset, p.numel());
        model::for_each_run(part, 0, p.numel(), [&](int64_t full_first, int64_t local_first, int64_t n) {
          Tensor dst = flat.flat_range(full_first, n);
          ops::cast(dst, src.flat_range(local_first, n));
        });
      }
      const auto part = fused_part.find(p.name);
      if (part == fused_part.end()) {
        shards->add(p.name, out);
        continue;
      }
      const model::FusedTensor& f = fused[part->second.first];
      auto& [whole, parts_in] = filling[part->second.first];
      if (!whole.defined()) whole = Tensor::empty(f.shape, o.dtype, Device::cpu(), "export fused");
      Tensor rows = whole.view({f.shape.numel()}).flat_range(f.offsets[part->second.second], p.full_numel());
      ops::cast(rows, flat);
      if (++parts_in == f.parts.size()) {
        shards->add(f.name, whole);
        filling.erase(part->second.first);
      }
    }
  }
  if (!writer) return;
  ST_ASSERT(filling.empty(), "export: a fused tensor missing some of its parts");
  shards->finish();
  const char* torch_dtype = o.dtype == DType::kBF16 ? "bfloat16" : o.dtype == DType::kF16 ? "float16" : "float32";
  nlohmann::json hf_config = model::to_hf_config(config, torch_dtype);
  if (o.with_tokenizer) write_tokenizer(o, config, staged, hf_config);
  io::write_file_atomic((fs::path(staged) / "config.json").string(), hf_config.dump(2) + "\n");
  swap_in_export(staged, o.folder, o.folder_key);  // fsyncs the copies too
  remove_staged.path = nullptr;
}

std::string export_checkpoint(const std::string& checkpoint, ExportOptions options) {
  check_export_target(options.folder, options.folder_key);  // before the checkpoint is read
  std::string dir = checkpoint;
  if (!fs::exists(fs::path(checkpoint) / "metadata.json") && fs::exists(fs::path(checkpoint) / "latest"))
    dir = resolve_checkpoint("auto", checkpoint);
  const CheckpointInfo info = read_checkpoint_info(dir);
  const model::ModelLayout layout = model::ModelLayout::llama(info.config, 1);
  auto comm = dist::make_single_rank();
  fsdp::ShardedUnitStore store(layout, comm.get(), fsdp::ShardingOptions{});
  load_checkpoint(info, store, nullptr);
  if (options.tokenizer_source.empty()) {
    options.tokenizer_source = info.tokenizer_source;
    options.tokenizer_key = fmt::format("the tokenizer checkpoint `{}` records (another one: --tokenizer)", dir);
  } else {
    options.tokenizer_key = "--tokenizer";
  }
  export_hf(store, info.config, *comm, options);
  return dir;
}

}  // namespace shardtrain::train
