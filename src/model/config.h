// The Llama model shape. Covers Llama 2 / 3 / 3.1 (llama3 rope scaling) / 3.2 (tied
// embeddings) and Llama-architecture variants (Qwen2-style q/k/v bias, a head dimension of
// its own as Mistral-Nemo's: N·H need not equal D).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ops/rope.h"
#include "ops/swiglu.h"

namespace shardtrain::model {

// The keys per token flops_per_token counts for an attention layer over seq_len tokens: seq_len
// with no window (0), and for a sliding window seq_len scaled by the share of the causal
// (query, key) pairs inside it.
double sliding_keys_per_token(int64_t window, int64_t seq_len);

struct LlamaConfig {
  int64_t vocab_size = 0;    // V
  int64_t dim = 0;           // D, hidden_size
  int64_t n_layers = 0;      // L
  int64_t n_heads = 0;       // N, query heads
  int64_t n_kv_heads = 0;    // M, key/value heads (M == N: multi-head; M < N: grouped-query)
  // H when set (HF `head_dim`, `model.head_dim`): q_proj is then [N·H, D], k/v_proj [M·H, D]
  // and o_proj [D, N·H] whatever D is. 0: H = D / N.
  int64_t head_dim_override = 0;
  int64_t ffn_dim = 0;       // F, intermediate_size
  int64_t max_seq_len = 0;   // longest sequence the rope table covers
  double norm_eps = 1e-5;
  ops::RopeOptions rope;
  bool tie_embeddings = false;  // lm_head shares model.embed_tokens.weight
  bool attention_bias = false;  // q/k/v projections carry biases (Qwen2)
  // QK-norm (Qwen3): an RMSNorm over each head's H values of q and of k, after their
  // projections and before rope, with learned weights `self_attn.q_norm.weight` and
  // `self_attn.k_norm.weight` [H] shared by all heads and norm_eps as its epsilon.
  bool qk_norm = false;
  double init_std = 0.02;       // normal init of matrices (HF initializer_range)
  // Sliding-window attention (Mistral, Qwen2's sliding layers, alternating patterns): on the
  // layers `sliding_layers` marks (n_layers entries), the query at position i sees the keys
  // i - sliding_window < j <= i only; the other layers attend to every earlier key. 0: none.
  int64_t sliding_window = 0;
  std::vector<bool> sliding_layers;
  // NoPE layers (SmolLM3): the layers `nope_layers` marks (n_layers entries, true: no rope)
  // attend with q and k as projected, no rotary embedding; the others rotate them. Empty:
  // every layer uses rope.
  std::vector<bool> nope_layers;
  // Granite's scalings (1 and 0: none, plain Llama): the embeddings are multiplied by
  // embedding_multiplier after the lookup, each sublayer's output (attention's o_proj and the
  // MLP's down_proj) by residual_multiplier before it joins the residual stream, the attention
  // scores by attention_multiplier in place of 1 / sqrt(H) (0: 1 / sqrt(H)), and the logits
  // divided by logits_scaling.
  double embedding_multiplier = 1.0;
  double residual_multiplier = 1.0;
  double attention_multiplier = 0.0;
  double logits_scaling = 1.0;
  // OLMo 2's norms: `post_norms` puts each sublayer's RMSNorm on its output instead of its
  // input (x2 = x + norm(attn(x)), y = x2 + norm(mlp(x2)), weights
  // `post_attention_layernorm.weight` and `post_feedforward_layernorm.weight`, no
  // `input_layernorm`); `qk_norm_whole` is an RMSNorm over all of q's N·H values and all of
  // k's M·H (weights [N·H] and [M·H]) after their projections and before rope.
  bool post_norms = false;
  bool qk_norm_whole = false;
  // Gemma 3's features (all off: Llama). norm_weight_offset: every RMSNorm (the blocks', the
  // QK-norm's, the final one) scales by weight + offset, Gemma's 1 with weights initialised to
  // 0 and stored as the checkpoint has them. sandwich_norms: a norm before and one after each
  // sublayer (x2 = x + post_attn_norm(attn(input_norm(x))), y = x2 +
  // post_ffn_norm(mlp(pre_ffn_norm(x2))); weights `input_layernorm`, `post_attention_layernorm`,
  // `pre_feedforward_layernorm`, `post_feedforward_layernorm`). mlp_activation: the gate's
  // activation (Gemma: the tanh-approximated GELU). scale_embeddings: the embeddings
  // multiplied by sqrt(D) rounded to the compute dtype (transformers' normalizer). rope_local_theta:
  // the sliding layers' rope base, without rope's scaling (0: every layer uses `rope`).
  double norm_weight_offset = 0.0;
  bool sandwich_norms = false;
  ops::GluActivation mlp_activation = ops::GluActivation::kSilu;
  bool scale_embeddings = false;
  double rope_local_theta = 0.0;
  // Gemma 2's soft-capping (0: none): the attention's scaled scores become
  // attn_logit_softcapping · tanh(s / attn_logit_softcapping) before the softmax, and the logits
  // final_logit_softcapping · tanh(z / final_logit_softcapping).
  double attn_logit_softcapping = 0.0;
  double final_logit_softcapping = 0.0;
  // Phi-3's Hugging Face files: q, k and v in one `self_attn.qkv_proj.weight` [(N + 2M)·H, D]
  // and gate and up in one `mlp.gate_up_proj.weight` [2F, D], split into shardtrain's
  // parameters on load and joined again on export (the model itself is Llama's). With LongRoPE
  // (rope.scaling) or a partial rotary (rope.partial_rotary), set or not, it exports as phi3.
  bool fused_projections = false;

