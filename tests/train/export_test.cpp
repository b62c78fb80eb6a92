// Export round trip: a Hugging Face folder loaded into the sharded store and exported in
// f32 gives back the same tensors bit for bit and an equivalent config.json. An export
// replaces an older one whole and never deletes files it did not write. Every export carries
// a tokenizer (the byte-level tokenizer's files written, or a tokenizer folder's copied) and
// its BOS and EOS ids in config.json, agreeing with a copied generation_config.json.
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "data/bpe_tokenizer.h"
#include "data/byte_tokenizer.h"
#include "io/hf_folder.h"
#include "io/safetensors_writer.h"
#include "model/hf_config.h"
#include "testing/compare.h"
#include "testing/model_folders.h"
#include "testing/shared_data.h"
#include "core/error.h"
#include "train/export.h"
#include "train/hf_fused.h"

namespace shardtrain::train {
namespace {

// Loads the HF folder `src` into a sharded store and exports it to `out` in f32 with shards of
// at most `max_shard_bytes`, without a tokenizer (the test models' vocabularies are smaller than
// any); returns its config.
model::LlamaConfig export_folder(const std::string& src, const std::string& out, int64_t max_shard_bytes) {
  const model::LlamaConfig c = model::load_hf_config(src + "/config.json");
  io::HfWeights in(src);
  expose_fused_tensors(in, c);  // Phi-3's qkv_proj and gate_up_proj, split
  auto comm = dist::make_single_rank();
  const model::ModelLayout layout = model::ModelLayout::llama(c, 1);
  fsdp::ShardedUnitStore store(layout, comm.get(), {});
  store.load([&](const model::ParamSpec& p, int64_t first, Tensor& dst) { in.read_range(p.name, first, dst); });
  ExportOptions o;
  o.folder = out;
  o.dtype = DType::kF32;
  o.max_shard_bytes = max_shard_bytes;
  o.with_tokenizer = false;
  export_hf(store, c, *comm, o);
  return c;
}

// export_folder of the HF reference `name` (tests/model/hf_reference).
model::LlamaConfig export_reference(const std::string& out, int64_t max_shard_bytes,
                                    const std::string& name = "gqa_untied") {
  return export_folder(testing::source_dir() + "/tests/model/hf_reference/" + name, out, max_shard_bytes);
}

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

// Every tensor of `in` reads back from `back` bit for bit (as f32).
void expect_same_tensors(const io::HfWeights& in, const io::HfWeights& back) {
  for (const std::string& name : in.names()) {
    const Tensor a = in.files().front()->read_as(name, DType::kF32);
    Tensor b = Tensor::empty(a.shape(), DType::kF32);
    back.read_range(name, 0, b);
    EXPECT_EQ(std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()), 0) << name;
  }
}

class ExportRoundTrip : public ::testing::TestWithParam<std::string> {};

TEST_P(ExportRoundTrip, TensorsAndConfigSurvive) {
  const std::string src = testing::source_dir() + "/tests/model/hf_reference/" + GetParam();
  const std::string out =
      (std::filesystem::temp_directory_path() / ("shardtrain_export_" + std::to_string(::getpid()) + GetParam())).string();
  std::filesystem::remove_all(out);
  const model::LlamaConfig c = export_reference(out, 20000, GetParam());  // several shards for these ~50 KB models
  const io::HfWeights in(src);

  EXPECT_TRUE(std::filesystem::exists(out + "/model.safetensors.index.json"));
  const io::HfWeights back(out);
  EXPECT_EQ(back.names(), in.names()) << "same tensor names (a tied head is not written)";
  expect_same_tensors(in, back);
  const model::LlamaConfig c2 = model::load_hf_config(out + "/config.json");
  EXPECT_EQ(c2.summary(), c.summary());
  EXPECT_EQ(c2.rope.theta, c.rope.theta);
  EXPECT_EQ(c2.rope.scaling.type, c.rope.scaling.type);
  EXPECT_EQ(c2.rope.scaling.original_max_positions, c.rope.scaling.original_max_positions);
  EXPECT_EQ(c2.norm_eps, c.norm_eps);
  // the family's config.json: Phi-3's written back as phi3, with its rope's factors
  const nlohmann::json in_json = read_json(src + "/config.json"), out_json = read_json(out + "/config.json");
  EXPECT_EQ(out_json.at("model_type"), in_json.at("model_type"));
  EXPECT_EQ(c2.rope.scaling.short_factor, c.rope.scaling.short_factor);
  EXPECT_EQ(c2.rope.scaling.long_factor, c.rope.scaling.long_factor);
  EXPECT_EQ(c2.rope.scaling.attention_factor, c.rope.scaling.attention_factor);
  EXPECT_EQ(c2.rope.partial_rotary, c.rope.partial_rotary);
  EXPECT_EQ(c2.sliding_window, c.sliding_window);
  std::filesystem::remove_all(out);
}

INSTANTIATE_TEST_SUITE_P(References, ExportRoundTrip,
                         ::testing::Values("gqa_untied", "mha_tied", "gqa4_llama3_rope", "qwen2_bias",
                                           "mistral_sliding", "ministral_layers", "qwen2_window_layers",
                                           "phi3_longrope", "phi4_partial_rotary"));

// Every HF reference folder, each family's tensors as transformers names them (Gemma's four
// norms, OLMo 2's, Qwen3's QK-norm, Phi-3's fused tensors, ...), loads under the names the
// layout gives (model/hf_names.h) and exports back under the same names, bit for bit.
TEST(ExportRoundTrip, EveryReferenceFolderKeepsItsTensorNames) {
  namespace fs = std::filesystem;
  int folders = 0;
  for (const fs::directory_entry& e : fs::directory_iterator(testing::source_dir() + "/tests/model/hf_reference")) {
    if (!fs::exists(e.path() / "model.safetensors")) continue;
    const std::string name = e.path().filename().string();
    SCOPED_TRACE(name);
    const std::string out =
        (fs::temp_directory_path() / ("shardtrain_export_names_" + std::to_string(::getpid()) + name)).string();
    fs::remove_all(out);
    export_reference(out, int64_t{1} << 30, name);
    const io::HfWeights in(e.path().string()), back(out);
    EXPECT_EQ(back.names(), in.names());
    expect_same_tensors(in, back);
    fs::remove_all(out);
    ++folders;
  }
  EXPECT_GE(folders, 10);
}

// Phi-3's fused tensors whose shape config.json does not imply (here 4 kv heads where the
// weights hold 2) are refused, naming the tensor, both shapes and the keys to check.
TEST(ExportRoundTrip, MisshapenFusedTensorsAreNamed) {
  const std::string src = testing::source_dir() + "/tests/model/hf_reference/phi3_longrope";
  nlohmann::json j = read_json(src + "/config.json");
  j["num_key_value_heads"] = 4;
  const model::LlamaConfig c = model::parse_hf_config(j, "phi3/config.json");
  io::HfWeights in(src);
  try {
    expose_fused_tensors(in, c);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("tensor `model.layers.0.self_attn.qkv_proj.weight` has shape [128, 64], but config.json implies "
                     "[192, 64] (64 rows of model.layers.0.self_attn.q_proj.weight, 64 rows of "
                     "model.layers.0.self_attn.k_proj.weight, 64 rows of model.layers.0.self_attn.v_proj.weight, each "
                     "of hidden_size 64 columns)"),
              std::string::npos)
        << m;
    EXPECT_NE(m.find("phi3_longrope`"), std::string::npos) << m;
  }
  j = read_json(src + "/config.json");
  j["intermediate_size"] = 80;
  io::HfWeights in2(src);
  try {
    expose_fused_tensors(in2, model::parse_hf_config(j, "phi3/config.json"));
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("`model.layers.0.mlp.gate_up_proj.weight` has shape [192, 64], but "
                                         "config.json implies [160, 64]"),
              std::string::npos)
        << e.what();
  }
  // the views read the fused tensor's rows: k_proj is rows 64..95 of qkv_proj
  io::HfWeights in3(src);
  expose_fused_tensors(in3, model::load_hf_config(src + "/config.json"));
  EXPECT_EQ(in3.names(), in.names()) << "views are not listed";
  const Tensor qkv = in3.files().front()->read_as("model.layers.1.self_attn.qkv_proj.weight", DType::kF32);
  Tensor k = Tensor::empty({32, 64}, DType::kF32);
  in3.read_range("model.layers.1.self_attn.k_proj.weight", 0, k);
  EXPECT_EQ(std::memcmp(k.raw_data(), qkv.data<float>() + 64 * 64, k.nbytes()), 0);
  Tensor up_tail = Tensor::empty({64}, DType::kF32);
  in3.read_range("model.layers.1.mlp.up_proj.weight", 95 * 64, up_tail);
  const Tensor gate_up = in3.files().front()->read_as("model.layers.1.mlp.gate_up_proj.weight", DType::kF32);
  EXPECT_EQ(std::memcmp(up_tail.raw_data(), gate_up.data<float>() + 191 * 64, up_tail.nbytes()), 0);
  Tensor past = Tensor::empty({65}, DType::kF32);
  EXPECT_THROW(in3.read_range("model.layers.1.mlp.up_proj.weight", 95 * 64, past), Error);
}

