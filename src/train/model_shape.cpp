// The model's shape from a job's `model` section (model_shape.h).
#include "train/model_shape.h"

#include <fmt/format.h>

#include "core/error.h"
#include "model/hf_config.h"
#include "model/presets.h"
#include "ops/rope.h"

namespace shardtrain::train {

void set_sliding_window(const ModelSection& m, model::LlamaConfig& c) {
  c.sliding_window = m.sliding_window;
  c.sliding_layers.clear();
  if (m.sliding_window > 0) {
    const int64_t every = m.full_attention_every;
    for (int64_t l = 0; l < c.n_layers; ++l) c.sliding_layers.push_back(every == 0 || (l + 1) % every != 0);
  }
  c.validate("model.");
}

void extend_context(const ModelSection& m, model::LlamaConfig& c, const std::string& what) {
  if (m.extend_context > 0) {
    ST_CHECK(c.rope.scaling.type != ops::RopeScalingType::kLongRope, "`model.extend_context` = ", m.extend_context,
             ": ", what, " uses LongRoPE, whose short and long factors are fitted to its own context of ",
             c.max_seq_len, " positions; drop model.extend_context");
    ST_CHECK(m.extend_context >= c.max_seq_len, "`model.extend_context` = ", m.extend_context, " is shorter than ",
             what, "'s own context (max_position_embeddings ", c.max_seq_len,
             "); it only lengthens it: drop it, or give at least ", c.max_seq_len);
    c.max_seq_len = m.extend_context;
  }
  c.rope.theta *= m.rope_theta_scale;
}

model::LlamaConfig llama_config(const ModelSection& m, int64_t tokenizer_vocab) {
  if (!m.preset.empty()) {
    model::LlamaConfig p = model::preset_config(m.preset);
    ST_CHECK(tokenizer_vocab <= p.vocab_size, "the tokenizer has ", tokenizer_vocab, " tokens but `model.preset` = \"",
             m.preset, "\" has a vocabulary of ", p.vocab_size, "; use that model's tokenizer (`data.tokenizer`)");
    set_sliding_window(m, p);
    extend_context(m, p, fmt::format("`model.preset` = \"{}\"", m.preset));
    return p;
  }
  model::LlamaConfig c;
  c.vocab_size = m.vocab_size > 0 ? m.vocab_size : tokenizer_vocab;
  ST_CHECK(c.vocab_size >= tokenizer_vocab, "`model.vocab_size` (", c.vocab_size,
           ") is smaller than the tokenizer's vocabulary (", tokenizer_vocab, "); set it to 0 to use the tokenizer's");
  c.dim = m.dim;
  c.n_layers = m.n_layers;
  c.n_heads = m.n_heads;
  c.n_kv_heads = m.n_kv_heads;
  c.head_dim_override = m.head_dim;
  c.ffn_dim = m.ffn_dim;
  c.max_seq_len = m.max_seq_len;
  c.norm_eps = m.norm_eps;
  c.rope.theta = m.rope_theta;
  if (m.rope_scaling == "llama3") {
    c.rope.scaling.type = ops::RopeScalingType::kLlama3;
    c.rope.scaling.factor = m.rope_scaling_factor;
    c.rope.scaling.low_freq_factor = m.rope_low_freq_factor;
    c.rope.scaling.high_freq_factor = m.rope_high_freq_factor;
    c.rope.scaling.original_max_positions = m.rope_original_max_positions;
  } else if (m.rope_scaling == "linear") {
    c.rope.scaling.type = ops::RopeScalingType::kLinear;
    c.rope.scaling.factor = m.rope_scaling_factor;
  }
  c.tie_embeddings = m.tie_embeddings;
  c.attention_bias = m.attention_bias;
  c.qk_norm = m.qk_norm;
  c.qk_norm_whole = m.qk_norm_whole;
  c.post_norms = m.post_norms;
  c.embedding_multiplier = m.embedding_multiplier;
  c.residual_multiplier = m.residual_multiplier;
  c.attention_multiplier = m.attention_multiplier;
  c.logits_scaling = m.logits_scaling;
  c.norm_weight_offset = m.norm_weight_offset;
  c.sandwich_norms = m.sandwich_norms;
  c.mlp_activation = m.mlp_activation == "gelu_tanh" ? ops::GluActivation::kGeluTanh : ops::GluActivation::kSilu;
  c.scale_embeddings = m.scale_embeddings;
  c.rope_local_theta = m.rope_local_theta;
  c.attn_logit_softcapping = m.attn_logit_softcapping;
  c.final_logit_softcapping = m.final_logit_softcapping;
  c.rope.partial_rotary = m.rotary_fraction;
  c.fused_projections = c.phi3_features();  // exported as phi3: its fused tensors
  c.nope_layers.clear();
  if (m.no_rope_every > 0)
    for (int64_t l = 0; l < c.n_layers; ++l) c.nope_layers.push_back((l + 1) % m.no_rope_every == 0);
  c.init_std = m.init_std;
  set_sliding_window(m, c);
  // checkpoints and exports record the model as a Hugging Face config.json
  model::check_hf_family(c, "the `model.*` keys");
  return c;
}

}  // namespace shardtrain::train
