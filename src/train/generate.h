// Sampling text from a model: temperature and top-k over the last position's logits.
#pragma once

#include <cstdint>
#include <string>

#include "data/tokenizer.h"
#include "model/llama.h"

namespace shardtrain::train {

struct SampleOptions {
  std::string prompt;
  int64_t tokens = 200;
  double temperature = 0.8;  // 0: greedy
  int64_t top_k = 40;        // 0: all tokens
  uint64_t seed = 7;
};

// Continues BOS + prompt by up to `tokens` tokens (stopping at EOS); returns the prompt
// followed by the generated text. The context is the last max_seq_len tokens.
std::string generate(model::Llama& model, const data::Tokenizer& tokenizer, const SampleOptions& options);

}  // namespace shardtrain::train
