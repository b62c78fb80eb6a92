// Exporting a sharded model as a Hugging Face folder: config.json (with the tokenizer's BOS and
// EOS ids), safetensors shards with an index, and the tokenizer's files (the byte-level
// tokenizer's written, data::byte_tokenizer_files; a tokenizer.json's copied with the files
// beside it), loadable by transformers' AutoModelForCausalLM and AutoTokenizer.from_pretrained
// and by `shardtrain generate`. Units are gathered one at a time; rank 0 writes.
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
  // The tokenizer the export carries: "" (or "byte") the byte-level tokenizer; else a folder holding
  // tokenizer.json, or a tokenizer.json (copied as tokenizer.json), whose folder's
  // tokenizer_config.json, special_tokens_map.json, generation_config.json and tokenizer.model
  // are copied when there.
  std::string tokenizer_source;
  bool with_tokenizer = true;             // false: weights and config.json only
  std::string tokenizer_key = "the tokenizer the export carries";  // where tokenizer_source came from, in errors
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
// the HF folder. options.tokenizer_source "" takes the one the checkpoint recorded (the
// byte-level tokenizer when it recorded none).
// Returns the step directory it read.
std::string export_checkpoint(const std::string& checkpoint, ExportOptions options);

}  // namespace shardtrain::train
