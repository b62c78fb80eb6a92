// The `shardtrain` command: exit codes and messages for bad input.
#include <array>
#include <sstream>
#include <vector>
#include <cstdio>
#include <string>

#include <gtest/gtest.h>

namespace {

struct Result {
  int status;
  std::string output;
};

Result run(const std::string& args) {
  const std::string cmd = std::string(SHARDTRAIN_BINARY_DIR) + "/shardtrain " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  std::array<char, 4096> buf;
  while (size_t n = fread(buf.data(), 1, buf.size(), p)) out.append(buf.data(), n);
  const int st = pclose(p);
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, out};
}

TEST(Cli, UnknownKeyFailsNamingIt) {
  const Result r = run("train --model.widht=3");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.output.find("error: override `--model.widht=3`: unknown config key `model.widht`"), std::string::npos)
      << r.output;
}

TEST(Cli, ImpossibleShapeFails) {
  const Result r = run("train --model.n_heads=7");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.output.find("`model.n_heads` (7) must divide `model.dim` (256)"), std::string::npos) << r.output;
}

TEST(Cli, MissingConfigFileFails) {
  const Result r = run("train /nonexistent/job.toml");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.output.find("/nonexistent/job.toml"), std::string::npos) << r.output;
}

TEST(Cli, UnknownCommandAndHelp) {
  EXPECT_EQ(run("trian").status, 2);
  const Result h = run("help");
  EXPECT_EQ(h.status, 0);
  EXPECT_NE(h.output.find("print-config"), std::string::npos);
  const Result p = run("print-config --training.steps=5");
  EXPECT_EQ(p.status, 0);
  EXPECT_NE(p.output.find("steps = 5  # override"), std::string::npos) << p.output;
}

}  // namespace

#include <fstream>

#include <nlohmann/json.hpp>

#include "testing/shared_data.h"

namespace {

TEST(Cli, TokenizePrintIdsMatchesGoldenIds) {
  ST_REQUIRE_SHARED_DATA(dir);
  // the first 50 golden web lines (single-line verses) through the command line
  std::ifstream golden(dir + "/tokenizer_tests/llama3_golden_web.jsonl");
  const std::string input = std::string(SHARDTRAIN_BINARY_DIR) + "/cli_tokenize_input.txt";
  std::ofstream in(input);
  std::vector<std::string> expected;
  std::string line;
  while (expected.size() < 50 && std::getline(golden, line)) {
    const nlohmann::json j = nlohmann::json::parse(line);
    const std::string text = j["text"];
    if (text.find('\n') != std::string::npos) continue;
    in << text << "\n";
    std::string ids;
    for (const auto& id : j["ids"]) {
      if (!ids.empty()) ids += ' ';
      ids += std::to_string(id.get<int>());
    }
    expected.push_back(ids);
  }
  in.close();
  const Result r = run("tokenize --tokenizer " + dir + "/tokenizers/llama3 --print-ids < " + input);
  ASSERT_EQ(r.status, 0) << r.output;
  std::istringstream out(r.output);
  for (size_t i = 0; i < expected.size(); ++i) {
    ASSERT_TRUE(std::getline(out, line)) << "missing output line " << i;
    EXPECT_EQ(line, expected[i]) << "line " << i;
  }
}

TEST(Cli, TokenizeNeedsATokenizer) {
  const Result r = run("tokenize --print-ids");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.output.find("--tokenizer PATH is required"), std::string::npos) << r.output;
}

}  // namespace

namespace {

TEST(Cli, InspectListsTensorsAndChecksTheShape) {
  const Result r = run("inspect " + shardtrain::testing::source_dir() + "/tests/model/hf_reference/gqa4_llama3_rope");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("model.layers.1.self_attn.k_proj.weight"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("[6, 24]"), std::string::npos) << r.output;  // 1 kv head x head dim 6
  EXPECT_NE(r.output.find("with llama3 scaling"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("every parameter present with the expected shape"), std::string::npos) << r.output;
  const Result bad = run("inspect /nonexistent/folder");
  EXPECT_EQ(bad.status, 1);
  EXPECT_NE(bad.output.find("/nonexistent/folder"), std::string::npos) << bad.output;
}

TEST(Cli, FineTuningWithoutTheModelsTokenizerIsNamed) {
  const Result r = run("train --model.hf=" + shardtrain::testing::source_dir() + "/tests/model/hf_reference/mha_tied");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.output.find("tokenizer.json"), std::string::npos) << r.output;
}

}  // namespace

TEST(Cli, PlanReadsAHuggingFaceFolderAndTakesRanks) {
  const std::string hf = shardtrain::testing::source_dir() + "/tests/model/hf_reference/gqa4_llama3_rope";
  const Result r = run("plan --model.hf=" + hf + " --training.seq_len=16 --ranks 4");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("ranks: 4 (GPUs"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("estimated peak"), std::string::npos) << r.output;
  const Result bad = run("plan --ranks 0");
  EXPECT_EQ(bad.status, 1);
  EXPECT_NE(bad.output.find("--ranks must be at least 1"), std::string::npos) << bad.output;
}
