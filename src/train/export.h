// Exporting a sharded model as a Hugging Face folder: config.json, safetensors shards with
// an index, and the tokenizer files of the source folder, loadable by transformers'
// AutoModelForCausalLM.from_pretrained. Units are gathered one at a time; rank 0 writes.
#pragma once

#include <string>

#include "dist/communicator.h"
#include "fsdp/sharded_store.h"
#include "model/config.h"

namespace shardtrain::train {

struct ExportOptions {
  std::string folder;
  DType dtype = DType::kBF16;             // weights are cast to this on the way out
  int64_t max_shard_bytes = int64_t{5} << 30;
  std::string tokenizer_source;           // folder whose tokenizer files are copied ("" for none)
  std::string folder_key = "export.folder";  // where `folder` came from, named in errors
};

// The folder is written beside `folder` and swapped in whole (run_paths.h): a reader sees the
// previous export or this one, never a mix; leftovers of interrupted exports are removed first.
// Collective over `comm` (every rank of the run). With tensor parallelism, `tp_comm` holds
// this rank's group: a block's parts are gathered over it and joined into whole tensors.
void export_hf(fsdp::ShardedUnitStore& store, const model::LlamaConfig& config, dist::Communicator& comm,
               const ExportOptions& options, dist::Communicator* tp_comm = nullptr);

// `shardtrain export CHECKPOINT OUT`: one process reads a checkpoint written by any number
// of ranks (a step directory, or a checkpoints folder whose `latest` names one) and writes
// the HF folder. options.tokenizer_source "" takes the one the checkpoint recorded.
// Returns the step directory it read.
std::string export_checkpoint(const std::string& checkpoint, ExportOptions options);

}  // namespace shardtrain::train
