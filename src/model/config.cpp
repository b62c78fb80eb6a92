// LlamaConfig validation and parameter / FLOP counts.
#include "model/config.h"

#include <cmath>
#include <sstream>

#include "core/error.h"
#include "ops/attention.h"

namespace shardtrain::model {

int64_t LlamaConfig::window_of(int64_t layer) const {
  if (sliding_window <= 0 || layer < 0 || layer >= static_cast<int64_t>(sliding_layers.size())) return 0;
  return sliding_layers[static_cast<size_t>(layer)] ? sliding_window : 0;
}

int64_t LlamaConfig::sliding_layer_count() const {
  int64_t n = 0;
  for (int64_t l = 0; l < n_layers; ++l) n += window_of(l) > 0 ? 1 : 0;
  return n;
}

bool LlamaConfig::uses_rope(int64_t layer) const {
  return layer < 0 || layer >= static_cast<int64_t>(nope_layers.size()) || !nope_layers[static_cast<size_t>(layer)];
}

int64_t LlamaConfig::nope_layer_count() const {
  int64_t n = 0;
  for (int64_t l = 0; l < n_layers; ++l) n += uses_rope(l) ? 0 : 1;
  return n;
}

bool LlamaConfig::granite_scaled() const {
  return embedding_multiplier != 1.0 || residual_multiplier != 1.0 || attention_multiplier != 0.0 ||
         logits_scaling != 1.0;
}

double LlamaConfig::attention_scale() const {
  return attention_multiplier > 0 ? attention_multiplier : 1.0 / std::sqrt(static_cast<double>(head_dim()));
}

bool LlamaConfig::gemma_features() const {
  return norm_weight_offset != 0.0 || sandwich_norms || mlp_activation != ops::GluActivation::kSilu ||
         scale_embeddings || rope_local_theta != 0.0 || soft_capped();
}

ops::RopeOptions LlamaConfig::rope_of(int64_t layer) const {
  if (rope_local_theta <= 0 || window_of(layer) == 0) return rope;
  ops::RopeOptions local;
  local.theta = rope_local_theta;
  local.partial_rotary = rope.partial_rotary;
  return local;
}

void LlamaConfig::validate_families(const std::string& p) const {
  ST_CHECK(nope_layers.empty() || static_cast<int64_t>(nope_layers.size()) == n_layers, "`", p, "nope_layers` lists ",
           nope_layers.size(), " layers for `", p, "n_layers` = ", n_layers,
           "; give one entry per layer (or none: every layer uses rope)");
  ST_CHECK(embedding_multiplier > 0, "`", p, "embedding_multiplier` must be > 0, found ", embedding_multiplier);
  ST_CHECK(residual_multiplier > 0, "`", p, "residual_multiplier` must be > 0, found ", residual_multiplier);
  ST_CHECK(attention_multiplier >= 0, "`", p, "attention_multiplier` must be >= 0 (0: 1 / sqrt(head dim)), found ",
           attention_multiplier);
  ST_CHECK(logits_scaling > 0, "`", p, "logits_scaling` must be > 0, found ", logits_scaling);
  ST_CHECK(!(qk_norm && qk_norm_whole), "`", p, "qk_norm` (per head, Qwen3) and `", p,
           "qk_norm_whole` (over all heads, OLMo 2) are both set; choose one");
  ST_CHECK(!(post_norms && sandwich_norms), "`", p, "post_norms` (norms after each sublayer only, OLMo 2) and `", p,
           "sandwich_norms` (norms before and after, Gemma) are both set; choose one");
  ST_CHECK(norm_weight_offset >= 0, "`", p, "norm_weight_offset` must be >= 0 (Gemma: 1, others 0), found ",
           norm_weight_offset);
  ST_CHECK(rope_local_theta >= 0, "`", p, "rope_local_theta` must be >= 0 (0: the sliding layers use rope_theta), found ",
           rope_local_theta);
  ST_CHECK(attn_logit_softcapping >= 0, "`", p, "attn_logit_softcapping` must be >= 0 (0: none), found ",
           attn_logit_softcapping);
  ST_CHECK(final_logit_softcapping >= 0, "`", p, "final_logit_softcapping` must be >= 0 (0: none), found ",
           final_logit_softcapping);
}

void LlamaConfig::validate_sliding_window(const std::string& p) const {
  ST_CHECK(sliding_window >= 0, "`", p, "sliding_window` must be >= 1 keys (0: no sliding window), found ",
           sliding_window);
  if (sliding_window == 0) {
    for (size_t l = 0; l < sliding_layers.size(); ++l)
      ST_CHECK(!sliding_layers[l], "layer ", l, " is marked as a sliding-window layer but `", p,
               "sliding_window` is 0 (no window); set a window of at least 1 key or mark no layer");
    return;
  }
  ST_CHECK(static_cast<int64_t>(sliding_layers.size()) == n_layers, "`", p, "sliding_window` = ", sliding_window,
           " needs one sliding/full entry per layer: found ", sliding_layers.size(), " entries for `", p,
           "n_layers` = ", n_layers);
}

void LlamaConfig::validate(const std::string& p) const {
  ST_CHECK(vocab_size > 0, "`", p, "vocab_size` must be > 0, found ", vocab_size);
  ST_CHECK(dim > 0, "`", p, "dim` must be > 0, found ", dim);
  ST_CHECK(n_layers > 0, "`", p, "n_layers` must be > 0, found ", n_layers);
  ST_CHECK(n_heads > 0, "`", p, "n_heads` must be > 0, found ", n_heads);
  ST_CHECK(n_kv_heads > 0, "`", p, "n_kv_heads` must be > 0, found ", n_kv_heads);
  ST_CHECK(ffn_dim > 0, "`", p, "ffn_dim` must be > 0, found ", ffn_dim);
  ST_CHECK(max_seq_len > 0, "`", p, "max_seq_len` must be > 0, found ", max_seq_len);
  ST_CHECK(head_dim_override >= 0, "`", p, "head_dim` must be >= 0 (0: dim / n_heads), found ", head_dim_override);
  if (head_dim_override == 0) {
    ST_CHECK(dim % n_heads == 0, "`", p, "n_heads` (", n_heads, ") must divide `", p, "dim` (", dim,
             "): the head dimension is dim / n_heads unless `", p, "head_dim` sets it");
    ST_CHECK(head_dim() % 2 == 0, "head dimension `", p, "dim` / `", p, "n_heads` = ", head_dim(),
             " must be even for rotary embeddings");
  } else {
    ST_CHECK(head_dim_override % 2 == 0, "`", p, "head_dim` = ", head_dim_override,
             " must be even for rotary embeddings");
  }
  ST_CHECK(n_heads % n_kv_heads == 0, "`", p, "n_kv_heads` (", n_kv_heads, ") must divide `", p,
           "n_heads` (", n_heads, ")");
  ST_CHECK(norm_eps > 0, "`", p, "norm_eps` must be > 0, found ", norm_eps);
  ST_CHECK(rope.theta > 0, "`", p, "rope_theta` must be > 0, found ", rope.theta);
  ST_CHECK(init_std > 0, "`", p, "init_std` must be > 0, found ", init_std);
  validate_sliding_window(p);
  validate_families(p);
  validate_rope(p);
}

void LlamaConfig::validate_rope(const std::string& p) const {
  ST_CHECK(rope.partial_rotary > 0 && rope.partial_rotary <= 1, "`", p, "rotary_fraction` must be in (0, 1] (the ",
           "share of each head that rope rotates; 1: all of it), found ", rope.partial_rotary);
  const auto R = static_cast<int64_t>(static_cast<double>(head_dim()) * rope.partial_rotary);
  ST_CHECK(R > 0 && R % 2 == 0, "`", p, "rotary_fraction` = ", rope.partial_rotary, " rotates int(", head_dim(),
           " x ", rope.partial_rotary, ") = ", R, " dimensions of each head of ", head_dim(),
           "; rope needs an even number > 0: choose a fraction that gives one");
  if (rope.scaling.type == ops::RopeScalingType::kLongRope) {
    const ops::RopeScaling& s = rope.scaling;
    for (const auto& [factors, name] : {std::pair{&s.short_factor, "short_factor"}, {&s.long_factor, "long_factor"}}) {
      ST_CHECK(static_cast<int64_t>(factors->size()) == R / 2, "LongRoPE's `", name, "` has ", factors->size(),
               " entries, but heads rotating ", R, " dimensions (head dim ", head_dim(), ", rotary fraction ",
               rope.partial_rotary, ") have ", R / 2, " frequencies; give one factor per frequency");
      for (size_t k = 0; k < factors->size(); ++k)
        ST_CHECK((*factors)[k] > 0, "LongRoPE's `", name, "[", k, "]` must be > 0, found ", (*factors)[k]);
    }
    ST_CHECK(s.original_max_positions > 0, "LongRoPE's `original_max_position_embeddings` must be > 0, found ",
             s.original_max_positions);
    ST_CHECK(s.attention_factor > 0, "LongRoPE's `attention_factor` must be > 0, found ", s.attention_factor);
  }
  if (rope.scaling.type == ops::RopeScalingType::kLinear)
    ST_CHECK(rope.scaling.factor >= 1, "`", p, "rope_scaling_factor` must be >= 1, found ", rope.scaling.factor);
  if (rope.scaling.type == ops::RopeScalingType::kLlama3) {
    ST_CHECK(rope.scaling.factor >= 1, "`", p, "rope_scaling_factor` must be >= 1, found ", rope.scaling.factor);
    ST_CHECK(rope.scaling.high_freq_factor > rope.scaling.low_freq_factor, "`", p,
             "rope_high_freq_factor` (", rope.scaling.high_freq_factor, ") must exceed `", p,
             "rope_low_freq_factor` (", rope.scaling.low_freq_factor, ")");
    ST_CHECK(rope.scaling.original_max_positions > 0, "`", p,
             "rope_original_max_positions` must be > 0, found ", rope.scaling.original_max_positions);
  }
}

int64_t LlamaConfig::num_non_embedding_parameters() const {
  int64_t block = 2 * dim;                                       // two norms (pre or post)
  block += dim * q_dim() + 2 * dim * kv_dim();                   // q, k, v
  if (attention_bias) block += q_dim() + 2 * kv_dim();
  if (qk_norm) block += 2 * head_dim();                          // q_norm, k_norm
  if (qk_norm_whole) block += q_dim() + kv_dim();                // q_norm, k_norm over all heads
  block += q_dim() * dim;                                        // o
  if (sandwich_norms) block += 2 * dim;                           // pre- and post-norms both
  block += 3 * dim * ffn_dim;                                    // gate, up, down
  return n_layers * block + dim + vocab_size * dim;              // final norm + head
}

int64_t LlamaConfig::num_parameters() const {
  return num_non_embedding_parameters() + (tie_embeddings ? 0 : vocab_size * dim);
}

double sliding_keys_per_token(int64_t window, int64_t seq_len) {
  const double T = static_cast<double>(seq_len);
  if (window <= 0 || seq_len <= 0) return T;
  return T * ops::causal_attention_pairs(seq_len, seq_len, window) / ops::causal_attention_pairs(seq_len, seq_len, 0);
}

double LlamaConfig::flops_per_token(int64_t seq_len) const {
  // the attention's keys per token: T on a full layer (the causal half not taken off, as
  // torchtitan counts), and on a sliding layer T scaled by the share of the causal pairs that
  // lie inside the window (T when the window holds every key, about 2W when W << T)
  double keys = 0;
  for (int64_t l = 0; l < n_layers; ++l) keys += sliding_keys_per_token(window_of(l), seq_len);
  return 6.0 * static_cast<double>(num_non_embedding_parameters()) + 12.0 * static_cast<double>(q_dim()) * keys;
}

std::string LlamaConfig::summary() const {
  std::ostringstream s;
  s << "Llama: " << n_layers << " layers, dim " << dim << ", " << n_heads << " heads / " << n_kv_heads
    << " kv heads (head dim " << head_dim();
  if (head_dim_decoupled()) s << ", decoupled: attention width " << n_heads << " x " << head_dim() << " = " << q_dim();
  s << ")";
  if (qk_norm) s << ", QK-norm";
  if (qk_norm_whole) s << ", QK-norm over all heads";
  if (post_norms) s << ", norms after each sublayer";
  if (sandwich_norms) s << ", norms before and after each sublayer";
  if (norm_weight_offset != 0) s << ", norms scaled by (" << norm_weight_offset << " + weight)";
  if (mlp_activation == ops::GluActivation::kGeluTanh) s << ", GeGLU (tanh GELU)";
  if (scale_embeddings) s << ", embeddings x sqrt(dim)";
  if (has_local_rope()) s << ", sliding layers' rope theta " << rope_local_theta;
  if (rope.scaling.type == ops::RopeScalingType::kLongRope)
    s << ", LongRoPE (long factors past " << rope.scaling.original_max_positions << " positions)";
  if (rope.partial_rotary != 1.0) s << ", rope on " << rotary_dim() << " of " << head_dim() << " dims";
  if (fused_projections) s << ", fused qkv and gate_up";
  if (attn_logit_softcapping > 0) s << ", attention scores soft-capped at " << attn_logit_softcapping;
  if (final_logit_softcapping > 0) s << ", logits soft-capped at " << final_logit_softcapping;
  if (!nope_layers.empty() && nope_layer_count() > 0)
    s << ", no rope on " << nope_layer_count() << " of " << n_layers << " layers";
  if (gemma_features()) s << ", attention scale " << attention_scale();
  if (granite_scaled() && !gemma_features())
    s << ", scaled (embedding x" << embedding_multiplier << ", residual x" << residual_multiplier << ", attention x"
      << attention_scale() << ", logits /" << logits_scaling << ")";
  if (sliding_window > 0)
    s << ", sliding window " << sliding_window << " on " << sliding_layer_count() << " of " << n_layers << " layers";
  s << ", ffn " << ffn_dim << ", vocab " << vocab_size
    << (tie_embeddings ? " (tied)" : "") << ", " << num_parameters() << " parameters";
  return s.str();
}

}  // namespace shardtrain::model
