// Config loading: TOML, overrides, and errors that name the key.
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include <unistd.h>

#include "core/error.h"
#include "model/hf_config.h"
#include "testing/shared_data.h"
#include "train/config.h"
#include "train/job.h"
#include "train/model_shape.h"

namespace shardtrain::train {
namespace {

std::string error_of(const std::string& toml, const std::vector<std::string>& overrides) {
  std::string path;
  if (!toml.empty()) {
    path = (std::filesystem::temp_directory_path() / ("shardtrain_config_test_" + std::to_string(::getpid()) + ".toml")).string();
    std::ofstream(path) << toml;
  }
  try {
    (void)load_config(path, overrides);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Config, DefaultsAreValid) {
  const LoadedConfig c = load_config("", {});
  EXPECT_EQ(c.config.model.dim, 256);
  EXPECT_EQ(c.sources.at("model.dim"), ValueSource::kDefault);
  EXPECT_NE(describe(c).find("dim = 256"), std::string::npos);
  EXPECT_NE(reference_table().find("`training.steps`"), std::string::npos);
}

TEST(Config, FileThenOverrides) {
  const std::string path = (std::filesystem::temp_directory_path() / "shardtrain_config_ok.toml").string();
  std::ofstream(path) << "[model]\ndim = 64\nn_heads = 4\nn_kv_heads = 2\n[optimizer]\nlr = 1\n";
  const LoadedConfig c = load_config(path, {"--model.dim=128", "training.steps=70", "--data.source=x.txt"});
  EXPECT_EQ(c.config.model.dim, 128);
  EXPECT_EQ(c.config.model.n_heads, 4);
  EXPECT_DOUBLE_EQ(c.config.optimizer.lr, 1.0);  // integer accepted for a float key
  EXPECT_EQ(c.config.training.steps, 70);
  EXPECT_EQ(c.config.data.source, "x.txt");
  EXPECT_EQ(c.sources.at("model.dim"), ValueSource::kOverride);
  EXPECT_EQ(c.sources.at("model.n_heads"), ValueSource::kFile);
}

TEST(Config, UnknownKeySuggestsNearest) {
  const std::string e = error_of("", {"--model.n_head=4"});
  EXPECT_NE(e.find("unknown config key `model.n_head`"), std::string::npos) << e;
  EXPECT_NE(e.find("did you mean `model.n_heads`"), std::string::npos) << e;
  const std::string f = error_of("[trainng]\nsteps = 3\n", {});
  EXPECT_NE(f.find("`trainng.steps`"), std::string::npos) << f;
  EXPECT_NE(f.find("training.steps"), std::string::npos) << f;
}

TEST(Config, WrongTypesNameTheKey) {
  std::string e = error_of("", {"--training.steps=many"});
  EXPECT_NE(e.find("`training.steps` expects an integer, found `many`"), std::string::npos) << e;
  e = error_of("[model]\ndim = \"wide\"\n", {});
  EXPECT_NE(e.find("`model.dim` expects an integer, found a string"), std::string::npos) << e;
  e = error_of("", {"--model.tie_embeddings=maybe"});
  EXPECT_NE(e.find("model.tie_embeddings"), std::string::npos) << e;
}

TEST(Config, ImpossibleValuesNameTheKeys) {
  std::string e = error_of("", {"--model.dim=100", "--model.n_heads=8"});
  EXPECT_NE(e.find("`model.n_heads` (8) must divide `model.dim` (100)"), std::string::npos) << e;
  e = error_of("", {"--model.n_kv_heads=3"});
  EXPECT_NE(e.find("`model.n_kv_heads` (3) must divide `model.n_heads` (8)"), std::string::npos) << e;
  e = error_of("", {"--training.batch_size=0"});
  EXPECT_NE(e.find("`training.batch_size` must be > 0"), std::string::npos) << e;
  e = error_of("", {"--training.seq_len=512"});
  EXPECT_NE(e.find("exceeds `model.max_seq_len`"), std::string::npos) << e;
  e = error_of("", {"--schedule.type=exp"});
  EXPECT_NE(e.find("`schedule.type` must be one of cosine, linear, sqrt, constant"), std::string::npos) << e;
  e = error_of("", {"--training.deterministic=true", "--training.gemm_selection=timed"});
  EXPECT_NE(e.find("`training.deterministic` needs `training.gemm_selection` = \"heuristic\" (found \"timed\")"),
            std::string::npos)
      << e;
  EXPECT_EQ(error_of("", {"--training.deterministic=true"}), "");
  e = error_of("", {"--sample.top_p=0"});
  EXPECT_NE(e.find("`sample.top_p` must be in (0, 1], found 0"), std::string::npos) << e;
  EXPECT_EQ(error_of("", {"--sample.top_p=0.9"}), "");
  e = error_of("[model\n", {});
  EXPECT_NE(e.find("config `"), std::string::npos) << e;
}

TEST(Config, PresetsAreKnownNamesAndNotWithModelHf) {
  const LoadedConfig c = load_config("", {"--model.preset=llama3.1-8b", "--training.seq_len=8192"});
  EXPECT_EQ(c.config.model.preset, "llama3.1-8b");
  // the preset's 131072 positions bound the sequence, not model.max_seq_len's 256
  EXPECT_EQ(c.config.model.max_seq_len, 256);
  std::string e = error_of("", {"--model.preset=llama-8b"});
  EXPECT_NE(e.find("`model.preset` = \"llama-8b\" is not a built-in model shape; the presets are llama3.2-1b, "),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("llama2-70b"), std::string::npos) << e;
  e = error_of("[model]\nhf = \"models/Llama-3.1-8B\"\npreset = \"llama3.1-8b\"\n", {});
  EXPECT_NE(e.find("`model.preset` (\"llama3.1-8b\") and `model.hf` (\"models/Llama-3.1-8B\") both give the "
                   "model's shape; set one"),
            std::string::npos)
      << e;
  e = error_of("", {"--model.preset=llama2-7b", "--training.seq_len=8192"});
  EXPECT_NE(e.find("`training.seq_len` (8192) exceeds the max_position_embeddings (4096) of `model.preset` = "
                   "\"llama2-7b\""),
            std::string::npos)
      << e;
  EXPECT_EQ(error_of("", {"--model.preset=llama2-7b", "--training.seq_len=4096"}), "");
  // tensor parallelism divides the preset's heads, not the shape keys': 3.2 3B has 24 heads, 8 kv heads
  e = error_of("", {"--model.preset=llama3.2-3b", "--parallel.tensor_parallel=16"});
  EXPECT_NE(e.find("`parallel.tensor_parallel` (16) must divide the heads (24), kv heads (8) and FFN width (8192) of "
                   "`model.preset` = \"llama3.2-3b\""),
            std::string::npos)
      << e;
  EXPECT_EQ(error_of("", {"--model.preset=llama3.2-3b", "--parallel.tensor_parallel=8"}), "");
  // the key's help names every preset
  const std::string help = describe(load_config("", {}));
  for (const char* name : {"llama3.2-1b", "llama3.2-3b", "llama3.1-8b", "llama3.1-70b", "llama3.1-405b", "llama2-7b",
                           "llama2-13b", "llama2-70b"})
    EXPECT_NE(help.find(name), std::string::npos) << name;
}

// parallel.context_parallel: checked against the keys it cannot run with before anything is
// allocated, each error naming both keys.
TEST(Config, ContextParallelismRefusesWhatTheRingCannotRun) {
  EXPECT_EQ(error_of("", {"--parallel.context_parallel=2", "--training.seq_len=64"}), "");
  std::string e = error_of("", {"--parallel.context_parallel=3", "--training.seq_len=64"});
  EXPECT_NE(e.find("a sequence of 64 tokens does not divide into them: make training.seq_len a multiple of 2 x "
                   "parallel.context_parallel = 6"),
            std::string::npos)
      << e;
  e = error_of("", {"--parallel.context_parallel=2", "--parallel.tensor_parallel=2", "--training.seq_len=64"});
  EXPECT_NE(e.find("`parallel.context_parallel` (2) with `parallel.tensor_parallel` (2)"), std::string::npos) << e;
  // packed documents run through the ring
  EXPECT_EQ(error_of("", {"--parallel.context_parallel=2", "--data.document_mask=on", "--training.seq_len=64"}), "");
  e = error_of("", {"--parallel.context_parallel=2", "--training.fp8_attention=true", "--training.seq_len=64"});
  EXPECT_NE(e.find("`parallel.context_parallel` (2) with `training.fp8_attention` = true"), std::string::npos) << e;
  e = error_of("", {"--parallel.context_parallel=0"});
  EXPECT_NE(e.find("parallel.context_parallel"), std::string::npos) << e;
  // 1 is off: none of these apply
  EXPECT_EQ(error_of("", {"--data.document_mask=on", "--training.seq_len=63"}), "");
}

// model.head_dim: heads of a width of their own (Mistral-Nemo's shape), 0 for dim / n_heads.
TEST(Config, HeadDimDecouplesTheHeadsFromTheWidth) {
  const std::vector<std::string> shape = {"--model.dim=100", "--model.n_heads=8", "--model.n_kv_heads=4"};
  std::string e = error_of("", shape);
  EXPECT_NE(e.find("`model.n_heads` (8) must divide `model.dim` (100); change one of them, or set `model.head_dim`"),
            std::string::npos)
      << e;
  std::vector<std::string> with = shape;
  with.push_back("--model.head_dim=16");
  EXPECT_EQ(error_of("", with), "");
  with.back() = "--model.head_dim=7";
  e = error_of("", with);
  EXPECT_NE(e.find("`model.head_dim` = 7 must be even for rotary embeddings"), std::string::npos) << e;
  with.back() = "--model.head_dim=-2";
  e = error_of("", with);
  EXPECT_NE(e.find("`model.head_dim`"), std::string::npos) << e;

  ModelSection m;
  m.dim = 100;
  m.n_heads = 8;
  m.n_kv_heads = 4;
  m.head_dim = 16;
  const model::LlamaConfig c = llama_config(m, 258);
  EXPECT_EQ(c.head_dim(), 16);
  EXPECT_EQ(c.q_dim(), 128);
  EXPECT_EQ(c.kv_dim(), 64);
  m.head_dim = 0;
  m.dim = 128;
  EXPECT_EQ(llama_config(m, 258).head_dim(), 16);
  EXPECT_FALSE(llama_config(m, 258).head_dim_decoupled());
}

// model.sliding_window and model.full_attention_every: the layers they choose, with the shape
// keys and with a preset, and their errors.
TEST(Config, SlidingWindowKeysChooseTheLayers) {
  ModelSection m;
  m.n_layers = 6;
  m.sliding_window = 32;
  auto windows = [](const model::LlamaConfig& c) {
    std::vector<int64_t> w;
    for (int64_t l = 0; l < c.n_layers; ++l) w.push_back(c.window_of(l));
    return w;
  };
  EXPECT_EQ(windows(llama_config(m, 258)), (std::vector<int64_t>{32, 32, 32, 32, 32, 32}));
  m.full_attention_every = 2;  // Gemma 2: every other layer full
  EXPECT_EQ(windows(llama_config(m, 258)), (std::vector<int64_t>{32, 0, 32, 0, 32, 0}));
  m.full_attention_every = 3;
  EXPECT_EQ(windows(llama_config(m, 258)), (std::vector<int64_t>{32, 32, 0, 32, 32, 0}));
  m.sliding_window = 0;
  m.full_attention_every = 0;
  EXPECT_EQ(llama_config(m, 258).sliding_window, 0);
  m.preset = "llama3.2-1b";  // 16 layers: 5 and 11 full with N = 6 (Gemma 3)
  m.sliding_window = 1024;
  m.full_attention_every = 6;
  const model::LlamaConfig p = llama_config(m, 258);
  EXPECT_EQ(p.sliding_layer_count(), 14);
  EXPECT_EQ(p.window_of(5), 0);
  EXPECT_EQ(p.window_of(11), 0);
  EXPECT_EQ(p.window_of(15), 1024);

  EXPECT_EQ(error_of("", {"--model.sliding_window=64", "--model.full_attention_every=4"}), "");
  std::string e = error_of("", {"--model.full_attention_every=2"});
  EXPECT_NE(e.find("`model.full_attention_every` = 2 chooses the full-attention layers among sliding ones, but "
                   "`model.sliding_window` is 0"),
            std::string::npos)
      << e;
  e = error_of("", {"--model.sliding_window=64", "--model.full_attention_every=1"});
  EXPECT_NE(e.find("`model.full_attention_every` = 1 makes every layer attend fully"), std::string::npos) << e;
  e = error_of("", {"--model.sliding_window=-3"});
  EXPECT_NE(e.find("`model.sliding_window`"), std::string::npos) << e;
  e = error_of("", {"--model.sliding_window=64", "--model.hf=some/folder"});
  EXPECT_NE(e.find("`model.sliding_window` = 64 with `model.hf` = \"some/folder\": the folder's config.json decides"),
            std::string::npos)
      << e;
}

// model.qk_norm: Qwen3's per-head norms of q and k, off by default, with heads of their own.
TEST(Config, QkNormReachesTheModelAndComposesWithHeadDim) {
  EXPECT_FALSE(llama_config(load_config("", {}).config.model, 258).qk_norm);
  const LoadedConfig l = load_config("", {"--model.qk_norm=true", "--model.dim=64", "--model.n_heads=4",
                                          "--model.n_kv_heads=2", "--model.head_dim=32"});
  const model::LlamaConfig c = llama_config(l.config.model, 258);
  EXPECT_TRUE(c.qk_norm);
  EXPECT_EQ(c.head_dim(), 32);
  EXPECT_EQ(c.q_dim(), 128);
  EXPECT_NE(c.summary().find("QK-norm"), std::string::npos) << c.summary();
  model::LlamaConfig without = c;
  without.qk_norm = false;
  EXPECT_EQ(c.num_parameters() - without.num_parameters(), c.n_layers * 2 * 32);  // q_norm, k_norm per block
  const std::string e = error_of("", {"--model.qk_norm=yes"});
  EXPECT_NE(e.find("model.qk_norm"), std::string::npos) << e;
}

// The SmolLM3, Granite and OLMo 2 keys reach the model; they are off by default, refused
// beside a preset or a folder (whose shape is its own), and a mix that no Hugging Face family
// has is refused before training (checkpoints and exports write a config.json).
TEST(Config, FamilyKeysReachTheModel) {
  const model::LlamaConfig plain = llama_config(load_config("", {}).config.model, 258);
  EXPECT_EQ(plain.nope_layer_count(), 0);
  EXPECT_FALSE(plain.granite_scaled());
  EXPECT_FALSE(plain.post_norms || plain.qk_norm_whole);
  const model::LlamaConfig smol =
      llama_config(load_config("", {"--model.no_rope_every=4", "--model.n_layers=8"}).config.model, 258);
  EXPECT_EQ(smol.nope_layers, std::vector<bool>({false, false, false, true, false, false, false, true}));
  const model::LlamaConfig granite =
      llama_config(load_config("", {"--model.embedding_multiplier=12", "--model.residual_multiplier=0.22",
                                    "--model.attention_multiplier=0.015625", "--model.logits_scaling=8"})
                       .config.model,
                   258);
  EXPECT_EQ(granite.embedding_multiplier, 12.0);
  EXPECT_EQ(granite.residual_multiplier, 0.22);
  EXPECT_EQ(granite.attention_scale(), 0.015625);
  EXPECT_EQ(granite.logits_scaling, 8.0);
  const model::LlamaConfig olmo =
      llama_config(load_config("", {"--model.post_norms=true", "--model.qk_norm_whole=true"}).config.model, 258);
  EXPECT_TRUE(olmo.post_norms);
  EXPECT_TRUE(olmo.qk_norm_whole);
  EXPECT_EQ(olmo.num_parameters() - plain.num_parameters(), plain.n_layers * (plain.q_dim() + plain.kv_dim()));

  std::string e = error_of("", {"--model.no_rope_every=4", "--model.preset=llama3.2-1b"});
  EXPECT_NE(e.find("`model.no_rope_every` is set, but `model.preset` gives the model's shape"), std::string::npos) << e;
  e = error_of("", {"--model.logits_scaling=8", "--model.hf=some/folder"});
  EXPECT_NE(e.find("`model.logits_scaling` is set, but `model.hf` gives the model's shape"), std::string::npos) << e;
  e = error_of("", {"--model.qk_norm=true", "--model.qk_norm_whole=true"});
  EXPECT_NE(e.find("`model.qk_norm` (per head, Qwen3) and `model.qk_norm_whole` (over all heads, OLMo 2) both set"),
            std::string::npos)
      << e;
  e = error_of("", {"--model.attention_multiplier=-1"});
  EXPECT_NE(e.find("model.attention_multiplier"), std::string::npos) << e;
  auto shape_error = [](std::vector<std::string> args) {
    try {
      (void)llama_config(load_config("", args).config.model, 258);
    } catch (const Error& err) {
      return std::string(err.what());
    }
    return std::string();
  };
  e = shape_error({"--model.post_norms=true"});
  EXPECT_NE(e.find("the `model.*` keys: OLMo 2 has both norms after each sublayer (post_norms) and QK-norm over the "
                   "whole q and k (qk_norm_whole)"),
            std::string::npos)
      << e;
  e = shape_error({"--model.no_rope_every=2", "--model.logits_scaling=2"});
  EXPECT_NE(e.find("combines features of several Hugging Face families (SmolLM3's NoPE layers, Granite's "
                   "scalings)"),
            std::string::npos)
      << e;
}

// Packed documents beside soft-capped attention scores (Gemma 2) are refused at launch on a GPU
// in bf16 or f16, naming the keys that help; on the CPU, in f32 or without a cap they are taken.
TEST(Config, PackedDocumentsWithCappedScoresAreRefusedOnAGpuInBf16) {
  JobConfig c = load_config("", {"--data.document_mask=on"}).config;
  model::LlamaConfig capped;
  capped.attn_logit_softcapping = 50;
  try {
    check_documents_with_capped_scores(c, true, Device::cuda(0), DType::kBF16, capped);
    ADD_FAILURE() << "no error";
  } catch (const Error& x) {
    EXPECT_NE(std::string(x.what()).find("`data.document_mask` (on: packed documents attend only to themselves) with "
                                         "attention scores soft-capped at 50 (Gemma 2) in bf16 on a GPU"),
              std::string::npos)
        << x.what();
    EXPECT_NE(std::string(x.what()).find("data.packing = false"), std::string::npos) << x.what();
  }
  EXPECT_NO_THROW(check_documents_with_capped_scores(c, true, Device::cpu(), DType::kF32, capped));
  EXPECT_NO_THROW(check_documents_with_capped_scores(c, true, Device::cuda(0), DType::kF32, capped));
  EXPECT_NO_THROW(check_documents_with_capped_scores(c, false, Device::cuda(0), DType::kBF16, capped));
  EXPECT_NO_THROW(check_documents_with_capped_scores(c, true, Device::cuda(0), DType::kBF16, model::LlamaConfig{}));
}

// model.extend_context and model.rope_theta_scale lengthen a preset's context and scale its
// rotary base (LongRoPE and a shorter context refused); beside the shape keys they are refused.
TEST(Config, ExtendContextLengthensAPresetsContext) {
  std::string e = error_of("", {"--model.preset=llama3.1-8b", "--training.seq_len=524288"});
  EXPECT_NE(e.find("exceeds the max_position_embeddings (131072) of `model.preset` = \"llama3.1-8b\""),
            std::string::npos) << e;
  EXPECT_NE(e.find("`model.extend_context`"), std::string::npos) << e;
  const JobConfig j = load_config("", {"--model.preset=llama3.1-8b", "--training.seq_len=524288",
                                       "--model.extend_context=524288", "--model.rope_theta_scale=8"})
                          .config;
  const model::LlamaConfig c = llama_config(j.model, 128256);
  EXPECT_EQ(c.max_seq_len, 524288);
  EXPECT_DOUBLE_EQ(c.rope.theta, 8 * 500000.0);
  EXPECT_EQ(c.rope.scaling.type, ops::RopeScalingType::kLlama3);  // kept: it applies on top
  const nlohmann::json hf = model::to_hf_config(c, "bfloat16");
  EXPECT_EQ(hf.at("max_position_embeddings"), 524288);
  EXPECT_DOUBLE_EQ(hf.at("rope_theta").get<double>(), 4e6);

  model::LlamaConfig longrope = c;
  longrope.rope.scaling.type = ops::RopeScalingType::kLongRope;
  try {
    extend_context(j.model, longrope, "the folder");
    ADD_FAILURE() << "no error";
  } catch (const Error& x) {
    EXPECT_NE(std::string(x.what()).find("the folder uses LongRoPE"), std::string::npos) << x.what();
  }
  e = error_of("", {"--model.preset=llama3.1-8b", "--model.extend_context=4096", "--training.seq_len=2048"});
  EXPECT_EQ(e, "");  // the preset is checked when its shape is made
  try {
    llama_config(load_config("", {"--model.preset=llama3.1-8b", "--model.extend_context=4096",
                                  "--training.seq_len=2048"}).config.model, 128256);
    ADD_FAILURE() << "no error";
  } catch (const Error& x) {
    EXPECT_NE(std::string(x.what()).find("`model.extend_context` = 4096 is shorter than `model.preset` = "
                                         "\"llama3.1-8b\"'s own context (max_position_embeddings 131072)"),
              std::string::npos) << x.what();
  }
  for (const char* key : {"--model.extend_context=1024", "--model.rope_theta_scale=2"}) {
    e = error_of("", {key});
    EXPECT_NE(e.find("a model made by the shape keys has its context in `model.max_seq_len`"), std::string::npos)
        << e;
  }
}

// Gemma 3's keys reach the model (with its linear rope scaling on the full layers and the
// sliding layers' rope base), are refused beside a preset, and go together.
// model.rotary_fraction: Phi-4-mini's partial rotary from scratch, exported as phi3; an odd
// number of rotated dimensions, a fraction outside (0, 1] and the key beside model.hf refused.
TEST(Config, RotaryFractionReachesTheModel) {
  const model::LlamaConfig c =
      llama_config(load_config("", {"--model.dim=64", "--model.n_heads=4", "--model.rotary_fraction=0.75"})
                       .config.model,
                   258);
  EXPECT_EQ(c.rope.partial_rotary, 0.75);
  EXPECT_EQ(c.rotary_dim(), 12);
  EXPECT_TRUE(c.fused_projections);
  const nlohmann::json hf = model::to_hf_config(c, "float32");
  EXPECT_EQ(hf.at("model_type"), "phi3");
  EXPECT_EQ(hf.at("partial_rotary_factor"), 0.75);
  EXPECT_FALSE(llama_config(load_config("", {}).config.model, 258).fused_projections);
  std::string e = error_of("", {"--model.rotary_fraction=0", "--model.dim=64", "--model.n_heads=4"});
  EXPECT_NE(e.find("`model.rotary_fraction` must be in (0, 1], found 0"), std::string::npos) << e;
  e = error_of("", {"--model.rotary_fraction=0.5", "--model.hf=some/folder"});
  EXPECT_NE(e.find("`model.rotary_fraction` is set, but `model.hf` gives the model's shape"), std::string::npos) << e;
  model::LlamaConfig odd = c;
  odd.rope.partial_rotary = 0.625;  // 10 of 16: even, accepted
  EXPECT_NO_THROW(odd.validate("model."));
  odd.rope.partial_rotary = 0.5625;  // 9 of 16
  try {
    odd.validate("model.");
    ADD_FAILURE() << "no error";
  } catch (const Error& x) {
    EXPECT_NE(std::string(x.what()).find("`model.rotary_fraction` = 0.5625 rotates int(16 x 0.5625) = 9 dimensions"),
              std::string::npos)
        << x.what();
  }
}

TEST(Config, Gemma3KeysReachTheModel) {
  const std::vector<std::string> gemma = {
      "--model.norm_weight_offset=1",      "--model.sandwich_norms=true",   "--model.mlp_activation=gelu_tanh",
      "--model.scale_embeddings=true",     "--model.qk_norm=true",          "--model.attention_multiplier=0.0625",
      "--model.sliding_window=64",         "--model.full_attention_every=6", "--model.rope_local_theta=10000",
      "--model.rope_theta=1000000",        "--model.rope_scaling=linear",   "--model.rope_scaling_factor=8",
      "--model.n_layers=6"};
  const model::LlamaConfig c = llama_config(load_config("", gemma).config.model, 258);
  EXPECT_EQ(c.norm_weight_offset, 1.0);
  EXPECT_TRUE(c.sandwich_norms);
  EXPECT_EQ(c.mlp_activation, ops::GluActivation::kGeluTanh);
  EXPECT_TRUE(c.scale_embeddings);
  EXPECT_EQ(c.rope_local_theta, 10000.0);
  EXPECT_EQ(c.rope.scaling.type, ops::RopeScalingType::kLinear);
  EXPECT_EQ(c.rope.scaling.factor, 8.0);
  EXPECT_EQ(c.rope_of(0).theta, 10000.0);
  EXPECT_EQ(c.rope_of(5).theta, 1000000.0);
  EXPECT_EQ(model::to_hf_config(c, "float32").at("model_type"), "gemma3_text");
  const model::LlamaConfig plain = llama_config(load_config("", {}).config.model, 258);
  EXPECT_FALSE(plain.gemma_features());
  // Gemma 2: without QK-norm and the sliding layers' rope, with soft-capping
  const model::LlamaConfig two =
      llama_config(load_config("", {"--model.norm_weight_offset=1", "--model.sandwich_norms=true",
                                    "--model.mlp_activation=gelu_tanh", "--model.scale_embeddings=true",
                                    "--model.attn_logit_softcapping=50", "--model.final_logit_softcapping=30",
                                    "--model.sliding_window=64", "--model.full_attention_every=2"})
                       .config.model,
                   258);
  EXPECT_EQ(two.attn_logit_softcapping, 50.0);
  EXPECT_EQ(two.final_logit_softcapping, 30.0);
  EXPECT_EQ(model::to_hf_config(two, "float32").at("model_type"), "gemma2");
  std::string e2 = error_of("", {"--model.final_logit_softcapping=30", "--model.hf=some/folder"});
  EXPECT_NE(e2.find("`model.final_logit_softcapping` is set, but `model.hf` gives the model's shape"),
            std::string::npos)
      << e2;

  std::string e = error_of("", {"--model.sandwich_norms=true", "--model.preset=llama3.2-1b"});
  EXPECT_NE(e.find("`model.sandwich_norms` is set, but `model.preset` gives the model's shape"), std::string::npos)
      << e;
  e = error_of("", {"--model.mlp_activation=gelu"});
  EXPECT_NE(e.find("model.mlp_activation"), std::string::npos) << e;
  e = error_of("", {"--model.sandwich_norms=true", "--model.post_norms=true"});
  EXPECT_NE(e.find("`model.post_norms` (norms after each sublayer only, OLMo 2) and `model.sandwich_norms` (before "
                   "and after, Gemma) both set"),
            std::string::npos)
      << e;
  try {
    (void)llama_config(load_config("", {"--model.mlp_activation=gelu_tanh"}).config.model, 258);
    FAIL() << "expected an error";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("the `model.*` keys: Gemma (gemma3_text with per-head QK-norm, gemma2 "
                                           "without) has all of (1 + weight) norms"),
              std::string::npos)
        << err.what();
  }
}

TEST(Config, APresetGivesTheTrainedShape) {
  ModelSection m;
  m.preset = "llama3.2-1b";
  m.dim = 64;  // the shape keys give way, as they do to model.hf
  const model::LlamaConfig c = llama_config(m, 258);
  EXPECT_EQ(c.dim, 2048);
  EXPECT_EQ(c.num_parameters(), 1'235'814'400);
  m.preset = "llama2-7b";
  try {
    llama_config(m, 128256);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("the tokenizer has 128256 tokens but `model.preset` = \"llama2-7b\" has a "
                                         "vocabulary of 32000"),
              std::string::npos)
        << e.what();
  }
}

TEST(Config, TimeLimitsAreDurations) {
  EXPECT_EQ(parse_duration_seconds(""), 0);
  EXPECT_EQ(parse_duration_seconds("3h50m"), 3 * 3600 + 50 * 60);
  EXPECT_EQ(parse_duration_seconds("90m"), 5400);
  EXPECT_EQ(parse_duration_seconds("1.5h"), 5400);
  EXPECT_EQ(parse_duration_seconds("600s"), 600);
  EXPECT_EQ(parse_duration_seconds("2h5m30s"), 7530);
  EXPECT_EQ(parse_duration_seconds(".5m"), 30);
  for (const char* bad : {"90", "3x", "-1m", "m", "1m2h", "1h1h", "1h 2m", "inf", "0s", "1.5"}) {
    const std::string e = error_of("", {std::string("--training.time_limit=") + bad});
    EXPECT_NE(e.find("`training.time_limit` = \"" + std::string(bad) + "\""), std::string::npos) << bad << ": " << e;
  }
  EXPECT_EQ(error_of("", {"--training.time_limit=23h59m"}), "");
}

}  // namespace
}  // namespace shardtrain::train

