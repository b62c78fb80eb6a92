// Export: gather each unit collectively, cast its parameters, stream them into shards.
#include "train/export.h"

#include <unistd.h>

#include <filesystem>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/log.h"
#include "io/safetensors_writer.h"
#include "model/hf_config.h"
#include "ops/elementwise.h"
#include "train/checkpoint.h"
#include "train/run_paths.h"

namespace shardtrain::train {

void export_hf(fsdp::ShardedUnitStore& store, const model::LlamaConfig& config, dist::Communicator& comm,
               const ExportOptions& o, dist::Communicator* tp_comm) {
  namespace fs = std::filesystem;
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
      shards->add(p.name, out);
    }
  }
  if (!writer) return;
  shards->finish();
  const char* torch_dtype = o.dtype == DType::kBF16 ? "bfloat16" : o.dtype == DType::kF16 ? "float16" : "float32";
  io::write_file_atomic((fs::path(staged) / "config.json").string(),
                        model::to_hf_config(config, torch_dtype).dump(2) + "\n");
  if (!o.tokenizer_source.empty()) {
    for (const char* f : {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                          "generation_config.json", "tokenizer.model"}) {
      const fs::path src = fs::path(o.tokenizer_source) / f;
      if (fs::exists(src)) fs::copy_file(src, fs::path(staged) / f, fs::copy_options::overwrite_existing);
    }
  }
  swap_in_export(staged, o.folder, o.folder_key);  // fsyncs the copies too
  remove_staged.path = nullptr;
}

std::string export_checkpoint(const std::string& checkpoint, ExportOptions options) {
  namespace fs = std::filesystem;
  check_export_target(options.folder, options.folder_key);  // before the checkpoint is read
  std::string dir = checkpoint;
  if (!fs::exists(fs::path(checkpoint) / "metadata.json") && fs::exists(fs::path(checkpoint) / "latest"))
    dir = resolve_checkpoint("auto", checkpoint);
  const CheckpointInfo info = read_checkpoint_info(dir);
  const model::ModelLayout layout = model::ModelLayout::llama(info.config, 1);
  auto comm = dist::make_single_rank();
  fsdp::ShardedUnitStore store(layout, comm.get(), fsdp::ShardingOptions{});
  load_checkpoint(info, store, nullptr);
  if (options.tokenizer_source.empty()) options.tokenizer_source = info.tokenizer_source;
  export_hf(store, info.config, *comm, options);
  return dir;
}

}  // namespace shardtrain::train
