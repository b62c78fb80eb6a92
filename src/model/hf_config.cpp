// Reading and writing HF config.json. Accepts both the transformers 4 form (rope_theta +
// rope_scaling) and the transformers 5 form (rope_parameters).
#include "model/hf_config.h"

#include <fstream>

#include "core/error.h"

namespace shardtrain::model {
namespace {

using nlohmann::json;

const json* find(const json& j, const char* key) {
  auto it = j.find(key);
  return it == j.end() || it->is_null() ? nullptr : &*it;
}

int64_t get_int(const json& j, const char* key, const std::string& src, const int64_t* fallback = nullptr) {
  const json* v = find(j, key);
  if (!v) {
    ST_CHECK(fallback != nullptr, src, ": required key `", key, "` is missing");
    return *fallback;
  }
  ST_CHECK(v->is_number_integer(), src, ": `", key, "` must be an integer, found ", v->dump());
  return v->get<int64_t>();
}

double get_double(const json& j, const char* key, const std::string& src, double fallback) {
  const json* v = find(j, key);
  if (!v) return fallback;
  ST_CHECK(v->is_number(), src, ": `", key, "` must be a number, found ", v->dump());
  return v->get<double>();
}

bool get_bool(const json& j, const char* key, const std::string& src, bool fallback) {
  const json* v = find(j, key);
  if (!v) return fallback;
  ST_CHECK(v->is_boolean(), src, ": `", key, "` must be true or false, found ", v->dump());
  return v->get<bool>();
}

void parse_rope(const json& j, const std::string& src, LlamaConfig& c) {
  // transformers 5: rope_parameters {rope_type, rope_theta, factor, ...}; 4: rope_theta + rope_scaling
  const json* params = find(j, "rope_parameters");
  const json* scaling = params ? params : find(j, "rope_scaling");
  const char* where = params ? "rope_parameters" : "rope_scaling";
  c.rope.theta = get_double(params ? *params : j, "rope_theta", src, 10000.0);
  if (!scaling) return;
  ST_CHECK(scaling->is_object(), src, ": `", where, "` must be an object, found ", scaling->dump());
  std::string type = "default";
  if (const json* t = find(*scaling, "rope_type")) type = t->get<std::string>();
  else if (const json* t2 = find(*scaling, "type")) type = t2->get<std::string>();
  if (type == "default") return;
  ST_CHECK(type == "llama3", src, ": `", where, ".rope_type` = \"", type,
           "\" is not supported; shardtrain supports default and llama3");
  c.rope.scaling.type = ops::RopeScalingType::kLlama3;
  c.rope.scaling.factor = get_double(*scaling, "factor", src, 8.0);
  c.rope.scaling.low_freq_factor = get_double(*scaling, "low_freq_factor", src, 1.0);
  c.rope.scaling.high_freq_factor = get_double(*scaling, "high_freq_factor", src, 4.0);
  const int64_t orig_default = 8192;
  c.rope.scaling.original_max_positions = get_int(*scaling, "original_max_position_embeddings", src, &orig_default);
}

// Families transformers names that shardtrain's block cannot run yet, with what they need.
struct UnsupportedFamily {
  const char* model_type;
  const char* missing;
};
constexpr UnsupportedFamily kUnsupported[] = {
    {"olmo2", "QK-norm over the whole q and k and norms after each sublayer"},
    {"gemma", "GeGLU MLPs, embeddings scaled by sqrt(hidden_size) and (1 + weight) norms"},
    {"gemma2", "logit soft-capping, sliding-window layers and norms after each sublayer"},
    {"gemma3", "QK-norm, sliding-window layers and norms after each sublayer"},
    {"phi3", "fused qkv_proj and gate_up_proj tensors"},
    {"mixtral", "mixture-of-experts MLPs"},
    {"qwen2_moe", "mixture-of-experts MLPs"},
    {"qwen3_moe", "mixture-of-experts MLPs and QK-norm"},
};
constexpr const char* kSupported = "llama (Llama 2, 3, 3.1, 3.2), mistral (no sliding window; a head_dim of its own "
                                   "as Mistral-Nemo's is fine), qwen2 (no sliding window) and qwen3 (dense, QK-norm, "
                                   "no sliding window)";

void check_model_type(const std::string& model_type, const std::string& src) {
  if (model_type == "llama" || model_type == "mistral" || model_type == "qwen2" || model_type == "qwen3") return;
  for (const UnsupportedFamily& f : kUnsupported)
    ST_CHECK(model_type != f.model_type, src, ": `model_type` = \"", model_type,
             "\" is not supported: shardtrain does not implement its ", f.missing, " yet; it trains ", kSupported);
  ST_THROW(src, ": `model_type` = \"", model_type, "\" is not supported; shardtrain trains ", kSupported);
}

constexpr const char* kFullAttentionOnly = "sliding-window attention is not supported yet; shardtrain runs full "
                                          "(causal) attention in every layer";

// Every layer attends to the whole causal prefix. qwen2 and qwen3 switch windows on with
// `use_sliding_window` (`sliding_window` is then the window, and null or a number without it);
// transformers 5 lists each layer's kind in `layer_types`; mistral has a window whenever
// `sliding_window` is set.
void check_full_attention(const json& j, const std::string& model_type, const std::string& src) {
  if (model_type == "qwen2" || model_type == "qwen3") {
    ST_CHECK(!get_bool(j, "use_sliding_window", src, false), src, ": `use_sliding_window` = true: ", kFullAttentionOnly,
             "; set it to false (or train a model without sliding windows)");
  } else if (model_type == "mistral") {
    const json* window = find(j, "sliding_window");
    ST_CHECK(window == nullptr, src, ": `sliding_window` = ", window ? window->dump() : "", ": ", kFullAttentionOnly,
             "; set it to null (or train a model without sliding windows)");
  }
  const json* types = find(j, "layer_types");
  if (types == nullptr) return;
  ST_CHECK(types->is_array(), src, ": `layer_types` must be a list of \"full_attention\" entries, found ",
           types->dump());
  for (size_t i = 0; i < types->size(); ++i) {
    const json& t = (*types)[i];
    ST_CHECK(t.is_string(), src, ": `layer_types[", i, "]` must be a string, found ", t.dump());
    ST_CHECK(t == "full_attention", src, ": `layer_types[", i, "]` = ", t.dump(), ": ", kFullAttentionOnly,
             " (\"full_attention\" in each entry)");
  }
}

}  // namespace

LlamaConfig parse_hf_config(const json& j, const std::string& src) {
  ST_CHECK(j.is_object(), src, ": expected a JSON object");
  const json* mt = find(j, "model_type");
  ST_CHECK(mt && mt->is_string(), src, ": `model_type` is missing");
  const std::string model_type = mt->get<std::string>();
  check_model_type(model_type, src);
  if (const json* act = find(j, "hidden_act"))
    ST_CHECK(*act == "silu", src, ": `hidden_act` = ", act->dump(), " is not supported; expected \"silu\"");
  ST_CHECK(!get_bool(j, "mlp_bias", src, false), src, ": `mlp_bias` = true is not supported");
  const int64_t one = 1;
  ST_CHECK(get_int(j, "pretraining_tp", src, &one) == 1, src, ": `pretraining_tp` other than 1 is not supported");
  check_full_attention(j, model_type, src);

  LlamaConfig c;
  c.vocab_size = get_int(j, "vocab_size", src);
  c.dim = get_int(j, "hidden_size", src);
  c.n_layers = get_int(j, "num_hidden_layers", src);
  if (const json* types = find(j, "layer_types"))
    ST_CHECK(static_cast<int64_t>(types->size()) == c.n_layers, src, ": `layer_types` lists ", types->size(),
             " layers but `num_hidden_layers` = ", c.n_layers, "; give one entry per layer");
  c.n_heads = get_int(j, "num_attention_heads", src);
  c.n_kv_heads = get_int(j, "num_key_value_heads", src, &c.n_heads);
  c.ffn_dim = get_int(j, "intermediate_size", src);
  c.max_seq_len = get_int(j, "max_position_embeddings", src);
  c.norm_eps = get_double(j, "rms_norm_eps", src, 1e-6);
  c.tie_embeddings = get_bool(j, "tie_word_embeddings", src, false);
  c.attention_bias = model_type == "qwen2" ? true : get_bool(j, "attention_bias", src, false);
  c.qk_norm = model_type == "qwen3";  // Qwen3's q_norm / k_norm
  c.init_std = get_double(j, "initializer_range", src, 0.02);
  parse_rope(j, src, c);
  // transformers 4 and 5 both write head_dim at the top (null or absent: hidden_size /
  // num_attention_heads); a value of its own sets the projections' widths (Mistral-Nemo)
  if (find(j, "head_dim") != nullptr) {
    c.head_dim_override = get_int(j, "head_dim", src);
    ST_CHECK(c.head_dim_override > 0, src, ": `head_dim` must be > 0, found ", c.head_dim_override);
  }
  with_context([&] { return src + ": checking the model shape"; }, [&] { c.validate(""); });
  return c;
}

LlamaConfig load_hf_config(const std::string& path) {
  std::ifstream in(path);
  ST_CHECK(in.good(), "cannot open `", path, "`");
  json j = json::parse(in, nullptr, false);
  ST_CHECK(!j.is_discarded(), path, ": not valid JSON");
  return parse_hf_config(j, path);
}

json to_hf_config(const LlamaConfig& c, const std::string& torch_dtype) {
  json j;
  // QK-norm: Qwen3 (with or without q/k/v biases); biases alone: Qwen2; else Llama
  const char* family = c.qk_norm ? "qwen3" : c.attention_bias ? "qwen2" : "llama";
  j["architectures"] = {c.qk_norm ? "Qwen3ForCausalLM" : c.attention_bias ? "Qwen2ForCausalLM" : "LlamaForCausalLM"};
  j["model_type"] = family;
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = c.dim;
  j["intermediate_size"] = c.ffn_dim;
  j["num_hidden_layers"] = c.n_layers;
  j["num_attention_heads"] = c.n_heads;
  j["num_key_value_heads"] = c.n_kv_heads;
  j["head_dim"] = c.head_dim();  // always written: transformers' default is hidden_size / heads
  j["max_position_embeddings"] = c.max_seq_len;
  j["rms_norm_eps"] = c.norm_eps;
  j["hidden_act"] = "silu";
  j["tie_word_embeddings"] = c.tie_embeddings;
  if (!c.qk_norm && !c.attention_bias) {
    j["attention_bias"] = false;
    j["mlp_bias"] = false;
  } else {
    if (c.qk_norm) j["attention_bias"] = c.attention_bias;  // qwen2 always has the biases
    j["use_sliding_window"] = false;
  }
  if (c.qk_norm) {
    // full attention in every layer, as transformers writes a Qwen3 config without windows
    j["sliding_window"] = nullptr;
    j["max_window_layers"] = c.n_layers;
  }
  j["initializer_range"] = c.init_std;
  j["rope_theta"] = c.rope.theta;
  if (c.rope.scaling.type == ops::RopeScalingType::kLlama3) {
    j["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", c.rope.scaling.factor},
                         {"low_freq_factor", c.rope.scaling.low_freq_factor},
                         {"high_freq_factor", c.rope.scaling.high_freq_factor},
                         {"original_max_position_embeddings", c.rope.scaling.original_max_positions}};
  } else {
    j["rope_scaling"] = nullptr;
  }
  j["torch_dtype"] = torch_dtype;
  j["attention_dropout"] = 0.0;
  return j;
}

}  // namespace shardtrain::model
