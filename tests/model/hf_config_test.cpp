// Reading HF config.json: a head dimension of its own (Mistral-Nemo's head_dim 128 beside
// hidden_size 5120 and 32 heads) in the transformers 4 and 5 forms, its checks, its way back
// out through to_hf_config, and the errors for families shardtrain does not train. Qwen3
// (QK-norm, heads of 128 in a width of 1024) both ways, with sliding windows refused.
#include "model/hf_config.h"

#include <string>

#include <gtest/gtest.h>

#include "core/error.h"
#include "model/layout.h"

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

TEST(HfConfig, UnsupportedFamiliesNameTheTypeTheMissingFeatureAndTheSupportedOnes) {
  json j = qwen3_0_6b();
  j["model_type"] = "qwen3_moe";
  std::string e = error_of(j);
  EXPECT_NE(e.find("m/config.json: `model_type` = \"qwen3_moe\" is not supported"), std::string::npos) << e;
  EXPECT_NE(e.find("mixture-of-experts"), std::string::npos) << e;
  EXPECT_NE(e.find("it trains llama (Llama 2, 3, 3.1, 3.2), mistral"), std::string::npos) << e;
  EXPECT_NE(e.find("qwen3 (dense, QK-norm, no sliding window)"), std::string::npos) << e;
  j["model_type"] = "gemma2";
  e = error_of(j);
  EXPECT_NE(e.find("`model_type` = \"gemma2\" is not supported"), std::string::npos) << e;
  EXPECT_NE(e.find("soft-capping"), std::string::npos) << e;
  EXPECT_NE(e.find("qwen2"), std::string::npos) << e;
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

TEST(HfConfig, SlidingWindowsAreRefusedNamingTheKeyAndValue) {
  json j = qwen3_0_6b();
  j["use_sliding_window"] = true;
  j["sliding_window"] = 4096;
  std::string e = error_of(j);
  EXPECT_NE(e.find("m/config.json: `use_sliding_window` = true: sliding-window attention is not supported yet; "
                   "shardtrain runs full (causal) attention in every layer; set it to false"),
            std::string::npos)
      << e;
  // a window size beside use_sliding_window false is not a window (transformers ignores it)
  j["use_sliding_window"] = false;
  EXPECT_EQ(error_of(j), "");

  j = qwen3_0_6b_five();
  j["layer_types"][3] = "sliding_attention";
  e = error_of(j);
  EXPECT_NE(e.find("m/config.json: `layer_types[3]` = \"sliding_attention\": sliding-window attention is not "
                   "supported yet"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("(\"full_attention\" in each entry)"), std::string::npos) << e;
  j["layer_types"] = {"full_attention"};
  e = error_of(j);
  EXPECT_NE(e.find("m/config.json: `layer_types` lists 1 layers but `num_hidden_layers` = 28"), std::string::npos)
      << e;
  j["layer_types"] = "full_attention";
  e = error_of(j);
  EXPECT_NE(e.find("m/config.json: `layer_types` must be a list of \"full_attention\" entries, found "
                   "\"full_attention\""),
            std::string::npos)
      << e;

  j = mistral_nemo();
  j["sliding_window"] = 4096;
  e = error_of(j);
  EXPECT_NE(e.find("m/config.json: `sliding_window` = 4096: sliding-window attention is not supported yet"),
            std::string::npos)
      << e;
}

}  // namespace
}  // namespace shardtrain::model
