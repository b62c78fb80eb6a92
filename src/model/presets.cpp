// The presets' table: each entry holds the shape keys of the model's published config.json
// verbatim (values as Hugging Face publishes them), so parse_hf_config is the one reader of
// both a download and a preset.
#include "model/presets.h"

#include <algorithm>
#include <cctype>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "model/hf_config.h"

namespace shardtrain::model {
namespace {

// Llama 3.1 and 3.2: rope_theta 500000 with llama3 frequency scaling from 8192 positions
// (factor 8 for 3.1, 32 for 3.2), 131072 positions, vocabulary 128256; 3.2's small models
// tie the head to the embedding.
constexpr const char* kLlama32_1b = R"({
  "model_type": "llama", "hidden_act": "silu", "vocab_size": 128256, "hidden_size": 2048,
  "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8,
  "head_dim": 64, "max_position_embeddings": 131072, "rms_norm_eps": 1e-05, "rope_theta": 500000.0,
  "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "tie_word_embeddings": true, "attention_bias": false, "mlp_bias": false, "initializer_range": 0.02})";

constexpr const char* kLlama32_3b = R"({
  "model_type": "llama", "hidden_act": "silu", "vocab_size": 128256, "hidden_size": 3072,
  "intermediate_size": 8192, "num_hidden_layers": 28, "num_attention_heads": 24, "num_key_value_heads": 8,
  "head_dim": 128, "max_position_embeddings": 131072, "rms_norm_eps": 1e-05, "rope_theta": 500000.0,
  "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "tie_word_embeddings": true, "attention_bias": false, "mlp_bias": false, "initializer_range": 0.02})";

constexpr const char* kLlama31_8b = R"({
  "model_type": "llama", "hidden_act": "silu", "vocab_size": 128256, "hidden_size": 4096,
  "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
  "max_position_embeddings": 131072, "rms_norm_eps": 1e-05, "rope_theta": 500000.0,
  "rope_scaling": {"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "tie_word_embeddings": false, "attention_bias": false, "mlp_bias": false, "initializer_range": 0.02})";

constexpr const char* kLlama31_70b = R"({
  "model_type": "llama", "hidden_act": "silu", "vocab_size": 128256, "hidden_size": 8192,
  "intermediate_size": 28672, "num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8,
  "max_position_embeddings": 131072, "rms_norm_eps": 1e-05, "rope_theta": 500000.0,
  "rope_scaling": {"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "tie_word_embeddings": false, "attention_bias": false, "mlp_bias": false, "initializer_range": 0.02})";

constexpr const char* kLlama31_405b = R"({
  "model_type": "llama", "hidden_act": "silu", "vocab_size": 128256, "hidden_size": 16384,
  "intermediate_size": 53248, "num_hidden_layers": 126, "num_attention_heads": 128, "num_key_value_heads": 8,
  "max_position_embeddings": 131072, "rms_norm_eps": 1e-05, "rope_theta": 500000.0,
  "rope_scaling": {"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "tie_word_embeddings": false, "attention_bias": false, "mlp_bias": false, "initializer_range": 0.02})";

// Llama 2: rope_theta 10000 without scaling (its config.json leaves rope_theta to
// transformers' default), 4096 positions, vocabulary 32000; only 70B uses grouped-query
// attention.
constexpr const char* kLlama2_7b = R"({
  "model_type": "llama", "hidden_act": "silu", "vocab_size": 32000, "hidden_size": 4096,
  "intermediate_size": 11008, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32,
  "max_position_embeddings": 4096, "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "rope_scaling": null,
  "tie_word_embeddings": false, "pretraining_tp": 1, "initializer_range": 0.02})";

constexpr const char* kLlama2_13b = R"({
  "model_type": "llama", "hidden_act": "silu", "vocab_size": 32000, "hidden_size": 5120,
  "intermediate_size": 13824, "num_hidden_layers": 40, "num_attention_heads": 40, "num_key_value_heads": 40,
  "max_position_embeddings": 4096, "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "rope_scaling": null,
  "tie_word_embeddings": false, "pretraining_tp": 1, "initializer_range": 0.02})";

constexpr const char* kLlama2_70b = R"({
  "model_type": "llama", "hidden_act": "silu", "vocab_size": 32000, "hidden_size": 8192,
  "intermediate_size": 28672, "num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8,
  "max_position_embeddings": 4096, "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "rope_scaling": null,
  "tie_word_embeddings": false, "pretraining_tp": 1, "initializer_range": 0.02})";

// Qwen3 1.7B: QK-norm, head dim 128 (16 query and 8 key/value heads over a width of 2048),
// rope_theta 1000000 without scaling, 40960 positions, vocabulary 151936, the head tied.
constexpr const char* kQwen3_1_7b = R"({
  "model_type": "qwen3", "hidden_act": "silu", "vocab_size": 151936, "hidden_size": 2048,
  "intermediate_size": 6144, "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8,
  "head_dim": 128, "max_position_embeddings": 40960, "max_window_layers": 28, "rms_norm_eps": 1e-06,
  "rope_scaling": null, "rope_theta": 1000000, "sliding_window": null, "use_sliding_window": false,
  "tie_word_embeddings": true, "attention_bias": false, "initializer_range": 0.02})";

