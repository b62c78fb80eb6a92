// `shardtrain generate` on a Hugging Face folder and a checkpoint, its errors, and exports of a
// byte-tokenizer model that generate and transformers use as they are.
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

#ifdef SHARDTRAIN_WITH_CUDA
#include "core/cuda/device.h"
#endif
#include "data/bpe_tokenizer.h"
#include "data/byte_tokenizer.h"
#include "io/safetensors.h"
#include "io/safetensors_writer.h"
#include "testing/model_folders.h"
#include "testing/shardtrain_binary.h"
#include "testing/shared_data.h"
#include "train/generate.h"
#include "train/open_model.h"

using Result = shardtrain::testing::CommandResult;
using shardtrain::testing::run_shardtrain;

namespace {

using shardtrain::train::SampleOptions;

struct SplitResult {
  int status;
  std::string out, err;  // standard output, standard error
};

SplitResult run_split(const std::string& args, const std::string& stdin_file = "/dev/null") {
  const std::string err_file = std::string(SHARDTRAIN_BINARY_DIR) + "/cli_test_stderr_" + std::to_string(::getpid());
  const std::string cmd =
      std::string(SHARDTRAIN_BINARY_DIR) + "/shardtrain " + args + " < " + stdin_file + " 2> " + err_file;
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  std::array<char, 4096> buf;
  while (size_t n = fread(buf.data(), 1, buf.size(), p)) out.append(buf.data(), n);
  const int st = pclose(p);
  std::ifstream e(err_file);
  std::string err((std::istreambuf_iterator<char>(e)), std::istreambuf_iterator<char>());
  std::filesystem::remove(err_file);
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, out, err};
}

// What `shardtrain generate` prints on standard output for these options: the sample the
// library makes from the same folder, then a newline.
std::string expected_output(const std::string& model, const std::string& tokenizer, SampleOptions o) {
  const shardtrain::train::OpenedModel m = shardtrain::train::open_model(model);
  const auto tok = shardtrain::train::open_tokenizer(tokenizer, m);
  o.context_limit = shardtrain::train::ContextLimit::kStop;
  return shardtrain::train::sample(*m.model, *tok, o).text + "\n";
}

// The commands name --device cpu: on a machine with a GPU, auto would sample from a bf16 model.
class CliGenerate : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string base = std::string(SHARDTRAIN_BINARY_DIR) + "/cli_generate_" + std::to_string(::getpid());
    hf_ = new std::string(base + "_hf");
    checkpoints_ = new std::string(base + "_ck");
    shardtrain::testing::TinyStore s(config(), 77);
    shardtrain::testing::write_hf_folder(s, config(), *hf_, "", false);  // without tokenizer files
    shardtrain::testing::write_checkpoint(s, config(), *checkpoints_, 20);
  }
  static void TearDownTestSuite() {
    std::filesystem::remove_all(*hf_);
    std::filesystem::remove_all(*checkpoints_);
    delete hf_;
    delete checkpoints_;
  }
  static shardtrain::model::LlamaConfig config() { return shardtrain::testing::tiny_generation_config(); }
  static std::string* hf_;
  static std::string* checkpoints_;
};
std::string* CliGenerate::hf_ = nullptr;
std::string* CliGenerate::checkpoints_ = nullptr;

SampleOptions sample_options(const std::string& prompt, int64_t tokens, double temperature, int64_t top_k, double top_p,
                             uint64_t seed) {
  SampleOptions o;
  o.prompt = prompt;
  o.tokens = tokens;
  o.temperature = temperature;
  o.top_k = top_k;
  o.top_p = top_p;
  o.seed = seed;
  return o;
}

