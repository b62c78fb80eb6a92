// Training data from Parquet files reads as the same data in JSONL does: pyarrow turns a JSONL
// file's rows into a Parquet file, and documents, token files and SFT sequences (prompt/response,
// and chat in the Llama 3 template) must come out identical from both.
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "data/bpe_tokenizer.h"
#include "data/byte_tokenizer.h"
#include "data/corpus.h"
#include "data/sft.h"
#include "data/tokenize_file.h"
#include "testing/compare.h"
#include "testing/shared_data.h"
#include "train/training_data.h"

namespace shardtrain::data {
namespace {

using testing::throws_with;

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("shardtrain_pqdata_" + std::to_string(::getpid()) + "_" + name))
      .string();
}

std::string write(const std::string& name, const std::string& contents) {
  const std::string path = temp_path(name);
  std::ofstream(path, std::ios::binary) << contents;
  return path;
}

bool have_pyarrow() { return std::system("python3 -c 'import pyarrow' > /dev/null 2>&1") == 0; }

// The rows of JSONL file `jsonl` as a Parquet file (pyarrow infers the schema), `rows_per_group`
// rows to a row group.
std::string to_parquet(const std::string& jsonl, const std::string& name, int rows_per_group) {
  const std::string out = temp_path(name);
  const std::string script = write(name + ".py",
                                   "import json, sys, pyarrow as pa, pyarrow.parquet as pq\n"
                                   "rows = [json.loads(l) for l in open(sys.argv[1], encoding='utf-8') if l.strip()]\n"
                                   "pq.write_table(pa.Table.from_pylist(rows), sys.argv[2], compression='zstd',\n"
                                   "               row_group_size=int(sys.argv[3]))\n");
  const std::string command = "python3 " + script + " " + jsonl + " " + out + " " + std::to_string(rows_per_group);
  EXPECT_EQ(std::system(command.c_str()), 0) << command;
  return out;
}

std::string documents_jsonl(int n, bool with_null) {
  std::string s;
  for (int i = 0; i < n; ++i) {
    if (with_null && i % 9 == 4) {
      s += "{\"text\": null, \"id\": " + std::to_string(i) + "}\n";
      continue;
    }
    std::string text = "document ";
    text += std::to_string(i);
    text += ": ";
    text.append(static_cast<size_t>(i % 37), static_cast<char>('a' + i % 26));
    if (i % 5 == 0) text += " ünïcode 日本語\nsecond line";
    const nlohmann::json j = {{"text", text}, {"id", i}};
    s += j.dump() + "\n";
  }
  return s;
}

TEST(ParquetData, DocumentsAreTheTextColumnsRowsWithoutNulls) {
  if (!have_pyarrow()) GTEST_SKIP() << "python3 cannot import pyarrow (scripts/setup.sh --tests installs it)";
  const std::string parquet = to_parquet(write("docs.jsonl", documents_jsonl(200, true)), "docs.parquet", 64);
  const std::vector<std::string> expected = load_jsonl_documents(write("plain.jsonl", documents_jsonl(200, false)), "text");
  std::vector<std::string> without_nulls;
  for (size_t i = 0; i < expected.size(); ++i)
    if (i % 9 != 4) without_nulls.push_back(expected[i]);
  EXPECT_EQ(load_parquet_documents(parquet, "text"), without_nulls);
  EXPECT_TRUE(throws_with([&] { load_parquet_documents(parquet, "body"); },
                          "no field `body` (set data.text_field to the field holding the text; the file's fields are "
                          "id (int64), text (string))"));
  EXPECT_TRUE(throws_with([&] { load_parquet_documents(parquet, "id"); }, "field `id` is int64, expected a string"));
}

