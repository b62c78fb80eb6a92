// Reading and writing HF config.json. Accepts both the transformers 4 form (rope_theta +
// rope_scaling) and the transformers 5 form (rope_parameters).
#include "model/hf_config.h"

#include <cmath>
#include <fstream>
#include <utility>
#include <vector>

#include "core/error.h"
#include "model/hf_names.h"
#include "model/layout.h"

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

// transformers 5's `rope_parameters`, or null. Models with layer types (ministral) may key it
// by layer type, {"full_attention": {...}, "sliding_attention": {...}}: shardtrain has one rope
// for all layers, so the entries must be equal, and that entry is returned.
const json* rope_parameters(const json& j, const std::string& src) {
  const json* params = find(j, "rope_parameters");
  if (params == nullptr || !params->is_object()) return params;
  const json* full = find(*params, "full_attention");
  const json* sliding = find(*params, "sliding_attention");
  if (full == nullptr && sliding == nullptr) return params;
  ST_CHECK(full == nullptr || sliding == nullptr || *full == *sliding, src, ": `rope_parameters` differ between ",
           "\"full_attention\" (", full ? full->dump() : "", ") and \"sliding_attention\" (",
           sliding ? sliding->dump() : "", ") layers; shardtrain uses one rope for every layer");
  return full != nullptr ? full : sliding;
}

// LongRoPE's factors (Phi-3) as transformers reads them: short_factor and long_factor from the
// rope parameters; original_max_position_embeddings from them (transformers 5), else from the
// top of config.json (4), else max_position_embeddings; the attention factor given, else
// sqrt(1 + ln(factor) / ln(original)) for a factor above 1 (factor given, else
// max_position_embeddings / original), else 1. Their lengths are checked with the head's shape
// (LlamaConfig::validate).
void parse_longrope(const json& j, const json& scaling, const char* where, const std::string& src, LlamaConfig& c) {
  ops::RopeScaling& s = c.rope.scaling;
  s.type = ops::RopeScalingType::kLongRope;
  auto factors = [&](const char* key) {
    const json* v = find(scaling, key);
    ST_CHECK(v != nullptr && v->is_array(), src, ": `", where, ".", key, "` must be a list of numbers (LongRoPE's ",
             "divisors of each rope frequency), found ", v != nullptr ? v->dump() : std::string("nothing"));
    std::vector<double> out;
    for (const json& e : *v) {
      ST_CHECK(e.is_number(), src, ": `", where, ".", key, "` must hold numbers, found ", e.dump());
      out.push_back(e.get<double>());
    }
    return out;
  };
  s.short_factor = factors("short_factor");
  s.long_factor = factors("long_factor");
  s.original_max_positions = find(scaling, "original_max_position_embeddings") != nullptr
                                 ? get_int(scaling, "original_max_position_embeddings", src)
                                 : get_int(j, "original_max_position_embeddings", src, &c.max_seq_len);
  ST_CHECK(s.original_max_positions > 0, src, ": `original_max_position_embeddings` must be > 0, found ",
           s.original_max_positions);
  s.factor = get_double(scaling, "factor", src,
                        static_cast<double>(c.max_seq_len) / static_cast<double>(s.original_max_positions));
  const double orig = static_cast<double>(s.original_max_positions);
  const double derived = s.factor <= 1.0 ? 1.0 : std::sqrt(1.0 + std::log(s.factor) / std::log(orig));
  s.attention_factor = get_double(scaling, "attention_factor", src, derived);
}

void parse_rope(const json& j, const std::string& src, LlamaConfig& c, double default_theta) {
  // transformers 5: rope_parameters {rope_type, rope_theta, factor, ...}; 4: rope_theta + rope_scaling
  const json* params = rope_parameters(j, src);
  const json* scaling = params ? params : find(j, "rope_scaling");
  const char* where = params ? "rope_parameters" : "rope_scaling";
  c.rope.theta = get_double(params ? *params : j, "rope_theta", src, default_theta);
  if (!scaling) return;
  ST_CHECK(scaling->is_object(), src, ": `", where, "` must be an object, found ", scaling->dump());
  std::string type = "default";
  if (const json* t = find(*scaling, "rope_type")) type = t->get<std::string>();
  else if (const json* t2 = find(*scaling, "type")) type = t2->get<std::string>();
  if (type == "default") return;
  if (type == "linear") {
    c.rope.scaling.type = ops::RopeScalingType::kLinear;
    c.rope.scaling.factor = get_double(*scaling, "factor", src, 1.0);
    return;
  }
  if (type == "longrope") {
    parse_longrope(j, *scaling, where, src, c);
    return;
  }
  ST_CHECK(type == "llama3", src, ": `", where, ".rope_type` = \"", type,
           "\" is not supported; shardtrain supports default, linear, llama3 and longrope");
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
    {"gemma", "Gemma 1 configs (Gemma 3's text models, model_type gemma3_text, are supported)"},
    {"gemma3", "multimodal Gemma 3 (a vision tower); use a text-only checkpoint (model_type gemma3_text, "
               "Gemma3ForCausalLM, as google/gemma-3-1b-it)"},
    {"mixtral", "mixture-of-experts MLPs"},
    {"qwen2_moe", "mixture-of-experts MLPs"},
    {"qwen3_moe", "mixture-of-experts MLPs and QK-norm"},
};
constexpr const char* kSupported = "llama (Llama 2, 3, 3.1, 3.2), mistral (a sliding window, and a head_dim of its "
                                   "own as Mistral-Nemo's, are fine), ministral, qwen2 (sliding-window layers too), "
                                   "qwen3 (dense, QK-norm, sliding-window layers too), smollm3 (NoPE layers), granite "
                                   "(Granite 3's embedding, residual, attention and logits scalings), olmo2 (norms "
                                   "after each sublayer, QK-norm over the whole q and k) and gemma3_text (Gemma 3's "
                                   "text models: (1 + weight) norms before and after each sublayer, GeGLU, scaled "
                                   "embeddings, QK-norm, sliding layers with their own rope), gemma2 (Gemma 2: "
                                   "the same without QK-norm, with soft-capped attention scores and logits) and "
                                   "phi3 (Phi-3 and Phi-4-mini: fused qkv_proj and gate_up_proj, "
                                   "LongRoPE, a partial rotary, a sliding window)";