// A Qwen3 folder as transformers writes one: config.json (transformers 4 form) and
// model.safetensors of random f32 tensors under the Hugging Face names, q_norm and k_norm
// included. 2 blocks, width 24, 4 heads of 16 (attention 64 wide), 2 kv heads.
void write_qwen3_folder(const std::string& folder, bool tied, bool bias) {
  std::filesystem::remove_all(folder);
  std::filesystem::create_directories(folder);
  const int64_t V = 67, D = 24, L = 2, N = 4, M = 2, H = 16, F = 40;
  nlohmann::json config = {{"architectures", {"Qwen3ForCausalLM"}}, {"attention_bias", bias},
                           {"attention_dropout", 0.0}, {"head_dim", H}, {"hidden_act", "silu"},
                           {"hidden_size", D}, {"initializer_range", 0.02}, {"intermediate_size", F},
                           {"max_position_embeddings", 64}, {"max_window_layers", 28}, {"model_type", "qwen3"},
                           {"num_attention_heads", N}, {"num_hidden_layers", L}, {"num_key_value_heads", M},
                           {"rms_norm_eps", 1e-6}, {"rope_scaling", nullptr}, {"rope_theta", 1000000.0},
                           {"sliding_window", nullptr}, {"tie_word_embeddings", tied}, {"torch_dtype", "float32"},
                           {"use_sliding_window", false}, {"vocab_size", V}};
  std::ofstream(folder + "/config.json") << config.dump(2);
  std::vector<std::pair<std::string, Tensor>> tensors;
  uint64_t seed = 100;
  auto add = [&](const std::string& name, Shape shape) {
    Tensor t = Tensor::empty(shape, DType::kF32);
    testing::fill_random(t, ++seed, 0.5, 0.3);
    tensors.emplace_back(name, t);
  };
  add("model.embed_tokens.weight", {V, D});
  for (int64_t l = 0; l < L; ++l) {
    const std::string b = "model.layers." + std::to_string(l) + ".";
    add(b + "input_layernorm.weight", {D});
    add(b + "self_attn.q_proj.weight", {N * H, D});
    add(b + "self_attn.k_proj.weight", {M * H, D});
    add(b + "self_attn.v_proj.weight", {M * H, D});
    if (bias) {
      add(b + "self_attn.q_proj.bias", {N * H});
      add(b + "self_attn.k_proj.bias", {M * H});
      add(b + "self_attn.v_proj.bias", {M * H});
    }
    add(b + "self_attn.q_norm.weight", {H});
    add(b + "self_attn.k_norm.weight", {H});
    add(b + "self_attn.o_proj.weight", {D, N * H});
    add(b + "post_attention_layernorm.weight", {D});
    add(b + "mlp.gate_proj.weight", {F, D});
    add(b + "mlp.up_proj.weight", {F, D});
    add(b + "mlp.down_proj.weight", {D, F});
  }
  add("model.norm.weight", {D});
  if (!tied) add("lm_head.weight", {V, D});
  io::write_safetensors(folder + "/model.safetensors", tensors);
}