// Gemma 3 1B (text): GeGLU with tanh GELU, norms before and after each sublayer, QK-norm, head
// dim 256 (4 query heads, 1 key/value head over a width of 1152), five of every six layers
// sliding over 512 keys with rope base 10000, the others global with 1000000, 32768 positions,
// vocabulary 262144, the head tied.
constexpr const char* kGemma3_1b = R"({
  "model_type": "gemma3_text", "hidden_activation": "gelu_pytorch_tanh", "vocab_size": 262144,
  "hidden_size": 1152, "intermediate_size": 6912, "num_hidden_layers": 26, "num_attention_heads": 4,
  "num_key_value_heads": 1, "head_dim": 256, "max_position_embeddings": 32768, "query_pre_attn_scalar": 256,
  "rms_norm_eps": 1e-06, "rope_local_base_freq": 10000, "rope_scaling": null, "rope_theta": 1000000,
  "sliding_window": 512, "sliding_window_pattern": 6, "attn_logit_softcapping": null,
  "final_logit_softcapping": null, "attention_bias": false, "initializer_range": 0.02})";

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

}  // namespace

const std::vector<ModelPreset>& model_presets() {
  static const std::vector<ModelPreset> table = {
      {"llama3.2-1b", "meta-llama/Llama-3.2-1B", {"Llama-3.2-1B", "Llama-3.2-1B-Instruct"}, kLlama32_1b},
      {"llama3.2-3b", "meta-llama/Llama-3.2-3B", {"Llama-3.2-3B", "Llama-3.2-3B-Instruct"}, kLlama32_3b},
      {"llama3.1-8b",
       "meta-llama/Llama-3.1-8B",
       {"Llama-3.1-8B", "Llama-3.1-8B-Instruct", "Meta-Llama-3.1-8B", "Meta-Llama-3.1-8B-Instruct"},
       kLlama31_8b},
      {"llama3.1-70b",
       "meta-llama/Llama-3.1-70B",
       {"Llama-3.1-70B", "Llama-3.1-70B-Instruct", "Meta-Llama-3.1-70B", "Meta-Llama-3.1-70B-Instruct"},
       kLlama31_70b},
      {"llama3.1-405b",
       "meta-llama/Llama-3.1-405B",
       {"Llama-3.1-405B", "Llama-3.1-405B-Instruct", "Meta-Llama-3.1-405B", "Meta-Llama-3.1-405B-Instruct"},
       kLlama31_405b},
      {"llama2-7b", "meta-llama/Llama-2-7b-hf", {"Llama-2-7b-hf", "Llama-2-7b-chat-hf"}, kLlama2_7b},
      {"llama2-13b", "meta-llama/Llama-2-13b-hf", {"Llama-2-13b-hf", "Llama-2-13b-chat-hf"}, kLlama2_13b},
      {"llama2-70b", "meta-llama/Llama-2-70b-hf", {"Llama-2-70b-hf", "Llama-2-70b-chat-hf"}, kLlama2_70b},
      {"qwen3-1.7b", "Qwen/Qwen3-1.7B", {"Qwen3-1.7B", "Qwen3-1.7B-Base"}, kQwen3_1_7b},
      {"gemma3-1b", "google/gemma-3-1b-pt", {"gemma-3-1b-pt", "gemma-3-1b-it"}, kGemma3_1b},
  };
  return table;
}

std::string preset_names() {
  std::string s;
  for (const ModelPreset& p : model_presets()) s += (s.empty() ? "" : ", ") + p.name;
  return s;
}

const ModelPreset* find_preset(const std::string& name) {
  for (const ModelPreset& p : model_presets())
    if (p.name == name) return &p;
  return nullptr;
}

LlamaConfig preset_config(const std::string& name, const std::string& key) {
  const ModelPreset* p = find_preset(name);
  ST_CHECK(p != nullptr, "`", key, "` = \"", name, "\" is not a built-in model shape; the presets are ", preset_names(),
           " (for another model, point model.hf at its Hugging Face folder or set the model.* shape keys)");
  return parse_hf_config(nlohmann::json::parse(p->config_json), "preset `" + p->name + "` (" + p->hf_repo + ")");
}

const ModelPreset* preset_for_folder_name(const std::string& folder_name) {
  const std::string wanted = lower(folder_name);
  for (const ModelPreset& p : model_presets()) {
    if (lower(p.name) == wanted) return &p;
    for (const std::string& n : p.folder_names)
      if (lower(n) == wanted) return &p;
  }
  return nullptr;
}

}  // namespace shardtrain::model