void check_model_type(const std::string& model_type, const std::string& src) {
  if (model_type == "llama" || model_type == "mistral" || model_type == "ministral" || model_type == "qwen2" ||
      model_type == "qwen3" || model_type == "smollm3" || model_type == "granite" || model_type == "olmo2" ||
      model_type == "gemma3_text" || model_type == "gemma2" || model_type == "phi3")
    return;
  for (const UnsupportedFamily& f : kUnsupported)
    ST_CHECK(model_type != f.model_type, src, ": `model_type` = \"", model_type,
             "\" is not supported: shardtrain does not implement its ", f.missing, " yet; it trains ", kSupported);
  ST_THROW(src, ": `model_type` = \"", model_type, "\" is not supported; shardtrain trains ", kSupported);
}

// transformers' defaults where mistral's and qwen2's (qwen3's) configs leave the keys out
constexpr int64_t kDefaultSlidingWindow = 4096;
constexpr int64_t kDefaultQwen2MaxWindowLayers = 28;
constexpr const char* kSlidingLayer = "sliding_attention";
constexpr const char* kFullLayer = "full_attention";

// transformers 5's `layer_types`, checked: n_layers entries of "sliding_attention" or
// "full_attention"; true for the sliding ones. Empty when the key is absent or null.
std::vector<bool> parse_layer_types(const json& j, int64_t n_layers, const std::string& src) {
  const json* types = find(j, "layer_types");
  if (types == nullptr) return {};
  ST_CHECK(types->is_array(), src, ": `layer_types` must be a list of \"", kSlidingLayer, "\" / \"", kFullLayer,
           "\", found ", types->dump());
  ST_CHECK(static_cast<int64_t>(types->size()) == n_layers, src, ": `layer_types` has ", types->size(),
           " entries but `num_hidden_layers` is ", n_layers, "; it needs one per layer");
  std::vector<bool> sliding;
  for (size_t i = 0; i < types->size(); ++i) {
    const json& t = (*types)[i];
    ST_CHECK(t == kSlidingLayer || t == kFullLayer, src, ": `layer_types[", i, "]` = ", t.dump(),
             " is not supported; shardtrain knows \"", kSlidingLayer, "\" and \"", kFullLayer, "\"");
    sliding.push_back(t == kSlidingLayer);
  }
  return sliding;
}

// The window size at `sliding_window` (absent: transformers' default); >= 1.
int64_t window_size(const json& j, const std::string& src) {
  const int64_t w = get_int(j, "sliding_window", src, &kDefaultSlidingWindow);
  ST_CHECK(w >= 1, src, ": `sliding_window` must be >= 1 keys (or null for none), found ", w);
  return w;
}

// The sliding window as transformers reads it: mistral slides every layer when
// `sliding_window` is not null (absent: 4096); ministral the layers `layer_types` marks (every
// one without it); qwen2 and qwen3 only with `use_sliding_window`, on the layers `layer_types`
// marks or else on layers i >= `max_window_layers`. llama has none.
void parse_sliding_window(const json& j, const std::string& model_type, const std::string& src, LlamaConfig& c) {
  if (model_type == "phi3") {  // every layer slides when `sliding_window` is set (absent or null: none)
    if (find(j, "sliding_window") == nullptr) return;
    c.sliding_window = window_size(j, src);
    c.sliding_layers.assign(static_cast<size_t>(c.n_layers), true);
    return;
  }
  if (model_type != "mistral" && model_type != "ministral" && model_type != "qwen2" && model_type != "qwen3") return;
  const std::vector<bool> types = parse_layer_types(j, c.n_layers, src);
  const bool window_key_null = j.contains("sliding_window") && j["sliding_window"].is_null();
  if (model_type == "ministral") {  // mistral with layer types; without them every layer slides
    if (window_key_null) {
      for (size_t i = 0; i < types.size(); ++i)
        ST_CHECK(!types[i], src, ": `layer_types[", i, "]` = \"", kSlidingLayer, "\" but `sliding_window` is null; ",
                 "give the window's size or mark the layer \"", kFullLayer, "\"");
      return;
    }
    c.sliding_window = window_size(j, src);
    c.sliding_layers = types.empty() ? std::vector<bool>(static_cast<size_t>(c.n_layers), true) : types;
    return;
  }
  if (model_type == "mistral") {
    if (window_key_null) {
      for (size_t i = 0; i < types.size(); ++i)
        ST_CHECK(!types[i], src, ": `layer_types[", i, "]` = \"", kSlidingLayer, "\" but `sliding_window` is null; ",
                 "give the window's size or mark every layer \"", kFullLayer, "\"");
      return;
    }
    c.sliding_window = window_size(j, src);
    for (size_t i = 0; i < types.size(); ++i)
      ST_CHECK(types[i], src, ": `layer_types[", i, "]` = \"", kFullLayer, "\", but transformers' mistral slides ",
               "every layer when `sliding_window` is set (it ignores `layer_types`); mark every layer \"",
               kSlidingLayer, "\", or set `model_type` = \"ministral\" (mistral with layer types) for layers of "
               "both kinds");
    c.sliding_layers.assign(static_cast<size_t>(c.n_layers), true);
    return;
  }
  const bool use = get_bool(j, "use_sliding_window", src, false);
  if (!use || window_key_null) {
    for (size_t i = 0; i < types.size(); ++i)
      ST_CHECK(!types[i], src, ": `layer_types[", i, "]` = \"", kSlidingLayer, "\" but ",
               use ? "`sliding_window` is null" : "`use_sliding_window` is false",
               ", so the layer has no window; set `use_sliding_window` = true and `sliding_window`, or mark the "
               "layer \"", kFullLayer, "\"");
    return;
  }
  c.sliding_window = window_size(j, src);
  if (!types.empty()) {
    c.sliding_layers = types;
    return;
  }
  const int64_t first = get_int(j, "max_window_layers", src, &kDefaultQwen2MaxWindowLayers);
  ST_CHECK(first >= 0, src, ": `max_window_layers` must be >= 0, found ", first);
  c.sliding_layers.assign(static_cast<size_t>(c.n_layers), false);
  for (int64_t l = first; l < c.n_layers; ++l) c.sliding_layers[static_cast<size_t>(l)] = true;
}

