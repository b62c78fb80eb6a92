// `shardtrain inspect` (tensors listed and checked against config.json, QK-norm and the SmolLM3,
// Granite and OLMo 2 features shown, missing tensors and pieces named), and what a resumed or
// fine-tuning run says about its tokenizer.
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "io/safetensors.h"
#include "io/safetensors_writer.h"
#include "testing/shardtrain_binary.h"
#include "testing/shared_data.h"

using Result = shardtrain::testing::CommandResult;
using shardtrain::testing::run_shardtrain;

namespace {

TEST(Cli, InspectListsTensorsAndChecksTheShape) {
  const Result r =
      run_shardtrain("inspect " + shardtrain::testing::source_dir() + "/tests/model/hf_reference/gqa4_llama3_rope");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("model.layers.1.self_attn.k_proj.weight"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("[6, 24]"), std::string::npos) << r.output;  // 1 kv head x head dim 6
  EXPECT_NE(r.output.find("with llama3 scaling"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("every parameter present with the expected shape"), std::string::npos) << r.output;
  const Result bad = run_shardtrain("inspect /nonexistent/folder");
  EXPECT_EQ(bad.status, 1);
  EXPECT_NE(bad.output.find("/nonexistent/folder"), std::string::npos) << bad.output;
}

// A Qwen3-style model trained and exported from the command line (model.qk_norm with heads of
// their own): inspect shows the QK-norm in the summary and its weights, and names a missing one.
TEST(Cli, InspectShowsQkNorm) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("shardtrain_cli_inspect_qwen3_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  const Result trained =
      run_shardtrain("train --model.qk_norm=true --model.head_dim=16 --model.dim=40 --model.n_layers=2 "
                     "--model.n_heads=4 --model.n_kv_heads=2 --model.ffn_dim=52 --model.max_seq_len=32 "
                     "--training.seq_len=16 --training.batch_size=2 --training.steps=1 --training.device=cpu "
                     "--eval.batches=1 --sample.tokens=0 --logging.progress=off --logging.level=warn "
                     "--export.dtype=f32 --export.folder=" +
                     (dir / "hf").string() + " --run.output_dir=" + (dir / "run").string());
  ASSERT_EQ(trained.status, 0) << trained.output;
  const Result r = run_shardtrain("inspect " + (dir / "hf").string());
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("4 heads / 2 kv heads (head dim 16, decoupled: attention width 4 x 16 = 64), QK-norm, "
                          "ffn 52"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("QK-norm: self_attn.q_norm.weight and self_attn.k_norm.weight [16] in each block"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("model.layers.1.self_attn.k_norm.weight"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("every parameter present with the expected shape"), std::string::npos) << r.output;

  // the weights rewritten without one block's q_norm
  const std::string file = (dir / "hf" / "model.safetensors").string();
  std::vector<std::pair<std::string, shardtrain::Tensor>> tensors;
  {
    const shardtrain::io::SafetensorsFile f(file);
    for (const shardtrain::io::TensorInfo& t : f.tensors())
      if (t.name != "model.layers.1.self_attn.q_norm.weight")
        tensors.emplace_back(t.name, f.read_as(t.name, shardtrain::DType::kF32));
  }
  shardtrain::io::write_safetensors(file, tensors, {});
  const Result missing = run_shardtrain("inspect " + (dir / "hf").string());
  EXPECT_EQ(missing.status, 1) << missing.output;
  EXPECT_NE(missing.output.find("missing: model.layers.1.self_attn.q_norm.weight"), std::string::npos)
      << missing.output;
  fs::remove_all(dir);
}

// SmolLM3-, Granite- and OLMo 2-style models trained from the command line with their
// `model.*` keys and exported: the folder's config.json names the family, and inspect shows
// each family's feature and finds every weight the family needs.
TEST(Cli, InspectShowsTheNewFamiliesFeatures) {
  namespace fs = std::filesystem;
  struct Family {
    const char* keys;
    const char* architecture;
    std::vector<std::string> shown;
  };
  const std::vector<Family> families = {
      {"--model.no_rope_every=2",
       "SmolLM3ForCausalLM",
       {"no rope on 1 of 2 layers", "no rope (NoPE) on layers 1: q and k attend unrotated there"}},
      {"--model.embedding_multiplier=12 --model.residual_multiplier=0.22 --model.attention_multiplier=0.015625 "
       "--model.logits_scaling=8",
       "GraniteForCausalLM",
       {"scaled (embedding x12, residual x0.22, attention x0.015625, logits /8)",
        "scalings: embeddings x 12, each sublayer's output x 0.22 before its residual add, attention scale "
        "0.015625, logits / 8"}},
      {"--model.post_norms=true --model.qk_norm_whole=true",
       "Olmo2ForCausalLM",
       {"QK-norm over all heads, norms after each sublayer",
        "QK-norm over the whole q and k: self_attn.q_norm.weight [40] and self_attn.k_norm.weight [20]",
        "norms after each sublayer: post_attention_layernorm", "model.layers.1.post_feedforward_layernorm.weight"}},
      {"--model.norm_weight_offset=1 --model.sandwich_norms=true --model.mlp_activation=gelu_tanh "
       "--model.scale_embeddings=true --model.qk_norm=true --model.attention_multiplier=0.125 "
       "--model.sliding_window=4 --model.full_attention_every=2 --model.rope_local_theta=10000",
       "Gemma3ForCausalLM",
       {"norms before and after each sublayer, norms scaled by (1 + weight), GeGLU (tanh GELU), embeddings x "
        "sqrt(dim), sliding layers' rope theta 10000",
        "sliding layers' rope theta 10000 (unscaled)", "norms before and after each sublayer: input_layernorm and "
        "pre_feedforward_layernorm", "every norm scales by (1 + weight)", "MLP: GeGLU",
        "embeddings x sqrt(hidden_size)", "attention scale 0.125 (query_pre_attn_scalar 64)"}},
      {"--model.norm_weight_offset=1 --model.sandwich_norms=true --model.mlp_activation=gelu_tanh "
       "--model.scale_embeddings=true --model.attn_logit_softcapping=50 --model.final_logit_softcapping=30 "
       "--model.sliding_window=4 --model.full_attention_every=2",
       "Gemma2ForCausalLM",
       {"attention scores soft-capped at 50, logits soft-capped at 30",
        "attention scores soft-capped: 50 x tanh(s / 50) before the softmax",
        "logits soft-capped: 30 x tanh(z / 30)"}},
  };
  for (const Family& f : families) {
    SCOPED_TRACE(f.architecture);
    const fs::path dir = fs::temp_directory_path() / ("shardtrain_cli_inspect_family_" + std::to_string(::getpid()));
    fs::remove_all(dir);
    const Result trained = run_shardtrain(
        std::string("train ") + f.keys +
        " --model.dim=40 --model.n_layers=2 --model.n_heads=4 --model.n_kv_heads=2 --model.ffn_dim=52 "
        "--model.max_seq_len=32 --training.seq_len=16 --training.batch_size=2 --training.steps=1 "
        "--training.device=cpu --eval.batches=1 --sample.tokens=0 --logging.progress=off --logging.level=warn "
        "--export.dtype=f32 --export.folder=" +
        (dir / "hf").string() + " --run.output_dir=" + (dir / "run").string());
    ASSERT_EQ(trained.status, 0) << trained.output;
    std::ifstream config(dir / "hf" / "config.json");
    const nlohmann::json j = nlohmann::json::parse(config);
    EXPECT_EQ(j.at("architectures"), nlohmann::json::array({f.architecture}));
    const Result r = run_shardtrain("inspect " + (dir / "hf").string());
    ASSERT_EQ(r.status, 0) << r.output;
    for (const std::string& line : f.shown)
      EXPECT_NE(r.output.find(line), std::string::npos) << line << "\n" << r.output;
    EXPECT_NE(r.output.find("every parameter present with the expected shape"), std::string::npos) << r.output;
    fs::remove_all(dir);
  }
}

// `inspect` exits non-zero when what it reports cannot be loaded (a script checks a folder or
// a checkpoint with it before a run): a Hugging Face folder missing tensors, a checkpoint
// missing pieces; 0 for healthy ones.
TEST(Cli, InspectFailsWhenTensorsOrPiecesAreMissing) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("shardtrain_cli_inspect_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir / "hf");
  const fs::path reference = fs::path(shardtrain::testing::source_dir()) / "tests/model/hf_reference/gqa4_llama3_rope";
  fs::copy_file(reference / "model.safetensors", dir / "hf" / "model.safetensors");
  {
    std::ifstream in(reference / "config.json");
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const size_t at = text.find("\"num_hidden_layers\": 2");
    ASSERT_NE(at, std::string::npos);
    text.replace(at, 22, "\"num_hidden_layers\": 3");  // the file holds 2 layers
    std::ofstream(dir / "hf" / "config.json") << text;
  }
  const Result hf = run_shardtrain("inspect " + (dir / "hf").string());
  EXPECT_EQ(hf.status, 1) << hf.output;
  EXPECT_NE(hf.output.find("missing: model.layers.2.self_attn.q_proj.weight"), std::string::npos) << hf.output;
  EXPECT_NE(hf.output.find("problems (named above); it cannot be loaded as it is"), std::string::npos) << hf.output;

  const Result trained =
      run_shardtrain("train --model.dim=40 --model.n_layers=2 --model.n_heads=4 --model.n_kv_heads=2 "
                     "--model.ffn_dim=52 --model.max_seq_len=32 --training.seq_len=16 "
                     "--training.batch_size=2 --training.steps=1 --training.device=cpu "
                     "--eval.batches=1 --sample.tokens=0 --logging.progress=off --logging.level=warn "
                     "--checkpoint.interval_steps=1 --run.output_dir=" +
                     (dir / "run").string());
  ASSERT_EQ(trained.status, 0) << trained.output;
  const fs::path step = dir / "run" / "checkpoints" / "step_00000001";
  const Result healthy = run_shardtrain("inspect " + (dir / "run" / "checkpoints").string());
  EXPECT_EQ(healthy.status, 0) << healthy.output;
  EXPECT_NE(healthy.output.find("complete: master weights"), std::string::npos) << healthy.output;
  // the rank file rewritten without its first piece
  const std::string file = (step / "rank_00000-of-00001.safetensors").string();
  std::vector<std::pair<std::string, shardtrain::Tensor>> pieces;
  {
    const shardtrain::io::SafetensorsFile f(file);
    for (const shardtrain::io::TensorInfo& t : f.tensors())
      pieces.emplace_back(t.name, f.read_as(t.name, shardtrain::DType::kF32));
  }
  pieces.erase(pieces.begin());
  shardtrain::io::write_safetensors(file, pieces, {});
  const Result incomplete = run_shardtrain("inspect " + step.string());
  EXPECT_EQ(incomplete.status, 1) << incomplete.output;
  EXPECT_NE(incomplete.output.find("INCOMPLETE: 1 problem"), std::string::npos) << incomplete.output;
  EXPECT_NE(incomplete.output.find("1 problem (named above)"), std::string::npos) << incomplete.output;
  fs::remove_all(dir);
}

// A requeued job whose run has finished: resuming trains nothing, says so in one line and
// exits 0 (a requeue loop must not see a failure).
TEST(Cli, ResumingAFinishedRunSucceedsAndSaysSo) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("shardtrain_cli_finished_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  const std::string job = "train --model.dim=40 --model.n_layers=2 --model.n_heads=4 --model.n_kv_heads=2 "
                          "--model.ffn_dim=52 --model.max_seq_len=32 --training.seq_len=16 --training.batch_size=2 "
                          "--training.steps=2 --training.device=cpu --eval.batches=1 --sample.tokens=0 "
                          "--logging.progress=off --checkpoint.interval_steps=1 --checkpoint.resume=auto "
                          "--run.output_dir=" +
                          dir.string();
  const Result first = run_shardtrain(job);
  ASSERT_EQ(first.status, 0) << first.output;
  const Result again = run_shardtrain(job);
  EXPECT_EQ(again.status, 0) << again.output;
  EXPECT_NE(again.output.find("the run is already complete at step 2: checkpoint `" +
                              (dir / "checkpoints" / "step_00000002").string() +
                              "` has done all `training.steps` = 2; nothing to train"),
            std::string::npos)
      << again.output;
  EXPECT_EQ(again.output.find("step     "), std::string::npos) << "no step trained: " << again.output;
  fs::remove_all(dir);
}

// A folder without tokenizer.json: auto takes the byte-level tokenizer, whose 258 ids do not fit
// this model's 67; the error says why that tokenizer, and what data.tokenizer takes.
TEST(Cli, FineTuningWithoutTheModelsTokenizerIsNamed) {
  const std::string hf = shardtrain::testing::source_dir() + "/tests/model/hf_reference/mha_tied";
  const Result r = run_shardtrain("train --model.hf=" + hf);
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.output.find("`model.hf` = `" + hf +
                          "` has a vocabulary of 67, fewer than the 258 tokens of the "
                          "byte-level tokenizer (data.tokenizer = auto, and model.hf `" +
                          hf +
                          "` holds no tokenizer.json; another one: data.tokenizer = the path of a tokenizer.json); "
                          "name the model's own tokenizer with `data.tokenizer`, which takes auto (model.hf's "
                          "tokenizer.json, else the byte-level tokenizer), byte ("),
            std::string::npos)
      << r.output;
}

TEST(Cli, ADataTokenizerThatNamesNothingListsTheValues) {
  const Result r = run_shardtrain("train --data.tokenizer=bytes --training.device=cpu");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.output.find("`data.tokenizer` = `bytes`: no such file or folder; it takes auto (model.hf's "
                          "tokenizer.json, else the byte-level tokenizer), byte (the byte-level tokenizer: 256 bytes "
                          "+ BOS/EOS), or the path of a tokenizer.json or of the folder holding one"),
            std::string::npos)
      << r.output;
}

}  // namespace
