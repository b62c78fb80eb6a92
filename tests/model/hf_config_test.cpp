// Reading HF config.json: a head dimension of its own (Mistral-Nemo's head_dim 128 beside
// hidden_size 5120 and 32 heads) in the transformers 4 and 5 forms, its checks, its way back
// out through to_hf_config, and the errors for families shardtrain does not train.
#include "model/hf_config.h"

#include <string>

#include <gtest/gtest.h>

#include "core/error.h"

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

// A model with QK-norm has no Hugging Face family shardtrain writes yet: exporting it says so
// instead of writing a config that would load without its q_norm / k_norm weights.
TEST(HfConfig, ExportingQkNormIsRefused) {
  LlamaConfig c = parse_hf_config(mistral_nemo(), "nemo/config.json");
  c.qk_norm = true;
  try {
    to_hf_config(c, "bfloat16");
    ADD_FAILURE() << "no error thrown";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("QK-norm (Qwen3)"), std::string::npos) << e.what();
  }
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
  json j = mistral_nemo();
  j["model_type"] = "qwen3";
  std::string e = error_of(j);
  EXPECT_NE(e.find("m/config.json: `model_type` = \"qwen3\" is not supported"), std::string::npos) << e;
  EXPECT_NE(e.find("QK-norm"), std::string::npos) << e;
  EXPECT_NE(e.find("it trains llama (Llama 2, 3, 3.1, 3.2), mistral"), std::string::npos) << e;
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

}  // namespace
}  // namespace shardtrain::model
