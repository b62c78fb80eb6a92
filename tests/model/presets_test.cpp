// The built-in model shapes (model.preset): each one's published hyper-parameters and
// parameter count, that a preset equals the config.json it stands for, and the names.
#include "model/presets.h"

#include <gtest/gtest.h>

#include <set>

#include "model/hf_config.h"
#include "testing/temp_folder.h"

namespace shardtrain::model {
namespace {

struct Published {
  const char* name;
  int64_t parameters;
  int64_t dim, layers, heads, kv_heads, ffn, vocab, positions;
  double rope_theta;
  double rope_factor;  // llama3 scaling from 8192 positions (low 1, high 4); 0: none
  bool tied;
  double eps = 1e-5;
};

// From each model's config.json on the Hugging Face hub (meta-llama/..., Qwen/Qwen3-1.7B,
// google/gemma-3-1b-pt); Llama's parameter counts as the models' safetensors hold them, Qwen3's
// and Gemma 3's from their shapes with the tied head counted once.
const Published kPublished[] = {
    {"llama3.2-1b", 1'235'814'400, 2048, 16, 32, 8, 8192, 128256, 131072, 500000, 32, true},
    {"llama3.2-3b", 3'212'749'824, 3072, 28, 24, 8, 8192, 128256, 131072, 500000, 32, true},
    {"llama3.1-8b", 8'030'261'248, 4096, 32, 32, 8, 14336, 128256, 131072, 500000, 8, false},
    {"llama3.1-70b", 70'553'706'496, 8192, 80, 64, 8, 28672, 128256, 131072, 500000, 8, false},
    {"llama3.1-405b", 405'853'388'800, 16384, 126, 128, 8, 53248, 128256, 131072, 500000, 8, false},
    {"llama2-7b", 6'738'415'616, 4096, 32, 32, 32, 11008, 32000, 4096, 10000, 0, false},
    {"llama2-13b", 13'015'864'320, 5120, 40, 40, 40, 13824, 32000, 4096, 10000, 0, false},
    {"llama2-70b", 68'976'648'192, 8192, 80, 64, 8, 28672, 32000, 4096, 10000, 0, false},
    {"qwen3-1.7b", 1'720'574'976, 2048, 28, 16, 8, 6144, 151936, 40960, 1000000, 0, true, 1e-6},
    {"gemma3-1b", 999'885'952, 1152, 26, 4, 1, 6912, 262144, 32768, 1000000, 0, true, 1e-6},
};

TEST(Presets, EachHasItsPublishedShape) {
  ASSERT_EQ(model_presets().size(), std::size(kPublished));
  for (const Published& m : kPublished) {
    SCOPED_TRACE(m.name);
    const LlamaConfig c = preset_config(m.name);
    EXPECT_EQ(c.num_parameters(), m.parameters);
    EXPECT_EQ(c.dim, m.dim);
    EXPECT_EQ(c.n_layers, m.layers);
    EXPECT_EQ(c.n_heads, m.heads);
    EXPECT_EQ(c.n_kv_heads, m.kv_heads);
    EXPECT_EQ(c.ffn_dim, m.ffn);
    EXPECT_EQ(c.vocab_size, m.vocab);
    EXPECT_EQ(c.max_seq_len, m.positions);
    EXPECT_EQ(c.tie_embeddings, m.tied);
    EXPECT_FALSE(c.attention_bias);
    EXPECT_EQ(c.norm_eps, m.eps);
    EXPECT_EQ(c.init_std, 0.02);
    EXPECT_EQ(c.rope.theta, m.rope_theta);
    if (m.rope_factor > 0) {
      EXPECT_EQ(c.rope.scaling.type, ops::RopeScalingType::kLlama3);
      EXPECT_EQ(c.rope.scaling.factor, m.rope_factor);
      EXPECT_EQ(c.rope.scaling.low_freq_factor, 1.0);
      EXPECT_EQ(c.rope.scaling.high_freq_factor, 4.0);
      EXPECT_EQ(c.rope.scaling.original_max_positions, 8192);
    } else {
      EXPECT_EQ(c.rope.scaling.type, ops::RopeScalingType::kNone);
    }
  }
  // the features beside the shape: Qwen3's QK-norm and 128-wide heads; Gemma 3's too, and its
  // sliding layers (five of six over 512 keys, base 10000) and sandwich norms
  const LlamaConfig q = preset_config("qwen3-1.7b");
  EXPECT_EQ(q.head_dim(), 128);
  EXPECT_EQ(q.sliding_window, 0);
  const LlamaConfig g = preset_config("gemma3-1b");
  EXPECT_EQ(g.head_dim(), 256);
  EXPECT_EQ(g.sliding_window, 512);
  ASSERT_EQ(g.sliding_layers.size(), 26u);
  for (size_t l = 0; l < 26; ++l) EXPECT_EQ(g.sliding_layers[l], (l + 1) % 6 != 0) << "layer " << l;
}

class PresetFiles : public testing::TempFolderTest {};

// A download's whole config.json (ids, dtype and all) gives the preset's shape: the preset is
// what model.hf would read. Llama 2's file leaves rope_theta out (transformers' 10000).
TEST_F(PresetFiles, EqualTheConfigJsonTheyStandFor) {
  const std::string llama32_1b = write("llama32_1b.json", R"({
  "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 128000, "eos_token_id": 128001, "head_dim": 64, "hidden_act": "silu", "hidden_size": 2048,
  "initializer_range": 0.02, "intermediate_size": 8192, "max_position_embeddings": 131072, "mlp_bias": false,
  "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8,
  "pretraining_tp": 1, "rms_norm_eps": 1e-05,
  "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "rope_theta": 500000.0, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
  "transformers_version": "4.45.0.dev0", "use_cache": true, "vocab_size": 128256})");
  const std::string llama2_7b = write("llama2_7b.json", R"({
  "_name_or_path": "meta-llama/Llama-2-7b-hf", "architectures": ["LlamaForCausalLM"], "bos_token_id": 1,
  "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
  "intermediate_size": 11008, "max_position_embeddings": 4096, "model_type": "llama", "num_attention_heads": 32,
  "num_hidden_layers": 32, "num_key_value_heads": 32, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
  "rope_scaling": null, "tie_word_embeddings": false, "torch_dtype": "float16",
  "transformers_version": "4.31.0.dev0", "use_cache": true, "vocab_size": 32000})");
  EXPECT_EQ(to_hf_config(load_hf_config(llama32_1b), "bfloat16"), to_hf_config(preset_config("llama3.2-1b"), "bfloat16"));
  EXPECT_EQ(to_hf_config(load_hf_config(llama2_7b), "bfloat16"), to_hf_config(preset_config("llama2-7b"), "bfloat16"));
  EXPECT_NE(to_hf_config(load_hf_config(llama2_7b), "bfloat16"), to_hf_config(preset_config("llama2-13b"), "bfloat16"));
}

TEST(Presets, AnUnknownNameListsTheValidOnes) {
  try {
    preset_config("llama3-8b", "model.preset");
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("`model.preset` = \"llama3-8b\" is not a built-in model shape; the presets are llama3.2-1b, "
                     "llama3.2-3b, llama3.1-8b, llama3.1-70b, llama3.1-405b, llama2-7b, llama2-13b, llama2-70b, qwen3-1.7b, "
                     "gemma3-1b"),
              std::string::npos)
        << m;
  }
  EXPECT_EQ(find_preset("Llama3.1-8B"), nullptr) << "names are exact";
  std::set<std::string> names;
  for (const ModelPreset& p : model_presets()) EXPECT_TRUE(names.insert(p.name).second) << p.name;
}

TEST(Presets, DownloadFoldersAreKnownByTheirNames) {
  const std::pair<const char*, const char*> named[] = {
      {"Llama-3.1-8B", "llama3.1-8b"},           {"meta-llama-3.1-8b-instruct", "llama3.1-8b"},
      {"Llama-3.1-405B", "llama3.1-405b"},       {"Llama-3.2-1B-Instruct", "llama3.2-1b"},
      {"Llama-2-70b-hf", "llama2-70b"},          {"Llama-2-13b-chat-hf", "llama2-13b"},
      {"llama3.1-70b", "llama3.1-70b"},          {"Qwen3-1.7B", "qwen3-1.7b"},
      {"gemma-3-1b-it", "gemma3-1b"},
  };
  for (const auto& [folder, preset] : named) {
    const ModelPreset* p = preset_for_folder_name(folder);
    ASSERT_NE(p, nullptr) << folder;
    EXPECT_EQ(p->name, preset) << folder;
  }
  for (const char* other : {"my-finetune", "Llama-3.1-8B-lora", "Meta-Llama-3-8B", ""})
    EXPECT_EQ(preset_for_folder_name(other), nullptr) << other;
}

}  // namespace
}  // namespace shardtrain::model