// A Qwen3 folder loaded into the sharded store and exported gives back its tensors bit for
// bit (q_norm and k_norm among them) and a qwen3 config.json of the same model; the export
// loads again into the same model.
TEST(ExportRoundTrip, Qwen3TensorsAndConfigSurvive) {
  for (const bool bias : {false, true}) {
    SCOPED_TRACE(bias ? "untied, with q/k/v biases" : "tied, no biases");
    const std::string base = (std::filesystem::temp_directory_path() /
                              ("shardtrain_export_qwen3_" + std::to_string(::getpid()) + (bias ? "_bias" : "")))
                                 .string();
    const std::string src = base + "/in", out = base + "/out";
    write_qwen3_folder(src, !bias, bias);
    const model::LlamaConfig c = export_folder(src, out, 20000);
    ASSERT_TRUE(c.qk_norm);
    EXPECT_EQ(c.attention_bias, bias);
    const io::HfWeights in(src);

    const io::HfWeights back(out);
    EXPECT_EQ(back.names(), in.names());
    expect_same_tensors(in, back);
    const nlohmann::json written = read_json(out + "/config.json");
    EXPECT_EQ(written.at("architectures"), nlohmann::json::array({"Qwen3ForCausalLM"}));
    EXPECT_EQ(written.at("model_type"), "qwen3");
    EXPECT_EQ(written.at("head_dim"), 16);
    EXPECT_EQ(written.at("attention_bias"), bias);
    EXPECT_EQ(written.at("tie_word_embeddings"), !bias);
    EXPECT_EQ(written.at("rms_norm_eps"), 1e-6);
    EXPECT_EQ(written.at("rope_theta"), 1e6);
    EXPECT_EQ(written.at("use_sliding_window"), false);
    const model::LlamaConfig c2 = model::load_hf_config(out + "/config.json");
    EXPECT_EQ(c2.summary(), c.summary());
    EXPECT_EQ(model::to_hf_config(c2, "float32"), model::to_hf_config(c, "float32"));
    std::filesystem::remove_all(base);
  }
}

