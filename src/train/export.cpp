// Export: gather each unit collectively, cast its parameters, stream them into shards.
#include "train/export.h"

#include <filesystem>

#include "io/safetensors_writer.h"
#include "model/hf_config.h"
#include "ops/elementwise.h"

namespace shardtrain::train {

void export_hf(fsdp::ShardedUnitStore& store, const model::LlamaConfig& config, dist::Communicator& comm,
               const ExportOptions& o) {
  namespace fs = std::filesystem;
  const bool writer = comm.rank() == 0;
  std::unique_ptr<io::ShardedWriter> shards;
  if (writer) shards = std::make_unique<io::ShardedWriter>(o.folder, o.max_shard_bytes);
  const model::ModelLayout& layout = store.layout();
  for (size_t u = 0; u < layout.units().size(); ++u) {
    const Tensor full = store.acquire_params(u, model::Pass::kEval);  // collective: every rank joins
    if (writer) {
      for (const model::ParamSpec& p : layout.units()[u].params) {
        Tensor out = Tensor::empty(p.shape, o.dtype, Device::cpu(), "export");
        Tensor flat = out.view({p.numel()});
        ops::cast(flat, full.flat_range(p.offset, p.numel()));
        shards->add(p.name, out);
      }
    }
    store.release_params(u, model::Pass::kEval);
  }
  if (!writer) return;
  shards->finish();
  const char* torch_dtype = o.dtype == DType::kBF16 ? "bfloat16" : o.dtype == DType::kF16 ? "float16" : "float32";
  io::write_file_atomic((fs::path(o.folder) / "config.json").string(),
                        model::to_hf_config(config, torch_dtype).dump(2) + "\n");
  if (!o.tokenizer_source.empty()) {
    for (const char* f : {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json"}) {
      const fs::path src = fs::path(o.tokenizer_source) / f;
      if (fs::exists(src)) fs::copy_file(src, fs::path(o.folder) / f, fs::copy_options::overwrite_existing);
    }
  }
}

}  // namespace shardtrain::train