TEST_F(CliGenerate, HuggingFaceFolderPrintsTheSampleAndItsSpeed) {
  const SplitResult greedy = run_split("generate --device cpu " + *hf_ +
                                       " --tokenizer byte --prompt Hello --tokens 12 "
                                       "--temperature 0");
  ASSERT_EQ(greedy.status, 0) << greedy.err;
  EXPECT_EQ(greedy.out, expected_output(*hf_, "byte", sample_options("Hello", 12, 0, 40, 1, 7)));
  EXPECT_NE(greedy.err.find("tokens/s"), std::string::npos) << greedy.err;
  EXPECT_NE(greedy.err.find("KV cache"), std::string::npos) << greedy.err;
  EXPECT_NE(greedy.err.find("from Hugging Face folder " + *hf_), std::string::npos) << greedy.err;

  const SplitResult recomputed = run_split("generate --device cpu " + *hf_ +
                                           " --tokenizer byte --prompt Hello --tokens 12 "
                                           "--temperature 0 --recompute");
  ASSERT_EQ(recomputed.status, 0) << recomputed.err;
  EXPECT_EQ(recomputed.out, greedy.out) << "the same ids without the cache";
  EXPECT_NE(recomputed.err.find("recomputed every token"), std::string::npos) << recomputed.err;

  const SplitResult sampled = run_split("generate --device cpu " + *hf_ +
                                        " --tokenizer byte --prompt Hello --tokens 20 "
                                        "--temperature 0.9 --top-k 50 --top-p 0.9 --seed 5");
  ASSERT_EQ(sampled.status, 0) << sampled.err;
  EXPECT_EQ(sampled.out, expected_output(*hf_, "byte", sample_options("Hello", 20, 0.9, 50, 0.9, 5)));

  const std::string prompt_file = *hf_ + "_prompt.txt";
  std::ofstream(prompt_file) << "Hello";
  const SplitResult piped = run_split(
      "generate --device cpu " + *hf_ + " --tokenizer byte --prompt - --tokens 12 --temperature 0", prompt_file);
  ASSERT_EQ(piped.status, 0) << piped.err;
  EXPECT_EQ(piped.out, greedy.out) << "--prompt - reads standard input";
  std::filesystem::remove(prompt_file);
}

TEST_F(CliGenerate, CheckpointUsesTheTokenizerItRecorded) {
  // the folder holding `latest`, and its step directory; no tokenizer recorded: bytes
  for (const std::string& path : {*checkpoints_, *checkpoints_ + "/step_00000020"}) {
    const SplitResult r = run_split("generate --device cpu " + path + " --prompt \"The \" --tokens 15 --seed 3");
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_EQ(r.out, expected_output(path, "", sample_options("The ", 15, 0.8, 40, 1, 3))) << path;
    EXPECT_NE(r.err.find("(step 20)"), std::string::npos) << r.err;
  }
}

TEST_F(CliGenerate, BadInputIsNamed) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"generate --device cpu /nonexistent/model --prompt x", "model `/nonexistent/model` does not exist"},
      {"generate --device cpu " + *hf_ + " --tokenizer byte --prompt " + std::string(70, 'x'),
       "the prompt is 71 tokens (with BOS), more than the model's context of max_seq_len = 64 tokens"},
      {"generate --device cpu " + *hf_ + " --prompt x", "holds no tokenizer.json; name one with --tokenizer PATH"},
      {"generate --device cpu " + *hf_ + " --prompt x --tokenizer /nonexistent/tokenizer.json",
       "--tokenizer = `/nonexistent/tokenizer.json`: no such file or folder; it takes a tokenizer.json, the folder "
       "holding one, or `byte`"},
      {"generate --device cpu " + *hf_ + " --tokenizer byte", "--prompt TEXT is required"},
      {"generate --device cpu " + *hf_ + " --tokenizer byte --prompt x --top-p 1.5",
       "top-p must be in (0, 1] (1 is all tokens), found 1.5"},
      {"generate --device cpu " + *hf_ + " --tokenizer byte --prompt x --tokens many",
       "--tokens takes an integer, found `many`"},
      {"generate --device cpu " + *hf_ + " --tokenizer byte --prompt x --temperature -1", "temperature must be >= 0"},
      {"generate --device cpu " + *hf_ + " --tokenizer byte --prompt x --topk 3", "unknown option `--topk`"},
      {"generate --device cpu --prompt x", "expected one MODEL"},
      {"generate " + *hf_ + " --tokenizer byte --prompt x --device tpu",
       "--device takes auto, cpu or cuda, found `tpu`"},
      {"generate --device cpu " + *hf_ + " --tokenizer byte --prompt x --chat",
       "a chat prompt needs a tokenizer with a chat template"},
      {"generate --device cpu " + *hf_ + " --tokenizer byte --prompt x --system y", "--system needs --chat"},
      {"generate --device cpu " + *hf_ + " --tokenizer byte --prompt x --conversation c.json",
       "give --prompt or --conversation, not both"},
      {"generate --device cpu " + *hf_ + " --tokenizer byte --conversation c.json --system y",
       "a --conversation file holds its own system message"},
      {"generate --device cpu " + *hf_ + " --tokenizer byte --conversation /nonexistent/c.json",
       "cannot open `/nonexistent/c.json` (--conversation)"},
  };
  for (const auto& [args, needle] : cases) {
    const SplitResult r = run_split(args);
    EXPECT_EQ(r.status, 1) << args;
    EXPECT_NE(r.err.find(needle), std::string::npos) << args << "\n" << r.err;
  }
  // a prompt that fills the context exactly: one token, then the context is full
  const SplitResult full =
      run_split("generate --device cpu " + *hf_ + " --tokenizer byte --prompt " + std::string(63, 'x'));
  ASSERT_EQ(full.status, 0) << full.err;
  EXPECT_NE(full.err.find("generate: 1 tokens"), std::string::npos) << full.err;
  EXPECT_NE(full.err.find("stopped: the context is full (max_seq_len = 64 tokens)"), std::string::npos) << full.err;
}