// A SmolLM3, Granite, OLMo 2, Gemma 3 or Gemma 2 folder written by hand (config.json in the transformers 4 form,
// random f32 tensors under the names the family has) exports back bit for bit with its
// family's config.json, which reads back as the same model.
TEST(ExportRoundTrip, SmolLM3GraniteAndOlmo2TensorsAndConfigSurvive) {
  struct Family {
    const char* architecture;
    const char* model_type;
    nlohmann::json keys;  // beside the shape
  };
  const std::vector<Family> families = {
      {"SmolLM3ForCausalLM", "smollm3", {{"no_rope_layers", {1, 0, 1}}, {"tie_word_embeddings", true}}},
      {"GraniteForCausalLM",
       "granite",
       {{"embedding_multiplier", 12.0},
        {"residual_multiplier", 0.22},
        {"attention_multiplier", 0.0625},
        {"logits_scaling", 8.0},
        {"attention_bias", true}}},
      {"Olmo2ForCausalLM", "olmo2", {{"attention_bias", false}, {"tie_word_embeddings", false}}},
      // Gemma 3: sliding and full layers with two ropes, linear scaling on the full ones, its
      // four norms per block and per-head QK-norm, tied
      {"Gemma3ForCausalLM",
       "gemma3_text",
       {{"hidden_activation", "gelu_pytorch_tanh"},
        {"head_dim", 16},
        {"query_pre_attn_scalar", 24},
        {"sliding_window", 8},
        {"layer_types", {"sliding_attention", "sliding_attention", "full_attention"}},
        {"rope_local_base_freq", 10000.0},
        {"rope_scaling", {{"rope_type", "linear"}, {"factor", 8.0}}},
        {"tie_word_embeddings", true}}},
      // Gemma 2: the even layers sliding, both soft-caps, no QK-norm
      {"Gemma2ForCausalLM",
       "gemma2",
       {{"hidden_activation", "gelu_pytorch_tanh"},
        {"head_dim", 16},
        {"query_pre_attn_scalar", 24},
        {"sliding_window", 8},
        {"attn_logit_softcapping", 50.0},
        {"final_logit_softcapping", 30.0},
        {"tie_word_embeddings", false}}},
  };
  for (const Family& f : families) {
    SCOPED_TRACE(f.model_type);
    const std::string base = (std::filesystem::temp_directory_path() /
                              ("shardtrain_export_" + std::string(f.model_type) + "_" + std::to_string(::getpid())))
                                 .string();
    const std::string src = base + "/in", out = base + "/out";
    std::filesystem::remove_all(base);
    std::filesystem::create_directories(src);
    nlohmann::json config = {{"architectures", {f.architecture}},
                             {"model_type", f.model_type},
                             {"hidden_act", "silu"},
                             {"hidden_size", 32},
                             {"intermediate_size", 40},
                             {"max_position_embeddings", 64},
                             {"num_attention_heads", 4},
                             {"num_hidden_layers", 3},
                             {"num_key_value_heads", 2},
                             {"rms_norm_eps", 1e-6},
                             {"rope_theta", 10000.0},
                             {"torch_dtype", "float32"},
                             {"vocab_size", 67}};
    config.update(f.keys);
    if (std::string(f.model_type).starts_with("gemma")) config.erase("hidden_act");  // Gemma reads hidden_activation
    std::ofstream(src + "/config.json") << config.dump(2);
    const model::LlamaConfig c = model::parse_hf_config(config, "in/config.json");
    std::vector<std::pair<std::string, Tensor>> tensors;
    uint64_t seed = 300;
    const model::ModelLayout layout = model::ModelLayout::llama(c, 1);
    for (const model::UnitLayout& u : layout.units())
      for (const model::ParamSpec& p : u.params) {
        Tensor t = Tensor::empty(p.full_shape, DType::kF32);
        testing::fill_random(t, ++seed, 0.5, 0.3);
        tensors.emplace_back(p.name, t);
      }
    io::write_safetensors(src + "/model.safetensors", tensors);
    EXPECT_EQ(export_folder(src, out, 20000).summary(), c.summary());
    const io::HfWeights in(src), back(out);
    EXPECT_EQ(back.names(), in.names());
    expect_same_tensors(in, back);
    const nlohmann::json written = read_json(out + "/config.json");
    EXPECT_EQ(written.at("architectures"), nlohmann::json::array({f.architecture}));
    EXPECT_EQ(written.at("model_type"), f.model_type);
    for (const auto& [key, value] : f.keys.items()) EXPECT_EQ(written.at(key), value) << key;
    const model::LlamaConfig c2 = model::load_hf_config(out + "/config.json");
    EXPECT_EQ(c2.summary(), c.summary());
    EXPECT_EQ(model::to_hf_config(c2, "float32"), model::to_hf_config(c, "float32"));
    std::filesystem::remove_all(base);
  }
}

