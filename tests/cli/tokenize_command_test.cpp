// `shardtrain tokenize`: Llama 3 ids through the command line against the golden ids, a missing
// tokenizer named, and a folder tokenized file by file.
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
  const Result r = run_shardtrain("tokenize --tokenizer " + dir + "/tokenizers/llama3 --print-ids < " + input);
  ASSERT_EQ(r.status, 0) << r.output;
  std::istringstream out(r.output);
  for (size_t i = 0; i < expected.size(); ++i) {
    ASSERT_TRUE(std::getline(out, line)) << "missing output line " << i;
    EXPECT_EQ(line, expected[i]) << "line " << i;
  }
}

TEST(Cli, TokenizeNeedsATokenizer) {
  const Result r = run_shardtrain("tokenize --print-ids");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.output.find("--tokenizer PATH is required"), std::string::npos) << r.output;
}

std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// A folder of shards tokenizes file by file into OUTPUT/<name>.tok, each as the file alone
// would, its format found per file; the dataset card is skipped.
TEST(Cli, TokenizeAFolderFileByFile) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("shardtrain_cli_tok_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir / "in");
  std::ofstream(dir / "in" / "train-00000.jsonl") << "{\"text\": \"first shard\"}\n{\"text\": \"more\"}\n";
  std::ofstream(dir / "in" / "train-00001.jsonl") << "{\"text\": \"second shard\"}\n";
  std::ofstream(dir / "in" / "notes.txt") << "a line\nanother line\n";
  std::ofstream(dir / "in" / "README.md") << "# a dataset card\n";
  const Result r = run_shardtrain("tokenize --tokenizer byte " + (dir / "in").string() + " " + (dir / "out").string());
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("[3/3]"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("3 files, 5 documents"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(dir / "out" / "README.tok")) << "the card is not data";
  EXPECT_FALSE(fs::exists(dir / "out" / "README.md.tok"));
  for (const char* name : {"train-00000", "train-00001", "notes"}) {
    const std::string in = (dir / "in" / name).string() + (std::string(name) == "notes" ? ".txt" : ".jsonl");
    const std::string alone = (dir / (std::string(name) + ".tok")).string();
    ASSERT_EQ(run_shardtrain("tokenize --tokenizer byte " + in + " " + alone).status, 0);
    const std::string a = file_bytes(alone), b = file_bytes((dir / "out" / (std::string(name) + ".tok")).string());
    EXPECT_FALSE(a.empty());
    EXPECT_TRUE(a == b) << name;
  }
  // several files at once (each with its share of the threads): the same token files
  const Result at_once = run_shardtrain("tokenize --tokenizer byte --files 3 --threads 3 " + (dir / "in").string() +
                                        " " + (dir / "out3").string());
  ASSERT_EQ(at_once.status, 0) << at_once.output;
  EXPECT_NE(at_once.output.find("tokenize: 3 files at once, 1 thread each"), std::string::npos) << at_once.output;
  EXPECT_NE(at_once.output.find("3 files, 5 documents"), std::string::npos) << at_once.output;
  for (const char* name : {"train-00000.tok", "train-00001.tok", "notes.tok"})
    EXPECT_TRUE(file_bytes((dir / "out" / name).string()) == file_bytes((dir / "out3" / name).string())) << name;
  // again with --skip-existing: the finished files are kept, a missing one is made
  fs::remove(dir / "out" / "notes.tok");
  const Result again = run_shardtrain("tokenize --tokenizer byte --skip-existing " + (dir / "in").string() + " " +
                                      (dir / "out").string());
  ASSERT_EQ(again.status, 0) << again.output;
  EXPECT_NE(again.output.find("3 files (2 already there), 5 documents"), std::string::npos) << again.output;
  EXPECT_TRUE(file_bytes((dir / "out" / "notes.tok").string()) == file_bytes((dir / "notes.tok").string()));
  // a pattern takes only its matches
  const Result p = run_shardtrain("tokenize --tokenizer byte '" + (dir / "in" / "train-*.jsonl").string() + "' " +
                                  (dir / "out2").string());
  ASSERT_EQ(p.status, 0) << p.output;
  EXPECT_NE(p.output.find("2 files, 3 documents"), std::string::npos) << p.output;
  fs::remove_all(dir);
}

}  // namespace
