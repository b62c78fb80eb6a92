// Sampling text from a model: temperature, top-k and top-p (nucleus) over the last position's
// logits. The prompt runs once and each new token alone, over a KV cache (model/kv_cache.h),
// on the CPU and on a GPU.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/random.h"
#include "data/chat_template.h"
#include "data/tokenizer.h"
#include "model/llama.h"

namespace shardtrain::train {

// What sampling does once BOS + prompt + generated tokens fill the model's max_seq_len positions.
enum class ContextLimit {
  kSlide,  // the context becomes the last max_seq_len tokens, recomputed for every new token
  kStop,   // a longer prompt is an error; generation stops once the context is full
};

struct SampleOptions {
  std::string prompt;
  int64_t tokens = 200;
  double temperature = 0.8;  // 0: greedy
  int64_t top_k = 40;        // 0: all tokens
  // Nucleus: among the top-k, the fewest most likely tokens whose probabilities (at the
  // temperature) sum to at least top_p; 1: all of them. In (0, 1].
  double top_p = 1.0;
  uint64_t seed = 7;
  ContextLimit context_limit = ContextLimit::kSlide;
  // false: recompute the whole context for every token (the reference the cache is tested
  // against).
  bool kv_cache = true;
  // On a GPU with the KV cache: each one-token step after the first replays a CUDA graph
  // (model/captured_decode.h) instead of launching its kernels one by one; same kernels, same
  // results. false: every step eager.
  bool cuda_graph = true;
  // false: the prompt is text already laid out for the model, its BOS included (a chat
  // template's, chat_prompt below), so none is put before it.
  bool add_bos = true;
  // Ids that end the sample as the tokenizer's EOS does (a chat model's end of turn).
  std::vector<int32_t> stop_ids;
};

enum class StopReason { kTokens, kEos, kContextFull };  // kEos: EOS or one of stop_ids

struct SampleResult {
  std::string text;             // the prompt followed by the generated text
  std::vector<int32_t> ids;     // generated ids (no EOS)
  int64_t prompt_tokens = 0;    // BOS (if the tokenizer has one and add_bos) + prompt
  StopReason stop = StopReason::kTokens;
  double first_token_s = 0;     // the prompt's forward and the first pick
  double rest_s = 0;            // every later token
  bool used_kv_cache = false;
};

// Called with the text of each generated token as soon as it is picked (decoding is per
// token: the pieces concatenate to the generated text).
using TextSink = std::function<void(std::string_view piece)>;

// Checks the options (tokens >= 0, temperature >= 0, top_k >= 0, 0 < top_p <= 1), naming
// `what` and the option in the error.
void check_sample_options(const SampleOptions& options, const std::string& what);

// Continues BOS + prompt by up to `tokens` tokens, stopping at EOS. Ids the tokenizer does
// not have (a model vocabulary padded beyond it) are never picked.
SampleResult sample(model::Llama& model, const data::Tokenizer& tokenizer, const SampleOptions& options,
                    const TextSink& sink = {});

// sample(...).text: the end-of-training sample.
std::string generate(model::Llama& model, const data::Tokenizer& tokenizer, const SampleOptions& options);

// A conversation's start for a chat model: the tokenizer's chat template (tokenizer_config.json's
// chat_template) over the messages (and tool schemas, or none), ending in the assistant's header
// as add_generation_prompt writes it; and the ids that end the assistant's turn (EOS and the
// end-of-turn markers <|eot_id|>, <|eom_id|>, <|im_end|>, <|end|>, those the tokenizer has as
// special tokens). For SampleOptions with add_bos = false (the template writes BOS itself).
// Throws, naming the tokenizer, without a chat template.
struct ChatPrompt {
  std::string text;
  std::vector<int32_t> stop_ids;
};
ChatPrompt chat_prompt(const data::Tokenizer& tokenizer, std::span<const data::ChatMessage> messages,
                       const data::jinja::Value& tools);
// An optional system message and one user message.
ChatPrompt chat_prompt(const data::Tokenizer& tokenizer, const std::string& system, const std::string& user);

// The next token from `logits` (one per candidate id): the largest with temperature 0, else
// drawn (one uniform from `rng`) from softmax(logits / temperature) cut to top_k, then top_p.
// Ties are ordered by id.
int32_t pick_token(std::span<const double> logits, const SampleOptions& options, CounterRng& rng);

}  // namespace shardtrain::train
