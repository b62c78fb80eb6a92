// The whole model's gradients against central finite differences in f64 on tiny shapes,
// activation checkpointing (pointwise, selective and full) against none (bitwise), and the layout's sharding invariants.
#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "model/block.h"
#include "model/llama.h"
#include "ops/attention.h"
#include "ops/elementwise.h"
#include "ops/linear.h"
#include "ops/rope.h"
#include "testing/compare.h"
#include "testing/gradcheck.h"
#include "testing/model_shapes.h"
#include "testing/packed_documents.h"

namespace shardtrain::model {
namespace {

struct TinyCase {
  const char* name;
  int64_t n_heads, n_kv_heads;
  bool tied, bias, llama3_rope;
  int64_t head_dim = 0;  // 0: dim / n_heads
  bool qk_norm = false;  // Qwen3's RMSNorm of each head's q and k before rope
  int64_t window = 0;    // > 0: a sliding window of this many positions on layer 0 (layer 1 full)
  bool nope = false;     // SmolLM3's NoPE layers: layer 1 without rope
  bool granite = false;  // Granite's embedding, residual, attention and logits scalings
  bool olmo2 = false;    // OLMo 2's norms after each sublayer and QK-norm over the whole q and k
  // Gemma 3: (1 + w) norms before and after each sublayer, per-head QK-norm, GeGLU, embeddings x
  // sqrt(dim), a softmax scale of its own, layer 0 sliding (3 positions) with a rope base of its
  // own and layer 1 full with linear rope scaling
  bool gemma3 = false;
  // Gemma 2: Gemma 3's norms, GeGLU and scaled embeddings without QK-norm, one rope, layer 0
  // sliding, the attention scores soft-capped at 2 and the logits at 3 (both well inside tanh's
  // curve here)
  bool gemma2 = false;
  // Phi-4-mini-style: rope on half of each head (4 of 8 dims; set head_dim 8) with LongRoPE from
  // 4 original positions, so the 7-token rows take its long factors, and its attention factor
  bool phi3 = false;
};
void PrintTo(const TinyCase& c, std::ostream* os) { *os << c.name; }

LlamaConfig tiny_config(const TinyCase& c) {
  LlamaConfig cfg;
  cfg.vocab_size = 11;
  cfg.dim = 12;
  cfg.n_layers = 2;
  cfg.n_heads = c.n_heads;
  cfg.n_kv_heads = c.n_kv_heads;
  cfg.head_dim_override = c.head_dim;
  cfg.ffn_dim = 10;
  cfg.max_seq_len = 8;
  cfg.norm_eps = 1e-5;
  cfg.rope.theta = 100.0;
  if (c.llama3_rope) {
    cfg.rope.scaling.type = ops::RopeScalingType::kLlama3;
    cfg.rope.scaling.factor = 4.0;
    cfg.rope.scaling.original_max_positions = 16;
  }
  cfg.tie_embeddings = c.tied;
  cfg.attention_bias = c.bias;
  cfg.qk_norm = c.qk_norm;
  cfg.init_std = 0.5;  // large enough that every path carries signal
  if (c.window > 0) {
    cfg.sliding_window = c.window;
    cfg.sliding_layers = {true, false};
  }
  if (c.nope) cfg.nope_layers = {false, true};
  if (c.granite) {  // none a power of two, so that no scaling is exact by accident
    cfg.embedding_multiplier = 3.0;
    cfg.residual_multiplier = 0.4;
    cfg.attention_multiplier = 0.3;
    cfg.logits_scaling = 2.5;
  }
  cfg.post_norms = cfg.qk_norm_whole = c.olmo2;
  if (c.gemma3) {
    cfg.norm_weight_offset = 1.0;
    cfg.sandwich_norms = true;
    cfg.qk_norm = true;
    cfg.mlp_activation = ops::GluActivation::kGeluTanh;
    cfg.scale_embeddings = true;
    cfg.attention_multiplier = 0.3;
    cfg.sliding_window = 3;
    cfg.sliding_layers = {true, false};
    cfg.rope_local_theta = 10.0;
    cfg.rope.scaling.type = ops::RopeScalingType::kLinear;
    cfg.rope.scaling.factor = 2.0;
  }
  if (c.gemma2) {
    cfg.norm_weight_offset = 1.0;
    cfg.sandwich_norms = cfg.scale_embeddings = true;
    cfg.mlp_activation = ops::GluActivation::kGeluTanh;
    cfg.attention_multiplier = 0.3;
    cfg.sliding_window = 3;
    cfg.sliding_layers = {true, false};
    cfg.attn_logit_softcapping = 2.0;
    cfg.final_logit_softcapping = 3.0;
  }
  if (c.phi3) {
    cfg.rope.partial_rotary = 0.5;
    cfg.rope.scaling.type = ops::RopeScalingType::kLongRope;
    cfg.rope.scaling.original_max_positions = 4;
    cfg.rope.scaling.short_factor = {1.0, 1.7};
    cfg.rope.scaling.long_factor = {2.0, 3.5};
    cfg.rope.scaling.attention_factor = 1.3;
  }
  return cfg;
}

// Random parameters everywhere (norm weights and biases too), so no gradient is trivially
// zero or symmetric. Padding stays zero.
void randomize(Llama& m, uint64_t seed) {
  for (size_t u = 0; u < m.layout().units().size(); ++u) {
    for (const ParamSpec& p : m.layout().units()[u].params) {
      Tensor v = m.param(p.name);
      testing::fill_random(v, seed + u * 101 + static_cast<uint64_t>(p.offset), p.is_matrix ? 0.05 : 1.0, 0.4);
    }
  }
}

class LlamaGradient : public ::testing::TestWithParam<TinyCase> {};

TEST_P(LlamaGradient, MatchesFiniteDifferencesF64) {
  const LlamaConfig cfg = tiny_config(GetParam());
  Llama model(cfg, DType::kF64);
  randomize(model, 17);
  const int64_t B = 2, T = 7;
  Tensor ids = Tensor::empty({B, T}, DType::kI32);
  Tensor targets = Tensor::empty({B, T}, DType::kI32);
  testing::fill_random_ints(ids, 3, 0, cfg.vocab_size);
  testing::fill_random_ints(targets, 4, 0, cfg.vocab_size);
  targets.data<int32_t>()[5] = -100;  // one ignored position

  StepOptions o;
  o.grad_scale = 1.0 / 13.0;  // the mean over the 13 counted tokens
  o.loss_chunk_tokens = 5;
  model.zero_grads();
  const LossSum ls = model.forward_backward(ids, targets, o);
  EXPECT_EQ(ls.tokens, 13);

  auto loss = [&]() { return model.evaluate(ids, targets, o).loss_sum / 13.0; };
  EXPECT_NEAR(loss(), ls.loss_sum / 13.0, 1e-12);
  for (size_t u = 0; u < model.layout().units().size(); ++u) {
    for (const ParamSpec& p : model.layout().units()[u].params) {
      Tensor w = model.param(p.name).view({p.numel()});
      const Tensor fd = testing::finite_difference(w, loss, 1e-6);
      EXPECT_TRUE(testing::all_close(model.grad(p.name).view({p.numel()}), fd, testing::kFiniteDifference))
          << GetParam().name << " parameter " << p.name;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Tiny, LlamaGradient,
    ::testing::Values(TinyCase{"gqa2_tied", 2, 1, true, false, false},
                      TinyCase{"mha_untied", 2, 2, false, false, false},
                      TinyCase{"gqa3_bias_llama3rope", 3, 1, false, true, true},
                      // heads of a width of their own (Mistral-Nemo): attention wider (2 x 8 = 16)
                      // and narrower (3 x 2 = 6) than dim 12
                      TinyCase{"gqa2_head_dim8_wider", 2, 1, false, true, true, 8},
                      TinyCase{"mha3_head_dim2_narrower", 3, 3, true, false, false, 2},
                      // QK-norm (Qwen3): its q_norm / k_norm weights' gradients, and the
                      // projections' through it, on stacked heads of their own width
                      TinyCase{"gqa2_qk_norm", 2, 1, true, false, false, 0, true},
                      TinyCase{"gqa3_qk_norm_bias_head_dim8", 3, 1, false, true, true, 8, true},
                      // a sliding window of 3 positions on the first layer, the second full
                      TinyCase{"gqa2_sliding_window3", 2, 1, false, true, false, 0, false, 3},
                      // SmolLM3: layer 1 a NoPE layer (q and k not rotated), layer 0 rotated
                      TinyCase{"gqa2_nope_layer1", 2, 1, true, false, false, 0, false, 0, true},
                      // Granite: embeddings, both sublayers' outputs, the scores and the logits scaled
                      TinyCase{"gqa3_granite_bias", 3, 1, false, true, false, 0, false, 0, false, true},
                      TinyCase{"gqa2_granite_tied_llama3rope", 2, 1, true, false, true, 0, false, 0, false, true},
                      // OLMo 2: norms after the sublayers, q and k normed over all their heads
                      TinyCase{"gqa2_olmo2", 2, 1, false, false, false, 0, false, 0, false, false, true},
                      TinyCase{"gqa3_olmo2_bias_head_dim8", 3, 1, true, true, false, 8, false, 0, false, false, true},
                      // Gemma 3: every (1 + w) norm's weight, GeGLU's gate, the scaled embeddings
                      // (tied), both ropes
                      TinyCase{"gqa2_gemma3_tied_head_dim8", 2, 1, true, false, false, 8, false, 0, false, false,
                               false, true},
                      TinyCase{"mha3_gemma3", 3, 3, false, false, false, 0, false, 0, false, false, false, true},
                      // Gemma 2: through both soft-caps
                      TinyCase{"gqa2_gemma2_tied", 2, 1, true, false, false, 0, false, 0, false, false, false, false,
                               true},
                      TinyCase{"gqa3_gemma2_head_dim8", 3, 1, false, false, false, 8, false, 0, false, false, false,
                               false, true},
                      // Phi-4-mini: rope on half of each head, LongRoPE's long factors, with a window
                      TinyCase{.name = "gqa2_phi3_partial_longrope", .n_heads = 2, .n_kv_heads = 1, .tied = true,
                               .bias = false, .llama3_rope = false, .head_dim = 8, .window = 3, .phi3 = true}),
    [](const ::testing::TestParamInfo<TinyCase>& i) { return std::string(i.param.name); });

// StepOptions::overwrite_grads: the first micro-batch writes every gradient over whatever its
// buffer held (garbage here; the padding stays zero), the second adds: bitwise what clearing
// the gradients and adding both gives. Tied head (the table's gradient is written by the head
// and added to by the embedding), untied (the table cleared before the scatter), biases.
TEST_P(LlamaGradient, OverwritingGradientsEqualsClearingThem) {
  const LlamaConfig cfg = tiny_config(GetParam());
  const int64_t B = 2, T = 7;
  Tensor ids[2], targets[2];
  for (int i = 0; i < 2; ++i) {
    ids[i] = Tensor::empty({B, T}, DType::kI32);
    targets[i] = Tensor::empty({B, T}, DType::kI32);
    testing::fill_random_ints(ids[i], 50 + i, 0, cfg.vocab_size);
    testing::fill_random_ints(targets[i], 60 + i, 0, cfg.vocab_size);
  }
  StepOptions o;
  o.grad_scale = 1.0 / 28.0;
  o.loss_chunk_tokens = 5;
  Llama cleared(cfg, DType::kF32), overwritten(cfg, DType::kF32);
  randomize(cleared, 17);
  randomize(overwritten, 17);
  cleared.zero_grads();
  for (size_t u = 0; u < overwritten.layout().units().size(); ++u)
    for (const ParamSpec& p : overwritten.layout().units()[u].params) {
      Tensor g = overwritten.grad(p.name);
      testing::fill_random(g, 90 + u, 3.0, 1.0);
    }
  for (int i = 0; i < 2; ++i) {
    StepOptions oi = o;
    oi.overwrite_grads = i == 0;
    const LossSum a = cleared.forward_backward(ids[i], targets[i], o);
    const LossSum b = overwritten.forward_backward(ids[i], targets[i], oi);
    EXPECT_EQ(a.loss_sum, b.loss_sum);
  }
  for (size_t u = 0; u < cleared.layout().units().size(); ++u)
    EXPECT_TRUE(testing::all_close(overwritten.unit_grads(u), cleared.unit_grads(u), testing::kExact))
        << GetParam().name << ", unit " << u;
}

// q, k and v (and gate and up) from one product of their stacked weights (the default)
// against one product each (Llama::set_separate_projections): the same model up to the
// order of f64 sums, with and without biases. The weights stack when they lie back to back
// in the unit: each projection's size a multiple of the 128-element parameter alignment, as
// in every Llama shape (the tiny ones above are not, and run one product per projection).
TEST(Llama, StackedProjectionsEqualSeparateOnes) {
  struct Case {
    bool bias;
    int64_t head_dim;  // 0: dim / n_heads
    bool qk_norm = false;
  };
  for (const Case c : {Case{false, 0}, Case{true, 0}, Case{false, 96}, Case{true, 0, true}}) {
    const bool bias = c.bias;
    SCOPED_TRACE(std::string(bias ? "biases" : "no biases") + (c.head_dim > 0 ? ", head dim 96" : "") +
                 (c.qk_norm ? ", QK-norm" : ""));
    LlamaConfig cfg = tiny_config({"stackable", 4, 2, !bias, bias, false, c.head_dim, c.qk_norm});
    // head dim 64: q 256 x 256, k and v 128 x 256, biases 256 and 128; head dim 96 (attention
    // wider than dim): q 384 x 256, k and v 192 x 256
    cfg.dim = 256;
    cfg.init_std = 0.05;
    const int64_t B = 2, T = 7;
    Tensor ids = Tensor::empty({B, T}, DType::kI32), targets = Tensor::empty({B, T}, DType::kI32);
    testing::fill_random_ints(ids, 70, 0, cfg.vocab_size);
    testing::fill_random_ints(targets, 71, 0, cfg.vocab_size);
    StepOptions o;
    o.grad_scale = 1.0 / 14.0;
    o.loss_chunk_tokens = 5;
    Llama stacked(cfg, DType::kF64), separate(cfg, DType::kF64);
    randomize(stacked, 19);
    randomize(separate, 19);
    const UnitLayout& block = stacked.layout().units()[1];
    const BlockWeights w = BlockWeights::view(stacked.unit_params(1), block, cfg);
    ASSERT_TRUE(w.wqkv_ED.defined()) << "q, k, v not back to back in " << block.name;
    EXPECT_EQ(w.wqkv_ED.shape(), Shape({c.head_dim > 0 ? 768 : 512, 256}));
    EXPECT_EQ(w.bqkv_E.defined(), bias);
    ASSERT_TRUE(w.w_gate_up_2FD.defined()) << "gate, up not back to back in " << block.name;
    separate.set_separate_projections(true);
    stacked.zero_grads();
    separate.zero_grads();
    const LossSum a = stacked.forward_backward(ids, targets, o);
    const LossSum b = separate.forward_backward(ids, targets, o);
    EXPECT_NEAR(a.loss_sum, b.loss_sum, 1e-12 * std::abs(b.loss_sum));
    // each tensor to 1e-12 relative norm; elements that cancel to near zero keep the rounding
    // of their larger terms, hence the looser per-element bound
    for (size_t u = 0; u < stacked.layout().units().size(); ++u)
      EXPECT_TRUE(testing::all_close(stacked.unit_grads(u), separate.unit_grads(u), {1e-12, 1e-8, 1e-12}))
          << "unit " << u;
  }
}

// Selective and full checkpointing recompute exactly what the forward computed (the same
// kernels on the same inputs), so loss and every gradient equal the run that keeps all.
TEST(Llama, CheckpointingIsBitwiseEqual) {
  for (const TinyCase& c :
       {TinyCase{"gqa", 2, 1, false, false, false}, TinyCase{"gqa_qk_norm", 2, 1, false, false, false, 0, true},
        TinyCase{"gqa_nope", 2, 1, false, false, false, 0, false, 0, true},
        TinyCase{"gqa_granite", 2, 1, false, false, false, 0, false, 0, false, true},
        TinyCase{"gqa_olmo2", 2, 1, false, false, false, 0, false, 0, false, false, true},
        TinyCase{"gqa_gemma3", 2, 1, true, false, false, 0, false, 0, false, false, false, true},
        TinyCase{"gqa_gemma2", 2, 1, true, false, false, 0, false, 0, false, false, false, false, true}}) {
    SCOPED_TRACE(c.name);
    const LlamaConfig cfg = tiny_config(c);
    Tensor ids = Tensor::empty({3, 8}, DType::kI32);
    Tensor targets = Tensor::empty({3, 8}, DType::kI32);
    testing::fill_random_ints(ids, 8, 0, cfg.vocab_size);
    testing::fill_random_ints(targets, 9, 0, cfg.vocab_size);
    StepOptions o;
    o.grad_scale = 1.0 / 24;
    Llama a(cfg, DType::kF32);
    a.init_random(5);
    const LossSum la = a.forward_backward(ids, targets, o);
    for (ActivationCheckpointing ac :
         {ActivationCheckpointing::kPointwise, ActivationCheckpointing::kSelective, ActivationCheckpointing::kFull}) {
      Llama b(cfg, DType::kF32);
      b.init_random(5);
      o.checkpointing = ac;
      const LossSum lb = b.forward_backward(ids, targets, o);
      EXPECT_EQ(la.loss_sum, lb.loss_sum) << checkpointing_name(ac);
      for (size_t u = 0; u < a.layout().units().size(); ++u)
        EXPECT_TRUE(testing::all_close(a.unit_grads(u), b.unit_grads(u), testing::kExact))
            << checkpointing_name(ac) << ", unit " << u;
    }
  }
}

// A chunked MLP (Llama::set_mlp_chunk_tokens) under selective and full checkpointing: the
// forward's y, the recomputation and the backward run by pieces of token rows (5 of 14 here:
// pieces of 5, 5 and 4), so every weight gradient is a sum of per-piece products. Against the
// MLP at once: the same model up to the order of f64 sums, for stacked and separate gate/up,
// over two micro-batches whose first overwrites gradient buffers holding garbage (the first
// piece must overwrite, the others add) and whose second adds; evaluation too. Without
// checkpointing the setting is ignored: bitwise the plain run.
TEST(Llama, ChunkedMlpEqualsTheMlpAtOnce) {
  for (int family = 0; family < 4; ++family)
    for (bool stackable : {true, false}) {
      SCOPED_TRACE(std::string(stackable ? "stacked gate|up" : "separate gate and up") +
                   (family == 1   ? ", Granite's scalings"
                    : family == 2 ? ", OLMo 2's norms"
                    : family == 3 ? ", Gemma 3's norms and GeGLU"
                                  : ""));
      TinyCase tc = stackable ? TinyCase{"gqa", 4, 2, false, false, true} : TinyCase{"gqa", 2, 1, false, false, true};
      tc.granite = family == 1;
      tc.olmo2 = family == 2;
      tc.gemma3 = family == 3;
      LlamaConfig cfg = tiny_config(tc);
      if (stackable) cfg.dim = 256;  // head dim 64; gate and up a multiple of the parameter alignment: stacked
      cfg.init_std = 0.05;
      const int64_t B = 2, T = 7;
      std::vector<Tensor> ids, targets;
      for (int i = 0; i < 2; ++i) {
        ids.push_back(Tensor::empty({B, T}, DType::kI32));
        targets.push_back(Tensor::empty({B, T}, DType::kI32));
        testing::fill_random_ints(ids.back(), 80 + i, 0, cfg.vocab_size);
        testing::fill_random_ints(targets.back(), 90 + i, 0, cfg.vocab_size);
      }
      for (ActivationCheckpointing ac :
           {ActivationCheckpointing::kNone, ActivationCheckpointing::kSelective, ActivationCheckpointing::kFull}) {
        SCOPED_TRACE(checkpointing_name(ac));
        StepOptions o;
        o.grad_scale = 1.0 / 28.0;
        o.loss_chunk_tokens = 5;
        o.checkpointing = ac;
        Llama whole(cfg, DType::kF64), pieces(cfg, DType::kF64);
        randomize(whole, 23);
        randomize(pieces, 23);
        pieces.set_mlp_chunk_tokens(5);
        ASSERT_EQ(BlockWeights::view(whole.unit_params(1), whole.layout().units()[1], cfg).w_gate_up_2FD.defined(),
                  stackable);
        for (size_t u = 0; u < whole.layout().units().size(); ++u) {
          Tensor gw = whole.unit_grads(u), gp = pieces.unit_grads(u);
          testing::fill_random(gw, 300 + u, 0.3, 1.0);
          testing::fill_random(gp, 300 + u, 0.3, 1.0);
        }
        for (int i = 0; i < 2; ++i) {
          o.overwrite_grads = i == 0;
          const LossSum a = whole.forward_backward(ids[i], targets[i], o);
          const LossSum b = pieces.forward_backward(ids[i], targets[i], o);
          if (ac == ActivationCheckpointing::kNone)
            EXPECT_EQ(a.loss_sum, b.loss_sum);
          else
            EXPECT_NEAR(a.loss_sum, b.loss_sum, 1e-12 * std::abs(a.loss_sum));
        }
        for (size_t u = 0; u < whole.layout().units().size(); ++u) {
          const testing::Tolerance tol =
              ac == ActivationCheckpointing::kNone ? testing::kExact : testing::Tolerance{1e-12, 1e-8, 1e-12};
          EXPECT_TRUE(testing::all_close(pieces.unit_grads(u), whole.unit_grads(u), tol)) << "unit " << u;
        }
        const LossSum ea = whole.evaluate(ids[1], targets[1], o), eb = pieces.evaluate(ids[1], targets[1], o);
        EXPECT_NEAR(ea.loss_sum, eb.loss_sum, 1e-12 * std::abs(ea.loss_sum));
      }
    }
}

// Documents packed into rows (positions restarting at each one's first token) train as if each
// were a row of its own: the loss sum, every parameter's gradient and the logits equal those
// of the documents run one by one (f64, up to the order of sums), with and without full
// checkpointing. Without the positions the same batch gives another loss.
TEST(Llama, PackedDocumentsTrainAsSeparateSequences) {
  const LlamaConfig cfg = tiny_config({"gqa3_bias_llama3rope", 3, 1, false, true, true});
  const std::vector<std::vector<int64_t>> rows = {{3, 5}, {8}, {1, 2, 5}};
  const int64_t B = 3, T = 8;
  Tensor ids = Tensor::empty({B, T}, DType::kI32), targets = Tensor::empty({B, T}, DType::kI32);
  testing::fill_random_ints(ids, 80, 0, cfg.vocab_size);
  testing::fill_random_ints(targets, 81, 0, cfg.vocab_size);
  targets.data<int32_t>()[4] = -100;
  const Tensor pos = testing::document_positions(rows);
  for (ActivationCheckpointing ac : {ActivationCheckpointing::kNone, ActivationCheckpointing::kFull}) {
    SCOPED_TRACE(checkpointing_name(ac));
    StepOptions o;
    o.loss_chunk_tokens = 5;
    o.checkpointing = ac;
    Llama packed(cfg, DType::kF64), separate(cfg, DType::kF64);
    randomize(packed, 23);
    randomize(separate, 23);
    packed.zero_grads();
    separate.zero_grads();
    const LossSum got = packed.forward_backward(ids, targets, o, pos);
    const Tensor logits = packed.logits(ids, pos);
    LossSum want;
    for (int64_t b = 0; b < B; ++b) {
      int64_t t0 = 0;
      for (int64_t len : rows[static_cast<size_t>(b)]) {
        const Tensor di = contiguous(ids.slice(0, b, b + 1).slice(1, t0, t0 + len));
        const Tensor dt = contiguous(targets.slice(0, b, b + 1).slice(1, t0, t0 + len));
        const LossSum r = separate.forward_backward(di, dt, o);
        want.loss_sum += r.loss_sum;
        want.tokens += r.tokens;
        const Tensor l = separate.logits(di);
        EXPECT_TRUE(testing::all_close(contiguous(logits.slice(0, b * T + t0, b * T + t0 + len)), l,
                                       {1e-12, 1e-11, 1e-12}))
            << "logits of row " << b << ", document at " << t0;
        t0 += len;
      }
    }
    EXPECT_EQ(got.tokens, want.tokens);
    EXPECT_NEAR(got.loss_sum, want.loss_sum, 1e-11 * std::abs(want.loss_sum));
    for (size_t u = 0; u < packed.layout().units().size(); ++u)
      EXPECT_TRUE(testing::all_close(packed.unit_grads(u), separate.unit_grads(u), {1e-11, 1e-9, 1e-12}))
          << "unit " << u;
    const double unmasked = packed.evaluate(ids, targets, o).loss_sum;
    EXPECT_NEAR(packed.evaluate(ids, targets, o, pos).loss_sum, got.loss_sum, 1e-11 * std::abs(got.loss_sum));
    EXPECT_GT(std::abs(unmasked - got.loss_sum), 1e-3);
  }
}

TEST(Llama, ActivationOffloadOnTheCpuIsAnError) {
  const LlamaConfig cfg = tiny_config({"gqa", 2, 1, false, false, false});
  Tensor ids = Tensor::empty({1, 8}, DType::kI32), targets = Tensor::empty({1, 8}, DType::kI32);
  testing::fill_random_ints(ids, 8, 0, cfg.vocab_size);
  testing::fill_random_ints(targets, 9, 0, cfg.vocab_size);
  Llama m(cfg, DType::kF32);
  StepOptions o;
  o.offload_activations = true;
  try {
    m.forward_backward(ids, targets, o);
    ADD_FAILURE() << "offload_activations was accepted on the CPU";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("training.offload_activations"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("cpu"), std::string::npos) << e.what();
  }
}

TEST(Llama, CheckpointingNamesParse) {
  for (ActivationCheckpointing ac : kCheckpointingByMemory)
    EXPECT_EQ(parse_checkpointing(checkpointing_name(ac), "x"), ac);
  try {
    parse_checkpointing("partial", "training.activation_checkpointing");
    ADD_FAILURE() << "\"partial\" was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("training.activation_checkpointing: expected none, pointwise, selective or "
                                         "full, found \"partial\""),
              std::string::npos)
        << e.what();
  }
}

TEST(Llama, TargetOutsideTheVocabularyIsAnErrorNamingItsPosition) {
  const LlamaConfig cfg = tiny_config({"gqa", 2, 1, false, false, false});
  Llama m(cfg, DType::kF32);
  m.init_random(5);
  Tensor ids = Tensor::empty({1, 4}, DType::kI32), targets = Tensor::empty({1, 4}, DType::kI32);
  testing::fill_random_ints(ids, 8, 0, cfg.vocab_size);
  testing::fill_random_ints(targets, 9, 0, cfg.vocab_size);
  targets.data<int32_t>()[2] = static_cast<int32_t>(cfg.vocab_size);
  StepOptions o;
  for (int pass = 0; pass < 2; ++pass) {
    try {
      if (pass == 0) (void)m.forward_backward(ids, targets, o);
      else (void)m.evaluate(ids, targets, o);
      ADD_FAILURE() << "a target equal to the vocabulary size was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("target 11 at position 2 outside [0, 11)"), std::string::npos) << e.what();
    }
  }
}

TEST(Llama, InitIsIndependentOfLayoutAndIsNormal) {
  const LlamaConfig cfg = tiny_config({"gqa", 2, 1, false, false, false});
  Llama a(cfg, DType::kF32);
  a.init_random(11);
  Llama b(cfg, DType::kF64);
  b.init_random(11);
  EXPECT_TRUE(testing::all_close(a.param("model.layers.1.mlp.up_proj.weight"),
                                 b.param("model.layers.1.mlp.up_proj.weight"), testing::kCpuF32VsF64));
  const Tensor norm = a.param("model.layers.0.input_layernorm.weight");
  for (int64_t i = 0; i < norm.numel(); ++i) EXPECT_EQ(norm.data<float>()[i], 1.0f);
}

TEST(ModelLayout, UnitsPadToAlignmentTimesWorld) {
  LlamaConfig cfg = tiny_config({"gqa", 2, 1, false, true, false});
  for (int world : {1, 2, 3, 4, 8}) {
    const ModelLayout l = ModelLayout::llama(cfg, world);
    ASSERT_EQ(l.units().size(), static_cast<size_t>(cfg.n_layers + 2));
    for (const UnitLayout& u : l.units()) {
      EXPECT_EQ(u.numel % (kParamAlignment * world), 0) << u.name << " world " << world;
      int64_t end = 0;
      for (const ParamSpec& p : u.params) {
        EXPECT_EQ(p.offset % kParamAlignment, 0) << p.name;
        EXPECT_GE(p.offset, end) << p.name << " overlaps the previous parameter";
        end = p.offset + p.numel();
      }
      EXPECT_LE(end, u.numel);
    }
  }
  EXPECT_THROW((void)ModelLayout::llama(cfg, 1).locate("model.layers.9.mlp.up_proj.weight"), Error);
}

// A head dimension of its own: q and o are N·H wide whatever dim is, k and v M·H, split by
// heads under tensor parallelism (rows of q, k, v; columns of o).
TEST(ModelLayout, DecoupledHeadDimShapesTheProjections) {
  LlamaConfig cfg = tiny_config({"gqa2_head_dim8", 2, 1, false, true, false, 8});
  EXPECT_EQ(cfg.q_dim(), 16);
  EXPECT_TRUE(cfg.head_dim_decoupled());
  const ModelLayout whole = ModelLayout::llama(cfg, 1);
  auto shape = [](const ModelLayout& l, const char* name) { return l.locate(name).spec->shape; };
  EXPECT_EQ(shape(whole, "model.layers.0.self_attn.q_proj.weight"), Shape({16, 12}));
  EXPECT_EQ(shape(whole, "model.layers.0.self_attn.k_proj.weight"), Shape({8, 12}));
  EXPECT_EQ(shape(whole, "model.layers.0.self_attn.v_proj.weight"), Shape({8, 12}));
  EXPECT_EQ(shape(whole, "model.layers.0.self_attn.q_proj.bias"), Shape({16}));
  EXPECT_EQ(shape(whole, "model.layers.0.self_attn.o_proj.weight"), Shape({12, 16}));
  EXPECT_EQ(cfg.num_parameters(), 11 * 12 * 2 + 2 * (2 * 12 + 16 * 12 + 2 * 8 * 12 + 16 + 2 * 8 + 12 * 16 + 3 * 12 * 10) + 12);
  cfg.n_kv_heads = 2;
  const ModelLayout part = ModelLayout::llama(cfg, Mesh{.data_parallel = 1, .tensor_parallel = 2}, 1);
  const ParamSpec* o = part.locate("model.layers.1.self_attn.o_proj.weight").spec;
  EXPECT_EQ(o->shape, Shape({12, 8}));
  EXPECT_EQ(o->full_shape, Shape({12, 16}));
  EXPECT_EQ(o->split_first, 8);
  EXPECT_EQ(shape(part, "model.layers.1.self_attn.q_proj.weight"), Shape({8, 12}));
  EXPECT_EQ(shape(part, "model.layers.1.self_attn.k_proj.weight"), Shape({8, 12}));
}

// QK-norm (Qwen3) adds one [H] weight for q and one for k to every block, whole on each
// tensor-parallel rank, initialised to ones and not weight-decayed (1-D).
TEST(ModelLayout, QkNormAddsHeadWideWeights) {
  LlamaConfig cfg = tiny_config({"gqa2_head_dim8", 2, 1, false, false, false, 8, true});
  const int64_t without = [&] {
    LlamaConfig plain = cfg;
    plain.qk_norm = false;
    return plain.num_parameters();
  }();
  EXPECT_EQ(cfg.num_parameters(), without + 2 * 2 * 8);
  EXPECT_NE(cfg.summary().find("(head dim 8, decoupled: attention width 2 x 8 = 16), QK-norm, ffn 10"),
            std::string::npos) << cfg.summary();
  cfg.n_kv_heads = 2;
  for (const int tp : {1, 2}) {
    const ModelLayout l = ModelLayout::llama(cfg, Mesh{.data_parallel = 1, .tensor_parallel = tp}, tp - 1);
    for (const char* name : {"model.layers.1.self_attn.q_norm.weight", "model.layers.1.self_attn.k_norm.weight"}) {
      const ParamSpec* p = l.locate(name).spec;
      EXPECT_EQ(p->shape, Shape({8})) << name;
      EXPECT_FALSE(p->is_matrix) << name;
      EXPECT_EQ(p->init, ParamInit::kOnes) << name;
      EXPECT_EQ(p->replicated, tp > 1) << name;
    }
  }
  cfg.qk_norm = false;
  EXPECT_THROW(ModelLayout::llama(cfg, 1).locate("model.layers.0.self_attn.q_norm.weight"), Error);
}

// QK-norm's forward against a direct computation: each head's projected q (and k) row
// divided by its root mean square (eps inside), times the norm's weight, and only then
// rotated by rope (the order matters: the weight does not commute with the rotation).
TEST(Block, QkNormNormalisesEachHeadBeforeRope) {
  const LlamaConfig cfg = tiny_config({"gqa2_qk_norm", 2, 1, false, true, false, 0, true});
  const ModelLayout layout = ModelLayout::llama(cfg, 1);
  const UnitLayout& unit = layout.units()[1];
  Tensor flat = Tensor::empty({unit.numel}, DType::kF64);
  testing::fill_random(flat, 31, 0.1, 1.0);
  const BlockWeights w = BlockWeights::view(flat, unit, cfg);
  const int64_t T = 5, D = cfg.dim, N = cfg.n_heads, M = cfg.n_kv_heads, H = cfg.head_dim();
  Tensor cos = Tensor::empty({T, H / 2}, DType::kF64), sin = Tensor::empty({T, H / 2}, DType::kF64);
  ops::rope_table(cos, sin, H, cfg.rope);
  BlockContext ctx;
  ctx.config = &cfg;
  ctx.batch = 1;
  ctx.seq = T;
  ctx.cos_TK = cos;
  ctx.sin_TK = sin;
  Tensor x = Tensor::empty({1, T, D}, DType::kF64);
  testing::fill_random(x, 32, 0.0, 1.0);
  BlockActivations a;
  block_forward(a, w, x, ctx);
  const Tensor xn1 = contiguous(a.xn1_BTD);
  // the projection of heads `heads` from xn1, each head's row normed, then rope
  auto expected = [&](const Tensor& weight, const Tensor& bias, const Tensor& norm, int64_t heads) {
    Tensor out = Tensor::empty({1, T, heads, H}, DType::kF64);
    const double* xn = xn1.data<double>();
    const double* wt = weight.data<double>();
    const double* b = bias.data<double>();
    const double* g = norm.data<double>();
    double* o = out.data<double>();
    for (int64_t t = 0; t < T; ++t)
      for (int64_t n = 0; n < heads; ++n) {
        double* row = o + (t * heads + n) * H;
        double ss = 0;
        for (int64_t h = 0; h < H; ++h) {
          double v = b[n * H + h];
          for (int64_t i = 0; i < D; ++i) v += wt[(n * H + h) * D + i] * xn[t * D + i];
          row[h] = v;
          ss += v * v;
        }
        const double r = 1.0 / std::sqrt(ss / static_cast<double>(H) + cfg.norm_eps);
        for (int64_t h = 0; h < H; ++h) row[h] = g[h] * (row[h] * r);
      }
    ops::rope_forward(out, cos, sin);
    return out;
  };
  EXPECT_TRUE(testing::all_close(contiguous(a.q_BTNH), expected(w.wq_QD, w.bq_Q, w.q_norm_H, N), {1e-13, 1e-12, 1e-13}));
  EXPECT_TRUE(testing::all_close(contiguous(a.k_BTMH), expected(w.wk_KD, w.bk_K, w.k_norm_H, M), {1e-13, 1e-12, 1e-13}));
}

TEST(LlamaConfig, HeadDimMustBeEvenAndNotNegative) {
  LlamaConfig c = tiny_config({"gqa", 2, 1, false, false, false, 8});
  c.n_heads = 5;  // 12 / 5 is no head dimension, but heads of 8 need none
  c.n_kv_heads = 1;
  EXPECT_NO_THROW(c.validate("model."));
  c.head_dim_override = 7;
  try {
    c.validate("model.");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("`model.head_dim` = 7 must be even"), std::string::npos) << e.what();
  }
  c.head_dim_override = -2;
  EXPECT_THROW(c.validate("model."), Error);
  c.head_dim_override = 0;
  try {
    c.validate("model.");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unless `model.head_dim` sets it"), std::string::npos) << e.what();
  }
}

// Sliding windows through the whole model: a window of T or more positions is full attention
// (bitwise: loss and gradients), a smaller one changes the loss; with checkpointing the
// recomputed forward keeps the window (bitwise); packed documents with a window train as
// the documents would alone with it.
TEST(Llama, SlidingWindowOfTOrMoreIsFullAttentionASmallerOneIsNot) {
  const int64_t B = 2, T = 8;
  Tensor ids = Tensor::empty({B, T}, DType::kI32), targets = Tensor::empty({B, T}, DType::kI32);
  testing::fill_random_ints(ids, 90, 0, 11);
  testing::fill_random_ints(targets, 91, 0, 11);
  StepOptions o;
  o.loss_chunk_tokens = 5;
  auto run = [&](int64_t window, std::vector<bool> layers, ActivationCheckpointing ac) {
    LlamaConfig cfg = tiny_config({"gqa2", 2, 1, false, true, false});
    cfg.sliding_window = window;
    cfg.sliding_layers = window > 0 ? layers : std::vector<bool>{};
    Llama m(cfg, DType::kF64);
    randomize(m, 41);
    m.zero_grads();
    StepOptions oc = o;
    oc.checkpointing = ac;
    const LossSum l = m.forward_backward(ids, targets, oc);
    std::vector<Tensor> grads;
    for (size_t u = 0; u < m.layout().units().size(); ++u) grads.push_back(contiguous(m.unit_grads(u)));
    return std::pair{l.loss_sum, grads};
  };
  const auto none = ActivationCheckpointing::kNone;
  const auto [full_loss, full_grads] = run(0, {}, none);
  for (const int64_t window : {T, T + 5}) {
    const auto [loss, grads] = run(window, {true, true}, none);
    EXPECT_EQ(loss, full_loss) << "window " << window;
    for (size_t u = 0; u < grads.size(); ++u)
      EXPECT_EQ(std::memcmp(grads[u].raw_data(), full_grads[u].raw_data(), grads[u].nbytes()), 0) << "unit " << u;
  }
  const auto [small_loss, small_grads] = run(2, {false, true}, none);
  EXPECT_GT(std::abs(small_loss - full_loss), 1e-3) << "a window of 2 on layer 1";
  const auto [other_loss, other_grads] = run(2, {true, false}, none);
  EXPECT_GT(std::abs(other_loss - small_loss), 1e-3) << "the window on layer 0 instead";
  for (ActivationCheckpointing ac : {ActivationCheckpointing::kPointwise, ActivationCheckpointing::kSelective,
                                     ActivationCheckpointing::kFull}) {
    const auto [loss, grads] = run(2, {false, true}, ac);
    EXPECT_EQ(loss, small_loss) << checkpointing_name(ac);
    for (size_t u = 0; u < grads.size(); ++u)
      EXPECT_EQ(std::memcmp(grads[u].raw_data(), small_grads[u].raw_data(), grads[u].nbytes()), 0)
          << checkpointing_name(ac) << ", unit " << u;
  }
}

TEST(Llama, PackedDocumentsWithASlidingWindowTrainAsSeparateSequences) {
  LlamaConfig cfg = tiny_config({"gqa3_bias", 3, 1, false, true, false});
  cfg.sliding_window = 3;
  cfg.sliding_layers = {true, true};
  const std::vector<std::vector<int64_t>> rows = {{2, 6}, {8}};
  const int64_t B = 2, T = 8;
  Tensor ids = Tensor::empty({B, T}, DType::kI32), targets = Tensor::empty({B, T}, DType::kI32);
  testing::fill_random_ints(ids, 92, 0, cfg.vocab_size);
  testing::fill_random_ints(targets, 93, 0, cfg.vocab_size);
  StepOptions o;
  Llama packed(cfg, DType::kF64), separate(cfg, DType::kF64);
  randomize(packed, 43);
  randomize(separate, 43);
  packed.zero_grads();
  separate.zero_grads();
  const LossSum got = packed.forward_backward(ids, targets, o, testing::document_positions(rows));
  LossSum want;
  for (int64_t b = 0; b < B; ++b) {
    int64_t t0 = 0;
    for (int64_t len : rows[static_cast<size_t>(b)]) {
      const LossSum r = separate.forward_backward(contiguous(ids.slice(0, b, b + 1).slice(1, t0, t0 + len)),
                                                  contiguous(targets.slice(0, b, b + 1).slice(1, t0, t0 + len)), o);
      want.loss_sum += r.loss_sum;
      t0 += len;
    }
  }
  EXPECT_NEAR(got.loss_sum, want.loss_sum, 1e-11 * std::abs(want.loss_sum));
  for (size_t u = 0; u < packed.layout().units().size(); ++u)
    EXPECT_TRUE(testing::all_close(packed.unit_grads(u), separate.unit_grads(u), {1e-11, 1e-9, 1e-12})) << "unit " << u;
}

TEST(LlamaConfig, SlidingWindowLayersAreCheckedCountedAndSummarised) {
  LlamaConfig c = testing::llama_1b();  // 16 layers
  EXPECT_EQ(c.window_of(3), 0);
  c.sliding_window = 4096;
  c.sliding_layers.assign(16, true);
  for (int64_t l = 5; l < 16; l += 6) c.sliding_layers[static_cast<size_t>(l)] = false;  // layers 5 and 11 full
  c.validate("model.");
  EXPECT_EQ(c.window_of(0), 4096);
  EXPECT_EQ(c.window_of(5), 0);
  EXPECT_EQ(c.sliding_layer_count(), 14);
  EXPECT_NE(c.summary().find(", sliding window 4096 on 14 of 16 layers"), std::string::npos) << c.summary();
  // FLOPs: a sliding layer counts T keys per token times the share of the causal pairs inside
  // its window (sum over i of min(i + 1, W) of T (T + 1) / 2); at T <= W it counts as a full one
  LlamaConfig full = c;
  full.sliding_window = 0;
  full.sliding_layers.clear();
  const int64_t T = 8192, W = 4096;
  const double pairs = static_cast<double>(W) * (W + 1) / 2 + static_cast<double>(T - W) * W;
  EXPECT_NEAR(full.flops_per_token(T) - c.flops_per_token(T),
              12.0 * static_cast<double>(c.q_dim()) * 14 * (static_cast<double>(T) - 2 * pairs / (T + 1)),
              1e-12 * full.flops_per_token(T));  // the difference of two large figures
  LlamaConfig wide = c;
  wide.sliding_window = T;
  EXPECT_DOUBLE_EQ(wide.flops_per_token(T), full.flops_per_token(T)) << "a window that holds every key";
  c.sliding_layers.pop_back();
  EXPECT_TRUE(testing::throws_with([&] { c.validate("model."); },
                                   "`model.sliding_window` = 4096 needs one sliding/full entry per layer: found 15 "
                                   "entries for `model.n_layers` = 16"));
  c.sliding_window = -1;
  EXPECT_TRUE(testing::throws_with([&] { c.validate("model."); }, "`model.sliding_window` must be >= 1 keys"));
  c.sliding_window = 0;
  EXPECT_TRUE(testing::throws_with([&] { c.validate("model."); },
                                   "layer 0 is marked as a sliding-window layer but `model.sliding_window` is 0"));
  c.sliding_layers.clear();
  c.validate("model.");
  EXPECT_EQ(c.summary().find("sliding"), std::string::npos);
}

// One block's forward in f64 on random weights with the kept activations (no checkpointing),
// for the family tests below.
struct BlockRun {
  LlamaConfig cfg;
  Tensor flat, cos, sin, x;
  BlockWeights w;
  BlockActivations a;
  static constexpr int64_t T = 5;
  BlockRun(const LlamaConfig& c, bool rope = true) : cfg(c) {
    const ModelLayout layout = ModelLayout::llama(cfg, 1);
    const UnitLayout& unit = layout.units()[1];
    flat = Tensor::empty({unit.numel}, DType::kF64);
    testing::fill_random(flat, 51, 0.2, 1.0);
    w = BlockWeights::view(flat, unit, cfg);
    const int64_t H = cfg.head_dim();
    cos = Tensor::empty({T, H / 2}, DType::kF64);
    sin = Tensor::empty({T, H / 2}, DType::kF64);
    ops::rope_table(cos, sin, H, cfg.rope);
    x = Tensor::empty({1, T, cfg.dim}, DType::kF64);
    testing::fill_random(x, 52, 0.0, 1.0);
    block_forward(a, w, x, context(rope));
  }
  BlockContext context(bool rope) const {
    BlockContext ctx;
    ctx.config = &cfg;
    ctx.batch = 1;
    ctx.seq = T;
    ctx.cos_TK = cos;
    ctx.sin_TK = sin;
    ctx.rope = rope;
    return ctx;
  }
};

// x_TI · weight_OIᵀ (+ bias) as a new [T, O] tensor.
Tensor product(const Tensor& x_TI, const Tensor& weight_OI, const Tensor& bias_O = {}) {
  Tensor y = Tensor::empty({x_TI.size(0), weight_OI.size(0)}, DType::kF64);
  ops::linear_forward(y, contiguous(x_TI), weight_OI, bias_O);
  return y;
}

// RMSNorm of each row of x [T, W] with `weight` [W], written out (eps inside the root).
Tensor rms_rows(const Tensor& x_TW, const Tensor& weight_W, double eps) {
  const Tensor x = contiguous(x_TW);
  const int64_t T = x.size(0), W = x.size(1);
  Tensor y = Tensor::empty({T, W}, DType::kF64);
  for (int64_t t = 0; t < T; ++t) {
    double ss = 0;
    for (int64_t i = 0; i < W; ++i) ss += x.data<double>()[t * W + i] * x.data<double>()[t * W + i];
    const double r = 1.0 / std::sqrt(ss / static_cast<double>(W) + eps);
    for (int64_t i = 0; i < W; ++i)
      y.data<double>()[t * W + i] = weight_W.data<double>()[i] * (x.data<double>()[t * W + i] * r);
  }
  return y;
}

// a + f · b, elementwise, as a new tensor of a's shape
Tensor plus_scaled(const Tensor& a, double f, const Tensor& b) {
  const Tensor ac = contiguous(a), bc = contiguous(b);
  Tensor y = Tensor::empty(ac.shape(), DType::kF64);
  for (int64_t i = 0; i < y.numel(); ++i) y.data<double>()[i] = ac.data<double>()[i] + f * bc.data<double>()[i];
  return y;
}

constexpr testing::Tolerance kF64Forward{1e-13, 1e-12, 1e-13};

// SmolLM3's NoPE layer: q and k reach the attention as projected (no rotation); the same
// block with rope rotates them.
TEST(Block, NopeLayerLeavesQAndKUnrotated) {
  const LlamaConfig cfg = tiny_config({"gqa2_nope", 2, 1, false, true, false, 0, false, 0, true});
  const BlockRun nope(cfg, false), rope(cfg, true);
  const int64_t T = BlockRun::T;
  const Tensor xn1 = contiguous(nope.a.xn1_BTD).view({T, cfg.dim});
  EXPECT_TRUE(testing::all_close(contiguous(nope.a.q_BTNH).view({T, cfg.q_dim()}),
                                 product(xn1, nope.w.wq_QD, nope.w.bq_Q), kF64Forward));
  EXPECT_TRUE(testing::all_close(contiguous(nope.a.k_BTMH).view({T, cfg.kv_dim()}),
                                 product(xn1, nope.w.wk_KD, nope.w.bk_K), kF64Forward));
  Tensor rotated = product(xn1, rope.w.wq_QD, rope.w.bq_Q).view({1, T, cfg.n_heads, cfg.head_dim()});
  ops::rope_forward(rotated, rope.cos, rope.sin);
  EXPECT_TRUE(testing::all_close(contiguous(rope.a.q_BTNH), rotated, kF64Forward));
  EXPECT_FALSE(testing::all_close(contiguous(rope.a.q_BTNH), contiguous(nope.a.q_BTNH), {1e-3, 1e-3, 1e-3}));
}

// Granite's scalings inside the block: the scores scaled by attention_multiplier (not
// 1/sqrt(H)), and each sublayer's output times residual_multiplier before its residual add.
TEST(Block, GraniteScalesTheScoresAndEachSublayerOutput) {
  const LlamaConfig cfg = tiny_config({"gqa3_granite", 3, 1, false, true, false, 0, false, 0, false, true});
  const BlockRun b(cfg);
  const int64_t T = BlockRun::T, D = cfg.dim;
  Tensor attn = Tensor::empty(b.a.attn_BTNH.shape(), DType::kF64),
         lse = Tensor::empty(b.a.lse_BNT.shape(), DType::kF64);
  ops::attention_forward(attn, lse, b.a.q_BTNH, b.a.k_BTMH, b.a.v_BTMH, {.scale = 0.3});
  EXPECT_TRUE(testing::all_close(contiguous(b.a.attn_BTNH), attn, kF64Forward));
  ops::attention_forward(attn, lse, b.a.q_BTNH, b.a.k_BTMH, b.a.v_BTMH, {});
  EXPECT_FALSE(testing::all_close(contiguous(b.a.attn_BTNH), attn, {1e-3, 1e-3, 1e-3})) << "1/sqrt(H) instead";
  const Tensor o = product(contiguous(b.a.attn_BTNH).view({T, cfg.q_dim()}), b.w.wo_DQ);
  EXPECT_TRUE(
      testing::all_close(contiguous(b.a.x2_BTD).view({T, D}), plus_scaled(b.x.view({T, D}), 0.4, o), kF64Forward));
  const Tensor down = product(contiguous(b.a.h_BTF).view({T, cfg.ffn_dim}), b.w.w_down_DF);
  EXPECT_TRUE(testing::all_close(contiguous(b.a.y_BTD).view({T, D}),
                                 plus_scaled(contiguous(b.a.x2_BTD).view({T, D}), 0.4, down), kF64Forward));
}

// Granite's embedding and logits scalings through the whole model: the logits equal those
// of the unscaled model whose embedding table holds the scaled rows, divided by
// logits_scaling.
TEST(Llama, GraniteScalesTheEmbeddingsAndTheLogits) {
  LlamaConfig scaled = tiny_config({"granite", 2, 1, false, false, false});
  scaled.embedding_multiplier = 3.0;
  scaled.logits_scaling = 2.5;
  LlamaConfig plain = scaled;
  plain.embedding_multiplier = plain.logits_scaling = 1.0;
  Llama a(scaled, DType::kF64), b(plain, DType::kF64);
  randomize(a, 61);
  randomize(b, 61);
  Tensor table = b.param("model.embed_tokens.weight");
  ops::scale(table, 3.0);
  Tensor ids = Tensor::empty({2, 6}, DType::kI32);
  testing::fill_random_ints(ids, 62, 0, scaled.vocab_size);
  const Tensor want = b.logits(ids);
  Tensor divided = contiguous(want);
  ops::scale(divided, 1.0 / 2.5);
  EXPECT_TRUE(testing::all_close(a.logits(ids), divided, kF64Forward));
  EXPECT_NE(scaled.summary().find("scaled (embedding x3, residual x1, attention x0.408248, logits /2.5)"),
            std::string::npos)
      << scaled.summary();
}

// OLMo 2's block written out: q and k normed over all their heads before rope, no input
// norms, and each sublayer's output normed before its residual add.
TEST(Block, Olmo2NormsAfterEachSublayerAndOverTheWholeQAndK) {
  const LlamaConfig cfg = tiny_config({"gqa3_olmo2", 3, 1, false, true, false, 0, false, 0, false, false, true});
  const BlockRun b(cfg);
  const int64_t T = BlockRun::T, D = cfg.dim, H = cfg.head_dim();
  EXPECT_FALSE(b.w.attn_norm_D.defined());
  EXPECT_EQ(b.w.q_norm_H.shape(), Shape({cfg.q_dim()}));
  EXPECT_EQ(b.w.k_norm_H.shape(), Shape({cfg.kv_dim()}));
  const Tensor x = b.x.view({T, D});
  Tensor q = rms_rows(product(x, b.w.wq_QD, b.w.bq_Q), b.w.q_norm_H, cfg.norm_eps).view({1, T, cfg.n_heads, H});
  Tensor k = rms_rows(product(x, b.w.wk_KD, b.w.bk_K), b.w.k_norm_H, cfg.norm_eps).view({1, T, cfg.n_kv_heads, H});
  ops::rope_forward(q, b.cos, b.sin);
  ops::rope_forward(k, b.cos, b.sin);
  EXPECT_TRUE(testing::all_close(contiguous(b.a.q_BTNH), q, kF64Forward));
  EXPECT_TRUE(testing::all_close(contiguous(b.a.k_BTMH), k, kF64Forward));
  const Tensor o = product(contiguous(b.a.attn_BTNH).view({T, cfg.q_dim()}), b.w.wo_DQ);
  const Tensor x2 = plus_scaled(x, 1.0, rms_rows(o, b.w.ffn_norm_D, cfg.norm_eps));
  EXPECT_TRUE(testing::all_close(contiguous(b.a.x2_BTD).view({T, D}), x2, kF64Forward));
  EXPECT_TRUE(
      testing::all_close(contiguous(b.a.gate_BTF).view({T, cfg.ffn_dim}), product(x2, b.w.w_gate_FD), kF64Forward))
      << "the MLP reads x2 itself";
  const Tensor down = product(contiguous(b.a.h_BTF).view({T, cfg.ffn_dim}), b.w.w_down_DF);
  EXPECT_TRUE(testing::all_close(contiguous(b.a.y_BTD).view({T, D}),
                                 plus_scaled(x2, 1.0, rms_rows(down, b.w.post_ffn_norm_D, cfg.norm_eps)), kF64Forward));
}

// w + 1 (Gemma's norm scale), as a new f64 tensor.
Tensor plus_one(const Tensor& w) {
  Tensor y = contiguous(w);
  for (int64_t i = 0; i < y.numel(); ++i) y.data<double>()[i] += 1.0;
  return y;
}

// Gemma 3's block written out: (1 + w) norms on the inputs of both sublayers and on their
// outputs before the residual adds, q and k normed per head with (1 + w) before rope, the
// scores scaled by the attention multiplier, and h = gelu_tanh(gate) * up.
TEST(Block, Gemma3NormsBeforeAndAfterEachSublayerAndGeglu) {
  const LlamaConfig cfg =
      tiny_config({"gqa3_gemma3", 3, 1, false, false, false, 0, false, 0, false, false, false, true});
  const BlockRun b(cfg);
  const int64_t T = BlockRun::T, D = cfg.dim, H = cfg.head_dim(), F = cfg.ffn_dim;
  ASSERT_TRUE(b.w.attn_norm_D.defined() && b.w.pre_ffn_norm_D.defined() && b.w.post_ffn_norm_D.defined());
  const double eps = cfg.norm_eps;
  const Tensor x = b.x.view({T, D});
  const Tensor xn1 = rms_rows(x, plus_one(b.w.attn_norm_D), eps);
  EXPECT_TRUE(testing::all_close(contiguous(b.a.xn1_BTD).view({T, D}), xn1, kF64Forward));
  Tensor q = rms_rows(product(xn1, b.w.wq_QD).view({T * cfg.n_heads, H}), plus_one(b.w.q_norm_H), eps)
                 .view({1, T, cfg.n_heads, H});
  Tensor k = rms_rows(product(xn1, b.w.wk_KD).view({T * cfg.n_kv_heads, H}), plus_one(b.w.k_norm_H), eps)
                 .view({1, T, cfg.n_kv_heads, H});
  ops::rope_forward(q, b.cos, b.sin);
  ops::rope_forward(k, b.cos, b.sin);
  EXPECT_TRUE(testing::all_close(contiguous(b.a.q_BTNH), q, kF64Forward));
  EXPECT_TRUE(testing::all_close(contiguous(b.a.k_BTMH), k, kF64Forward));
  Tensor attn = Tensor::empty(b.a.attn_BTNH.shape(), DType::kF64), lse = Tensor::empty(b.a.lse_BNT.shape(), DType::kF64);
  ops::attention_forward(attn, lse, b.a.q_BTNH, b.a.k_BTMH, b.a.v_BTMH, {.scale = 0.3});
  EXPECT_TRUE(testing::all_close(contiguous(b.a.attn_BTNH), attn, kF64Forward));
  const Tensor o = product(contiguous(b.a.attn_BTNH).view({T, cfg.q_dim()}), b.w.wo_DQ);
  const Tensor x2 = plus_scaled(x, 1.0, rms_rows(o, plus_one(b.w.ffn_norm_D), eps));
  EXPECT_TRUE(testing::all_close(contiguous(b.a.x2_BTD).view({T, D}), x2, kF64Forward));
  const Tensor xn2 = rms_rows(x2, plus_one(b.w.pre_ffn_norm_D), eps);
  const Tensor gate = product(xn2, b.w.w_gate_FD), up = product(xn2, b.w.w_up_FD);
  EXPECT_TRUE(testing::all_close(contiguous(b.a.gate_BTF).view({T, F}), gate, kF64Forward));
  Tensor h = Tensor::empty({T, F}, DType::kF64);
  for (int64_t i = 0; i < T * F; ++i) {
    const double g = gate.data<double>()[i];
    h.data<double>()[i] =
        0.5 * g * (1 + std::tanh(std::sqrt(2 / M_PI) * (g + 0.044715 * g * g * g))) * up.data<double>()[i];
  }
  EXPECT_TRUE(testing::all_close(contiguous(b.a.h_BTF).view({T, F}), h, kF64Forward));
  const Tensor down = product(h, b.w.w_down_DF);
  EXPECT_TRUE(testing::all_close(contiguous(b.a.y_BTD).view({T, D}),
                                 plus_scaled(x2, 1.0, rms_rows(down, plus_one(b.w.post_ffn_norm_D), eps)),
                                 kF64Forward));
}

// Gemma 3's embeddings: multiplied by sqrt(dim) (rounded to f32, as transformers' normalizer)
// after the lookup; the logits equal those of the unscaled model whose table holds the scaled
// rows. The sliding layers' rope: another base than the full layers', unscaled.
TEST(Llama, Gemma3ScalesTheEmbeddingsAndGivesSlidingLayersTheirRope) {
  LlamaConfig scaled = tiny_config({"gemma3", 2, 1, false, false, false, 0, false, 0, false, false, false, true});
  LlamaConfig plain = scaled;
  plain.scale_embeddings = false;
  Llama a(scaled, DType::kF64), b(plain, DType::kF64);
  randomize(a, 71);
  randomize(b, 71);
  Tensor table = b.param("model.embed_tokens.weight");
  ops::scale(table, static_cast<double>(static_cast<float>(std::sqrt(12.0))));
  Tensor ids = Tensor::empty({2, 6}, DType::kI32);
  testing::fill_random_ints(ids, 72, 0, scaled.vocab_size);
  EXPECT_TRUE(testing::all_close(a.logits(ids), b.logits(ids), kF64Forward));
  // a model whose sliding layer uses the full layers' (scaled) rope differs
  LlamaConfig one_rope = scaled;
  one_rope.rope_local_theta = 0;
  Llama c(one_rope, DType::kF64);
  randomize(c, 71);
  EXPECT_FALSE(testing::all_close(a.logits(ids), c.logits(ids), {1e-6, 1e-6, 1e-6}));
  const ops::RopeOptions local = scaled.rope_of(0), global = scaled.rope_of(1);
  EXPECT_EQ(local.theta, 10.0);
  EXPECT_EQ(local.scaling.type, ops::RopeScalingType::kNone);
  EXPECT_EQ(global.theta, 100.0);
  EXPECT_EQ(global.scaling.type, ops::RopeScalingType::kLinear);
}

// Gemma 2's final soft-capping: the logits are those of the uncapped model passed through
// cap · tanh(z / cap), and the loss is the cross-entropy of those.
TEST(Llama, Gemma2SoftCapsTheLogits) {
  LlamaConfig capped = tiny_config({"gemma2", 2, 1, false, false, false, 0, false, 0, false, false, false, false, true});
  LlamaConfig plain = capped;
  plain.final_logit_softcapping = 0;
  Llama a(capped, DType::kF64), b(plain, DType::kF64);
  randomize(a, 81);
  randomize(b, 81);
  Tensor ids = Tensor::empty({2, 6}, DType::kI32);
  testing::fill_random_ints(ids, 82, 0, capped.vocab_size);
  Tensor want = contiguous(b.logits(ids));
  for (int64_t i = 0; i < want.numel(); ++i) want.data<double>()[i] = 3.0 * std::tanh(want.data<double>()[i] / 3.0);
  const Tensor got = a.logits(ids);
  EXPECT_TRUE(testing::all_close(got, want, kF64Forward));
  const int64_t V = capped.vocab_size;
  Tensor want_last = Tensor::empty({2, V}, DType::kF64);
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t c = 0; c < V; ++c) want_last.data<double>()[b * V + c] = want.data<double>()[(b * 6 + 5) * V + c];
  EXPECT_TRUE(testing::all_close(a.last_logits(ids), want_last, kF64Forward));
  Tensor targets = Tensor::empty({2, 6}, DType::kI32);
  testing::fill_random_ints(targets, 83, 0, capped.vocab_size);
  double loss = 0;
  for (int64_t r = 0; r < 12; ++r) {
    const double* z = want.data<double>() + r * capped.vocab_size;
    double mx = z[0], sum = 0;
    for (int64_t c = 1; c < capped.vocab_size; ++c) mx = std::max(mx, z[c]);
    for (int64_t c = 0; c < capped.vocab_size; ++c) sum += std::exp(z[c] - mx);
    loss += mx + std::log(sum) - z[targets.data<int32_t>()[r]];
  }
  EXPECT_NEAR(a.evaluate(ids, targets, {}).loss_sum, loss, 1e-10);
}