// The sliding window in the form transformers reads for the config's model type: a llama
// config whose every layer slides becomes mistral's (`sliding_window`), one with layers of
// both kinds ministral's (`sliding_window` and `layer_types`); qwen2's and qwen3's get
// `use_sliding_window`, `sliding_window`, `layer_types` (transformers 5) and
// `max_window_layers` (the first sliding layer, what transformers 4 reads: exact when the
// sliding layers are the last ones).
void write_sliding_window(const LlamaConfig& c, json& j) {
  if (c.sliding_window <= 0) return;
  const int64_t sliding = c.sliding_layer_count();
  if (j["model_type"] == "qwen2" || j["model_type"] == "qwen3") {
    j["use_sliding_window"] = true;
    j["sliding_window"] = c.sliding_window;
    int64_t first = c.n_layers;
    json types = json::array();
    for (int64_t l = 0; l < c.n_layers; ++l) {
      const bool s = c.window_of(l) > 0;
      if (s && first == c.n_layers) first = l;
      types.push_back(s ? kSlidingLayer : kFullLayer);
    }
    j["max_window_layers"] = first;
    j["layer_types"] = types;
    return;
  }
  if (sliding == 0) return;  // a window no layer uses: plain llama
  j.erase("attention_bias");  // mistral and ministral have neither bias
  j.erase("mlp_bias");
  j["sliding_window"] = c.sliding_window;
  if (sliding == c.n_layers) {
    j["architectures"] = {"MistralForCausalLM"};
    j["model_type"] = "mistral";
    return;
  }
  j["architectures"] = {"MinistralForCausalLM"};
  j["model_type"] = "ministral";
  json types = json::array();
  for (int64_t l = 0; l < c.n_layers; ++l) types.push_back(c.window_of(l) > 0 ? kSlidingLayer : kFullLayer);
  j["layer_types"] = types;
}

// SmolLM3's NoPE layers as transformers reads them: `no_rope_layers` (1: the layer uses rope,
// 0: it does not; at least one entry per layer), or when it is absent or null a NoPE layer
// every `no_rope_layer_interval` layers (layers interval-1, 2·interval-1, ...; default 4).
// SmolLM3's sliding window (only ever on NoPE layers) is refused.
void parse_smollm3(const json& j, const std::string& src, LlamaConfig& c) {
  c.nope_layers.assign(static_cast<size_t>(c.n_layers), false);
  if (const json* list = find(j, "no_rope_layers")) {
    ST_CHECK(list->is_array() && static_cast<int64_t>(list->size()) >= c.n_layers, src,
             ": `no_rope_layers` must be a list of 0 / 1 with an entry for each of the ", c.n_layers,
             " layers (`num_hidden_layers`), found ", list->dump());
    for (int64_t l = 0; l < c.n_layers; ++l) {
      const json& v = (*list)[static_cast<size_t>(l)];
      ST_CHECK(v.is_number_integer() && (v.get<int64_t>() == 0 || v.get<int64_t>() == 1), src, ": `no_rope_layers[", l,
               "]` = ", v.dump(), "; expected 1 (the layer uses rope) or 0 (it does not)");
      c.nope_layers[static_cast<size_t>(l)] = v.get<int64_t>() == 0;
    }
  } else {
    const int64_t default_interval = 4;
    const int64_t interval = get_int(j, "no_rope_layer_interval", src, &default_interval);
    ST_CHECK(interval >= 1, src, ": `no_rope_layer_interval` must be >= 1, found ", interval);
    for (int64_t l = 0; l < c.n_layers; ++l) c.nope_layers[static_cast<size_t>(l)] = (l + 1) % interval == 0;
  }
  const std::vector<bool> types = parse_layer_types(j, c.n_layers, src);
  bool sliding = get_bool(j, "use_sliding_window", src, false) && find(j, "sliding_window") != nullptr;
  for (bool t : types) sliding = sliding || t;
  ST_CHECK(!sliding, src, ": a smollm3 sliding window (`use_sliding_window`, `sliding_window`, `layer_types`) is not ",
           "supported; shardtrain reads SmolLM3 with full attention on every layer (set `use_sliding_window` = false)");
}

// Granite's four scalings (transformers' defaults 1.0; its attention_multiplier replaces
// 1 / sqrt(head_dim) whatever its value).
void parse_granite(const json& j, const std::string& src, LlamaConfig& c) {
  c.embedding_multiplier = get_double(j, "embedding_multiplier", src, 1.0);
  c.residual_multiplier = get_double(j, "residual_multiplier", src, 1.0);
  c.attention_multiplier = get_double(j, "attention_multiplier", src, 1.0);
  c.logits_scaling = get_double(j, "logits_scaling", src, 1.0);
  ST_CHECK(
      c.embedding_multiplier > 0 && c.residual_multiplier > 0 && c.attention_multiplier > 0 && c.logits_scaling > 0,
      src, ": Granite's `embedding_multiplier` (", c.embedding_multiplier, "), `residual_multiplier` (",
      c.residual_multiplier, "), `attention_multiplier` (", c.attention_multiplier, ") and `logits_scaling` (",
      c.logits_scaling, ") must all be > 0");
}

