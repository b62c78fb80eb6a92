// Autoregressive sampling. The prompt's keys and values are computed once into a KV cache and
// each new token runs alone over it (CPU and GPU); past max_seq_len with ContextLimit::kSlide,
// or when asked (SampleOptions::kv_cache off), the window is recomputed for every token.
#include "train/generate.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <numeric>
#include <optional>

#include "data/bpe_tokenizer.h"
#include "model/captured_decode.h"
#include "ops/elementwise.h"

namespace shardtrain::train {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// The logits of the sequence so far, through the cache where it holds the sequence's
// positions, else recomputed over the last max_seq_len tokens.
class NextLogits {
 public:
  NextLogits(model::Llama& model, bool use_cache, bool cuda_graph, int64_t positions)
      : model_(model), cuda_graph_(cuda_graph && model.device().is_cuda()) {
    if (use_cache)
      cache_.emplace(model.config(), 1, std::min(positions, model.config().max_seq_len), model.dtype(),
                     model.device(), model.kv_heads_per_rank());
  }
  bool cached() const { return cache_.has_value(); }

  // Logits [V] of the last of `ids`, as f64 on the host.
  std::vector<double> operator()(const std::vector<int32_t>& ids) {
    const int64_t n = static_cast<int64_t>(ids.size());
    Tensor logits;
    if (cache_ && n <= cache_->capacity()) {
      // LongRoPE (Phi-3): keys cached with the short factors are recomputed with the long ones
      // when the sequence first passes original_max_positions, as transformers' Phi-3 does
      const model::LlamaConfig& c = model_.config();
      if (cache_->length() > 0 && !c.rope_long(cache_->length()) && c.rope_long(n)) cache_->clear();
      const int64_t first = cache_->length();  // the positions the cache has not seen yet
      if (cuda_graph_ && n - first == 1) {  // one new token: the captured step
        if (!graph_) graph_ = std::make_unique<model::CapturedDecode>(model_, *cache_);
        logits = graph_->run(ids_tensor(ids, first, n));
      } else {
        logits = model_.last_logits_cached(ids_tensor(ids, first, n), *cache_);
      }
    } else {
      logits = model_.last_logits(ids_tensor(ids, std::max<int64_t>(0, n - model_.config().max_seq_len), n));
    }
    Tensor host = Tensor::empty(logits.shape(), DType::kF64, Device::cpu(), "sample logits");
    ops::cast(host, logits);
    const double* l = host.data<double>();
    return std::vector<double>(l, l + host.numel());
  }

 private:
  static Tensor ids_tensor(const std::vector<int32_t>& ids, int64_t begin, int64_t end) {
    Tensor x = Tensor::empty({1, end - begin}, DType::kI32, Device::cpu(), "sample ids");
    std::copy(ids.begin() + begin, ids.begin() + end, x.data<int32_t>());
    return x;
  }

  model::Llama& model_;
  bool cuda_graph_;
  std::optional<model::KvCache> cache_;
  std::unique_ptr<model::CapturedDecode> graph_;  // after cache_: destroyed first
};

}  // namespace

void check_sample_options(const SampleOptions& o, const std::string& what) {
  ST_CHECK(o.tokens >= 0, what, ": the number of tokens must be >= 0, found ", o.tokens);
  ST_CHECK(o.temperature >= 0 && std::isfinite(o.temperature), what,
           ": the temperature must be >= 0 (0 is greedy), found ", o.temperature);
  ST_CHECK(o.top_k >= 0, what, ": top-k must be >= 0 (0 is all tokens), found ", o.top_k);
  ST_CHECK(o.top_p > 0 && o.top_p <= 1, what, ": top-p must be in (0, 1] (1 is all tokens), found ", o.top_p);
}

