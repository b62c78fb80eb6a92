// Training checkpoints: a directory CHECKPOINTS/step_00000123/ written atomically (a
// temporary directory, every file fsynced, then renamed; `latest` is updated after), with
//   metadata.json                       format version, step, the mesh it came from, the
//                                       model config (as HF config.json), the tokenizer
//                                       source, and the piece list of every rank file
//   rank_00000-of-00004.safetensors     that rank's pieces: f32 master weights and AdamW
//                                       state, each named "<param>|<kind>|<first>:<end>"
//                                       (kind: master, exp_avg, exp_avg_sq; elements
//                                       [first, end) of the parameter, row-major)
// Padding is never saved. Any number of ranks loads any checkpoint: each rank reads only
// the pieces that overlap its own shard ranges, whatever mesh wrote them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dist/communicator.h"
#include "fsdp/sharded_store.h"
#include "model/config.h"
#include "optim/adamw.h"

namespace shardtrain::train {

struct CheckpointInfo {
  std::string path;      // the step directory
  int64_t step = 0;      // optimizer steps completed
  int world_size = 0;    // ranks that wrote it
  model::LlamaConfig config;
  std::string tokenizer_source;  // folder with tokenizer files ("" when the tokenizer was built in)
};

// Collective: every rank writes its pieces; rank 0 writes the metadata, renames the
// directory into place, points `latest` at it and deletes all but the newest `keep` step
// directories (0 keeps all). Returns the step directory.
std::string save_checkpoint(const std::string& root, int64_t step, const model::LlamaConfig& config,
                            const std::string& tokenizer_source, fsdp::ShardedUnitStore& store,
                            optim::AdamW* optimizer, dist::Communicator& comm, int keep);

// Resolves "auto" (the checkpoint `latest` names under root, or "" when there is none) or
// a step directory, and reads its metadata (throws naming the file on any problem).
std::string resolve_checkpoint(const std::string& spec, const std::string& root);
CheckpointInfo read_checkpoint_info(const std::string& step_dir);

// Fills this rank's master shards (and the optimizer's state and step count, when given)
// from the checkpoint's pieces. The store's layout must match the checkpoint's config.
void load_checkpoint(const CheckpointInfo& info, fsdp::ShardedUnitStore& store, optim::AdamW* optimizer);

// The whole model's master weights into `unit_params` (one full buffer [unit.numel] per unit
// of `layout`, on the host, any float dtype; padding untouched), in one process: a model to
// sample from. `layout` must be the checkpoint's config's.
void load_checkpoint_params(const CheckpointInfo& info, const model::ModelLayout& layout,
                            std::vector<Tensor>& unit_params);

}  // namespace shardtrain::train