// Phi-3's own keys: the fused tensors; the partial rotary (`partial_rotary_factor` in the rope
// parameters, transformers 5, or at the top of config.json; Phi-4-mini: 0.75); its dropouts,
// which shardtrain does not apply, must be 0.
void parse_phi3(const json& j, const std::string& src, LlamaConfig& c) {
  c.fused_projections = true;
  for (const char* key : {"resid_pdrop", "embd_pdrop", "attention_dropout"}) {
    const double p = get_double(j, key, src, 0.0);
    ST_CHECK(p == 0.0, src, ": `", key, "` = ", p,
             " is not supported: shardtrain trains without dropout; set it to 0.0");
  }
  const json* params = rope_parameters(j, src);
  const json* in_params = params != nullptr && params->is_object() ? find(*params, "partial_rotary_factor") : nullptr;
  c.rope.partial_rotary = in_params != nullptr ? get_double(*params, "partial_rotary_factor", src, 1.0)
                                               : get_double(j, "partial_rotary_factor", src, 1.0);
  ST_CHECK(c.rope.partial_rotary > 0 && c.rope.partial_rotary <= 1, src,
           ": `partial_rotary_factor` must be in (0, 1], found ", c.rope.partial_rotary);
}

// A rope_scaling / rope_parameters entry for Gemma 3's global layers: default or linear.
void parse_gemma3_scaling(const json& s, const char* where, const std::string& src, LlamaConfig& c) {
  ST_CHECK(s.is_object(), src, ": `", where, "` must be an object, found ", s.dump());
  std::string type = "default";
  if (const json* t = find(s, "rope_type")) type = t->get<std::string>();
  else if (const json* t2 = find(s, "type")) type = t2->get<std::string>();
  if (type == "default") return;
  ST_CHECK(type == "linear", src, ": `", where, "` rope type \"", type, "\" is not supported for gemma3_text; ",
           "shardtrain supports default and linear there (Gemma 3's 4B and larger use linear, factor 8)");
  c.rope.scaling.type = ops::RopeScalingType::kLinear;
  c.rope.scaling.factor = get_double(s, "factor", src, 1.0);
  ST_CHECK(c.rope.scaling.factor >= 1, src, ": `", where, ".factor` must be >= 1, found ", c.rope.scaling.factor);
}

// Gemma 3's text model as transformers reads it: (1 + weight) norms before and after each
// sublayer, QK-norm per head, GeGLU (gelu_pytorch_tanh), embeddings x sqrt(hidden_size), the
// softmax scale query_pre_attn_scalar^-0.5, sliding layers from layer_types (or every layer
// but each sliding_window_pattern-th) with rope_local_base_freq as their unscaled rope base,
// global layers rope_theta with rope_scaling (default or linear). transformers 5 keys the rope
// by layer type in rope_parameters. Soft-capping (Gemma 2's) is refused.
// What Gemma 2 and Gemma 3 share: (1 + weight) norms before and after each sublayer, GeGLU
// (gelu_pytorch_tanh), embeddings x sqrt(hidden_size), the softmax scale
// query_pre_attn_scalar^-0.5, causal attention, no biases.
void parse_gemma_common(const json& j, const std::string& model_type, const std::string& src, LlamaConfig& c) {
  if (const json* act = find(j, "hidden_activation"))
    ST_CHECK(*act == "gelu_pytorch_tanh", src, ": `hidden_activation` = ", act->dump(), " is not supported for ",
             model_type, "; expected \"gelu_pytorch_tanh\"");
  ST_CHECK(!get_bool(j, "use_bidirectional_attention", src, false), src,
           ": `use_bidirectional_attention` = true is not supported; shardtrain trains causal models");
  ST_CHECK(!c.attention_bias, src, ": `attention_bias` = true is not supported for ", model_type,
           " (its o_proj bias has no place in shardtrain's block); Gemma has none");
  c.sandwich_norms = true;
  c.norm_weight_offset = 1.0;
  c.mlp_activation = ops::GluActivation::kGeluTanh;
  c.scale_embeddings = true;
  const double scalar = get_double(j, "query_pre_attn_scalar", src, 256.0);
  ST_CHECK(scalar > 0, src, ": `query_pre_attn_scalar` must be > 0, found ", scalar);
  c.attention_multiplier = 1.0 / std::sqrt(scalar);
}

// A soft-capping key: its value, `fallback` when absent (transformers' default), 0 when null.
double softcap_key(const json& j, const char* key, const std::string& src, double fallback) {
  if (find(j, key) == nullptr) return j.contains(key) ? 0.0 : fallback;  // null: none
  const double v = get_double(j, key, src, fallback);
  ST_CHECK(v > 0, src, ": `", key, "` must be > 0 (or null for none), found ", v);
  return v;
}

// The sliding layers from layer_types or, without it, every layer i with (i + 1) % pattern != 0
// (Gemma 3's sliding_window_pattern, default 6; Gemma 2's even layers: pattern 2), and the window.
void parse_gemma_sliding(const json& j, const std::string& src, int64_t default_pattern, LlamaConfig& c) {
  c.sliding_layers = parse_layer_types(j, c.n_layers, src);
  if (c.sliding_layers.empty()) {
    const int64_t pattern = get_int(j, "sliding_window_pattern", src, &default_pattern);
    ST_CHECK(pattern >= 1, src, ": `sliding_window_pattern` must be >= 1, found ", pattern);
    for (int64_t l = 0; l < c.n_layers; ++l) c.sliding_layers.push_back((l + 1) % pattern != 0);
  }
  bool any_sliding = false;
  for (bool s : c.sliding_layers) any_sliding = any_sliding || s;
  if (!any_sliding) {
    c.sliding_layers.clear();
    return;
  }
  ST_CHECK(find(j, "sliding_window") != nullptr || !j.contains("sliding_window"), src,
           ": `sliding_window` is null but layers slide (`layer_types` / `sliding_window_pattern`); give its size");
  c.sliding_window = window_size(j, src);
}

