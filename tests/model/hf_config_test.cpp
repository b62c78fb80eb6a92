// Reading HF config.json: a head dimension of its own (Mistral-Nemo's head_dim 128 beside
// hidden_size 5120 and 32 heads) in the transformers 4 and 5 forms, its checks, its way back
// out through to_hf_config, and the errors for families shardtrain does not train. Qwen3
// (QK-norm, heads of 128 in a width of 1024) both ways. Sliding windows as mistral, ministral,
// qwen2 and qwen3 write them (transformers 4 and 5), their errors, and their way back out.
// SmolLM3 (NoPE layers), Granite (its four scalings) and OLMo 2 (norms after each sublayer,
// QK-norm over the whole q and k) both ways, and models that mix families refused. Gemma 3's
// text models (gemma3_text) in both forms, with linear rope scaling, their refusals and export.
// Phi-3 (phi3: LongRoPE, a partial rotary, a sliding window, its fused tensors) in both forms,
// its refusals and export.
#include "model/hf_config.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/error.h"
#include "model/layout.h"
#include "testing/shared_data.h"

namespace shardtrain::model {
namespace {

using nlohmann::json;

// mistralai/Mistral-Nemo-Base-2407's config.json as published (transformers 4 form).
json mistral_nemo() {
  return json::parse(R"({
  "architectures": ["MistralForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1, "eos_token_id": 2,
  "head_dim": 128, "hidden_act": "silu", "hidden_size": 5120, "initializer_range": 0.02,
  "intermediate_size": 14336, "max_position_embeddings": 1024000, "model_type": "mistral",
  "num_attention_heads": 32, "num_hidden_layers": 40, "num_key_value_heads": 8, "rms_norm_eps": 1e-05,
  "rope_theta": 1000000.0, "sliding_window": null, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "transformers_version": "4.43.0.dev0", "use_cache": true, "vocab_size": 131072})");
}

// Qwen/Qwen3-0.6B's config.json as published (transformers 4 form).
json qwen3_0_6b() {
  return json::parse(R"({
  "architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu", "hidden_size": 1024,
  "initializer_range": 0.02, "intermediate_size": 3072, "max_position_embeddings": 40960, "max_window_layers": 28,
  "model_type": "qwen3", "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8,
  "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000, "sliding_window": null,
  "tie_word_embeddings": true, "torch_dtype": "bfloat16", "transformers_version": "4.51.0", "use_cache": true,
  "use_sliding_window": false, "vocab_size": 151936})");
}

// The same in the form transformers 5 writes: rope_parameters, layer_types, dtype.
json qwen3_0_6b_five() {
  json j = qwen3_0_6b();
  j.erase("rope_theta");
  j.erase("rope_scaling");
  j.erase("torch_dtype");
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1000000}};
  j["layer_types"] = json::array();
  for (int i = 0; i < 28; ++i) j["layer_types"].push_back("full_attention");
  j["dtype"] = "bfloat16";
  j["transformers_version"] = "5.0.0";
  return j;
}