namespace fs = std::filesystem;

std::string fresh_parent(const std::string& name) {
  const fs::path p = fs::temp_directory_path() / ("shardtrain_export_swap_" + std::to_string(::getpid()) + "_" + name);
  fs::remove_all(p);
  fs::create_directories(p);
  return p.string();
}

std::vector<std::string> names_in(const std::string& folder) {
  std::vector<std::string> names;
  for (const fs::directory_entry& e : fs::directory_iterator(folder)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

TEST(ExportSwap, AnExportReplacesAnOlderOneWhole_3ShardsThen1) {
  const std::string parent = fresh_parent("replace");
  const std::string out = parent + "/hf";
  export_reference(out, 20000);
  ASSERT_TRUE(fs::exists(out + "/model-00003-of-00003.safetensors")) << "the first export has three shards";
  export_reference(out, int64_t{1} << 30);
  EXPECT_EQ(names_in(out), (std::vector<std::string>{"config.json", "model.safetensors"}))
      << "no shard or index of the older export remains";
  EXPECT_EQ(names_in(parent), std::vector<std::string>{"hf"}) << "no staging or old folder remains beside it";
  const io::HfWeights back(out);
  EXPECT_FALSE(back.names().empty());
  fs::remove_all(parent);
}

TEST(ExportSwap, LeftoversOfAnInterruptedExportAreRemovedByTheNext) {
  const std::string parent = fresh_parent("interrupted");
  const std::string out = parent + "/hf";
  export_reference(out, int64_t{1} << 30);
  // killed while writing its staging folder, and another killed between its two renames
  fs::create_directories(out + ".tmp.4242");
  std::ofstream(out + ".tmp.4242/shard-0.partial.safetensors") << "partial";
  fs::create_directories(out + ".old.4243");
  std::ofstream(out + ".old.4243/model-00001-of-00002.safetensors") << "older";
  std::ofstream(parent + "/hf.tmp.notes") << "the user's";  // not digits: not an export's leftover
  export_reference(out, 20000);
  EXPECT_EQ(names_in(parent), (std::vector<std::string>{"hf", "hf.tmp.notes"}));
  EXPECT_TRUE(fs::exists(out + "/model.safetensors.index.json"));
  EXPECT_FALSE(fs::exists(out + "/model.safetensors")) << "the single shard of the previous export is gone";
  fs::remove_all(parent);
}

TEST(ExportSwap, AForeignFileInTheFolderFailsNamingItAndIsKept) {
  const std::string parent = fresh_parent("foreign");
  const std::string out = parent + "/hf";
  export_reference(out, int64_t{1} << 30);
  std::ofstream(out + "/notes.txt") << "the user's";
  std::string error;
  try {
    export_reference(out, 20000);
  } catch (const Error& e) {
    error = e.what();
  }
  EXPECT_NE(error.find("`export.folder` = \"" + out + "\" holds `notes.txt`, which an export does not write"),
            std::string::npos) << error;
  EXPECT_EQ(names_in(out), (std::vector<std::string>{"config.json", "model.safetensors", "notes.txt"}))
      << "the folder is left as it was";
  EXPECT_EQ(names_in(parent), std::vector<std::string>{"hf"}) << "the staging folder is removed";
  fs::remove_all(parent);
}

TEST(ExportSwap, ASymlinkOrAFileAsTheFolderFails) {
  const std::string parent = fresh_parent("symlink");
  fs::create_directories(parent + "/real");
  fs::create_directory_symlink(parent + "/real", parent + "/link");
  std::ofstream(parent + "/file") << "the user's";
  for (const auto& [target, expected] : {std::pair<std::string, std::string>{parent + "/link", "is a symbolic link"},
                                         {parent + "/file", "exists and is not a folder"}}) {
    std::string error;
    try {
      export_reference(target, 20000);
    } catch (const Error& e) {
      error = e.what();
    }
    EXPECT_NE(error.find("`export.folder` = \"" + target + "\" " + expected), std::string::npos) << error;
  }
  EXPECT_TRUE(fs::is_empty(parent + "/real"));
  EXPECT_EQ(names_in(parent), (std::vector<std::string>{"file", "link", "real"}));
  fs::remove_all(parent);
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

TEST(ExportTokenizer, AByteModelCarriesTheByteTokenizersFilesAndIds) {
  const std::string parent = fresh_parent("byte");
  const std::string out = parent + "/hf";
  const model::LlamaConfig c = testing::tiny_generation_config();
  testing::TinyStore s(c, 3);
  testing::write_hf_folder(s, c, out);  // tokenizer_source "": the byte-level tokenizer
  EXPECT_EQ(names_in(out), (std::vector<std::string>{"config.json", "model.safetensors", "special_tokens_map.json",
                                                     "tokenizer.json", "tokenizer_config.json"}));
  for (const auto& [name, text] : data::byte_tokenizer_files()) EXPECT_EQ(read_text(out + "/" + name), text) << name;
  const nlohmann::json config = read_json(out + "/config.json");
  EXPECT_EQ(config["bos_token_id"], 256);
  EXPECT_EQ(config["eos_token_id"], 257);
  EXPECT_EQ(config["vocab_size"], 300);
  EXPECT_EQ(data::load_tokenizer(out, "--tokenizer", "")->fingerprint(), "byte");
  fs::remove_all(parent);
}

TEST(ExportTokenizer, TheByteTokenizerMustFitTheModelsVocabulary) {
  const std::string parent = fresh_parent("small");
  model::LlamaConfig c = testing::tiny_generation_config();
  c.vocab_size = 100;
  testing::TinyStore s(c, 3);
  EXPECT_TRUE(testing::throws_with([&] { testing::write_hf_folder(s, c, parent + "/hf"); },
                                   "export: the byte-level tokenizer (the one built in) has 258 tokens but the "
                                   "model's vocabulary is 100; name the model's own tokenizer"));
  EXPECT_EQ(names_in(parent), std::vector<std::string>{}) << "nothing is left behind";
  fs::remove_all(parent);
}

// A tokenizer folder whose tokenizer_config.json names the byte tokens the other way round
// (BOS 257, EOS 256), so that ids taken from it differ from the byte tokenizer's.
std::string swapped_tokenizer_folder(const std::string& parent) {
  const std::string dir = parent + "/tok";
  fs::create_directories(dir);
  for (const auto& [name, text] : data::byte_tokenizer_files()) std::ofstream(dir + "/" + name) << text;
  std::ofstream(dir + "/tokenizer_config.json")
      << R"({"bos_token": "<|end_of_text|>", "eos_token": "<|begin_of_text|>"})";
  return dir;
}

TEST(ExportTokenizer, ATokenizerFolderIsCopiedAndItsIdsWritten) {
  const std::string parent = fresh_parent("bpe");
  const std::string tok = swapped_tokenizer_folder(parent);
  const model::LlamaConfig c = testing::tiny_generation_config();
  testing::TinyStore s(c, 3);
  testing::write_hf_folder(s, c, parent + "/hf", tok);
  EXPECT_EQ(names_in(parent + "/hf"), (std::vector<std::string>{"config.json", "model.safetensors",
                                                                "special_tokens_map.json", "tokenizer.json",
                                                                "tokenizer_config.json"}));
  EXPECT_EQ(read_text(parent + "/hf/tokenizer_config.json"), read_text(tok + "/tokenizer_config.json"));
  nlohmann::json config = read_json(parent + "/hf/config.json");
  EXPECT_EQ(config["bos_token_id"], 257);
  EXPECT_EQ(config["eos_token_id"], 256);

  // a tokenizer.json by another name is copied as tokenizer.json, with the files beside it
  fs::rename(tok + "/tokenizer.json", tok + "/mine.json");
  testing::write_hf_folder(s, c, parent + "/hf2", tok + "/mine.json");
  EXPECT_EQ(read_text(parent + "/hf2/tokenizer.json"), read_text(tok + "/mine.json"));
  EXPECT_EQ(read_json(parent + "/hf2/config.json")["bos_token_id"], 257);
  EXPECT_EQ(data::BpeTokenizer(parent + "/hf2").bos_id(), 257);
  fs::remove_all(parent);
}

TEST(ExportTokenizer, ACopiedGenerationConfigsIdsGoIntoConfigJson) {
  const std::string parent = fresh_parent("generation");
  const std::string tok = swapped_tokenizer_folder(parent);
  std::ofstream(tok + "/generation_config.json") << R"({"eos_token_id": [256, 7], "temperature": 0.6})";
  const model::LlamaConfig c = testing::tiny_generation_config();
  testing::TinyStore s(c, 3);
  testing::write_hf_folder(s, c, parent + "/hf", tok);
  EXPECT_EQ(read_text(parent + "/hf/generation_config.json"), read_text(tok + "/generation_config.json"));
  const nlohmann::json config = read_json(parent + "/hf/config.json");
  EXPECT_EQ(config["eos_token_id"], nlohmann::json::array({256, 7})) << "as generation_config.json says";
  EXPECT_EQ(config["bos_token_id"], 257) << "generation_config.json has none: the tokenizer's";
  fs::remove_all(parent);
}

TEST(ExportTokenizer, ACheckpointOfTheByteTokenizerExportsItAndABadTokenizerIsNamed) {
  const std::string parent = fresh_parent("checkpoint");
  const model::LlamaConfig c = testing::tiny_generation_config();
  testing::TinyStore s(c, 3);
  const std::string step = testing::write_checkpoint(s, c, parent + "/ck", 4);  // records no tokenizer
  ExportOptions o;
  o.folder = parent + "/hf";
  o.dtype = DType::kF32;
  export_checkpoint(parent + "/ck", o);
  EXPECT_EQ(read_text(parent + "/hf/tokenizer.json"), data::byte_tokenizer_files()[0].second);
  EXPECT_EQ(read_json(parent + "/hf/config.json")["eos_token_id"], 257);
  o.folder = parent + "/hf_bad";
  o.tokenizer_source = parent + "/nonexistent";
  EXPECT_TRUE(testing::throws_with([&] { export_checkpoint(step, o); },
                                   "--tokenizer = `" + parent + "/nonexistent`: no such file or folder; it takes a "
                                   "tokenizer.json or the folder holding one"));
  EXPECT_FALSE(fs::exists(parent + "/hf_bad"));
  fs::remove_all(parent);
}

}  // namespace
}  // namespace shardtrain::train