// Gemma 2 as transformers reads it: Gemma's common features (parse_gemma_common), attention
// scores and logits soft-capped (attn_logit_softcapping 50, final_logit_softcapping 30 by
// default; null: none), one rope for every layer, every even layer sliding (layer_types where
// given).
void parse_gemma2(const json& j, const std::string& src, LlamaConfig& c) {
  parse_gemma_common(j, "gemma2", src, c);
  c.attn_logit_softcapping = softcap_key(j, "attn_logit_softcapping", src, 50.0);
  c.final_logit_softcapping = softcap_key(j, "final_logit_softcapping", src, 30.0);
  parse_rope(j, src, c, 10000.0);
  parse_gemma_sliding(j, src, 2, c);
}

void parse_gemma3(const json& j, const std::string& src, LlamaConfig& c) {
  parse_gemma_common(j, "gemma3_text", src, c);
  ST_CHECK(find(j, "attn_logit_softcapping") == nullptr, src, ": `attn_logit_softcapping` = ",
           j["attn_logit_softcapping"].dump(), " is not supported for gemma3_text: transformers' Gemma 3 attention "
           "does not apply it; Gemma 3 leaves it null");
  c.final_logit_softcapping = softcap_key(j, "final_logit_softcapping", src, 0.0);
  c.qk_norm = true;
  // the rope: global layers' (rope_theta, rope_scaling) and the sliding layers' base; in
  // rope_parameters an entry's own rope_theta, else the top-level key, else transformers' default
  c.rope.theta = get_double(j, "rope_theta", src, 1000000.0);
  c.rope_local_theta = get_double(j, "rope_local_base_freq", src, 10000.0);
  if (const json* params = find(j, "rope_parameters")) {
    ST_CHECK(params->is_object(), src, ": `rope_parameters` must be an object, found ", params->dump());
    const json* full = find(*params, kFullLayer);
    const json* sliding = find(*params, kSlidingLayer);
    if (full == nullptr && sliding == nullptr) full = params;  // one entry for every layer
    if (full != nullptr) {
      c.rope.theta = get_double(*full, "rope_theta", src, c.rope.theta);
      parse_gemma3_scaling(*full, "rope_parameters.full_attention", src, c);
    }
    if (sliding != nullptr) {
      c.rope_local_theta = get_double(*sliding, "rope_theta", src, c.rope_local_theta);
      std::string type = "default";
      if (const json* t = find(*sliding, "rope_type")) type = t->get<std::string>();
      ST_CHECK(type == "default", src, ": `rope_parameters.sliding_attention.rope_type` = \"", type,
               "\" is not supported; Gemma 3's sliding layers use the default rope");
    }
  } else if (const json* s = find(j, "rope_scaling")) {
    parse_gemma3_scaling(*s, "rope_scaling", src, c);
  }
  ST_CHECK(c.rope_local_theta > 0, src, ": the sliding layers' rope base (`rope_local_base_freq`) must be > 0, "
           "found ", c.rope_local_theta);
  parse_gemma_sliding(j, src, 6, c);
}

// Whether every layer but each p-th slides, for some p >= 2 (transformers 4's
// sliding_window_pattern): p, or 0 when no pattern gives the layers.
int64_t sliding_pattern(const LlamaConfig& c) {
  for (int64_t p = 2; p <= c.n_layers + 1; ++p) {
    bool match = true;
    for (int64_t l = 0; l < c.n_layers && match; ++l) match = (c.window_of(l) > 0) == ((l + 1) % p != 0);
    if (match) return p;
  }
  return 0;
}

// The fields every family's config.json writes alike: the architecture and model_type, and the
// shape (vocabulary, width, FFN, layers, heads, context, norm epsilon).
json config_shape(const LlamaConfig& c, const char* architecture, const char* model_type) {
  json j;
  j["architectures"] = {architecture};
  j["model_type"] = model_type;
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = c.dim;
  j["intermediate_size"] = c.ffn_dim;
  j["num_hidden_layers"] = c.n_layers;
  j["num_attention_heads"] = c.n_heads;
  j["num_key_value_heads"] = c.n_kv_heads;
  j["max_position_embeddings"] = c.max_seq_len;
  j["rms_norm_eps"] = c.norm_eps;
  return j;
}

