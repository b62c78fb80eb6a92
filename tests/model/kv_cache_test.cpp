// Incremental decoding over a KV cache against recomputing the whole prefix: the logits of
// every position, with the prompt prefilled at once and then one token (or a few) per call,
// equal Llama::last_logits of the same prefix, on small random GQA models with odd sizes (tied
// and untied, q/k/v biases, llama3 rope scaling, stacked and separate projections, two
// sequences, sliding windows); a call that does not fit leaves the cache as it was.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "model/kv_cache.h"
#include "model/llama.h"
#include "testing/compare.h"

namespace shardtrain::model {
namespace {

struct CacheCase {
  const char* name;
  bool tied, bias, llama3_rope, separate_projections;
  int64_t batch;
  DType dtype;
  int64_t head_dim = 0;  // 0: dim / n_heads (6)
  bool qk_norm = false;  // Qwen3's norm of each head's q and k: the cache holds k normed, then rotated
  int64_t window = 0;    // > 0: a sliding window of this many positions on layers 0 and 2 (layer 1 full)
  bool nope = false;     // SmolLM3's NoPE layers: layer 1 without rope (the cache holds its k unrotated)
  bool granite = false;  // Granite's embedding, residual, attention and logits scalings
  bool olmo2 = false;    // OLMo 2's norms after each sublayer and QK-norm over the whole q and k
  // Gemma 3: (1 + w) norms before and after each sublayer, QK-norm, GeGLU, scaled embeddings, a
  // window of 4 on layers 0 and 2 whose rope has a base of its own (the cache holds their k
  // rotated by it), layer 1 full with linear rope scaling
  bool gemma3 = false;
  bool gemma2 = false;  // Gemma 2: the same without QK-norm and the second rope, soft-capped at 2 and 3
};
void PrintTo(const CacheCase& c, std::ostream* os) { *os << c.name; }

// 3 blocks, width 36, 6 query heads over 2 kv heads of dimension 6, FFN 22, vocabulary 37,
// up to 45 positions.
LlamaConfig small_config(const CacheCase& c) {
  LlamaConfig cfg;
  cfg.vocab_size = 37;
  cfg.dim = 36;
  cfg.n_layers = 3;
  cfg.n_heads = 6;
  cfg.n_kv_heads = 2;
  cfg.head_dim_override = c.head_dim;
  cfg.ffn_dim = 22;
  cfg.max_seq_len = 45;
  cfg.rope.theta = 100.0;  // fast rotations: a wrong position shows in the first few tokens
  if (c.llama3_rope) {
    cfg.rope.scaling.type = ops::RopeScalingType::kLlama3;
    cfg.rope.scaling.factor = 4.0;
    cfg.rope.scaling.original_max_positions = 16;
  }
  cfg.tie_embeddings = c.tied;
  cfg.attention_bias = c.bias;
  cfg.qk_norm = c.qk_norm;
  if (c.window > 0) {
    cfg.sliding_window = c.window;
    cfg.sliding_layers = {true, false, true};
  }
  if (c.nope) cfg.nope_layers = {false, true, false};
  if (c.granite) {
    cfg.embedding_multiplier = 3.0;
    cfg.residual_multiplier = 0.4;
    cfg.attention_multiplier = 0.3;
    cfg.logits_scaling = 2.5;
  }
  cfg.post_norms = cfg.qk_norm_whole = c.olmo2;
  if (c.gemma3) {
    cfg.norm_weight_offset = 1.0;
    cfg.sandwich_norms = cfg.qk_norm = cfg.scale_embeddings = true;
    cfg.mlp_activation = ops::GluActivation::kGeluTanh;
    cfg.attention_multiplier = 0.3;
    cfg.sliding_window = 4;
    cfg.sliding_layers = {true, false, true};
    cfg.rope_local_theta = 10.0;
    cfg.rope.scaling.type = ops::RopeScalingType::kLinear;
    cfg.rope.scaling.factor = 3.0;
  }
  if (c.gemma2) {
    cfg.norm_weight_offset = 1.0;
    cfg.sandwich_norms = cfg.scale_embeddings = true;
    cfg.mlp_activation = ops::GluActivation::kGeluTanh;
    cfg.attention_multiplier = 0.3;
    cfg.sliding_window = 4;
    cfg.sliding_layers = {true, false, true};
    cfg.attn_logit_softcapping = 2.0;
    cfg.final_logit_softcapping = 3.0;
  }
  return cfg;
}

// Every parameter random, with nonzero mean and a scale that keeps the logits spread.
void randomize(Llama& m, uint64_t seed) {
  for (size_t u = 0; u < m.layout().units().size(); ++u)
    for (const ParamSpec& p : m.layout().units()[u].params) {
      Tensor v = m.param(p.name);
      testing::fill_random(v, seed + u * 101 + static_cast<uint64_t>(p.offset), p.is_matrix ? 0.02 : 1.0,
                           p.is_matrix ? 0.3 : 0.2);
    }
}

Tensor prefix(const Tensor& ids_BS, int64_t begin, int64_t end) { return contiguous(ids_BS.slice(1, begin, end)); }

// The products over one row and over many differ only in the order of their additions. f64
// both ways: 1e-12. f32 both ways, neither side exact: the f32-vs-f64 default but for atol,
// 1e-5 instead of 1e-6, since logits near zero come from sums of O(1) terms (seen: 1.3e-6 on a
// logit of 0.006 at a relative norm of 6e-7).
// f32: the decoding step's products have other shapes than the whole prefix's (one row against
// many), so BLAS sums them in another order, and a logit's rounding follows the size of the
// terms it adds, not its own (a small logit cancels larger ones): each element is held to 1e-5
// of the largest logit, the whole to 1e-5 in norm. Which order a BLAS kernel takes depends on the
// processor (OpenBLAS's Haswell kernels and its Sandy Bridge ones differ here by 2e-5 of 0.29).
testing::Tolerance tolerance(DType dtype, const Tensor& ref) {
  if (dtype == DType::kF64) return testing::Tolerance{1e-12, 1e-9, 1e-12};
  double largest = 0;
  const Tensor r = testing::to_f64(ref);
  for (int64_t i = 0; i < r.numel(); ++i) largest = std::max(largest, std::abs(r.data<double>()[i]));
  return testing::Tolerance{1e-5, 0.0, 1e-5 * largest};
}

class KvCacheDecoding : public ::testing::TestWithParam<CacheCase> {};

TEST_P(KvCacheDecoding, EveryPositionEqualsRecomputingThePrefix) {
  const CacheCase c = GetParam();
  const LlamaConfig cfg = small_config(c);
  Llama model(cfg, c.dtype);
  randomize(model, 31);
  model.set_separate_projections(c.separate_projections);
  const int64_t B = c.batch, S = cfg.max_seq_len, prompt = 7;
  Tensor ids = Tensor::empty({B, S}, DType::kI32);
  testing::fill_random_ints(ids, 5, 0, cfg.vocab_size);

  // the prompt at once, then one token per call up to the last position; then again with
  // three tokens per call after the prompt (the last call takes what is left)
  for (const int64_t step : {int64_t{1}, int64_t{3}}) {
    KvCache cache(cfg, B, S, c.dtype);
    int64_t n = 0;
    while (n < S) {
      const int64_t next = n == 0 ? prompt : std::min(S, n + step);
      const Tensor cached = model.last_logits_cached(prefix(ids, n, next), cache);
      n = next;
      ASSERT_EQ(cache.length(), n);
      const Tensor full = model.last_logits(prefix(ids, 0, n));
      ASSERT_TRUE(testing::all_close(cached, full, tolerance(c.dtype, full)))
          << c.name << ": " << step << " token(s) per call, logits of position " << n - 1 << " (seed 31, B " << B
          << ", " << dtype_name(c.dtype) << ")";
    }
    EXPECT_EQ(cache.length(), S);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Small, KvCacheDecoding,
    ::testing::Values(CacheCase{"gqa3_tied_f64", true, false, false, false, 1, DType::kF64},
                      CacheCase{"gqa3_untied_bias_llama3rope_f64", false, true, true, false, 1, DType::kF64},
                      CacheCase{"gqa3_separate_projections_f64", false, false, false, true, 1, DType::kF64},
                      CacheCase{"gqa3_two_sequences_f64", true, true, false, false, 2, DType::kF64},
                      CacheCase{"gqa3_untied_f32", false, false, true, false, 1, DType::kF32},
                      // heads of 10 (attention 60 wide in a width of 36), as Mistral-Nemo's
                      CacheCase{"gqa3_head_dim10_f64", false, true, true, false, 2, DType::kF64, 10},
                      CacheCase{"gqa3_qk_norm_bias_f64", false, true, true, false, 2, DType::kF64, 0, true},
                      CacheCase{"gqa3_qk_norm_separate_projections_f32", true, false, false, true, 1, DType::kF32, 0,
                                true},
                      // a new token sees the last 5 positions on the sliding layers: the cache's
                      // older ones stay out of its attention there, not on the full layer
                      CacheCase{"gqa3_sliding_window5_f64", false, true, true, false, 2, DType::kF64, 0, false, 5},
                      CacheCase{"gqa3_sliding_window1_separate_projections_f32", true, false, false, true, 1,
                                DType::kF32, 0, false, 1},
                      CacheCase{"gqa3_nope_layer1_f64", true, false, false, false, 2, DType::kF64, 0, false, 0, true},
                      CacheCase{"gqa3_granite_bias_f64", false, true, false, false, 2, DType::kF64, 0, false, 0, false,
                                true},
                      CacheCase{"gqa3_olmo2_f64", false, false, false, false, 2, DType::kF64, 0, false, 0, false, false,
                                true},
                      CacheCase{"gqa3_olmo2_separate_projections_f32", true, true, false, true, 1, DType::kF32, 0,
                                false, 0, false, false, true},
                      CacheCase{"gqa3_gemma3_tied_head_dim8_f64", true, false, false, false, 2, DType::kF64, 8, false,
                                0, false, false, false, true},
                      CacheCase{"gqa3_gemma3_separate_projections_f32", false, false, false, true, 1, DType::kF32, 0,
                                false, 0, false, false, false, true},
                      CacheCase{"gqa3_gemma2_f64", true, false, false, false, 2, DType::kF64, 0, false, 0, false, false,
                                false, false, true}),
    [](const ::testing::TestParamInfo<CacheCase>& i) { return std::string(i.param.name); });

TEST(KvCache, TokensBeyondItsRoomAreAnErrorThatLeavesItAsItWas) {
  const CacheCase c{"gqa3", true, false, false, false, 1, DType::kF64};
  const LlamaConfig cfg = small_config(c);
  Llama model(cfg, DType::kF64);
  randomize(model, 3);
  Tensor ids = Tensor::empty({1, 12}, DType::kI32);
  testing::fill_random_ints(ids, 6, 0, cfg.vocab_size);
  KvCache cache(cfg, 1, 10, DType::kF64);
  model.last_logits_cached(prefix(ids, 0, 8), cache);
  try {
    model.last_logits_cached(prefix(ids, 8, 11), cache);
    ADD_FAILURE() << "no error for 3 tokens after 8 in a cache of 10";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("3 new tokens after the 8 cached do not fit in the KV cache's 10 positions"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(cache.length(), 8);
  const Tensor cached = model.last_logits_cached(prefix(ids, 8, 10), cache);
  EXPECT_TRUE(testing::all_close(cached, model.last_logits(prefix(ids, 0, 10)), tolerance(DType::kF64, cached)));

  try {
    KvCache too_long(cfg, 1, cfg.max_seq_len + 1, DType::kF64);
    ADD_FAILURE() << "no error for a cache longer than max_seq_len";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("capacity 46 positions; the model takes 1 to max_seq_len = 45"),
              std::string::npos)
        << e.what();
  }
  KvCache wrong_dtype(cfg, 1, 10, DType::kF32);
  EXPECT_THROW(model.last_logits_cached(prefix(ids, 0, 2), wrong_dtype), Error);
}

TEST(KvCache, HoldsOnlyTheKeyValueHeads) {
  const LlamaConfig cfg = small_config({"gqa3", true, false, false, false, 1, DType::kF32});
  const KvCache cache(cfg, 2, 20, DType::kF32);
  EXPECT_EQ(cache.keys(0).shape(), Shape({2, 20, 2, 6}));  // M = 2 of the N = 6 heads
  EXPECT_EQ(cache.bytes(), 2 * 3 * 2 * 20 * 2 * 6 * 4);     // k and v, L, B, capacity, M, H, f32
  const KvCache wide(small_config({"gqa3_head_dim10", true, false, false, false, 1, DType::kF32, 10}), 2, 20,
                     DType::kF32);
  EXPECT_EQ(wide.keys(0).shape(), Shape({2, 20, 2, 10}));  // heads of their own width
}

}  // namespace
}  // namespace shardtrain::model
