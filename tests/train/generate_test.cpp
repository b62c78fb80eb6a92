// Sampling: greedy and seeded sampling over the KV cache pick exactly the ids the recompute
// path picks (also past max_seq_len, where the context slides); a seed repeats a sample;
// top-k = 1 and a tiny top-p are greedy; top-k and top-p draw only from their tokens;
// ContextLimit::kStop names the lengths of a prompt that does not fit and stops a full context.
// With sliding-window layers the cache and the recompute path pick the same ids too.
#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "testing/compare.h"
#include "train/generate.h"

namespace shardtrain::train {
namespace {

// Token i is the text "<i>"; the prompt is read as one token per character (its byte modulo
// the vocabulary). BOS 0, EOS configurable (-1: none), so a test decides whether EOS can stop it.
class IdTokenizer final : public data::Tokenizer {
 public:
  IdTokenizer(int64_t vocab, int32_t eos) : vocab_(vocab), eos_(eos) {}
  std::vector<int32_t> encode(std::string_view text) const override {
    std::vector<int32_t> ids;
    for (char c : text) ids.push_back(static_cast<int32_t>(static_cast<unsigned char>(c) % vocab_));
    return ids;
  }
  std::string decode(std::span<const int32_t> ids) const override {
    std::string s;
    for (int32_t id : ids) {  // appended piece by piece: "<" + std::string trips GCC 12's -Wrestrict
      s += '<';
      s += std::to_string(id);
      s += '>';
    }
    return s;
  }
  int64_t vocab_size() const override { return vocab_; }
  int32_t bos_id() const override { return 0; }
  int32_t eos_id() const override { return eos_; }