// Gemma 3's text config.json (gemma3_text, Gemma3ForCausalLM) or, without QK-norm, Gemma 2's
// (gemma2, Gemma2ForCausalLM): the keys transformers 4 reads (rope_theta, rope_scaling and
// rope_local_base_freq, sliding_window_pattern when one fits; Gemma 2's soft-capping) and
// layer_types, which transformers 4.53 and later read in its place.
json to_gemma_config(const LlamaConfig& c, const std::string& torch_dtype) {
  const bool gemma3 = c.qk_norm;
  json j = config_shape(c, gemma3 ? "Gemma3ForCausalLM" : "Gemma2ForCausalLM", gemma3 ? "gemma3_text" : "gemma2");
  j["head_dim"] = c.head_dim();
  j["hidden_activation"] = "gelu_pytorch_tanh";
  j["tie_word_embeddings"] = c.tie_embeddings;
  j["attention_bias"] = false;
  j["attention_dropout"] = 0.0;
  j["initializer_range"] = c.init_std;
  // the softmax scale as transformers takes it: query_pre_attn_scalar^-0.5 (an integer where
  // it is one, as Gemma 3's 256)
  const double scalar = 1.0 / (c.attention_scale() * c.attention_scale());
  const double whole = std::round(scalar);
  if (std::fabs(scalar - whole) <= 1e-9 * whole) {
    j["query_pre_attn_scalar"] = static_cast<int64_t>(whole);
  } else {
    j["query_pre_attn_scalar"] = scalar;
  }
  j["rope_theta"] = c.rope.theta;
  if (gemma3) {
    if (c.rope.scaling.type == ops::RopeScalingType::kLinear) {
      j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", c.rope.scaling.factor}};
    } else {
      j["rope_scaling"] = nullptr;
    }
    j["rope_local_base_freq"] = c.rope_local_theta > 0 ? c.rope_local_theta : c.rope.theta;
  }
  j["sliding_window"] = c.sliding_window > 0 ? c.sliding_window : kDefaultSlidingWindow;
  json types = json::array();
  for (int64_t l = 0; l < c.n_layers; ++l) types.push_back(c.window_of(l) > 0 ? kSlidingLayer : kFullLayer);
  j["layer_types"] = types;
  if (const int64_t p = sliding_pattern(c); p > 0 && gemma3) j["sliding_window_pattern"] = p;
  auto cap = [](double v) { return v > 0 ? json(v) : json(nullptr); };
  j["attn_logit_softcapping"] = cap(c.attn_logit_softcapping);
  j["final_logit_softcapping"] = cap(c.final_logit_softcapping);
  j["torch_dtype"] = torch_dtype;
  return j;
}

// The rope_scaling entry transformers 4 reads (null: none): llama3's, linear's or LongRoPE's.
// LongRoPE's holds just its type and factors, as Phi3Config validates it, unless the attention
// factor differs from the one derived from max_position_embeddings (then it is written too).
json rope_scaling_json(const LlamaConfig& c) {
  const ops::RopeScaling& s = c.rope.scaling;
  if (s.type == ops::RopeScalingType::kLlama3)
    return {{"rope_type", "llama3"},
            {"factor", s.factor},
            {"low_freq_factor", s.low_freq_factor},
            {"high_freq_factor", s.high_freq_factor},
            {"original_max_position_embeddings", s.original_max_positions}};
  if (s.type == ops::RopeScalingType::kLinear) return {{"rope_type", "linear"}, {"factor", s.factor}};
  if (s.type != ops::RopeScalingType::kLongRope) return nullptr;
  json r = {{"type", "longrope"}, {"short_factor", s.short_factor}, {"long_factor", s.long_factor}};
  const double factor = static_cast<double>(c.max_seq_len) / static_cast<double>(s.original_max_positions);
  const double derived =
      factor <= 1.0 ? 1.0 : std::sqrt(1.0 + std::log(factor) / std::log(static_cast<double>(s.original_max_positions)));
  if (s.attention_factor != derived) r["attention_factor"] = s.attention_factor;
  return r;
}

// Phi-3's config.json (phi3, Phi3ForCausalLM) in the form transformers 4 reads and 5 accepts:
// rope_theta, rope_scaling, original_max_position_embeddings (LongRoPE), partial_rotary_factor,
// sliding_window (every layer, or null) and its dropouts at 0.
json to_phi3_config(const LlamaConfig& c, const std::string& torch_dtype) {
  json j = config_shape(c, "Phi3ForCausalLM", "phi3");
  if (c.head_dim_decoupled()) j["head_dim"] = c.head_dim();
  if (c.rope.scaling.type == ops::RopeScalingType::kLongRope)
    j["original_max_position_embeddings"] = c.rope.scaling.original_max_positions;
  j["hidden_act"] = "silu";
  j["tie_word_embeddings"] = c.tie_embeddings;
  j["initializer_range"] = c.init_std;
  j["rope_theta"] = c.rope.theta;
  j["rope_scaling"] = rope_scaling_json(c);
  j["partial_rotary_factor"] = c.rope.partial_rotary;
  j["sliding_window"] = c.sliding_window > 0 ? json(c.sliding_window) : json(nullptr);
  j["resid_pdrop"] = 0.0;
  j["embd_pdrop"] = 0.0;
  j["attention_dropout"] = 0.0;
  j["torch_dtype"] = torch_dtype;
  return j;
}

}  // namespace

