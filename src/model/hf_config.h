// Hugging Face config.json <-> LlamaConfig for Llama-architecture checkpoints (llama,
// mistral, ministral, qwen2, qwen3, smollm3, granite, olmo2 and gemma3_text; their sliding windows
// included). Unsupported fields or values are rejected with the file, the key and the value
// found.
#pragma once

#include <string>

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
// features. `torch_dtype` names the saved weights' dtype.
nlohmann::json to_hf_config(const LlamaConfig& config, const std::string& torch_dtype);

}  // namespace shardtrain::model
