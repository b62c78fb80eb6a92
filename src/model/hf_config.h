// Hugging Face config.json <-> LlamaConfig for Llama-architecture checkpoints (llama,
// mistral, ministral, qwen2, qwen3, smollm3, granite, olmo2, gemma3_text, gemma2 and phi3; their
// sliding windows included). Unsupported fields or values are rejected with the file, the key and the value
// found.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/config.h"

namespace shardtrain::model {

// `source` names the file in messages.
LlamaConfig parse_hf_config(const nlohmann::json& json, const std::string& source);
LlamaConfig load_hf_config(const std::string& path);

// Throws (naming `what`) unless one transformers model type has every feature of `c`: OLMo 2's
// norms (post_norms with qk_norm_whole), SmolLM3's NoPE layers, Granite's scalings, Qwen3's
// QK-norm and Gemma 3's features (all of them together) exclude one another, and each family's
// limits hold.
void check_hf_family(const LlamaConfig& c, const std::string& what);

// A config.json that transformers loads as LlamaForCausalLM, Qwen2ForCausalLM when
// attention_bias is set, or Qwen3ForCausalLM when qk_norm is (with its attention_bias); without
// either, MistralForCausalLM for a sliding window on every layer and MinistralForCausalLM for
// one on some; Olmo2ForCausalLM with OLMo 2's norms, SmolLM3ForCausalLM with NoPE layers,
// GraniteForCausalLM with Granite's scalings and Gemma3ForCausalLM (gemma3_text) with Gemma 3's
// features, Phi3ForCausalLM (phi3) with Phi-3's (LongRoPE, a partial rotary, fused projections).
// `torch_dtype` names the saved weights' dtype.
nlohmann::json to_hf_config(const LlamaConfig& config, const std::string& torch_dtype);

// A tensor of a Hugging Face file that holds several of shardtrain's parameters, their rows
// stacked in `parts` order: Phi-3's `self_attn.qkv_proj.weight` (q_proj, k_proj, v_proj) and
// `mlp.gate_up_proj.weight` (gate_proj, up_proj). Each part is a contiguous run of the fused
// tensor's elements: part i starts `offset` elements in and has part_shapes[i].
struct FusedTensor {
  std::string name;
  Shape shape;
  std::vector<std::string> parts;
  std::vector<Shape> part_shapes;
  std::vector<int64_t> offsets;
};

// The fused tensors of a model whose Hugging Face files fuse them (phi3: LlamaConfig::
// phi3_features); empty otherwise.
std::vector<FusedTensor> hf_fused_tensors(const LlamaConfig& config);

}  // namespace shardtrain::model