void check_hf_family(const LlamaConfig& c, const std::string& what) {
  const bool olmo2 = c.post_norms || c.qk_norm_whole;
  const bool smollm3 = c.nope_layer_count() > 0;
  const bool gemma = c.gemma_features();
  // Gemma 3 has QK-norm and Gemma a softmax scale of its own (query_pre_attn_scalar)
  const bool granite = gemma ? c.embedding_multiplier != 1.0 || c.residual_multiplier != 1.0 ||
                                   c.logits_scaling != 1.0
                             : c.granite_scaled();
  const bool qwen3 = c.qk_norm && !gemma;
  const bool phi3 = c.phi3_features();
  std::string features;
  for (const auto& [has, name] :
       {std::pair{olmo2, "OLMo 2's norms"}, std::pair{smollm3, "SmolLM3's NoPE layers"},
        std::pair{granite, "Granite's scalings"}, std::pair{qwen3, "Qwen3's QK-norm"},
        std::pair{gemma, "Gemma's norms, GeGLU, scaled embeddings, sliding layers' rope or soft-capping"},
        std::pair{phi3, "Phi-3's fused projections, LongRoPE or partial rotary"}})
    if (has) features += (features.empty() ? "" : ", ") + std::string(name);
  ST_CHECK(int(olmo2) + int(smollm3) + int(granite) + int(qwen3) + int(gemma) + int(phi3) <= 1, what,
           ": the model combines features of several Hugging Face families (", features,
           "), which no single transformers model type has; keep one family's features");
  if (olmo2) {
    ST_CHECK(c.post_norms && c.qk_norm_whole, what,
             ": OLMo 2 has both norms after each sublayer (post_norms) and "
             "QK-norm over the whole q and k (qk_norm_whole), found post_norms = ",
             c.post_norms, ", qk_norm_whole = ", c.qk_norm_whole, "; set both (olmo2) or neither");
    ST_CHECK(c.sliding_window == 0, what, ": olmo2 has no sliding window");
  }
  if (phi3)
    ST_CHECK(!c.attention_bias && (c.sliding_layer_count() == 0 || c.sliding_layer_count() == c.n_layers), what,
             ": phi3 (fused projections, LongRoPE, a partial rotary) has no q/k/v biases and slides every layer or ",
             "none, found attention_bias = ", c.attention_bias, " and ", c.sliding_layer_count(), " of ", c.n_layers,
             " layers sliding");
  if (phi3)
    ST_CHECK(c.rope.scaling.type == ops::RopeScalingType::kNone ||
                 c.rope.scaling.type == ops::RopeScalingType::kLongRope,
             what, ": phi3 (fused projections, LongRoPE, a partial rotary) takes LongRoPE or no rope scaling, not ",
             c.rope.scaling.type == ops::RopeScalingType::kLlama3 ? "llama3" : "linear");
  if (smollm3)
    ST_CHECK(!c.attention_bias && c.sliding_window == 0, what, ": smollm3 (NoPE layers) has no q/k/v biases and no ",
             "sliding window here");
  if (granite)
    ST_CHECK(c.sliding_window == 0 && !c.head_dim_decoupled(), what, ": granite (scaled embeddings, residuals, ",
             "attention and logits) has no sliding window and heads of hidden_size / num_attention_heads");
  if (gemma) {
    ST_CHECK(c.norm_weight_offset == 1.0 && c.sandwich_norms && c.mlp_activation == ops::GluActivation::kGeluTanh &&
                 c.scale_embeddings,
             what, ": Gemma (gemma3_text with per-head QK-norm, gemma2 without) has all of (1 + weight) norms "
             "(norm_weight_offset = 1, found ", c.norm_weight_offset, "), norms before and after each sublayer "
             "(sandwich_norms = ", c.sandwich_norms, "), GeGLU (mlp_activation = gelu_tanh: ",
             c.mlp_activation == ops::GluActivation::kGeluTanh, ") and embeddings x sqrt(dim) (scale_embeddings = ",
             c.scale_embeddings, "); set all of them or none");
    ST_CHECK(!c.attention_bias, what, ": Gemma has no q/k/v biases here");
  }
  if (gemma && !c.qk_norm) {  // Gemma 2
    ST_CHECK(c.rope_local_theta == 0 || c.rope_local_theta == c.rope.theta || c.sliding_layer_count() == 0, what,
             ": gemma2 has one rope for every layer; a sliding layers' rope of its own (rope_local_theta = ",
             c.rope_local_theta, ") needs Gemma 3's QK-norm (gemma3_text)");
    ST_CHECK(c.rope.scaling.type == ops::RopeScalingType::kNone, what, ": gemma2 has no rope scaling");
  }
  if (gemma && c.qk_norm) {  // Gemma 3
    ST_CHECK(c.attn_logit_softcapping == 0, what, ": gemma3_text does not soft-cap its attention scores ",
             "(transformers' Gemma 3 ignores attn_logit_softcapping); Gemma 2's soft-capping goes without QK-norm");
    ST_CHECK(c.rope_local_theta > 0 || c.sliding_layer_count() == 0 ||
                 c.rope.scaling.type == ops::RopeScalingType::kNone,
             what, ": gemma3_text's sliding layers never scale their rope; with rope scaling give them a base of ",
             "their own (rope_local_theta)");
    ST_CHECK(c.rope.scaling.type != ops::RopeScalingType::kLlama3, what,
             ": gemma3_text takes default or linear rope scaling, not llama3");
  }
}

