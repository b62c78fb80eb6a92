// Small random models written to disk the way shardtrain writes them: a Hugging Face folder
// (export_hf) and a checkpoint (save_checkpoint), for the tests of what reads them back.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>

#include "dist/communicator.h"
#include "fsdp/sharded_store.h"
#include "model/config.h"
#include "train/checkpoint.h"
#include "train/export.h"

namespace shardtrain::testing {

// 2 blocks, width 32, GQA 4/2, FFN 40, vocabulary 300 (room for the byte tokenizer's 258),
// 64 positions, untied head.
inline model::LlamaConfig tiny_generation_config() {
  model::LlamaConfig c;
  c.vocab_size = 300;
  c.dim = 32;
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.ffn_dim = 40;
  c.max_seq_len = 64;
  c.rope.theta = 10000.0;
  c.init_std = 0.3;  // logits spread well beyond rounding
  return c;
}

// A one-rank store of `config`, initialised from `seed`.
struct TinyStore {
  model::ModelLayout layout;
  std::unique_ptr<dist::Communicator> comm;
  std::unique_ptr<fsdp::ShardedUnitStore> store;
  TinyStore(const model::LlamaConfig& config, uint64_t seed)
      : layout(model::ModelLayout::llama(config, 1)), comm(dist::make_single_rank()) {
    store = std::make_unique<fsdp::ShardedUnitStore>(layout, comm.get(), fsdp::ShardingOptions{});
    store->init_random(seed, config.init_std);
  }
};

// `folder` (replaced) as a Hugging Face folder of f32 weights, with the tokenizer files of
// `tokenizer_source` ("" for the byte-level tokenizer's), or none when `with_tokenizer` is false.
inline void write_hf_folder(TinyStore& s, const model::LlamaConfig& config, const std::string& folder,
                            const std::string& tokenizer_source = "", bool with_tokenizer = true) {
  std::filesystem::remove_all(folder);
  train::ExportOptions o;
  o.folder = folder;
  o.dtype = DType::kF32;
  o.tokenizer_source = tokenizer_source;
  o.with_tokenizer = with_tokenizer;
  train::export_hf(*s.store, config, *s.comm, o);
}

// A checkpoint of step `step` under `root` (replaced); returns its step directory.
inline std::string write_checkpoint(TinyStore& s, const model::LlamaConfig& config, const std::string& root,
                                    int64_t step, const std::string& tokenizer_source = "") {
  std::filesystem::remove_all(root);
  return train::save_checkpoint(root, step, config, tokenizer_source, *s.store, nullptr, *s.comm, 0);
}

}  // namespace shardtrain::testing