std::string error_of(const json& j) {
  try {
    (void)parse_hf_config(j, "m/config.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(HfConfig, MistralNemoHeadDimIsItsOwn) {
  const LlamaConfig c = parse_hf_config(mistral_nemo(), "nemo/config.json");
  EXPECT_EQ(c.dim, 5120);
  EXPECT_EQ(c.head_dim(), 128);
  EXPECT_EQ(c.q_dim(), 4096);
  EXPECT_EQ(c.kv_dim(), 1024);
  EXPECT_TRUE(c.head_dim_decoupled());
  EXPECT_EQ(c.rope.theta, 1e6);
  // the published count: q [4096, 5120], k and v [1024, 5120], o [5120, 4096] in each of 40 blocks
  EXPECT_EQ(c.num_parameters(), 12'247'782'400);
  // 6 N + 12 L (N·H) T: the attention term over the 4096-wide attention, not the 5120-wide stream
  EXPECT_DOUBLE_EQ(c.flops_per_token(1024), 6.0 * (12'247'782'400 - 131072.0 * 5120) + 12.0 * 40 * 4096 * 1024);
  EXPECT_NE(c.summary().find("32 heads / 8 kv heads (head dim 128, decoupled: attention width 32 x 128 = 4096)"),
            std::string::npos)
      << c.summary();
}

TEST(HfConfig, TransformersFiveFormGivesTheSameModel) {
  json j = mistral_nemo();
  j.erase("rope_theta");
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1000000.0}};
  j["transformers_version"] = "5.0.0";
  j["dtype"] = "bfloat16";
  j.erase("torch_dtype");
  const LlamaConfig five = parse_hf_config(j, "five/config.json");
  const LlamaConfig four = parse_hf_config(mistral_nemo(), "four/config.json");
  EXPECT_EQ(five.head_dim(), 128);
  EXPECT_EQ(to_hf_config(five, "bfloat16"), to_hf_config(four, "bfloat16"));
}

TEST(HfConfig, AbsentOrNullHeadDimIsTheWidthOverTheHeads) {
  for (const bool null : {false, true}) {
    json j = mistral_nemo();
    if (null) {
      j["head_dim"] = nullptr;
    } else {
      j.erase("head_dim");
    }
    const LlamaConfig c = parse_hf_config(j, "m/config.json");
    EXPECT_EQ(c.head_dim(), 160) << (null ? "null" : "absent");
    EXPECT_FALSE(c.head_dim_decoupled());
    EXPECT_EQ(c.summary().find("decoupled"), std::string::npos) << c.summary();
  }
}

TEST(HfConfig, WrittenHeadDimReadsBack) {
  const LlamaConfig c = parse_hf_config(mistral_nemo(), "nemo/config.json");
  const json out = to_hf_config(c, "bfloat16");
  EXPECT_EQ(out.at("head_dim"), 128);
  const LlamaConfig back = parse_hf_config(out, "exported/config.json");
  EXPECT_EQ(back.head_dim(), 128);
  EXPECT_EQ(back.summary(), c.summary());
  EXPECT_EQ(to_hf_config(back, "bfloat16"), out);
}

// A small config of `model_type` with 4 layers and the keys in `extra`.
json small(const std::string& model_type, const json& extra) {
  json j = {{"model_type", model_type}, {"hidden_act", "silu"}, {"vocab_size", 67}, {"hidden_size", 24},
            {"intermediate_size", 40}, {"num_hidden_layers", 4}, {"num_attention_heads", 4},
            {"num_key_value_heads", 2}, {"max_position_embeddings", 64}, {"rms_norm_eps", 1e-5}};
  for (const auto& [k, v] : extra.items()) j[k] = v;
  return j;
}

std::vector<int64_t> windows(const LlamaConfig& c) {
  std::vector<int64_t> w;
  for (int64_t l = 0; l < c.n_layers; ++l) w.push_back(c.window_of(l));
  return w;
}

TEST(HfConfig, MistralSlidingWindowSlidesEveryLayer) {
  const LlamaConfig c = parse_hf_config(small("mistral", {{"sliding_window", 16}}), "m/config.json");
  EXPECT_EQ(windows(c), (std::vector<int64_t>{16, 16, 16, 16}));
  EXPECT_NE(c.summary().find(", sliding window 16 on 4 of 4 layers"), std::string::npos) << c.summary();
  // null: none; absent: transformers' default of 4096
  EXPECT_EQ(windows(parse_hf_config(small("mistral", {{"sliding_window", nullptr}}), "m/config.json")),
            (std::vector<int64_t>{0, 0, 0, 0}));
  EXPECT_EQ(windows(parse_hf_config(small("mistral", json::object()), "m/config.json")),
            (std::vector<int64_t>{4096, 4096, 4096, 4096}));
  // layer_types that agree are fine
  const json all = {"sliding_attention", "sliding_attention", "sliding_attention", "sliding_attention"};
  EXPECT_EQ(windows(parse_hf_config(small("mistral", {{"sliding_window", 16}, {"layer_types", all}}), "m/c.json")),
            windows(c));
  // llama has no sliding window: its keys change nothing
  EXPECT_EQ(parse_hf_config(small("llama", {{"sliding_window", 16}}), "m/config.json").sliding_window, 0);
}

TEST(HfConfig, Qwen2SlidingLayersFromMaxWindowLayersOrLayerTypes) {
  // transformers 4: layers i >= max_window_layers slide, only with use_sliding_window
  LlamaConfig c = parse_hf_config(
      small("qwen2", {{"use_sliding_window", true}, {"sliding_window", 8}, {"max_window_layers", 1}}), "q/config.json");
  EXPECT_EQ(windows(c), (std::vector<int64_t>{0, 8, 8, 8}));
  c = parse_hf_config(small("qwen2", {{"use_sliding_window", false}, {"sliding_window", 8}, {"max_window_layers", 1}}),
                      "q/config.json");
  EXPECT_EQ(c.sliding_window, 0) << "use_sliding_window false: no window whatever sliding_window says";
  c = parse_hf_config(small("qwen2", {{"use_sliding_window", true}, {"sliding_window", 8}}), "q/config.json");
  EXPECT_EQ(windows(c), (std::vector<int64_t>{0, 0, 0, 0})) << "transformers' max_window_layers default is 28";
  // transformers 5: layer_types decides, whatever max_window_layers says
  const json types = {"full_attention", "sliding_attention", "full_attention", "sliding_attention"};
  c = parse_hf_config(small("qwen2", {{"use_sliding_window", true}, {"sliding_window", 8}, {"max_window_layers", 0},
                                      {"layer_types", types}}),
                      "q/config.json");
  EXPECT_EQ(windows(c), (std::vector<int64_t>{0, 8, 0, 8}));
  EXPECT_NE(c.summary().find(", sliding window 8 on 2 of 4 layers"), std::string::npos) << c.summary();
}

TEST(HfConfig, MinistralLayerTypesAndPerTypeRope) {
  const json types = {"sliding_attention", "full_attention", "sliding_attention", "full_attention"};
  const json rope = {{"rope_type", "default"}, {"rope_theta", 50000.0}};
  LlamaConfig c = parse_hf_config(
      small("ministral", {{"sliding_window", 6},
                          {"layer_types", types},
                          {"rope_parameters", {{"full_attention", rope}, {"sliding_attention", rope}}}}),
      "n/config.json");
  EXPECT_EQ(windows(c), (std::vector<int64_t>{6, 0, 6, 0}));
  EXPECT_EQ(c.rope.theta, 50000.0);
  EXPECT_FALSE(c.attention_bias);
  c = parse_hf_config(small("ministral", {{"sliding_window", 6}}), "n/config.json");
  EXPECT_EQ(windows(c), (std::vector<int64_t>{6, 6, 6, 6})) << "no layer_types: every layer slides";
  json other = rope;
  other["rope_theta"] = 10000.0;
  const json differing = {{"full_attention", rope}, {"sliding_attention", other}};
  EXPECT_NE(error_of(small("ministral", {{"sliding_window", 6}, {"rope_parameters", differing}}))
                .find("m/config.json: `rope_parameters` differ between \"full_attention\""),
            std::string::npos);
}

TEST(HfConfig, BadSlidingWindowsNameTheFileKeyIndexAndValue) {
  const json four = {"full_attention", "sliding_attention", "full_attention", "sliding_attention"};
  const json q = {{"use_sliding_window", true}, {"sliding_window", 8}};
  auto with = [&](const json& extra) {
    json j = small("qwen2", q);
    for (const auto& [k, v] : extra.items()) j[k] = v;
    return error_of(j);
  };
  const json unknown = {"full_attention", "sliding_attention", "chunked_attention", "full_attention"};
  std::string e = with({{"layer_types", unknown}});
  EXPECT_NE(e.find("m/config.json: `layer_types[2]` = \"chunked_attention\" is not supported; shardtrain knows "
                   "\"sliding_attention\" and \"full_attention\""),
            std::string::npos)
      << e;
  e = with({{"layer_types", {"full_attention", "sliding_attention"}}});
  EXPECT_NE(e.find("m/config.json: `layer_types` lists 2 layers but `num_hidden_layers` = 4"), std::string::npos)
      << e;
  e = with({{"layer_types", {{"0", "sliding_attention"}, {"1", "full_attention"}, {"2", "x"}, {"3", "y"}}}});
  EXPECT_NE(e.find("m/config.json: `layer_types` must be a list"), std::string::npos) << e;
  e = with({{"sliding_window", 0}});
  EXPECT_NE(e.find("m/config.json: `sliding_window` must be >= 1 keys (or null for none), found 0"), std::string::npos)
      << e;
  e = with({{"sliding_window", "8"}});
  EXPECT_NE(e.find("m/config.json: `sliding_window` must be an integer, found \"8\""), std::string::npos) << e;
  e = with({{"use_sliding_window", false}, {"layer_types", four}});
  EXPECT_NE(e.find("m/config.json: `layer_types[1]` = \"sliding_attention\" but `use_sliding_window` is false"),
            std::string::npos)
      << e;
  e = error_of(small("mistral", {{"sliding_window", 8}, {"layer_types", four}}));
  EXPECT_NE(e.find("m/config.json: `layer_types[0]` = \"full_attention\", but transformers' mistral slides every "
                   "layer"),
            std::string::npos)
      << e;
  e = error_of(small("mistral", {{"sliding_window", nullptr}, {"layer_types", four}}));
  EXPECT_NE(e.find("m/config.json: `layer_types[1]` = \"sliding_attention\" but `sliding_window` is null"),
            std::string::npos)
      << e;
}

// load -> export -> load keeps the window and its layers, in the form transformers reads for
// the model type: mistral's sliding_window; ministral's layer_types; qwen2's use_sliding_window,
// sliding_window, max_window_layers and layer_types.
TEST(HfConfig, SlidingWindowsSurviveExport) {
  const json alternating = {"sliding_attention", "full_attention", "sliding_attention", "full_attention"};
  const json cases[] = {
      small("mistral", {{"sliding_window", 16}}),
      small("ministral", {{"sliding_window", 6}, {"layer_types", alternating}}),
      small("qwen2", {{"use_sliding_window", true}, {"sliding_window", 8}, {"max_window_layers", 2}}),
      small("qwen2", {{"use_sliding_window", true}, {"sliding_window", 8}, {"layer_types", alternating}}),
      small("qwen2", {{"use_sliding_window", false}, {"sliding_window", 8}}),
  };
  for (const json& in : cases) {
    SCOPED_TRACE(in.dump());
    const LlamaConfig c = parse_hf_config(in, "in/config.json");
    const json out = to_hf_config(c, "float32");
    EXPECT_EQ(out.at("model_type"), in.at("model_type"));
    const LlamaConfig back = parse_hf_config(out, "out/config.json");
    EXPECT_EQ(windows(back), windows(c));
    EXPECT_EQ(back.summary(), c.summary());
    EXPECT_EQ(to_hf_config(back, "float32"), out);
  }
  const json mistral = to_hf_config(parse_hf_config(cases[0], "in/config.json"), "float32");
  EXPECT_EQ(mistral.at("architectures"), json({"MistralForCausalLM"}));
  EXPECT_EQ(mistral.at("sliding_window"), 16);
  EXPECT_FALSE(mistral.contains("layer_types")) << "transformers' mistral ignores them";
  EXPECT_FALSE(mistral.contains("attention_bias"));
  const json ministral = to_hf_config(parse_hf_config(cases[1], "in/config.json"), "float32");
  EXPECT_EQ(ministral.at("architectures"), json({"MinistralForCausalLM"}));
  EXPECT_EQ(ministral.at("layer_types"), alternating);
  const json qwen = to_hf_config(parse_hf_config(cases[2], "in/config.json"), "float32");
  EXPECT_EQ(qwen.at("use_sliding_window"), true);
  EXPECT_EQ(qwen.at("sliding_window"), 8);
  EXPECT_EQ(qwen.at("max_window_layers"), 2);
  EXPECT_EQ(qwen.at("layer_types"),
            json({"full_attention", "full_attention", "sliding_attention", "sliding_attention"}));
  const json no_window = to_hf_config(parse_hf_config(cases[4], "in/config.json"), "float32");
  EXPECT_EQ(no_window.at("use_sliding_window"), false);
  EXPECT_FALSE(no_window.contains("sliding_window"));
  // a llama-style model (no biases) whose window is on every layer exports as mistral
  LlamaConfig built = parse_hf_config(small("llama", json::object()), "in/config.json");
  built.sliding_window = 5;
  built.sliding_layers.assign(4, true);
  EXPECT_EQ(to_hf_config(built, "float32").at("model_type"), "mistral");
}

TEST(HfConfig, BadHeadDimsAreNamed) {
  json j = mistral_nemo();
  j["head_dim"] = 127;
  std::string e = error_of(j);
  EXPECT_NE(e.find("`head_dim` = 127 must be even for rotary embeddings"), std::string::npos) << e;
  EXPECT_NE(e.find("m/config.json"), std::string::npos) << e;
  j["head_dim"] = 0;
  e = error_of(j);
  EXPECT_NE(e.find("m/config.json: `head_dim` must be > 0, found 0"), std::string::npos) << e;
  j["head_dim"] = "128";
  e = error_of(j);
  EXPECT_NE(e.find("m/config.json: `head_dim` must be an integer, found \"128\""), std::string::npos) << e;
}

// HuggingFaceTB/SmolLM3-3B's config.json as published (transformers 4 form): a NoPE layer
// every fourth (no_rope_layers 1 = rope, 0 = none), tied embeddings.
json smollm3_3b() {
  json j = json::parse(R"({
  "architectures": ["SmolLM3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": null, "eos_token_id": 128012, "hidden_act": "silu", "hidden_size": 2048,
  "initializer_range": 0.02, "intermediate_size": 11008, "max_position_embeddings": 65536, "max_window_layers": 28,
  "mlp_bias": false, "model_type": "smollm3", "no_rope_layer_interval": 4, "num_attention_heads": 16,
  "num_hidden_layers": 36, "num_key_value_heads": 4, "pad_token_id": 128004, "pretraining_tp": 2,
  "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 5000000.0, "sliding_window": null,
  "tie_word_embeddings": true, "torch_dtype": "bfloat16", "transformers_version": "4.54.0.dev0", "use_cache": false,
  "use_sliding_window": false, "vocab_size": 128256})");
  j["no_rope_layers"] = json::array();
  for (int l = 0; l < 36; ++l) j["no_rope_layers"].push_back((l + 1) % 4 == 0 ? 0 : 1);
  return j;
}

// ibm-granite/granite-3.0-2b-base's config.json as published (transformers 4 form).
json granite_3_2b() {
  return json::parse(R"({
  "architectures": ["GraniteForCausalLM"], "attention_bias": false, "attention_dropout": 0.1,
  "attention_multiplier": 0.015625, "bos_token_id": 0, "embedding_multiplier": 12.0, "eos_token_id": 0,
  "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 8192,
  "logits_scaling": 8.0, "max_position_embeddings": 4096, "mlp_bias": false, "model_type": "granite",
  "num_attention_heads": 32, "num_hidden_layers": 40, "num_key_value_heads": 8, "pad_token_id": 0,
  "residual_multiplier": 0.22, "rms_norm_eps": 1e-05, "rope_scaling": null, "rope_theta": 10000.0,
  "tie_word_embeddings": true, "torch_dtype": "bfloat16", "transformers_version": "4.46.0.dev0", "use_cache": true,
  "vocab_size": 49155})");
}

// allenai/OLMo-2-0425-1B's config.json as published (transformers 4 form).
json olmo2_1b() {
  return json::parse(R"({
  "architectures": ["Olmo2ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0, "eos_token_id": 100257,
  "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 8192,
  "max_position_embeddings": 4096, "model_type": "olmo2", "num_attention_heads": 16, "num_hidden_layers": 16,
  "num_key_value_heads": 16, "pad_token_id": 100277, "rms_norm_eps": 1e-06, "rope_scaling": null,
  "rope_theta": 500000, "tie_word_embeddings": false, "torch_dtype": "float32", "transformers_version": "4.48.0",
  "use_cache": true, "vocab_size": 100352})");
}

// transformers 5's form of a transformers 4 config: rope_parameters in place of rope_theta and
// rope_scaling, dtype in place of torch_dtype.
json five_form(json j) {
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", j.at("rope_theta")}};
  j.erase("rope_theta");
  j.erase("rope_scaling");
  j["dtype"] = j.at("torch_dtype");
  j.erase("torch_dtype");
  j["transformers_version"] = "5.0.0";
  return j;
}

// Every key `published` has (but the token ids, which the tokenizer gives, use_cache, the
// version and those listed) has its published value in `out`.
void expect_published_keys(const json& out, const json& published, const std::vector<std::string>& skip = {}) {
  for (const auto& [key, value] : published.items()) {
    if (key == "bos_token_id" || key == "eos_token_id" || key == "pad_token_id" || key == "use_cache" ||
        key == "transformers_version" || std::find(skip.begin(), skip.end(), key) != skip.end())
      continue;
    ASSERT_TRUE(out.contains(key)) << key;
    EXPECT_EQ(out.at(key), value) << key;
  }
}

TEST(HfConfig, SmolLM3NoRopeLayersOneUsesRopeZeroDoesNot) {
  const LlamaConfig c = parse_hf_config(smollm3_3b(), "smollm3/config.json");
  EXPECT_EQ(c.nope_layer_count(), 9);
  EXPECT_TRUE(c.uses_rope(0));
  EXPECT_TRUE(c.uses_rope(2));
  EXPECT_FALSE(c.uses_rope(3));
  EXPECT_FALSE(c.uses_rope(35));
  EXPECT_TRUE(c.tie_embeddings);
  EXPECT_EQ(c.rope.theta, 5e6);
  EXPECT_EQ(c.sliding_window, 0);
  EXPECT_NE(c.summary().find("no rope on 9 of 36 layers"), std::string::npos) << c.summary();
  // 3,075,098,624: the model card's 3B
  EXPECT_EQ(c.num_parameters(), 3'075'098'624);
  // without the list, transformers builds it from no_rope_layer_interval (default 4); the
  // transformers 5 form (and its default rope theta) reads the same
  json j = smollm3_3b();
  j.erase("no_rope_layers");
  EXPECT_EQ(parse_hf_config(j, "m/config.json").summary(), c.summary());
  j["no_rope_layer_interval"] = 3;
  EXPECT_EQ(parse_hf_config(j, "m/config.json").nope_layer_count(), 12);
  j.erase("no_rope_layer_interval");
  j.erase("rope_theta");
  EXPECT_EQ(parse_hf_config(j, "m/config.json").rope.theta, 2e6) << "SmolLM3Config's default_theta";
  const LlamaConfig five = parse_hf_config(five_form(smollm3_3b()), "five/config.json");
  EXPECT_EQ(five.summary(), c.summary());
  EXPECT_EQ(to_hf_config(five, "bfloat16"), to_hf_config(c, "bfloat16"));
}

TEST(HfConfig, SmolLM3ExportsAsSmolLM3AndReadsBack) {
  const LlamaConfig c = parse_hf_config(smollm3_3b(), "smollm3/config.json");
  const json out = to_hf_config(c, "bfloat16");
  EXPECT_EQ(out.at("architectures"), json::array({"SmolLM3ForCausalLM"}));
  EXPECT_EQ(out.at("model_type"), "smollm3");
  expect_published_keys(out, smollm3_3b(), {"max_window_layers", "no_rope_layer_interval", "pretraining_tp"});
  const LlamaConfig back = parse_hf_config(out, "exported/config.json");
  EXPECT_EQ(back.nope_layers, c.nope_layers);
  EXPECT_EQ(to_hf_config(back, "bfloat16"), out);
  // every layer with rope: plain llama
  LlamaConfig all = c;
  all.nope_layers.assign(36, false);
  EXPECT_EQ(to_hf_config(all, "bfloat16").at("model_type"), "llama");
}

TEST(HfConfig, BadSmolLM3ConfigsNameTheKeyAndValue) {
  json j = smollm3_3b();
  j["no_rope_layers"][5] = 2;
  EXPECT_NE(error_of(j).find("m/config.json: `no_rope_layers[5]` = 2; expected 1 (the layer uses rope) or 0"),
            std::string::npos)
      << error_of(j);
  j["no_rope_layers"] = json::array({1, 0});
  EXPECT_NE(error_of(j).find("`no_rope_layers` must be a list of 0 / 1 with an entry for each of the 36 layers"),
            std::string::npos)
      << error_of(j);
  j = smollm3_3b();
  j["use_sliding_window"] = true;
  j["sliding_window"] = 4096;
  EXPECT_NE(error_of(j).find("a smollm3 sliding window"), std::string::npos) << error_of(j);
  j = smollm3_3b();
  j["attention_bias"] = true;
  EXPECT_NE(error_of(j).find("`attention_bias` = true is not supported for smollm3"), std::string::npos);
}

TEST(HfConfig, GraniteReadsItsFourScalings) {
  const LlamaConfig c = parse_hf_config(granite_3_2b(), "granite/config.json");
  EXPECT_EQ(c.embedding_multiplier, 12.0);
  EXPECT_EQ(c.residual_multiplier, 0.22);
  EXPECT_EQ(c.attention_multiplier, 0.015625);
  EXPECT_EQ(c.attention_scale(), 0.015625);  // not 1 / sqrt(64) = 0.125
  EXPECT_EQ(c.logits_scaling, 8.0);
  EXPECT_TRUE(c.granite_scaled());
  EXPECT_TRUE(c.tie_embeddings);
  EXPECT_NE(c.summary().find("scaled (embedding x12, residual x0.22, attention x0.015625, logits /8)"),
            std::string::npos)
      << c.summary();
  // 2,533,531,648: the model card's 2.5B
  EXPECT_EQ(c.num_parameters(), 2'533'531'648);
  const LlamaConfig five = parse_hf_config(five_form(granite_3_2b()), "five/config.json");
  EXPECT_EQ(to_hf_config(five, "bfloat16"), to_hf_config(c, "bfloat16"));
  // transformers' defaults are 1.0 each: attention_multiplier 1 is a scale of 1, not 1/sqrt(H)
  json j = granite_3_2b();
  for (const char* k : {"embedding_multiplier", "residual_multiplier", "attention_multiplier", "logits_scaling"})
    j.erase(k);
  const LlamaConfig d = parse_hf_config(j, "m/config.json");
  EXPECT_EQ(d.attention_scale(), 1.0);
  EXPECT_EQ(d.embedding_multiplier, 1.0);
  EXPECT_EQ(to_hf_config(d, "bfloat16").at("model_type"), "granite");
  j["logits_scaling"] = 0;
  EXPECT_NE(error_of(j).find("`logits_scaling` (0) must all be > 0"), std::string::npos) << error_of(j);
}

TEST(HfConfig, GraniteExportsAsGraniteWithFloatScalingsAndReadsBack) {
  json published = granite_3_2b();
  const LlamaConfig c = parse_hf_config(published, "granite/config.json");
  const json out = to_hf_config(c, "bfloat16");
  EXPECT_EQ(out.at("architectures"), json::array({"GraniteForCausalLM"}));
  EXPECT_EQ(out.at("model_type"), "granite");
  for (const char* k : {"embedding_multiplier", "residual_multiplier", "attention_multiplier", "logits_scaling"})
    EXPECT_TRUE(out.at(k).is_number_float()) << k;  // transformers 5 checks that they are floats
  expect_published_keys(out, published, {"attention_dropout"});
  const LlamaConfig back = parse_hf_config(out, "exported/config.json");
  EXPECT_EQ(back.summary(), c.summary());
  EXPECT_EQ(to_hf_config(back, "bfloat16"), out);
}

TEST(HfConfig, Olmo2HasNormsAfterEachSublayerAndWholeQkNorms) {
  const LlamaConfig c = parse_hf_config(olmo2_1b(), "olmo2/config.json");
  EXPECT_TRUE(c.post_norms);
  EXPECT_TRUE(c.qk_norm_whole);
  EXPECT_FALSE(c.qk_norm);
  EXPECT_FALSE(c.tie_embeddings);
  // per block: 2 norms of 2048, q/k/v/o 4 x [2048, 2048], q_norm and k_norm of 2048, the MLP
  // 3 x [8192, 2048]; then the final norm, the embedding and the head
  const int64_t block = 2 * 2048 + 4 * 2048 * 2048 + 2 * 2048 + 3 * 8192 * 2048;
  EXPECT_EQ(c.num_parameters(), 16 * block + 2048 + 2 * 100352 * 2048);
  // 1,484,916,736: the model card's 1B (1.5B with the embedding and the head)
  EXPECT_EQ(c.num_parameters(), 1'484'916'736);
  EXPECT_NE(c.summary().find("QK-norm over all heads, norms after each sublayer"), std::string::npos) << c.summary();
  const ModelLayout layout = ModelLayout::llama(c, 1);
  EXPECT_EQ(layout.locate("model.layers.3.self_attn.q_norm.weight").spec->shape, Shape({2048}));
  EXPECT_EQ(layout.locate("model.layers.3.post_feedforward_layernorm.weight").spec->shape, Shape({2048}));
  EXPECT_THROW(layout.locate("model.layers.3.input_layernorm.weight"), Error);
  const LlamaConfig five = parse_hf_config(five_form(olmo2_1b()), "five/config.json");
  EXPECT_EQ(to_hf_config(five, "float32"), to_hf_config(c, "float32"));
}

TEST(HfConfig, Olmo2ExportsAsOlmo2AndReadsBack) {
  const LlamaConfig c = parse_hf_config(olmo2_1b(), "olmo2/config.json");
  const json out = to_hf_config(c, "float32");
  EXPECT_EQ(out.at("architectures"), json::array({"Olmo2ForCausalLM"}));
  EXPECT_EQ(out.at("model_type"), "olmo2");
  expect_published_keys(out, olmo2_1b());
  const LlamaConfig back = parse_hf_config(out, "exported/config.json");
  EXPECT_EQ(back.summary(), c.summary());
  EXPECT_EQ(to_hf_config(back, "float32"), out);
}

// A model no single transformers family describes cannot be written as a config.json.
TEST(HfConfig, MixedFamiliesAreRefusedOnTheWayOut) {
  LlamaConfig c = parse_hf_config(olmo2_1b(), "olmo2/config.json");
  c.logits_scaling = 2.0;
  try {
    (void)to_hf_config(c, "float32");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("combines features of several Hugging Face families (OLMo 2's norms, "
                                         "Granite's scalings)"),
              std::string::npos)
        << e.what();
  }
  c.logits_scaling = 1.0;
  c.qk_norm_whole = false;
  EXPECT_THROW((void)to_hf_config(c, "float32"), Error);  // post_norms alone: no olmo2
  c = parse_hf_config(granite_3_2b(), "granite/config.json");
  c.head_dim_override = 128;
  EXPECT_THROW((void)to_hf_config(c, "float32"), Error);
}

TEST(HfConfig, UnsupportedFamiliesNameTheTypeTheMissingFeatureAndTheSupportedOnes) {
  json j = qwen3_0_6b();
  j["model_type"] = "qwen3_moe";
  std::string e = error_of(j);
  EXPECT_NE(e.find("m/config.json: `model_type` = \"qwen3_moe\" is not supported"), std::string::npos) << e;
  EXPECT_NE(e.find("mixture-of-experts"), std::string::npos) << e;
  EXPECT_NE(e.find("it trains llama (Llama 2, 3, 3.1, 3.2), mistral"), std::string::npos) << e;
  EXPECT_NE(e.find("qwen3 (dense, QK-norm, sliding-window layers too)"), std::string::npos) << e;
  EXPECT_NE(e.find("smollm3 (NoPE layers), granite (Granite 3's embedding, residual, attention and logits "
                   "scalings), olmo2 (norms after each sublayer, QK-norm over the whole q and k) and gemma3_text "
                   "(Gemma 3's text models"),
            std::string::npos)
      << e;
  j["model_type"] = "gemma3";  // the multimodal wrapper
  e = error_of(j);
  EXPECT_NE(e.find("`model_type` = \"gemma3\" is not supported: shardtrain does not implement its multimodal Gemma "
                   "3 (a vision tower); use a text-only checkpoint (model_type gemma3_text"),
            std::string::npos)
      << e;
  j["model_type"] = "mixtral";
  e = error_of(j);
  EXPECT_NE(e.find("`model_type` = \"mixtral\" is not supported"), std::string::npos) << e;
  EXPECT_NE(e.find("mixture-of-experts MLPs"), std::string::npos) << e;
  EXPECT_NE(e.find("gemma2 (Gemma 2: the same without QK-norm, with soft-capped attention scores and logits) "
                   "and phi3 (Phi-3 and Phi-4-mini: fused qkv_proj and gate_up_proj, LongRoPE, a "
                   "partial rotary, a sliding window)"),
            std::string::npos)
      << e;
  j["model_type"] = "falcon";
  e = error_of(j);
  EXPECT_NE(e.find("`model_type` = \"falcon\" is not supported; shardtrain trains llama (Llama 2, 3, 3.1, 3.2), "
                   "mistral"),
            std::string::npos)
      << e;
}

TEST(HfConfig, Qwen3IsLlamaWithQkNormAndHeadsOfTheirOwn) {
  const LlamaConfig c = parse_hf_config(qwen3_0_6b(), "qwen3/config.json");
  EXPECT_TRUE(c.qk_norm);
  EXPECT_FALSE(c.attention_bias);
  EXPECT_TRUE(c.tie_embeddings);
  EXPECT_EQ(c.head_dim(), 128);
  EXPECT_EQ(c.q_dim(), 2048);  // 16 heads of 128 in a width of 1024
  EXPECT_EQ(c.kv_dim(), 1024);
  EXPECT_EQ(c.norm_eps, 1e-6);
  EXPECT_EQ(c.rope.theta, 1e6);
  EXPECT_EQ(c.rope.scaling.type, ops::RopeScalingType::kNone);
  // per block: 2 norms of 1024, q [2048, 1024], k and v [1024, 1024], o [1024, 2048], the MLP
  // 3 x [3072, 1024], q_norm and k_norm of 128; then the final norm and the tied embedding
  const int64_t block = 2 * 1024 + 2048 * 1024 + 2 * 1024 * 1024 + 1024 * 2048 + 3 * 3072 * 1024 + 2 * 128;
  EXPECT_EQ(c.num_parameters(), 28 * block + 1024 + 151936 * 1024);
  // 596,049,920: the model card's 0.6B, 0.44B of them outside the embedding
  EXPECT_EQ(c.num_parameters(), 596'049'920);
  EXPECT_EQ(c.num_parameters() - 151936 * 1024, 440'467'456);
  EXPECT_NE(c.summary().find("16 heads / 8 kv heads (head dim 128, decoupled: attention width 16 x 128 = 2048), "
                             "QK-norm, ffn 3072"),
            std::string::npos)
      << c.summary();
  const ModelLayout layout = ModelLayout::llama(c, 1);
  int norms = 0;
  for (const UnitLayout& u : layout.units())
    for (const ParamSpec& p : u.params)
      if (p.name.find("self_attn.q_norm.weight") != std::string::npos ||
          p.name.find("self_attn.k_norm.weight") != std::string::npos) {
        EXPECT_EQ(p.shape, Shape({128})) << p.name;
        ++norms;
      }
  EXPECT_EQ(norms, 2 * 28);
}

TEST(HfConfig, Qwen3InTheTransformersFiveFormGivesTheSameModel) {
  const LlamaConfig five = parse_hf_config(qwen3_0_6b_five(), "five/config.json");
  const LlamaConfig four = parse_hf_config(qwen3_0_6b(), "four/config.json");
  EXPECT_TRUE(five.qk_norm);
  EXPECT_EQ(five.summary(), four.summary());
  EXPECT_EQ(to_hf_config(five, "bfloat16"), to_hf_config(four, "bfloat16"));
}

TEST(HfConfig, Qwen3ExportsAsQwen3AndReadsBack) {
  const LlamaConfig c = parse_hf_config(qwen3_0_6b(), "qwen3/config.json");
  const json out = to_hf_config(c, "bfloat16");
  EXPECT_EQ(out.at("architectures"), json::array({"Qwen3ForCausalLM"}));
  EXPECT_EQ(out.at("model_type"), "qwen3");
  EXPECT_EQ(out.at("head_dim"), 128);
  EXPECT_EQ(out.at("attention_bias"), false);
  EXPECT_EQ(out.at("use_sliding_window"), false);
  EXPECT_TRUE(out.at("sliding_window").is_null());
  EXPECT_EQ(out.at("tie_word_embeddings"), true);
  EXPECT_EQ(out.at("rms_norm_eps"), 1e-6);
  EXPECT_EQ(out.at("rope_theta"), 1e6);
  EXPECT_FALSE(out.contains("mlp_bias"));  // not a Qwen3 key
  // every key the published config has (but the token ids, which the tokenizer gives, and
  // use_cache) has the published value
  const json published = qwen3_0_6b();
  for (const auto& [key, value] : published.items()) {
    if (key == "bos_token_id" || key == "eos_token_id" || key == "use_cache" || key == "transformers_version")
      continue;
    ASSERT_TRUE(out.contains(key)) << key;
    EXPECT_EQ(out.at(key), value) << key;
  }
  const LlamaConfig back = parse_hf_config(out, "exported/config.json");
  EXPECT_TRUE(back.qk_norm);
  EXPECT_EQ(back.summary(), c.summary());
  EXPECT_EQ(to_hf_config(back, "bfloat16"), out);
}

// Qwen3 with q/k/v biases (attention_bias true) keeps both: the biases in the layout, and
// qwen3 (not qwen2, which has no QK-norm) on the way out.
TEST(HfConfig, Qwen3WithAttentionBiasKeepsItsBiasesAndItsNorms) {
  json j = qwen3_0_6b();
  j["attention_bias"] = true;
  const LlamaConfig c = parse_hf_config(j, "qwen3/config.json");
  EXPECT_TRUE(c.attention_bias);
  EXPECT_TRUE(c.qk_norm);
  const ModelLayout layout = ModelLayout::llama(c, 1);
  bool bias = false, norm = false;
  for (const ParamSpec& p : layout.units()[1].params) {
    bias = bias || p.name.find("self_attn.q_proj.bias") != std::string::npos;
    norm = norm || p.name.find("self_attn.q_norm.weight") != std::string::npos;
  }
  EXPECT_TRUE(bias);
  EXPECT_TRUE(norm);
  const json out = to_hf_config(c, "bfloat16");
  EXPECT_EQ(out.at("model_type"), "qwen3");
  EXPECT_EQ(out.at("attention_bias"), true);
  const LlamaConfig back = parse_hf_config(out, "exported/config.json");
  EXPECT_TRUE(back.attention_bias);
  EXPECT_TRUE(back.qk_norm);
  EXPECT_EQ(back.num_parameters(), c.num_parameters());
}

// Qwen3 reads its sliding window as Qwen2 does (use_sliding_window, max_window_layers,
// layer_types), with QK-norm beside it, and writes it back.
TEST(HfConfig, Qwen3SlidingWindowsReadAsQwen2sAndSurviveExport) {
  json j = qwen3_0_6b();
  j["use_sliding_window"] = true;
  j["sliding_window"] = 4096;
  j["max_window_layers"] = 20;
  LlamaConfig c = parse_hf_config(j, "m/config.json");
  EXPECT_TRUE(c.qk_norm);
  EXPECT_EQ(c.sliding_layer_count(), 8);
  EXPECT_EQ(c.window_of(19), 0);
  EXPECT_EQ(c.window_of(20), 4096);
  const json out = to_hf_config(c, "bfloat16");
  EXPECT_EQ(out.at("model_type"), "qwen3");
  EXPECT_EQ(out.at("max_window_layers"), 20);
  const LlamaConfig back = parse_hf_config(out, "exported/config.json");
  EXPECT_EQ(back.summary(), c.summary());
  EXPECT_TRUE(back.qk_norm);
  // a window size beside use_sliding_window false is not a window (transformers ignores it)
  j["use_sliding_window"] = false;
  EXPECT_EQ(parse_hf_config(j, "m/config.json").sliding_window, 0);

  j = qwen3_0_6b_five();
  j["layer_types"][3] = "sliding_attention";
  std::string e = error_of(j);
  EXPECT_NE(e.find("m/config.json: `layer_types[3]` = \"sliding_attention\" but `use_sliding_window` is false"),
            std::string::npos)
      << e;
  j["use_sliding_window"] = true;
  j["sliding_window"] = 64;
  c = parse_hf_config(j, "m/config.json");
  EXPECT_EQ(c.sliding_layer_count(), 1);
  EXPECT_EQ(c.window_of(3), 64);
  j["layer_types"] = {"full_attention"};
  e = error_of(j);
  EXPECT_NE(e.find("m/config.json: `layer_types` lists 1 layers but `num_hidden_layers` = 28"), std::string::npos)
      << e;
}

}  // namespace
}  // namespace shardtrain::model

namespace shardtrain::model {
namespace {

// google/gemma-3-1b-it's config.json as published (transformers 4 form).
json gemma3_1b() {
  return json::parse(R"({
  "architectures": ["Gemma3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "attn_logit_softcapping": null, "bos_token_id": 2, "cache_implementation": "hybrid", "eos_token_id": [1, 106],
  "final_logit_softcapping": null, "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 1152,
  "initializer_range": 0.02, "intermediate_size": 6912, "max_position_embeddings": 32768,
  "model_type": "gemma3_text", "num_attention_heads": 4, "num_hidden_layers": 26, "num_key_value_heads": 1,
  "pad_token_id": 0, "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06, "rope_local_base_freq": 10000,
  "rope_scaling": null, "rope_theta": 1000000, "sliding_window": 512, "sliding_window_pattern": 6,
  "torch_dtype": "bfloat16", "transformers_version": "4.50.0.dev0", "use_cache": true, "vocab_size": 262144})");
}

// Its shape shrunk (8 layers: 5 sliding, one full, 2 sliding), a 4B-style linear rope scaling
// on the global layers, in the transformers 4 form or, `five`, the transformers 5 form (the rope
// keyed by layer type, layer_types in place of sliding_window_pattern).
json gemma3_small(bool five) {
  json j = gemma3_1b();
  j["hidden_size"] = 64;
  j["intermediate_size"] = 96;
  j["num_hidden_layers"] = 8;
  j["num_attention_heads"] = 4;
  j["num_key_value_heads"] = 2;
  j["head_dim"] = 16;
  j["query_pre_attn_scalar"] = 24;
  j["sliding_window"] = 4;
  j["vocab_size"] = 300;
  j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 8.0}};
  if (!five) return j;
  for (const char* k : {"rope_scaling", "rope_theta", "rope_local_base_freq", "sliding_window_pattern"}) j.erase(k);
  j["rope_parameters"] = {{"full_attention", {{"rope_type", "linear"}, {"factor", 8.0}, {"rope_theta", 1000000.0}}},
                          {"sliding_attention", {{"rope_type", "default"}, {"rope_theta", 10000.0}}}};
  json types = json::array();
  for (int l = 0; l < 8; ++l) types.push_back(l == 5 ? "full_attention" : "sliding_attention");
  j["layer_types"] = types;
  j["dtype"] = j.at("torch_dtype");
  j.erase("torch_dtype");
  return j;
}

std::string gemma_error_of(const json& j) {
  try {
    (void)parse_hf_config(j, "g/config.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

TEST(HfConfig, Gemma3TextHasItsNormsGegluScaledEmbeddingsAndTwoRopes) {
  const LlamaConfig c = parse_hf_config(gemma3_1b(), "gemma3/config.json");
  EXPECT_TRUE(c.qk_norm);
  EXPECT_TRUE(c.sandwich_norms);
  EXPECT_FALSE(c.post_norms);
  EXPECT_EQ(c.norm_weight_offset, 1.0);
  EXPECT_EQ(c.mlp_activation, ops::GluActivation::kGeluTanh);
  EXPECT_TRUE(c.scale_embeddings);
  EXPECT_EQ(c.embedding_multiplier, 1.0);
  EXPECT_TRUE(c.tie_embeddings);  // transformers' default for Gemma 3
  EXPECT_EQ(c.head_dim(), 256);
  EXPECT_TRUE(c.head_dim_decoupled());
  EXPECT_DOUBLE_EQ(c.attention_scale(), 1.0 / 16);
  EXPECT_EQ(c.norm_eps, 1e-6);
  EXPECT_EQ(c.sliding_window, 512);
  // every sixth layer attends fully: 5, 11, 17, 23
  for (int64_t l = 0; l < 26; ++l) EXPECT_EQ(c.window_of(l), (l + 1) % 6 == 0 ? 0 : 512) << l;
  EXPECT_EQ(c.rope.theta, 1000000.0);
  EXPECT_EQ(c.rope_of(0).theta, 10000.0);
  EXPECT_EQ(c.rope_of(5).theta, 1000000.0);
  EXPECT_TRUE(c.has_local_rope());
  // per block: 4 norms of 1152, q [1024, 1152], k and v [256, 1152], o [1152, 1024], q_norm and
  // k_norm of 256, the MLP 3 x [6912, 1152]; then the final norm and the tied embedding:
  // 999,885,952, the model card's 1B
  const int64_t block = 4 * 1152 + 1024 * 1152 + 2 * 256 * 1152 + 1152 * 1024 + 2 * 256 + 3 * 6912 * 1152;
  EXPECT_EQ(c.num_parameters(), 26 * block + 1152 + 262144 * 1152);
  EXPECT_EQ(c.num_parameters(), 999'885'952);
  const std::string summary = c.summary();
  for (const char* part : {"QK-norm", "norms before and after each sublayer", "norms scaled by (1 + weight)",
                           "GeGLU (tanh GELU)", "embeddings x sqrt(dim)", "sliding layers' rope theta 10000",
                           "sliding window 512 on 22 of 26 layers"})
    EXPECT_NE(summary.find(part), std::string::npos) << part << " in " << summary;
  EXPECT_EQ(summary.find("scaled (embedding"), std::string::npos) << summary;  // not Granite's
  // the four norms, their weights starting at 0 (weight + 1 scales)
  const ModelLayout layout = ModelLayout::llama(c, 1);
  for (const char* norm : {"input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                           "post_feedforward_layernorm"}) {
    const ParamSpec* p = layout.locate(std::string("model.layers.3.") + norm + ".weight").spec;
    EXPECT_EQ(p->shape, Shape({1152})) << norm;
    EXPECT_EQ(p->init, ParamInit::kZeros) << norm;
  }
  EXPECT_EQ(layout.locate("model.layers.3.self_attn.q_norm.weight").spec->init, ParamInit::kZeros);
  EXPECT_EQ(layout.locate("model.norm.weight").spec->init, ParamInit::kZeros);
  EXPECT_THROW(layout.locate("lm_head.weight"), Error);
}

TEST(HfConfig, Gemma3TextLinearRopeScalingIsTheGlobalLayersOnly) {
  const LlamaConfig c = parse_hf_config(gemma3_small(false), "gemma3/config.json");
  EXPECT_EQ(c.rope.scaling.type, ops::RopeScalingType::kLinear);
  EXPECT_EQ(c.rope.scaling.factor, 8.0);
  EXPECT_EQ(c.rope_of(5).scaling.type, ops::RopeScalingType::kLinear);   // the full layer
  EXPECT_EQ(c.rope_of(4).scaling.type, ops::RopeScalingType::kNone);     // a sliding one
  EXPECT_EQ(c.rope_of(4).theta, 10000.0);
  EXPECT_DOUBLE_EQ(c.attention_scale(), 1.0 / std::sqrt(24.0));
  // linear scaling divides every frequency by the factor
  ops::RopeOptions unscaled;
  unscaled.theta = 1000000.0;
  const std::vector<double> plain = ops::rope_inv_frequencies(16, unscaled);
  const std::vector<double> scaled = ops::rope_inv_frequencies(16, c.rope);
  for (size_t k = 0; k < plain.size(); ++k) EXPECT_DOUBLE_EQ(scaled[k], plain[k] / 8.0) << k;
  // the transformers 5 form is the same model
  const LlamaConfig five = parse_hf_config(gemma3_small(true), "five/config.json");
  EXPECT_EQ(to_hf_config(five, "float32"), to_hf_config(c, "float32"));
  EXPECT_EQ(five.summary(), c.summary());
  // rope_parameters without thetas of their own beside the top-level keys (as Hub configs
  // updated for transformers 5 have them)
  json top = gemma3_small(true);
  top["rope_parameters"] = {{"full_attention", {{"rope_type", "linear"}, {"factor", 8.0}}},
                            {"sliding_attention", {{"rope_type", "default"}}}};
  top["rope_theta"] = 1000000;
  top["rope_local_base_freq"] = 10000;
  EXPECT_EQ(to_hf_config(parse_hf_config(top, "top/config.json"), "float32"), to_hf_config(c, "float32"));
}

TEST(HfConfig, Gemma3TextExportsAsGemma3TextAndReadsBack) {
  for (const json& published : {gemma3_1b(), gemma3_small(false)}) {
    const LlamaConfig c = parse_hf_config(published, "gemma3/config.json");
    const json out = to_hf_config(c, "bfloat16");
    EXPECT_EQ(out.at("architectures"), json::array({"Gemma3ForCausalLM"}));
    EXPECT_EQ(out.at("model_type"), "gemma3_text");
    expect_published_keys(out, published, {"cache_implementation"});
    EXPECT_EQ(out.at("layer_types").size(), static_cast<size_t>(c.n_layers));
    EXPECT_FALSE(out.contains("hidden_act"));
    const LlamaConfig back = parse_hf_config(out, "exported/config.json");
    EXPECT_EQ(back.summary(), c.summary());
    EXPECT_EQ(to_hf_config(back, "bfloat16"), out);
  }
  // layers no sliding_window_pattern gives: layer_types alone
  LlamaConfig c = parse_hf_config(gemma3_small(false), "gemma3/config.json");
  c.sliding_layers = {true, false, false, true, true, true, false, true};
  const json out = to_hf_config(c, "float32");
  EXPECT_FALSE(out.contains("sliding_window_pattern"));
  const LlamaConfig back = parse_hf_config(out, "exported/config.json");
  EXPECT_EQ(back.sliding_layers, c.sliding_layers);
}

TEST(HfConfig, BadGemma3TextConfigsNameTheKeyAndValue) {
  json j = gemma3_small(false);
  j["attn_logit_softcapping"] = 50.0;
  std::string e = gemma_error_of(j);
  EXPECT_NE(e.find("g/config.json: `attn_logit_softcapping` = 50.0 is not supported for gemma3_text"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("transformers' Gemma 3 attention does not apply it"), std::string::npos) << e;
  j = gemma3_small(false);
  j.erase("final_logit_softcapping");  // absent: none, as null
  EXPECT_EQ(parse_hf_config(j, "g/config.json").final_logit_softcapping, 0.0);
  j["final_logit_softcapping"] = 30.0;  // transformers' Gemma 3 applies this one
  EXPECT_EQ(parse_hf_config(j, "g/config.json").final_logit_softcapping, 30.0);
  j["final_logit_softcapping"] = -1.0;
  e = gemma_error_of(j);
  EXPECT_NE(e.find("`final_logit_softcapping` must be > 0 (or null for none), found -1"), std::string::npos) << e;
  j = gemma3_small(false);
  j["hidden_activation"] = "gelu";
  e = gemma_error_of(j);
  EXPECT_NE(e.find("`hidden_activation` = \"gelu\" is not supported for gemma3_text; expected "
                   "\"gelu_pytorch_tanh\""),
            std::string::npos)
      << e;
  j = gemma3_small(false);
  j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
  e = gemma_error_of(j);
  EXPECT_NE(e.find("`rope_scaling` rope type \"yarn\" is not supported for gemma3_text; shardtrain supports "
                   "default and linear"),
            std::string::npos)
      << e;
  j = gemma3_small(true);
  j["rope_parameters"]["sliding_attention"]["rope_type"] = "linear";
  e = gemma_error_of(j);
  EXPECT_NE(e.find("`rope_parameters.sliding_attention.rope_type` = \"linear\" is not supported"),
            std::string::npos)
      << e;
  j = gemma3_small(false);
  j["attention_bias"] = true;
  e = gemma_error_of(j);
  EXPECT_NE(e.find("`attention_bias` = true is not supported for gemma3_text"), std::string::npos) << e;
  j = gemma3_small(false);
  j["use_bidirectional_attention"] = true;
  e = gemma_error_of(j);
  EXPECT_NE(e.find("`use_bidirectional_attention` = true is not supported"), std::string::npos) << e;
}

// Gemma 3's features are one family: a part of them, or beside another family's, is refused.
TEST(HfConfig, Gemma3TextFeaturesGoTogether) {
  LlamaConfig c = parse_hf_config(gemma3_small(false), "gemma3/config.json");
  c.logits_scaling = 2.0;
  try {
    (void)to_hf_config(c, "float32");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("combines features of several Hugging Face families (Granite's scalings, "
                                         "Gemma's norms"),
              std::string::npos)
        << e.what();
  }
  c = parse_hf_config(gemma3_small(false), "gemma3/config.json");
  c.sandwich_norms = false;
  try {
    (void)to_hf_config(c, "float32");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("Gemma (gemma3_text with per-head QK-norm, gemma2 without) has all of (1 + "
                                         "weight) norms"),
              std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("sandwich_norms = 0"), std::string::npos) << e.what();
  }
  c = parse_hf_config(gemma3_small(false), "gemma3/config.json");
  c.rope_local_theta = 0;  // the sliding layers would take the scaled rope, which transformers never gives them
  EXPECT_THROW((void)to_hf_config(c, "float32"), Error);
}

}  // namespace
}  // namespace shardtrain::model

namespace shardtrain::model {
namespace {

// google/gemma-2-2b's config.json as published (transformers 4 form).
json gemma2_2b() {
  return json::parse(R"({
  "architectures": ["Gemma2ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "attn_logit_softcapping": 50.0, "bos_token_id": 2, "cache_implementation": "hybrid", "eos_token_id": 1,
  "final_logit_softcapping": 30.0, "head_dim": 256, "hidden_act": "gelu_pytorch_tanh",
  "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 2304, "initializer_range": 0.02,
  "intermediate_size": 9216, "max_position_embeddings": 8192, "model_type": "gemma2", "num_attention_heads": 8,
  "num_hidden_layers": 26, "num_key_value_heads": 4, "pad_token_id": 0, "query_pre_attn_scalar": 256,
  "rms_norm_eps": 1e-06, "rope_theta": 10000.0, "sliding_window": 4096, "torch_dtype": "float32",
  "transformers_version": "4.42.4", "use_cache": true, "vocab_size": 256000})");
}

TEST(HfConfig, Gemma2IsGemmaWithSoftCappingAndOneRope) {
  const LlamaConfig c = parse_hf_config(gemma2_2b(), "gemma2/config.json");
  EXPECT_FALSE(c.qk_norm);
  EXPECT_TRUE(c.sandwich_norms);
  EXPECT_EQ(c.norm_weight_offset, 1.0);
  EXPECT_EQ(c.mlp_activation, ops::GluActivation::kGeluTanh);
  EXPECT_TRUE(c.scale_embeddings);
  EXPECT_TRUE(c.tie_embeddings);
  EXPECT_EQ(c.attn_logit_softcapping, 50.0);
  EXPECT_EQ(c.final_logit_softcapping, 30.0);
  EXPECT_DOUBLE_EQ(c.attention_scale(), 1.0 / 16);
  EXPECT_FALSE(c.has_local_rope());
  // the even layers slide
  for (int64_t l = 0; l < 26; ++l) EXPECT_EQ(c.window_of(l), l % 2 == 0 ? 4096 : 0) << l;
  // per block: 4 norms of 2304, q [2048, 2304], k and v [1024, 2304], o [2304, 2048], the MLP
  // 3 x [9216, 2304]; then the final norm and the tied embedding: 2,614,341,888, gemma-2-2b's
  const int64_t block = 4 * 2304 + 2048 * 2304 + 2 * 1024 * 2304 + 2304 * 2048 + 3 * 9216 * 2304;
  EXPECT_EQ(c.num_parameters(), 26 * block + 2304 + 256000 * 2304);
  EXPECT_EQ(c.num_parameters(), 2'614'341'888);
  for (const char* part : {"attention scores soft-capped at 50", "logits soft-capped at 30"})
    EXPECT_NE(c.summary().find(part), std::string::npos) << c.summary();
  EXPECT_THROW(ModelLayout::llama(c, 1).locate("model.layers.0.self_attn.q_norm.weight"), Error);
  // null soft-capping keys: none
  json j = gemma2_2b();
  j["attn_logit_softcapping"] = nullptr;
  j["final_logit_softcapping"] = nullptr;
  const LlamaConfig uncapped = parse_hf_config(j, "gemma2/config.json");
  EXPECT_FALSE(uncapped.soft_capped());
  // the transformers 5 form: rope_parameters and layer_types
  json five = five_form(gemma2_2b());
  json types = json::array();
  for (int l = 0; l < 26; ++l) types.push_back(l % 2 == 0 ? "sliding_attention" : "full_attention");
  five["layer_types"] = types;
  EXPECT_EQ(to_hf_config(parse_hf_config(five, "five/config.json"), "float32"), to_hf_config(c, "float32"));
}

TEST(HfConfig, Gemma2ExportsAsGemma2AndReadsBack) {
  const LlamaConfig c = parse_hf_config(gemma2_2b(), "gemma2/config.json");
  const json out = to_hf_config(c, "float32");
  EXPECT_EQ(out.at("architectures"), json::array({"Gemma2ForCausalLM"}));
  EXPECT_EQ(out.at("model_type"), "gemma2");
  expect_published_keys(out, gemma2_2b(), {"cache_implementation", "hidden_act"});
  EXPECT_FALSE(out.contains("rope_local_base_freq"));
  EXPECT_FALSE(out.contains("sliding_window_pattern"));
  const LlamaConfig back = parse_hf_config(out, "exported/config.json");
  EXPECT_EQ(back.summary(), c.summary());
  EXPECT_EQ(to_hf_config(back, "float32"), out);
  // Gemma 2 has one rope and no scaling; a Gemma 3 model soft-capping its attention has no family
  LlamaConfig two_ropes = c;
  two_ropes.rope_local_theta = 100.0;
  EXPECT_THROW((void)to_hf_config(two_ropes, "float32"), Error);
  LlamaConfig capped3 = parse_hf_config(gemma3_1b(), "gemma3/config.json");
  capped3.attn_logit_softcapping = 50.0;
  EXPECT_THROW((void)to_hf_config(capped3, "float32"), Error);
}

// Phi-3 as transformers 4 writes it: rope_theta, rope_scaling {type, short_factor,
// long_factor} and original_max_position_embeddings at the top; 4 heads of 16 (8 frequencies).
json phi3_small() {
  return {{"architectures", {"Phi3ForCausalLM"}}, {"model_type", "phi3"}, {"vocab_size", 67}, {"hidden_size", 64},
          {"intermediate_size", 96}, {"num_hidden_layers", 2}, {"num_attention_heads", 4},
          {"num_key_value_heads", 2}, {"max_position_embeddings", 256}, {"original_max_position_embeddings", 16},
          {"rms_norm_eps", 1e-5}, {"hidden_act", "silu"}, {"rope_theta", 10000.0}, {"sliding_window", 5},
          {"resid_pdrop", 0.0}, {"embd_pdrop", 0.0}, {"attention_dropout", 0.0}, {"tie_word_embeddings", false},
          {"rope_scaling",
           {{"type", "longrope"},
            {"short_factor", {1.0, 1.1, 1.3, 1.6, 2.0, 2.5, 3.1, 3.8}},
            {"long_factor", {1.0, 1.5, 2.2, 3.0, 4.5, 6.0, 9.0, 12.0}}}}};
}

std::string reference_config(const std::string& name) {
  return testing::source_dir() + "/tests/model/hf_reference/" + name + "/config.json";
}

TEST(HfConfig, Phi3LongRopeSlidingWindowAndFusedTensorsInBothForms) {
  const LlamaConfig four = parse_hf_config(phi3_small(), "phi3/config.json");
  const LlamaConfig five = load_hf_config(reference_config("phi3_longrope"));  // transformers 5's rope_parameters
  for (const LlamaConfig* c : {&four, &five}) {
    EXPECT_TRUE(c->fused_projections);
    EXPECT_TRUE(c->phi3_features());
    EXPECT_EQ(c->rope.scaling.type, ops::RopeScalingType::kLongRope);
    EXPECT_EQ(c->rope.scaling.original_max_positions, 16);
    EXPECT_EQ(c->rope.scaling.short_factor, (std::vector<double>{1.0, 1.1, 1.3, 1.6, 2.0, 2.5, 3.1, 3.8}));
    EXPECT_EQ(c->rope.scaling.long_factor, (std::vector<double>{1.0, 1.5, 2.2, 3.0, 4.5, 6.0, 9.0, 12.0}));
    // factor 256 / 16: sqrt(1 + ln 16 / ln 16)
    EXPECT_DOUBLE_EQ(c->rope.scaling.attention_factor, std::sqrt(2.0));
    EXPECT_EQ(c->rope.partial_rotary, 1.0);
    EXPECT_EQ(c->rotary_dim(), 16);
    EXPECT_EQ(c->rope.theta, 10000.0);
    EXPECT_EQ(windows(*c), (std::vector<int64_t>{5, 5}));
    EXPECT_FALSE(c->tie_embeddings);
    EXPECT_FALSE(c->rope_long(16));
    EXPECT_TRUE(c->rope_long(17));
    EXPECT_NE(c->summary().find("LongRoPE (long factors past 16 positions), fused qkv and gate_up"),
              std::string::npos)
        << c->summary();
  }
  EXPECT_EQ(four.summary(), five.summary());
  // the fused tensors: q, k, v rows of qkv_proj and gate, up rows of gate_up_proj
  const std::vector<FusedTensor> fused = hf_fused_tensors(four);
  ASSERT_EQ(fused.size(), 4u);
  EXPECT_EQ(fused[0].name, "model.layers.0.self_attn.qkv_proj.weight");
  EXPECT_EQ(fused[0].shape, Shape({64 + 2 * 32, 64}));
  EXPECT_EQ(fused[0].parts, (std::vector<std::string>{"model.layers.0.self_attn.q_proj.weight",
                                                      "model.layers.0.self_attn.k_proj.weight",
                                                      "model.layers.0.self_attn.v_proj.weight"}));
  EXPECT_EQ(fused[0].offsets, (std::vector<int64_t>{0, 64 * 64, 96 * 64}));
  EXPECT_EQ(fused[3].name, "model.layers.1.mlp.gate_up_proj.weight");
  EXPECT_EQ(fused[3].shape, Shape({192, 64}));
  EXPECT_EQ(fused[3].part_shapes[1], Shape({96, 64}));
  EXPECT_EQ(fused[3].offsets, (std::vector<int64_t>{0, 96 * 64}));
  // no window when sliding_window is null or absent; a plain phi3 (no rope scaling) still fuses
  json j = phi3_small();
  j["sliding_window"] = nullptr;
  j["rope_scaling"] = nullptr;
  const LlamaConfig plain = parse_hf_config(j, "phi3/config.json");
  EXPECT_EQ(plain.sliding_window, 0);
  EXPECT_EQ(plain.rope.scaling.type, ops::RopeScalingType::kNone);
  EXPECT_EQ(hf_fused_tensors(plain).size(), 4u);
  EXPECT_TRUE(hf_fused_tensors(parse_hf_config(small("llama", json::object()), "l/config.json")).empty());
  // Phi-3 has no q/k/v biases whatever attention_bias says (transformers' Phi3Attention has none)
  j["attention_bias"] = true;
  EXPECT_FALSE(parse_hf_config(j, "phi3/config.json").attention_bias);
}

TEST(HfConfig, Phi4PartialRotaryAndGivenFactors) {
  const LlamaConfig five = load_hf_config(reference_config("phi4_partial_rotary"));
  json j = phi3_small();  // transformers 4: partial_rotary_factor at the top
  j["partial_rotary_factor"] = 0.75;
  j["sliding_window"] = nullptr;
  j["tie_word_embeddings"] = true;
  j["rope_scaling"]["short_factor"] = {1.0, 1.2, 1.5, 2.0, 2.7, 3.5};
  j["rope_scaling"]["long_factor"] = {1.0, 2.0, 3.0, 5.0, 8.0, 13.0};
  const LlamaConfig four = parse_hf_config(j, "phi4/config.json");
  for (const LlamaConfig* c : {&four, &five}) {
    EXPECT_EQ(c->rope.partial_rotary, 0.75);
    EXPECT_EQ(c->rotary_dim(), 12);
    EXPECT_EQ(c->head_dim(), 16);
    EXPECT_EQ(c->rope.scaling.short_factor.size(), 6u);
    EXPECT_EQ(c->sliding_window, 0);
    EXPECT_TRUE(c->tie_embeddings);
    EXPECT_NE(c->summary().find("rope on 12 of 16 dims"), std::string::npos) << c->summary();
  }
  EXPECT_EQ(four.summary(), five.summary());
  // a factor given: the attention factor derives from it; an attention factor given is taken
  j["rope_scaling"]["factor"] = 4.0;
  EXPECT_DOUBLE_EQ(parse_hf_config(j, "phi4/config.json").rope.scaling.attention_factor,
                   std::sqrt(1.0 + std::log(4.0) / std::log(16.0)));
  j["rope_scaling"]["attention_factor"] = 1.25;
  EXPECT_EQ(parse_hf_config(j, "phi4/config.json").rope.scaling.attention_factor, 1.25);
  j["rope_scaling"].erase("attention_factor");
  j["rope_scaling"]["factor"] = 1.0;
  EXPECT_EQ(parse_hf_config(j, "phi4/config.json").rope.scaling.attention_factor, 1.0);
  // without original_max_position_embeddings anywhere: max_position_embeddings, factor 1
  j["rope_scaling"].erase("factor");
  j.erase("original_max_position_embeddings");
  const LlamaConfig no_orig = parse_hf_config(j, "phi4/config.json");
  EXPECT_EQ(no_orig.rope.scaling.original_max_positions, 256);
  EXPECT_EQ(no_orig.rope.scaling.attention_factor, 1.0);
}

TEST(HfConfig, Phi3ExportsAsPhi3AndReadsBack) {
  for (const char* name : {"phi3_longrope", "phi4_partial_rotary"}) {
    const LlamaConfig c = load_hf_config(reference_config(name));
    const json out = to_hf_config(c, "float32");
    EXPECT_EQ(out.at("model_type"), "phi3") << name;
    EXPECT_EQ(out.at("architectures"), json({"Phi3ForCausalLM"})) << name;
    EXPECT_EQ(out.at("original_max_position_embeddings"), 16) << name;
    // as Phi3Config validates it: type and the two lists only (the attention factor derives)
    EXPECT_EQ(out.at("rope_scaling").size(), 3u) << out.dump();
    EXPECT_EQ(out.at("rope_scaling").at("type"), "longrope");
    EXPECT_EQ(out.at("partial_rotary_factor"), c.rope.partial_rotary);
    for (const char* key : {"resid_pdrop", "embd_pdrop", "attention_dropout"}) EXPECT_EQ(out.at(key), 0.0) << key;
    const LlamaConfig back = parse_hf_config(out, "exported/config.json");
    EXPECT_EQ(back.summary(), c.summary()) << name;
    EXPECT_EQ(back.rope.scaling.short_factor, c.rope.scaling.short_factor);
    EXPECT_EQ(back.rope.scaling.long_factor, c.rope.scaling.long_factor);
    EXPECT_EQ(back.rope.scaling.attention_factor, c.rope.scaling.attention_factor);
    EXPECT_EQ(back.rope.partial_rotary, c.rope.partial_rotary);
    EXPECT_EQ(windows(back), windows(c));
  }
  const LlamaConfig c = load_hf_config(reference_config("phi3_longrope"));
  EXPECT_EQ(to_hf_config(c, "float32").at("sliding_window"), 5);
  LlamaConfig other = c;  // an attention factor of its own is written
  other.rope.scaling.attention_factor = 1.1;
  const json out = to_hf_config(other, "float32");
  EXPECT_EQ(out.at("rope_scaling").at("attention_factor"), 1.1);
  EXPECT_EQ(parse_hf_config(out, "o/config.json").rope.scaling.attention_factor, 1.1);
  // a partial rotary alone (trained from scratch) is phi3 too, without LongRoPE
  LlamaConfig partial = parse_hf_config(small("llama", json::object()), "l/config.json");
  partial.rope.partial_rotary = 0.5;
  partial.head_dim_override = 8;  // 4 heads of 8 in a width of 24: rope on 4 of each head's 8
  const json p = to_hf_config(partial, "float32");
  EXPECT_EQ(p.at("model_type"), "phi3");
  EXPECT_TRUE(p.at("rope_scaling").is_null());
  EXPECT_FALSE(p.contains("original_max_position_embeddings"));
  EXPECT_EQ(parse_hf_config(p, "p/config.json").rotary_dim(), 4);
  // other families' features with phi3's are refused
  partial.qk_norm = true;
  EXPECT_THROW(to_hf_config(partial, "float32"), Error);
  partial.qk_norm = false;
  partial.attention_bias = true;
  EXPECT_THROW(to_hf_config(partial, "float32"), Error);
  partial.attention_bias = false;
  partial.rope.scaling.type = ops::RopeScalingType::kLlama3;
  EXPECT_THROW(to_hf_config(partial, "float32"), Error);
}

TEST(HfConfig, BadPhi3ConfigsNameTheKeyAndValue) {
  for (const char* key : {"resid_pdrop", "embd_pdrop", "attention_dropout"}) {
    json j = phi3_small();
    j[key] = 0.1;
    const std::string e = error_of(j);
    EXPECT_NE(e.find(std::string("m/config.json: `") + key + "` = 0.1 is not supported: shardtrain trains without "
                     "dropout; set it to 0.0"),
              std::string::npos)
        << e;
  }
  json j = phi3_small();
  j["rope_scaling"]["short_factor"] = {1.0, 2.0};
  std::string e = error_of(j);
  EXPECT_NE(e.find("LongRoPE's `short_factor` has 2 entries, but heads rotating 16 dimensions (head dim 16, rotary "
                   "fraction 1) have 8 frequencies"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("m/config.json"), std::string::npos) << e;
  j = phi3_small();
  j["partial_rotary_factor"] = 0.75;  // 12 dims: 6 frequencies, the lists have 8
  e = error_of(j);
  EXPECT_NE(e.find("heads rotating 12 dimensions (head dim 16, rotary fraction 0.75) have 6 frequencies"),
            std::string::npos)
      << e;
  j = phi3_small();
  j["rope_scaling"].erase("long_factor");
  e = error_of(j);
  EXPECT_NE(e.find("`rope_scaling.long_factor` must be a list of numbers"), std::string::npos) << e;
  j = phi3_small();
  j["rope_scaling"]["short_factor"][2] = "x";
  e = error_of(j);
  EXPECT_NE(e.find("`rope_scaling.short_factor` must hold numbers, found \"x\""), std::string::npos) << e;
  j = phi3_small();
  j["partial_rotary_factor"] = 0.7;  // int(16 x 0.7) = 11
  e = error_of(j);
  EXPECT_NE(e.find("rotates int(16 x 0.7) = 11 dimensions"), std::string::npos) << e;
  j["partial_rotary_factor"] = 1.5;
  e = error_of(j);
  EXPECT_NE(e.find("`partial_rotary_factor` must be in (0, 1], found 1.5"), std::string::npos) << e;
  j = phi3_small();
  j["rope_scaling"]["type"] = "yarn";
  e = error_of(j);
  EXPECT_NE(e.find("shardtrain supports default, linear, llama3 and longrope"), std::string::npos) << e;
}

}  // namespace
}  // namespace shardtrain::model