// --device cuda where no GPU can serve: the error says why (open_model_cuda_test runs the
// command on a GPU).
TEST_F(CliGenerate, DeviceCudaWithoutAGpuIsNamed) {
#ifdef SHARDTRAIN_WITH_CUDA
  if (shardtrain::cuda::device_count() > 0) GTEST_SKIP() << "a GPU is visible";
  const std::string needle = "--device cuda, but no usable CUDA device is visible";
#else
  const std::string needle = "--device cuda, but this build has no CUDA backend";
#endif
  const SplitResult r = run_split("generate " + *hf_ + " --tokenizer byte --prompt x --device cuda");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find(needle), std::string::npos) << r.err;
}

// A small CPU job of the built-in data and tokenizer, saving a checkpoint at its last step.
std::string small_job(const std::string& output_dir) {
  return "train --model.dim=40 --model.n_layers=2 --model.n_heads=4 --model.n_kv_heads=2 --model.ffn_dim=52 "
         "--model.max_seq_len=32 --training.seq_len=16 --training.batch_size=2 --training.steps=2 "
         "--training.device=cpu --eval.batches=1 --sample.tokens=0 --logging.progress=off "
         "--checkpoint.interval_steps=2 --run.output_dir=" +
         output_dir;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// A byte-tokenizer model's exports (at the end of training, and `shardtrain export` of its
// checkpoint) carry the byte-level tokenizer and its ids, and `generate` samples from the
// export with no --tokenizer exactly as from the checkpoint.
TEST(CliByteExport, GenerateOnTheExportNeedsNoTokenizerFlag) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("shardtrain_cli_byte_export_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  const Result train =
      run_shardtrain(small_job(dir.string()) + " --export.folder=" + (dir / "end").string() + " --export.dtype=f32");
  ASSERT_EQ(train.status, 0) << train.output;
  EXPECT_NE(train.output.find("tokenizer: the byte-level tokenizer (data.tokenizer = auto, and no model.hf)"),
            std::string::npos)
      << train.output;
  const std::string out = (dir / "hf").string();
  const Result exported = run_shardtrain("export " + (dir / "checkpoints").string() + " " + out + " --dtype f32");
  ASSERT_EQ(exported.status, 0) << exported.output;
  for (const std::string& folder : {(dir / "end").string(), out}) {
    for (const auto& [name, text] : shardtrain::data::byte_tokenizer_files())
      EXPECT_EQ(read_text(folder + "/" + name), text) << folder << "/" << name;
    const nlohmann::json config = nlohmann::json::parse(read_text(folder + "/config.json"));
    EXPECT_EQ(config["bos_token_id"], 256) << folder;
    EXPECT_EQ(config["eos_token_id"], 257) << folder;
  }
  const std::string args = " --prompt \"The \" --tokens 12 --seed 3";
  const SplitResult from_export = run_split("generate --device cpu " + out + args);
  ASSERT_EQ(from_export.status, 0) << from_export.err;
  const SplitResult from_checkpoint = run_split("generate --device cpu " + (dir / "checkpoints").string() + args);
  ASSERT_EQ(from_checkpoint.status, 0) << from_checkpoint.err;
  EXPECT_EQ(from_export.out, from_checkpoint.out);
  EXPECT_EQ(from_export.out.rfind("The ", 0), 0u) << from_export.out;
  fs::remove_all(dir);
}

// data.tokenizer = auto with a model.hf folder that holds no tokenizer.json trains with the
// byte-level tokenizer, logs why, and its export carries that tokenizer.
TEST(CliByteExport, AutoFallsBackToTheByteTokenizerForAFolderWithoutOne) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("shardtrain_cli_auto_byte_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  const std::string hf = (dir / "model").string();
  const shardtrain::model::LlamaConfig c = shardtrain::testing::tiny_generation_config();
  shardtrain::testing::TinyStore s(c, 9);
  shardtrain::testing::write_hf_folder(s, c, hf, "", false);
  ASSERT_FALSE(fs::exists(hf + "/tokenizer.json"));
  const Result r = run_shardtrain("train --model.hf=" + hf +
                                  " --training.seq_len=16 --training.batch_size=2 --training.steps=1 "
                                  "--training.device=cpu --eval.batches=1 --sample.tokens=0 --logging.progress=off "
                                  "--run.output_dir=" +
                                  (dir / "run").string() + " --export.folder=" + (dir / "out").string());
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("tokenizer: the byte-level tokenizer (data.tokenizer = auto, and model.hf `" + hf +
                          "` holds no tokenizer.json; another one: data.tokenizer = the path of a tokenizer.json)"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(read_text((dir / "out" / "tokenizer.json").string()), shardtrain::data::byte_tokenizer_files()[0].second);
  fs::remove_all(dir);
}

TEST(CliGenerateShared, HuggingFaceFolderWithTheLlama3Tokenizer) {
  ST_REQUIRE_SHARED_DATA(dir);
  // a random model with Llama 3's vocabulary, exported with its tokenizer files
  shardtrain::model::LlamaConfig c = shardtrain::testing::tiny_generation_config();
  c.vocab_size = 128256;
  c.dim = 16;
  c.n_heads = 2;
  c.n_kv_heads = 1;
  c.tie_embeddings = true;
  const std::string hf = std::string(SHARDTRAIN_BINARY_DIR) + "/cli_generate_llama3_" + std::to_string(::getpid());
  shardtrain::testing::TinyStore s(c, 5);
  shardtrain::testing::write_hf_folder(s, c, hf, dir + "/tokenizers/llama3");
  const SplitResult r = run_split("generate --device cpu " + hf + " --prompt \"In the beginning\" --tokens 8 --seed 2");
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, expected_output(hf, "", sample_options("In the beginning", 8, 0.8, 40, 1, 2)));
  EXPECT_EQ(r.out.rfind("In the beginning", 0), 0u) << r.out;
  // --chat: the message goes through the template (its BOS, no other) and only the reply is
  // printed, ending at the end of the turn
  const SplitResult chat =
      run_split("generate --device cpu " + hf + " --chat --system \"Be brief.\" --prompt Hello --tokens 6 --seed 4");
  EXPECT_EQ(chat.status, 0) << chat.err;
  {
    const shardtrain::train::OpenedModel m = shardtrain::train::open_model(hf);
    const auto tok = shardtrain::train::open_tokenizer("", m);
    SampleOptions o = sample_options("", 6, 0.8, 40, 1, 4);
    const shardtrain::train::ChatPrompt p = shardtrain::train::chat_prompt(*tok, "Be brief.", "Hello");
    o.prompt = p.text;
    o.stop_ids = p.stop_ids;
    o.add_bos = false;
    o.context_limit = shardtrain::train::ContextLimit::kStop;
    const shardtrain::train::SampleResult expected = shardtrain::train::sample(*m.model, *tok, o);
    EXPECT_EQ(expected.prompt_tokens, static_cast<int64_t>(tok->encode(p.text).size()));
    EXPECT_EQ(chat.out, expected.text.substr(p.text.size()) + "\n");
    EXPECT_NE(chat.err.find("prompt " + std::to_string(expected.prompt_tokens) + " tokens"), std::string::npos)
        << chat.err;
  }
  // --conversation: a whole conversation (as a chat data line) goes through the template
  const std::string file = hf + "/conversation.json";
  std::ofstream(file) << R"({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
      {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Bye?"}], "tools": null})";
  const SplitResult conv =
      run_split("generate --device cpu " + hf + " --conversation " + file + " --tokens 6 --seed 4");
  EXPECT_EQ(conv.status, 0) << conv.err;
  {
    const shardtrain::train::OpenedModel m = shardtrain::train::open_model(hf);
    const auto tok = shardtrain::train::open_tokenizer("", m);
    SampleOptions o = sample_options("", 6, 0.8, 40, 1, 4);
    const std::vector<shardtrain::data::ChatMessage> messages = {
        {"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello."}, {"user", "Bye?"}};
    const shardtrain::train::ChatPrompt p =
        shardtrain::train::chat_prompt(*tok, messages, shardtrain::data::jinja::Value::none());
    EXPECT_NE(p.text.find("Hello.<|eot_id|>"), std::string::npos) << p.text;
    o.prompt = p.text;
    o.stop_ids = p.stop_ids;
    o.add_bos = false;
    o.context_limit = shardtrain::train::ContextLimit::kStop;
    const shardtrain::train::SampleResult expected = shardtrain::train::sample(*m.model, *tok, o);
    EXPECT_EQ(conv.out, expected.text.substr(p.text.size()) + "\n");
    EXPECT_NE(conv.err.find("prompt " + std::to_string(expected.prompt_tokens) + " tokens"), std::string::npos)
        << conv.err;
  }
  std::ofstream(file) << R"({"messages": [{"role": "user"}]})";
  const SplitResult bad = run_split("generate --device cpu " + hf + " --conversation " + file);
  EXPECT_EQ(bad.status, 1);
  EXPECT_NE(bad.err.find("conversation.json` (--conversation): message 0: no field `content`"), std::string::npos)
      << bad.err;
  std::filesystem::remove_all(hf);
}

}  // namespace