  // H
  int64_t head_dim() const { return head_dim_override > 0 ? head_dim_override : n_heads > 0 ? dim / n_heads : 0; }
  int64_t q_dim() const { return n_heads * head_dim(); }      // N·H, the attention's width
  int64_t kv_dim() const { return n_kv_heads * head_dim(); }  // M·H
  // Whether N·H differs from D (Mistral-Nemo: 32 heads of 128 in a width of 5120).
  bool head_dim_decoupled() const { return q_dim() != dim; }
  // The sliding window of layer `layer`'s attention: sliding_window on a sliding layer, 0 on
  // a full one.
  int64_t window_of(int64_t layer) const;
  // How many layers slide (0 without a window).
  int64_t sliding_layer_count() const;
  // Whether layer `layer` rotates q and k (false on a NoPE layer).
  bool uses_rope(int64_t layer) const;
  // How many layers have no rope.
  int64_t nope_layer_count() const;
  // Whether any of Granite's scalings differs from plain Llama's.
  bool granite_scaled() const;
  // The attention's softmax scale: attention_multiplier, or 1 / sqrt(H) when it is 0.
  double attention_scale() const;
  // Whether any of Gemma's features (Gemma 2's and 3's) is on.
  bool gemma_features() const;
  // Whether the model exports as Hugging Face's phi3: fused projections, LongRoPE or a partial
  // rotary.
  bool phi3_features() const {
    return fused_projections || rope.scaling.type == ops::RopeScalingType::kLongRope || rope.partial_rotary != 1.0;
  }
  // R, the rotated dimensions of each head: H, or int(H · rope.partial_rotary); K = R / 2 is
  // the rope tables' width.
  int64_t rotary_dim() const { return ops::rope_rotary_dim(head_dim(), rope); }
  // Whether a sequence of `length` positions takes LongRoPE's long factors (length >
  // rope.scaling.original_max_positions); false without LongRoPE.
  bool rope_long(int64_t length) const { return ops::rope_long_factors(rope, length); }
  // Whether either soft-capping is on (Gemma 2).
  bool soft_capped() const { return attn_logit_softcapping > 0 || final_logit_softcapping > 0; }
  // The rope of layer `layer`: on a sliding layer with rope_local_theta, that base without
  // scaling; `rope` otherwise.
  ops::RopeOptions rope_of(int64_t layer) const;
  // Whether some layers use another rope than `rope` (rope_local_theta with sliding layers).
  bool has_local_rope() const { return rope_local_theta > 0 && sliding_layer_count() > 0; }
  // Throws Error naming the offending field (`prefix` + field name, e.g. "model.n_heads").
  void validate(const std::string& prefix) const;
  // Parameters in the model (a tied head counted once), and without the input embedding
  // (the N of the 6·N FLOPs-per-token estimate; a tied head still counts there).
  int64_t num_parameters() const;
  int64_t num_non_embedding_parameters() const;
  // Training FLOPs per token: 6·N_non_embedding + 12·L·H·N·T (torchtitan's estimate; the
  // attention term counts the full T x T scores, without halving for causality). A sliding
  // layer's attention term counts the (query, key) pairs inside its window instead of T x T
  // (ops::causal_attention_pairs).
  double flops_per_token(int64_t seq_len) const;
  std::string summary() const;

 private:
  void validate_sliding_window(const std::string& prefix) const;
  void validate_families(const std::string& prefix) const;
  void validate_rope(const std::string& prefix) const;
};

}  // namespace shardtrain::model
