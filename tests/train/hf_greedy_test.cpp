// Greedy generation against Hugging Face transformers on the CPU: for the tiny models recorded
// by tools/make_hf_reference.py with a greedy continuation, shardtrain opens the folder in f32
// and continues the same 200-id prompt with transformers' 32 ids, with its KV cache and without
// it (testing/hf_greedy.h). LongRoPE's switch to its long factors in the middle of a
// continuation, with the KV cache as without it.
#include <filesystem>
#include <string>

#include <gtest/gtest.h>

#include "testing/hf_greedy.h"
#include "train/open_model.h"

namespace shardtrain::train {
namespace {

class HfGreedy : public ::testing::TestWithParam<std::string> {};

// Cases listed in tools/make_hf_reference.py whose folders are not committed yet: skipped
// until they are (the others must be there).
TEST_P(HfGreedy, ContinuesThePromptAsTransformers) {
  const OpenedModel opened = open_model(testing::hf_reference_dir(GetParam()), DType::kF32, Device::cpu());
  testing::expect_greedy_as_transformers(*opened.model, GetParam());
}

INSTANTIATE_TEST_SUITE_P(Transformers, HfGreedy,
                         ::testing::Values("mistral_head_dim", "qwen3_qk_norm", "mistral_sliding", "ministral_layers",
                                           "qwen2_window_layers", "smollm3_nope", "granite_scaled",
                                           "olmo2_post_norms", "gemma3_text_small", "gemma2_softcap",
                                           "phi3_longrope", "phi4_partial_rotary"));

// LongRoPE (Phi-3) past original_max_position_embeddings (16 in phi3_longrope): a prompt of 8
// ids sampled on to 40 positions picks the same ids with the KV cache as recomputing the context
// for every token, which rotates every key with the long factors once the sequence passes 16
// positions; the cache's keys, rotated with the short ones, are recomputed then, as
// transformers' Phi-3 does.
TEST(HfGreedyLongRope, TheCacheSwitchesToTheLongFactorsWithTheWholeSequence) {
  const OpenedModel opened = open_model(testing::hf_reference_dir("phi3_longrope"), DType::kF32, Device::cpu());
  ASSERT_EQ(opened.model->config().rope.scaling.original_max_positions, 16);
  const testing::ByteIdTokenizer tok(opened.model->config().vocab_size);
  SampleOptions o;
  o.prompt = "0123?@AB";  // ids 48..66, inside the vocabulary of 67
  o.tokens = 32;
  o.temperature = 1.0;  // sampled: every logit counts, not only the top one
  o.top_k = 0;
  o.add_bos = false;
  o.context_limit = ContextLimit::kStop;
  for (const uint64_t seed : {1, 2, 3}) {
    o.seed = seed;
    o.kv_cache = false;
    const SampleResult recomputed = sample(*opened.model, tok, o);
    o.kv_cache = true;
    const SampleResult cached = sample(*opened.model, tok, o);
    EXPECT_TRUE(cached.used_kv_cache);
    EXPECT_EQ(cached.ids, recomputed.ids) << "seed " << seed;
  }
}

}  // namespace
}  // namespace shardtrain::train