namespace shardtrain::train {
namespace {

TEST(Config, ShippedDefaultFileEqualsBuiltInDefaults) {
  const LoadedConfig file = load_config(testing::source_dir() + "/configs/default.toml", {});
  const LoadedConfig builtin = load_config("", {});
  // describe() prints every value; only the source column may differ
  std::string a = describe(file), b = describe(builtin);
  for (std::string* s : {&a, &b}) {
    std::string out;
    for (size_t pos = 0; pos < s->size();) {
      size_t end = s->find('\n', pos);
      if (end == std::string::npos) end = s->size();
      const std::string line = s->substr(pos, end - pos);
      out += line.substr(0, line.find("  # ")) + "\n";
      pos = end + 1;
    }
    *s = out;
  }
  EXPECT_EQ(a, b) << "configs/default.toml is stale: regenerate it with `shardtrain print-config`";
  // every key is written out, so a newly added key cannot go missing from the file
  for (const auto& [key, source] : file.sources)
    EXPECT_EQ(source, ValueSource::kFile)
        << key << " is missing from configs/default.toml: regenerate it with `shardtrain print-config`";
}

TEST(Config, ShippedJobFilesLoad) {
  // every ready job in configs/ parses and passes validation (their paths are placeholders)
  size_t n = 0;
  for (const auto& e : std::filesystem::directory_iterator(testing::source_dir() + "/configs")) {
    if (e.path().extension() != ".toml") continue;
    EXPECT_NO_THROW(validate(load_config(e.path().string(), {}).config)) << e.path();
    ++n;
  }
  EXPECT_GE(n, 3u);
}

}  // namespace
}  // namespace shardtrain::train
