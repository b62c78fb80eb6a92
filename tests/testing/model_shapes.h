// The published model shapes the tests check figures against (Llama 3.2 1B, Llama 3.1 8B and
// 405B, Llama 2 70B), and the small GQA shape the GPU engine tests train.
#pragma once

#include "model/config.h"

namespace shardtrain::testing {

// 16 layers, width 2048, 32/8 heads, FFN 8192, vocabulary 128256, tied head, seq 4096.
inline model::LlamaConfig llama_1b() {
  model::LlamaConfig c;
  c.vocab_size = 128256;
  c.dim = 2048;
  c.n_layers = 16;
  c.n_heads = 32;
  c.n_kv_heads = 8;
  c.ffn_dim = 8192;
  c.max_seq_len = 4096;
  c.tie_embeddings = true;
  return c;
}

// 32 layers, width 4096, 32/8 heads, FFN 14336, vocabulary 128256, untied head.
inline model::LlamaConfig llama_8b() {
  model::LlamaConfig c = llama_1b();
  c.dim = 4096;
  c.n_layers = 32;
  c.ffn_dim = 14336;
  c.tie_embeddings = false;
  return c;
}

// 80 layers, width 8192, 64/8 heads, FFN 28672, vocabulary 32000, untied head.
inline model::LlamaConfig llama2_70b() {
  model::LlamaConfig c = llama_8b();
  c.vocab_size = 32000;
  c.dim = 8192;
  c.n_layers = 80;
  c.n_heads = 64;
  c.ffn_dim = 28672;
  return c;
}

// 126 layers, width 16384, 128/8 heads, FFN 53248, vocabulary 128256, untied head.
inline model::LlamaConfig llama31_405b() {
  model::LlamaConfig c = llama_8b();
  c.dim = 16384;
  c.n_layers = 126;
  c.n_heads = 128;
  c.ffn_dim = 53248;
  return c;
}

// 3 blocks, width 256, GQA 4/2, FFN 640, sequences up to 128 tokens, vocabulary 1000.
inline model::LlamaConfig small_gqa(bool tied) {
  model::LlamaConfig c;
  c.vocab_size = 1000;
  c.dim = 256;
  c.n_layers = 3;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.ffn_dim = 640;
  c.max_seq_len = 128;
  c.tie_embeddings = tied;
  return c;
}

}  // namespace shardtrain::testing