 private:
  int64_t vocab_;
  int32_t eos_;
};

// 3 blocks, GQA 6/2 of head dimension 6, FFN 22, vocabulary 41, 40 positions.
model::LlamaConfig small_config() {
  model::LlamaConfig cfg;
  cfg.vocab_size = 41;
  cfg.dim = 36;
  cfg.n_layers = 3;
  cfg.n_heads = 6;
  cfg.n_kv_heads = 2;
  cfg.ffn_dim = 22;
  cfg.max_seq_len = 40;
  cfg.rope.theta = 100.0;
  cfg.tie_embeddings = false;
  return cfg;
}

// Random weights with a spread that makes the logits differ by far more than rounding.
void randomize(model::Llama& m, uint64_t seed) {
  for (size_t u = 0; u < m.layout().units().size(); ++u)
    for (const model::ParamSpec& p : m.layout().units()[u].params) {
      Tensor v = m.param(p.name);
      testing::fill_random(v, seed + u * 101 + static_cast<uint64_t>(p.offset), p.is_matrix ? 0.02 : 1.0,
                           p.is_matrix ? 0.4 : 0.2);
    }
}

SampleOptions options(double temperature, int64_t top_k, double top_p, int64_t tokens) {
  SampleOptions o;
  o.prompt = "abcde";
  o.temperature = temperature;
  o.top_k = top_k;
  o.top_p = top_p;
  o.tokens = tokens;
  o.seed = 11;
  return o;
}

struct PathCase {
  const char* name;
  double temperature;
  int64_t top_k;
  double top_p;
  int64_t tokens;
  DType dtype;
};
void PrintTo(const PathCase& c, std::ostream* os) { *os << c.name; }

class CacheAndRecompute : public ::testing::TestWithParam<PathCase> {};

TEST_P(CacheAndRecompute, PickTheSameIds) {
  const PathCase c = GetParam();
  model::Llama model(small_config(), c.dtype);
  randomize(model, 23);
  const IdTokenizer tok(41, -1);
  SampleOptions o = options(c.temperature, c.top_k, c.top_p, c.tokens);
  const SampleResult cached = sample(model, tok, o);
  o.kv_cache = false;
  const SampleResult recomputed = sample(model, tok, o);
  EXPECT_TRUE(cached.used_kv_cache);
  EXPECT_FALSE(recomputed.used_kv_cache);
  EXPECT_EQ(cached.ids.size(), static_cast<size_t>(c.tokens));
  EXPECT_EQ(cached.ids, recomputed.ids) << c.name;
  EXPECT_EQ(cached.text, recomputed.text);
  EXPECT_EQ(cached.text.rfind("abcde", 0), 0u) << "the text starts with the prompt";
  std::set<int32_t> distinct(cached.ids.begin(), cached.ids.end());
  EXPECT_GT(distinct.size(), 3u) << "a sample that says something";
}

// 6 prompt tokens (BOS + 5): 30 tokens stay within the 40 positions; 60 go past them, where
// the window slides (recomputed, as the recompute path does from the start).
INSTANTIATE_TEST_SUITE_P(
    Small, CacheAndRecompute,
    ::testing::Values(PathCase{"greedy_f64", 0.0, 0, 1.0, 30, DType::kF64},
                      PathCase{"greedy_f32", 0.0, 0, 1.0, 30, DType::kF32},
                      PathCase{"greedy_past_the_context_f64", 0.0, 0, 1.0, 60, DType::kF64},
                      PathCase{"sampled_topk8_f64", 0.9, 8, 1.0, 30, DType::kF64},
                      PathCase{"sampled_topp09_past_the_context_f64", 1.0, 0, 0.9, 60, DType::kF64}),
    [](const ::testing::TestParamInfo<PathCase>& i) { return std::string(i.param.name); });

// Sliding windows of 4 positions on layers 0 and 2 (layer 1 full): the cached continuation is
// the recomputed one, within the context and past it, and the window changes what is picked.
TEST(CacheAndRecomputeWithSlidingWindow, PickTheSameIds) {
  model::LlamaConfig cfg = small_config();
  cfg.sliding_window = 4;
  cfg.sliding_layers = {true, false, true};
  const IdTokenizer tok(41, -1);
  for (const int64_t tokens : {int64_t{30}, int64_t{60}}) {
    SCOPED_TRACE(std::to_string(tokens) + " tokens");
    model::Llama model(cfg, DType::kF64);
    randomize(model, 23);
    SampleOptions o = options(0.0, 0, 1.0, tokens);
    const SampleResult cached = sample(model, tok, o);
    o.kv_cache = false;
    const SampleResult recomputed = sample(model, tok, o);
    EXPECT_TRUE(cached.used_kv_cache);
    EXPECT_EQ(cached.ids, recomputed.ids);
    model::Llama full(small_config(), DType::kF64);
    randomize(full, 23);
    EXPECT_NE(sample(full, tok, options(0.0, 0, 1.0, tokens)).ids, cached.ids) << "the window matters";
  }
}

TEST(Sampling, ASeedRepeatsAndTopKOneOrATinyTopPIsGreedy) {
  model::Llama model(small_config(), DType::kF32);
  randomize(model, 29);
  const IdTokenizer tok(41, -1);
  const SampleResult greedy = sample(model, tok, options(0.0, 0, 1.0, 25));
  const SampleResult a = sample(model, tok, options(1.0, 20, 0.95, 25));
  const SampleResult b = sample(model, tok, options(1.0, 20, 0.95, 25));
  EXPECT_EQ(a.ids, b.ids) << "same seed, same sample";
  SampleOptions other = options(1.0, 20, 0.95, 25);
  other.seed = 12;
  EXPECT_NE(sample(model, tok, other).ids, a.ids) << "another seed, another sample";
  EXPECT_NE(a.ids, greedy.ids) << "sampling at temperature 1 is not greedy";
  EXPECT_EQ(sample(model, tok, options(0.8, 1, 1.0, 25)).ids, greedy.ids) << "top-k 1";
  EXPECT_EQ(sample(model, tok, options(5.0, 1, 1.0, 25)).ids, greedy.ids) << "top-k 1 at any temperature";
  EXPECT_EQ(sample(model, tok, options(0.8, 0, 1e-9, 25)).ids, greedy.ids) << "top-p 1e-9";
}

TEST(Sampling, PicksStayInsideTopKAndTopP) {
  // probabilities at temperature 1: 0.5, 0.25, 0.125, 0.0625, ... of ids 3, 0, 4, 1, ...
  const std::vector<double> logits = {std::log(0.25), std::log(0.0625), std::log(0.01), std::log(0.5),
                                      std::log(0.125), std::log(0.02)};
  auto counts = [&](int64_t top_k, double top_p) {
    SampleOptions o;
    o.temperature = 1.0;
    o.top_k = top_k;
    o.top_p = top_p;
    CounterRng rng(3);
    std::map<int32_t, int> n;
    for (int i = 0; i < 4000; ++i) ++n[pick_token(logits, o, rng)];
    return n;
  };
  auto ids_of = [](const std::map<int32_t, int>& n) {
    std::set<int32_t> s;
    for (const auto& [id, c] : n) s.insert(id);
    return s;
  };
  EXPECT_EQ(ids_of(counts(2, 1.0)), (std::set<int32_t>{3, 0})) << "top-k 2";
  EXPECT_EQ(ids_of(counts(0, 0.7)), (std::set<int32_t>{3, 0})) << "top-p 0.7: 0.75 of 0.9675 is 0.78";
  EXPECT_EQ(ids_of(counts(0, 0.8)), (std::set<int32_t>{3, 0, 4})) << "top-p 0.8: 0.78 < 0.8";
  EXPECT_EQ(ids_of(counts(3, 0.99)), (std::set<int32_t>{3, 0, 4})) << "top-k 3 first, then top-p";
  EXPECT_EQ(ids_of(counts(0, 1.0)).size(), logits.size()) << "no cut: every id";
  const std::map<int32_t, int> two = counts(2, 1.0);  // 2 : 1 between ids 3 and 0
  EXPECT_NEAR(static_cast<double>(two.at(3)) / 4000, 2.0 / 3.0, 0.03);

  SampleOptions greedy;
  greedy.temperature = 0;
  CounterRng rng(1);
  EXPECT_EQ(pick_token(logits, greedy, rng), 3);
  EXPECT_EQ(rng.counter(), 0u) << "greedy draws nothing";
  const std::vector<double> tied = {1.0, 2.0, 0.5, 2.0};
  EXPECT_EQ(pick_token(tied, greedy, rng), 1) << "ties go to the smaller id";
  SampleOptions top1 = greedy;
  top1.temperature = 0.7;
  top1.top_k = 1;
  EXPECT_EQ(pick_token(tied, top1, rng), 1);
}

TEST(Sampling, StopsAtEosAndNeverPicksIdsTheTokenizerLacks) {
  model::Llama model(small_config(), DType::kF32);
  randomize(model, 23);
  // the first id of the greedy sample after its first that it has not picked before, as EOS:
  // the sample stops there
  const SampleResult free = sample(model, IdTokenizer(41, -1), options(0.0, 0, 1.0, 10));
  size_t i = 1;
  while (i < free.ids.size() && std::find(free.ids.begin(), free.ids.begin() + i, free.ids[i]) != free.ids.begin() + i)
    ++i;
  ASSERT_LT(i, free.ids.size());
  const SampleResult stopped = sample(model, IdTokenizer(41, free.ids[i]), options(0.0, 0, 1.0, 10));
  EXPECT_EQ(stopped.stop, StopReason::kEos);
  EXPECT_EQ(stopped.ids, std::vector<int32_t>(free.ids.begin(), free.ids.begin() + static_cast<int64_t>(i)));
  // a tokenizer of 20 ids under a model of 41: only ids below 20 come out
  const SampleResult small = sample(model, IdTokenizer(20, -1), options(1.5, 0, 1.0, 30));
  EXPECT_EQ(small.ids.size(), 30u);
  for (int32_t id : small.ids) EXPECT_LT(id, 20);
}

// A prompt already laid out (add_bos off) gets no BOS; stop_ids end the sample as EOS does.
TEST(Sampling, StopIdsEndTheSampleAndAddBosOffPutsNoBos) {
  model::Llama model(small_config(), DType::kF32);
  randomize(model, 23);
  const SampleResult free = sample(model, IdTokenizer(41, -1), options(0.0, 0, 1.0, 10));
  EXPECT_EQ(free.prompt_tokens, 6);  // BOS + "abcde"
  ASSERT_GE(free.ids.size(), 3u);
  SampleOptions o = options(0.0, 0, 1.0, 10);
  o.stop_ids = {40, free.ids[2]};
  const SampleResult stopped = sample(model, IdTokenizer(41, -1), o);
  EXPECT_EQ(stopped.stop, StopReason::kEos);
  const auto until = std::find(free.ids.begin(), free.ids.end(), free.ids[2]);
  EXPECT_EQ(stopped.ids, std::vector<int32_t>(free.ids.begin(), until));
  o = options(0.0, 0, 1.0, 3);
  o.prompt = std::string(1, '\0') + "abcde";  // id 0 (the BOS) written as text
  o.add_bos = false;
  const SampleResult laid_out = sample(model, IdTokenizer(41, -1), o);
  EXPECT_EQ(laid_out.prompt_tokens, 6);
  EXPECT_EQ(laid_out.ids, std::vector<int32_t>(free.ids.begin(), free.ids.begin() + 3));
}

TEST(Sampling, ChatPromptNeedsATemplate) {
  EXPECT_TRUE(testing::throws_with([] { (void)chat_prompt(IdTokenizer(41, -1), "", "hi"); },
                                   "a chat prompt needs a tokenizer with a chat template"));
}

TEST(Sampling, StopAtTheContextNamesTheLengths) {
  model::Llama model(small_config(), DType::kF32);
  randomize(model, 23);
  const IdTokenizer tok(41, -1);
  SampleOptions o = options(0.0, 0, 1.0, 100);
  o.context_limit = ContextLimit::kStop;
  // BOS + 5 prompt tokens, 40 positions: 35 more can be fed, the last pick reads position 39
  const SampleResult r = sample(model, tok, o);
  EXPECT_EQ(r.stop, StopReason::kContextFull);
  EXPECT_EQ(r.ids.size(), 35u);
  SampleOptions slide = o;
  slide.context_limit = ContextLimit::kSlide;
  slide.tokens = 35;
  EXPECT_EQ(sample(model, tok, slide).ids, r.ids) << "up to the full context both limits agree";

  o.prompt = std::string(40, 'x');
  try {
    sample(model, tok, o);
    ADD_FAILURE() << "no error for a 41-token prompt and 40 positions";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("the prompt is 41 tokens (with BOS), more than the model's context of "
                                         "max_seq_len = 40 tokens"),
              std::string::npos)
        << e.what();
  }
  o.prompt = std::string(39, 'x');  // exactly the context: one token, read from position 39
  const SampleResult full = sample(model, tok, o);
  EXPECT_EQ(full.ids.size(), 1u);
  EXPECT_EQ(full.stop, StopReason::kContextFull);
}

TEST(Sampling, OptionsOutsideTheirRangeAreNamed) {
  model::Llama model(small_config(), DType::kF32);
  const IdTokenizer tok(41, -1);
  for (const auto& [o, needle] :
       {std::pair{options(-1.0, 0, 1.0, 5), "temperature must be >= 0"}, std::pair{options(1.0, -2, 1.0, 5), "top-k"},
        std::pair{options(1.0, 0, 0.0, 5), "top-p must be in (0, 1]"},
        std::pair{options(1.0, 0, 1.5, 5), "top-p must be in (0, 1]"},
        std::pair{options(1.0, 0, 1.0, -1), "tokens must be >= 0"}}) {
    try {
      sample(model, tok, o);
      ADD_FAILURE() << "no error: " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace shardtrain::train