// The FP8 attention does not soft-cap its scores: with Gemma 2's attn_logit_softcapping it is
// refused by name (it would silently drop the cap), and without it accepted.
TEST(Llama, Gemma2SoftCappedScoresRefuseTheFp8Attention) {
  LlamaConfig capped = tiny_config({"gemma2", 2, 1, false, false, false, 0, false, 0, false, false, false, false, true});
  Llama m(capped, DType::kF32);
  try {
    m.set_fp8_attention(true);
    ADD_FAILURE() << "training.fp8_attention was accepted with soft-capped attention scores";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("training.fp8_attention with attention scores soft-capped at 2"),
              std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("model.attn_logit_softcapping"), std::string::npos) << e.what();
  }
  m.set_fp8_attention(false);  // off is always fine
  LlamaConfig logits_only = capped;
  logits_only.attn_logit_softcapping = 0;  // only the logits capped: the attention is plain
  Llama n(logits_only, DType::kF32);
  n.set_fp8_attention(true);
}

// Gemma's norms in the layout: four per block, every norm weight starting at 0 (it scales by
// 1 + w), refused under tensor parallelism, and counted.
TEST(ModelLayout, Gemma3WeightsAndCount) {
  LlamaConfig cfg = tiny_config({"gemma3", 2, 1, true, false, false, 8, false, 0, false, false, false, true});
  LlamaConfig plain = cfg;
  plain.sandwich_norms = false;
  EXPECT_EQ(cfg.num_parameters(), plain.num_parameters() + 2 * 2 * 12);
  const ModelLayout l = ModelLayout::llama(cfg, 1);
  for (const char* name : {"model.layers.1.input_layernorm.weight", "model.layers.1.post_attention_layernorm.weight",
                           "model.layers.1.pre_feedforward_layernorm.weight",
                           "model.layers.1.post_feedforward_layernorm.weight", "model.layers.1.self_attn.q_norm.weight",
                           "model.norm.weight"})
    EXPECT_EQ(l.locate(name).spec->init, ParamInit::kZeros) << name;
  Llama m(cfg, DType::kF64);
  m.init_random(3);
  const Tensor w = m.param("model.layers.0.pre_feedforward_layernorm.weight");
  for (int64_t i = 0; i < w.numel(); ++i) EXPECT_EQ(w.data<double>()[i], 0.0);
  // tensor parallelism: the four norms whole on each rank, the projections split
  cfg.n_kv_heads = 2;
  const ModelLayout part = ModelLayout::llama(cfg, Mesh{.data_parallel = 1, .tensor_parallel = 2}, 1);
  EXPECT_EQ(part.locate("model.layers.1.pre_feedforward_layernorm.weight").spec->shape, Shape({cfg.dim}));
  EXPECT_EQ(part.locate("model.layers.1.post_feedforward_layernorm.weight").spec->shape, Shape({cfg.dim}));
  EXPECT_EQ(part.locate("model.layers.1.self_attn.q_norm.weight").spec->shape, Shape({cfg.head_dim()}));
  EXPECT_EQ(part.locate("model.layers.1.self_attn.q_proj.weight").spec->shape,
            Shape({cfg.n_heads * cfg.head_dim() / 2, cfg.dim}));
  cfg.post_norms = true;
  EXPECT_TRUE(testing::throws_with([&] { cfg.validate("model."); }, "`model.post_norms`"));
}