int32_t pick_token(std::span<const double> logits, const SampleOptions& o, CounterRng& rng) {
  const int64_t V = static_cast<int64_t>(logits.size());
  ST_CHECK(V > 0, "pick_token: no logits");
  // a total order, so that partial and full sorts agree: larger logit first, then smaller id
  auto before = [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
  if (o.temperature <= 0) {  // greedy: the first of the largest
    int32_t best = 0;
    for (int32_t i = 1; i < V; ++i)
      if (before(i, best)) best = i;
    return best;
  }
  std::vector<int32_t> order(static_cast<size_t>(V));
  std::iota(order.begin(), order.end(), 0);
  const int64_t k = o.top_k > 0 ? std::min(o.top_k, V) : V;
  std::partial_sort(order.begin(), order.begin() + k, order.end(), before);
  // softmax(logit / temperature) over the top k, unnormalised, relative to the largest
  std::vector<double> p(static_cast<size_t>(k));
  const double top = logits[order[0]];
  double sum = 0;
  for (int64_t i = 0; i < k; ++i) sum += p[i] = std::exp((logits[order[i]] - top) / o.temperature);
  // nucleus: the shortest prefix holding at least top_p of the probability (HF's
  // TopPLogitsWarper keeps the same tokens)
  int64_t n = k;
  double kept = sum;
  if (o.top_p < 1) {
    kept = 0;
    for (n = 0; n < k;) {
      kept += p[n++];
      if (kept >= o.top_p * sum) break;
    }
  }
  double u = rng.next_uniform() * kept;
  for (int64_t i = 0; i < n; ++i) {
    u -= p[i];
    if (u <= 0) return order[i];
  }
  return order[static_cast<size_t>(n - 1)];
}

SampleResult sample(model::Llama& model, const data::Tokenizer& tokenizer, const SampleOptions& o,
                    const TextSink& sink) {
  check_sample_options(o, "sampling");
  SampleResult r;
  std::vector<int32_t> ids;
  if (o.add_bos && tokenizer.bos_id() >= 0) ids.push_back(tokenizer.bos_id());
  const std::vector<int32_t> prompt = tokenizer.encode(o.prompt);
  ids.insert(ids.end(), prompt.begin(), prompt.end());
  r.prompt_tokens = static_cast<int64_t>(ids.size());
  r.text = o.prompt;
  const int64_t window = model.config().max_seq_len;
  if (o.context_limit == ContextLimit::kStop)
    ST_CHECK(r.prompt_tokens <= window, "the prompt is ", r.prompt_tokens, " tokens",
             o.add_bos && tokenizer.bos_id() >= 0 ? " (with BOS)" : "",
             ", more than the model's context of max_seq_len = ", window, " tokens; shorten the prompt");
  if (o.tokens == 0 || ids.empty()) return r;
  // positions fed before the last pick: the prompt and all generated tokens but the last
  NextLogits next_logits(model, o.kv_cache, o.cuda_graph, r.prompt_tokens + o.tokens - 1);
  r.used_kv_cache = next_logits.cached();
  // candidates: ids both the model and the tokenizer have
  const size_t candidates = static_cast<size_t>(std::min(model.config().vocab_size, tokenizer.vocab_size()));
  CounterRng rng(o.seed);
  std::vector<int32_t> decoded = prompt;  // the prompt's and the generated ids, without BOS
  size_t decoded_bytes = tokenizer.decode(decoded).size();
  const Clock::time_point t0 = Clock::now();
  Clock::time_point t1 = t0;
  for (int64_t n = 0; n < o.tokens; ++n) {
    if (o.context_limit == ContextLimit::kStop && static_cast<int64_t>(ids.size()) > window) {
      r.stop = StopReason::kContextFull;
      break;
    }
    const std::vector<double> logits = next_logits(ids);
    const int32_t next = pick_token(std::span<const double>(logits).first(std::min(candidates, logits.size())), o, rng);
    if (n == 0) {
      r.first_token_s = seconds_since(t0);
      t1 = Clock::now();
    }
    const bool stop_id = std::find(o.stop_ids.begin(), o.stop_ids.end(), next) != o.stop_ids.end();
    if (next == tokenizer.eos_id() || stop_id) {
      r.stop = StopReason::kEos;
      break;
    }
    ids.push_back(next);
    r.ids.push_back(next);
    // what the new token adds to the decoded prompt and generation (a SentencePiece token
    // decoded alone, or first, would lose its leading space: the decoder strips the text's first)
    decoded.insert(decoded.end(), r.ids.back());
    std::string all = tokenizer.decode(decoded);
    const std::string piece = all.substr(decoded_bytes);
    decoded_bytes = all.size();
    r.text += piece;
    if (sink) sink(piece);
  }
  r.rest_s = seconds_since(t1);
  return r;
}

ChatPrompt chat_prompt(const data::Tokenizer& tokenizer, const std::string& system, const std::string& user) {
  std::vector<data::ChatMessage> messages;
  if (!system.empty()) messages.push_back({"system", system});
  messages.push_back({"user", user});
  return chat_prompt(tokenizer, messages, data::jinja::Value::none());
}

ChatPrompt chat_prompt(const data::Tokenizer& tokenizer, std::span<const data::ChatMessage> messages,
                       const data::jinja::Value& tools) {
  const auto* bpe = dynamic_cast<const data::BpeTokenizer*>(&tokenizer);
  ST_CHECK(bpe != nullptr && bpe->has_chat_template(), "a chat prompt needs a tokenizer with a chat template "
           "(tokenizer_config.json's chat_template), and ",
           bpe == nullptr ? "the byte-level tokenizer has none" : "this one has none: " + bpe->chat_template_problem());
  ChatPrompt p;
  p.text = bpe->render_chat(messages, true, tools).text;
  // the reply ends at the end-of-sequence token, or at the end-of-turn marker chat templates
  // of the Llama 3, ChatML (Qwen) and Phi families close a turn with, where the vocabulary has it
  if (tokenizer.eos_id() >= 0) p.stop_ids.push_back(tokenizer.eos_id());
  for (const char* marker : {"<|eot_id|>", "<|eom_id|>", "<|im_end|>", "<|end|>"}) {
    const int32_t id = bpe->token_to_id(marker);
    if (id >= 0 && bpe->is_special(id) &&
        std::find(p.stop_ids.begin(), p.stop_ids.end(), id) == p.stop_ids.end())
      p.stop_ids.push_back(id);
  }
  return p;
}

std::string generate(model::Llama& model, const data::Tokenizer& tokenizer, const SampleOptions& options) {
  return sample(model, tokenizer, options).text;
}

}  // namespace shardtrain::train
