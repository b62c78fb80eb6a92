// Hugging Face config.json <-> LlamaConfig for Llama-architecture checkpoints (llama,
// mistral, ministral, qwen2 and qwen3; their sliding windows included). Unsupported fields or
// values are rejected with the file, the key and the value found.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "model/config.h"

namespace shardtrain::model {

// `source` names the file in messages.
LlamaConfig parse_hf_config(const nlohmann::json& json, const std::string& source);
LlamaConfig load_hf_config(const std::string& path);

// A config.json that transformers loads as LlamaForCausalLM, Qwen2ForCausalLM when
// attention_bias is set, or Qwen3ForCausalLM when qk_norm is (with its attention_bias); without
// either, MistralForCausalLM for a sliding window on every layer and MinistralForCausalLM for
// one on some. `torch_dtype` names the saved weights' dtype.
nlohmann::json to_hf_config(const LlamaConfig& config, const std::string& torch_dtype);

}  // namespace shardtrain::model