TEST(ParquetData, TokenizesAsTheSameJsonl) {
  if (!have_pyarrow()) GTEST_SKIP() << "python3 cannot import pyarrow (scripts/setup.sh --tests installs it)";
  const std::string jsonl = write("tok.jsonl", documents_jsonl(500, false));
  const std::string parquet = to_parquet(jsonl, "tok.parquet", 128);
  const ByteTokenizer t;
  TokenizeFileOptions o;
  o.num_threads = 2;
  o.format = TextFormat::kJsonl;
  tokenize_file(t, jsonl, temp_path("from_jsonl.tok"), o);
  o.format = TextFormat::kParquet;
  const TokenizeFileStats st = tokenize_file(t, parquet, temp_path("from_parquet.tok"), o);
  EXPECT_EQ(st.documents, 500u);
  const std::vector<int32_t> a = TokenFile(temp_path("from_jsonl.tok")).read_all();
  EXPECT_FALSE(a.empty());
  EXPECT_EQ(TokenFile(temp_path("from_parquet.tok")).read_all(), a);
}

std::string prompt_response_jsonl(int n) {
  std::string s;
  for (int i = 0; i < n; ++i) {
    std::string prompt = "Q", response = "A: ";
    prompt += std::to_string(i);
    prompt += ": what is that + 1?\n";
    response += std::to_string(i + 1);
    response.append(static_cast<size_t>(i % 13), '!');
    s += nlohmann::json({{"prompt", prompt}, {"response", response}}).dump();
    s += "\n";
  }
  return s;
}

void expect_same_sequences(const SftData& a, const SftData& b) {
  EXPECT_EQ(a.train_sequences().ids, b.train_sequences().ids);
  EXPECT_EQ(a.train_sequences().counted, b.train_sequences().counted);
  EXPECT_EQ(a.held_out_sequences().ids, b.held_out_sequences().ids);
  EXPECT_EQ(a.held_out_sequences().counted, b.held_out_sequences().counted);
  EXPECT_GT(a.train_sequences().count, 0);
}

TEST(ParquetData, SftPromptResponseAsTheSameJsonl) {
  if (!have_pyarrow()) GTEST_SKIP() << "python3 cannot import pyarrow (scripts/setup.sh --tests installs it)";
  const std::string jsonl = write("sft.jsonl", prompt_response_jsonl(150));
  const std::string parquet = to_parquet(jsonl, "sft.parquet", 40);
  const ByteTokenizer t;
  SftOptions o;
  o.seq_len = 96;
  o.seed = 3;
  o.val_fraction = 0.1;
  const SftData from_parquet(parquet, t, o);
  expect_same_sequences(from_parquet, SftData(jsonl, t, o));
  EXPECT_NE(from_parquet.summary().find("150 examples"), std::string::npos) << from_parquet.summary();
  o.response_field = "answer";
  EXPECT_TRUE(throws_with([&] { SftData(parquet, t, o); },
                          "no field `answer` (data.response_field names it); the file's fields are prompt (string), "
                          "response (string)"));
  const std::string empty_response =
      to_parquet(write("empty_response.jsonl", "{\"prompt\": \"a\", \"response\": \"b\"}\n"
                                               "{\"prompt\": \"c\", \"response\": \"\"}\n"),
                 "empty_response.parquet", 10);
  o.response_field = "response";
  EXPECT_TRUE(throws_with([&] { SftData(empty_response, t, o); }, "empty_response.parquet` row 2: field `response` is empty"));
}

TEST(ParquetData, SftChatAsTheSameJsonlInTheLlama3Template) {
  ST_REQUIRE_SHARED_DATA(dir);
  if (!have_pyarrow()) GTEST_SKIP() << "python3 cannot import pyarrow (scripts/setup.sh --tests installs it)";
  std::string lines;
  for (int i = 0; i < 60; ++i) {
    nlohmann::json messages = nlohmann::json::array();
    if (i % 3 == 0) messages.push_back({{"role", "system"}, {"content", "Answer briefly."}});
    for (int t = 0; t < 1 + i % 3; ++t) {
      messages.push_back({{"role", "user"}, {"content", "question " + std::to_string(i) + "." + std::to_string(t)}});
      messages.push_back({{"role", "assistant"}, {"content", "answer " + std::to_string(i * t) + " ünïcode"}});
    }
    lines += nlohmann::json({{"messages", messages}}).dump() + "\n";
  }
  const std::string jsonl = write("chat.jsonl", lines);
  const std::string parquet = to_parquet(jsonl, "chat.parquet", 25);
  const BpeTokenizer t(dir + "/tokenizers/llama3");
  SftOptions o;
  o.format = SftFormat::kChat;
  o.seq_len = 256;
  o.seed = 5;
  o.val_fraction = 0.1;
  expect_same_sequences(SftData(parquet, t, o), SftData(jsonl, t, o));
}