// The families' weights in the layout and the parameter count: OLMo 2 swaps input_layernorm
// for post_feedforward_layernorm and has [N·H] and [M·H] QK-norm weights, split with the heads.
TEST(ModelLayout, Olmo2WeightsAndCount) {
  LlamaConfig cfg = tiny_config({"olmo2", 2, 1, false, false, false, 8, false, 0, false, false, true});
  LlamaConfig plain = cfg;
  plain.post_norms = plain.qk_norm_whole = false;
  EXPECT_EQ(cfg.num_parameters(), plain.num_parameters() + 2 * (2 * 8 + 8));
  const ModelLayout l = ModelLayout::llama(cfg, 1);
  EXPECT_EQ(l.locate("model.layers.1.self_attn.q_norm.weight").spec->shape, Shape({16}));
  EXPECT_EQ(l.locate("model.layers.1.self_attn.k_norm.weight").spec->shape, Shape({8}));
  EXPECT_EQ(l.locate("model.layers.1.post_feedforward_layernorm.weight").spec->init, ParamInit::kOnes);
  EXPECT_THROW(l.locate("model.layers.1.input_layernorm.weight"), Error);
  cfg.n_kv_heads = 2;
  EXPECT_TRUE(testing::throws_with([&] { ModelLayout::llama(cfg, Mesh{.data_parallel = 1, .tensor_parallel = 2}, 0); },
                                   "`parallel.tensor_parallel` = 2 with OLMo 2's QK-norm over the whole q and k"));
  EXPECT_NE(cfg.summary().find("QK-norm over all heads, norms after each sublayer"), std::string::npos)
      << cfg.summary();
  cfg.qk_norm = true;
  EXPECT_TRUE(testing::throws_with([&] { cfg.validate("model."); }, "`model.qk_norm` (per head, Qwen3) and"));
}

TEST(LlamaConfig, NopeLayersOnePerLayer) {
  LlamaConfig c = tiny_config({"nope", 2, 1, false, false, false, 0, false, 0, true});
  EXPECT_TRUE(c.uses_rope(0));
  EXPECT_FALSE(c.uses_rope(1));
  EXPECT_EQ(c.nope_layer_count(), 1);
  EXPECT_NE(c.summary().find("no rope on 1 of 2 layers"), std::string::npos) << c.summary();
  c.nope_layers.push_back(true);
  EXPECT_TRUE(testing::throws_with([&] { c.validate("model."); }, "`model.nope_layers` lists 3 layers"));
  c = tiny_config({"granite", 2, 1, false, false, false});
  c.logits_scaling = 0;
  EXPECT_TRUE(testing::throws_with([&] { c.validate("model."); }, "`model.logits_scaling` must be > 0"));
}

TEST(LlamaConfig, CountsParametersAndRejectsBadShapes) {
  // Llama 3.2 1B: 1,235,814,400 parameters with the tied head counted once.
  LlamaConfig c = testing::llama_1b();
  EXPECT_EQ(c.num_parameters(), 1235814400);
  c.n_heads = 30;
  try {
    c.validate("model.");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model.n_heads"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace shardtrain::model