LlamaConfig parse_hf_config(const json& j, const std::string& src) {
  ST_CHECK(j.is_object(), src, ": expected a JSON object");
  const json* mt = find(j, "model_type");
  ST_CHECK(mt && mt->is_string(), src, ": `model_type` is missing");
  const std::string model_type = mt->get<std::string>();
  check_model_type(model_type, src);
  const bool gemma3 = model_type == "gemma3_text", gemma2 = model_type == "gemma2";
  // Gemma reads hidden_activation (parse_gemma_common), not hidden_act
  if (const json* act = find(j, "hidden_act"); act != nullptr && !gemma3 && !gemma2)
    ST_CHECK(*act == "silu", src, ": `hidden_act` = ", act->dump(), " is not supported; expected \"silu\"");
  ST_CHECK(!get_bool(j, "mlp_bias", src, false), src, ": `mlp_bias` = true is not supported");
  const int64_t one = 1;
  // llama-style models once sliced their products by it; smollm3's, granite's and olmo2's
  // modeling never reads it (SmolLM3-3B's config.json has 2)
  if (model_type != "smollm3" && model_type != "granite" && model_type != "olmo2")
    ST_CHECK(get_int(j, "pretraining_tp", src, &one) == 1, src, ": `pretraining_tp` other than 1 is not supported");

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
  const int64_t gemma3_positions = 131072, gemma2_positions = 8192;  // transformers' defaults
  c.max_seq_len = get_int(j, "max_position_embeddings", src,
                          gemma3 ? &gemma3_positions : gemma2 ? &gemma2_positions : nullptr);
  c.norm_eps = get_double(j, "rms_norm_eps", src, 1e-6);
  // transformers' default: tied for smollm3, untied for the others
  c.tie_embeddings = get_bool(j, "tie_word_embeddings", src, model_type == "smollm3" || gemma3 || gemma2);
  // qwen2 always has q/k/v biases, phi3 never (its config's attention_bias, if any, is unused)
  c.attention_bias = model_type == "qwen2"  ? true
                     : model_type == "phi3" ? false
                                            : get_bool(j, "attention_bias", src, false);
  c.qk_norm = model_type == "qwen3";  // Qwen3's q_norm / k_norm
  // OLMo 2's q_norm / k_norm over the whole projections, and its norms after each sublayer
  c.qk_norm_whole = c.post_norms = model_type == "olmo2";
  if (model_type == "smollm3") parse_smollm3(j, src, c);
  if (model_type == "granite") parse_granite(j, src, c);
  if (model_type == "phi3") parse_phi3(j, src, c);
  if (model_type == "smollm3")
    ST_CHECK(!c.attention_bias, src,
             ": `attention_bias` = true is not supported for smollm3; SmolLM3's "
             "projections have no biases");
  c.init_std = get_double(j, "initializer_range", src, 0.02);
  if (gemma3) {
    parse_gemma3(j, src, c);
  } else if (gemma2) {
    parse_gemma2(j, src, c);
  } else {
    parse_rope(j, src, c, model_type == "smollm3" ? 2000000.0 : 10000.0);
    parse_sliding_window(j, model_type, src, c);
  }
  // transformers 4 and 5 both write head_dim at the top (null or absent: hidden_size /
  // num_attention_heads); a value of its own sets the projections' widths (Mistral-Nemo)
  if (find(j, "head_dim") != nullptr) {
    c.head_dim_override = get_int(j, "head_dim", src);
    ST_CHECK(c.head_dim_override > 0, src, ": `head_dim` must be > 0, found ", c.head_dim_override);
  } else if (gemma3 || model_type == "gemma2") {
    c.head_dim_override = 256;  // transformers' Gemma 2 and 3 default, whatever hidden_size is
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
  check_hf_family(c, "writing a Hugging Face config.json");
  if (c.gemma_features()) return to_gemma_config(c, torch_dtype);
  if (c.phi3_features()) return to_phi3_config(c, torch_dtype);
  // OLMo 2's norms: olmo2; NoPE layers: smollm3; Granite's scalings: granite; QK-norm: Qwen3
  // (with or without q/k/v biases); biases alone: Qwen2; else Llama
  const bool olmo2 = c.post_norms, smollm3 = c.nope_layer_count() > 0, granite = c.granite_scaled();
  const bool own_family = olmo2 || smollm3 || granite;
  const char* family = olmo2              ? "olmo2"
                       : smollm3          ? "smollm3"
                       : granite          ? "granite"
                       : c.qk_norm        ? "qwen3"
                       : c.attention_bias ? "qwen2"
                                          : "llama";
  const char* architecture = olmo2              ? "Olmo2ForCausalLM"
                             : smollm3          ? "SmolLM3ForCausalLM"
                             : granite          ? "GraniteForCausalLM"
                             : c.qk_norm        ? "Qwen3ForCausalLM"
                             : c.attention_bias ? "Qwen2ForCausalLM"
                                                : "LlamaForCausalLM";
  json j = config_shape(c, architecture, family);
  j["head_dim"] = c.head_dim();  // always written: transformers' default is hidden_size / heads
  j["hidden_act"] = "silu";
  j["tie_word_embeddings"] = c.tie_embeddings;
  if (own_family) {
    j["attention_bias"] = c.attention_bias;
    j["mlp_bias"] = false;
  } else if (!c.qk_norm && !c.attention_bias) {
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
  j["rope_scaling"] = rope_scaling_json(c);
  if (smollm3) {
    json list = json::array();  // 1: the layer uses rope, 0: a NoPE layer
    for (int64_t l = 0; l < c.n_layers; ++l) list.push_back(c.uses_rope(l) ? 1 : 0);
    j["no_rope_layers"] = list;
    j["use_sliding_window"] = false;
    j["sliding_window"] = nullptr;
  }
  if (granite) {  // floats: transformers 5's GraniteConfig checks their type
    j["embedding_multiplier"] = c.embedding_multiplier;
    j["residual_multiplier"] = c.residual_multiplier;
    j["attention_multiplier"] = c.attention_scale();
    j["logits_scaling"] = c.logits_scaling;
  }
  j["torch_dtype"] = torch_dtype;
  j["attention_dropout"] = 0.0;
  write_sliding_window(c, j);
  return j;
}

std::vector<FusedTensor> hf_fused_tensors(const LlamaConfig& c) {
  std::vector<FusedTensor> out;
  if (!c.phi3_features()) return out;
  // each part's rows: q's, k's, v's, gate's or up's in the layout (the whole parameter)
  auto part_rows = [&](BlockParam p) {
    switch (p) {
      case BlockParam::kQ: return c.q_dim();
      case BlockParam::kK:
      case BlockParam::kV: return c.kv_dim();
      case BlockParam::kGate:
      case BlockParam::kUp: return c.ffn_dim;
      default: ST_THROW("a fused tensor holds q, k, v, gate or up, not ", block_param_suffix(p));
    }
  };
  for (int64_t l = 0; l < c.n_layers; ++l)
    for (const FusedBlockParam& fused : phi3_fused_params()) {
      FusedTensor f;
      f.name = block_tensor_name(l, fused.suffix);
      int64_t rows = 0;
      for (const BlockParam part : fused.parts) {
        const int64_t n = part_rows(part);
        f.parts.push_back(block_param_name(l, part));
        f.part_shapes.push_back({n, c.dim});
        f.offsets.push_back(rows * c.dim);
        rows += n;
      }
      f.shape = {rows, c.dim};
      out.push_back(std::move(f));
    }
  return out;
}

}  // namespace shardtrain::model