TEST(ParquetData, TheFormatFollowsTheFile) {
  if (!have_pyarrow()) GTEST_SKIP() << "python3 cannot import pyarrow (scripts/setup.sh --tests installs it)";
  train::DataSection d;
  d.source = to_parquet(write("fmt.jsonl", documents_jsonl(20, false)), "fmt.parquet", 100);
  EXPECT_EQ(train::resolve_data_format(d), "parquet");
  d.format = "sft";
  EXPECT_EQ(train::resolve_data_format(d), "sft");
  d.format = "jsonl";
  EXPECT_TRUE(throws_with([&] { train::resolve_data_format(d); },
                          "is a Parquet file, which reads as `data.format` = parquet (documents in data.text_field), sft "
                          "or chat, not jsonl"));
  d.source = write("fmt2.jsonl", documents_jsonl(3, false));
  d.format = "parquet";
  EXPECT_TRUE(throws_with([&] { train::resolve_data_format(d); }, "is not a Parquet file"));
}

// A folder or a file-name pattern names several Parquet files: their rows one after another in
// name order, other files skipped, as the concatenated JSONL would read.
TEST(ParquetData, FoldersAndPatternsReadTheirParquetFilesInNameOrder) {
  if (!have_pyarrow()) GTEST_SKIP() << "python3 cannot import pyarrow (scripts/setup.sh --tests installs it)";
  namespace fs = std::filesystem;
  const std::string dir = temp_path("shards");
  fs::create_directories(dir);
  const std::string a = prompt_response_jsonl(70), b = prompt_response_jsonl(45);
  // b's examples first by name: train-00000 holds b, train-00001 holds a
  fs::rename(to_parquet(write("b.jsonl", b), "b.parquet", 20), dir + "/train-00000-of-00002.parquet");
  fs::rename(to_parquet(write("a.jsonl", a), "a.parquet", 30), dir + "/train-00001-of-00002.parquet");
  fs::rename(to_parquet(write("t.jsonl", prompt_response_jsonl(5)), "t.parquet", 30), dir + "/test-00000-of-00001.parquet");
  std::ofstream(dir + "/README.md") << "# a dataset card\n";
  const ByteTokenizer t;
  SftOptions o;
  o.seq_len = 96;
  o.seed = 9;
  o.val_fraction = 0.1;
  const std::string concatenated = write("ba.jsonl", b + a);
  expect_same_sequences(SftData(dir + "/train-*.parquet", t, o), SftData(concatenated, t, o));
  EXPECT_EQ(source_files(dir + "/train-*.parquet").size(), 2u);
  EXPECT_EQ(parquet_files(dir).size(), 3u);  // the folder: every Parquet file, not the card
  EXPECT_TRUE(throws_with([&] { source_files(dir + "/valid-*.parquet"); }, "valid-*.parquet` matches no file"));

  train::DataSection d;
  d.source = dir + "/train-*.parquet";
  EXPECT_EQ(train::resolve_data_format(d), "parquet");
  d.source = dir;
  EXPECT_EQ(train::resolve_data_format(d), "parquet");
  d.format = "text";
  EXPECT_TRUE(throws_with([&] { train::resolve_data_format(d); }, "names Parquet files, which read as"));
  d.format = "auto";
  d.source = dir + "/*.md";
  EXPECT_TRUE(throws_with([&] { train::resolve_data_format(d); }, "none of them a token file"));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace shardtrain::data
