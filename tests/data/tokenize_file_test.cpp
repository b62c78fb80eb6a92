// Token files: writer/reader round trips, tokenize_file on lines, JSONL and whole files with
// 1 and several threads (identical bytes), and header/size validation errors.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/error.h"
#include "data/bpe_tokenizer.h"
#include "data/byte_tokenizer.h"
#include "data/tokenize_file.h"
#include "testing/shared_data.h"

namespace shardtrain::data {
namespace {

namespace fs = std::filesystem;

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

class TokenFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("shardtrain_tokfile_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  std::string write(const std::string& name, const std::string& bytes) const {
    std::ofstream(path(name), std::ios::binary) << bytes;
    return path(name);
  }
  // Opening `file` fails with a message containing `part`.
  static void expect_open_error(const std::string& file, const std::string& part) {
    try {
      TokenFile t(file);
      ADD_FAILURE() << "no error, expected one containing `" << part << "`";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    }
  }
  fs::path dir_;
};

// What tokenize_file should produce for one document per line.
std::vector<int32_t> expected_line_ids(const Tokenizer& t, const std::string& text) {
  std::vector<int32_t> ids;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) continue;
    if (t.bos_id() >= 0) ids.push_back(t.bos_id());
    const std::vector<int32_t> doc = t.encode(line);
    ids.insert(ids.end(), doc.begin(), doc.end());
    if (t.eos_id() >= 0) ids.push_back(t.eos_id());
  }
  return ids;
}

TEST(TokenFileNames, TokenFilesAndSourcesAreNamedWithoutTheirSuffixes) {
  EXPECT_EQ(token_file_name("c4/c4-train.00000-of-01024.json.gz"), "c4-train.00000-of-01024.tok");
  EXPECT_EQ(token_file_name("a/b.parquet"), "b.tok");
  EXPECT_EQ(token_file_name("notes.md"), "notes.md.tok");
  EXPECT_EQ(source_name("tokens/web.tok"), "web");
  EXPECT_EQ(source_name("books/part.jsonl.zst"), "part");
  EXPECT_EQ(source_name("c4/en/train-*.json.gz"), "en");
  EXPECT_EQ(source_name("tokens/fineweb/"), "fineweb");
  EXPECT_EQ(source_name("corpus.txt"), "corpus");
  EXPECT_EQ(source_name("."), "source");
  EXPECT_EQ(source_name("*.jsonl"), "source");
}

TEST_F(TokenFileTest, WriterReaderRoundTripU16) {
  {
    TokenFileWriter w(path("a.sttok"), 300, 299);
    const std::vector<int32_t> doc1 = {0, 1, 298}, doc2 = {};
    w.append_document(doc1);
    w.append_document(doc2);
    EXPECT_FALSE(fs::exists(path("a.sttok")));  // only the .tmp until finish()
    w.finish();
  }
  const TokenFile f(path("a.sttok"));
  EXPECT_EQ(f.header().token_bytes, 2u);
  EXPECT_EQ(f.header().document_count, 2u);
  EXPECT_EQ(f.header().vocab_size, 300);
  EXPECT_EQ(f.header().eos_id, 299);
  EXPECT_EQ(f.read_all(), (std::vector<int32_t>{0, 1, 298, 299, 299}));
  EXPECT_EQ(fs::file_size(path("a.sttok")), kTokenFileHeaderBytes + 5 * 2);
  std::vector<int32_t> two(2);
  f.read(3, two);
  EXPECT_EQ(two, (std::vector<int32_t>{299, 299}));
  std::vector<int32_t> past(3);
  EXPECT_THROW(f.read(3, past), Error);
  EXPECT_FALSE(fs::exists(path("a.sttok.tmp")));
}

TEST_F(TokenFileTest, WriterRejectsIdsAndCleansUp) {
  {
    TokenFileWriter w(path("b.sttok"), 70000, -1);
    EXPECT_EQ(w.header().token_bytes, 4u);
    const std::vector<int32_t> bad = {5, 70000};
    EXPECT_THROW(w.append_document(bad), Error);
    EXPECT_TRUE(fs::exists(path("b.sttok.tmp")));
  }
  EXPECT_FALSE(fs::exists(path("b.sttok.tmp")));  // abandoned writer removes its temp file
  EXPECT_FALSE(fs::exists(path("b.sttok")));
  EXPECT_THROW(TokenFileWriter(path("c.sttok"), 10, 10), Error);
}

TEST_F(TokenFileTest, CorruptHeadersAndTruncation) {
  ByteTokenizer t;
  const std::string in = write("in.txt", "hello\nworld\n");
  (void)tokenize_file(t, in, path("good.sttok"));
  const std::string good = read_bytes(path("good.sttok"));
  ASSERT_EQ(good.size(), kTokenFileHeaderBytes + 14 * 2);  // two documents of BOS, 5 bytes, EOS

  expect_open_error(path("missing.sttok"), "cannot open token file");
  expect_open_error(write("short.sttok", good.substr(0, 20)), "shorter than the 48-byte header");
  std::string bad = good;
  bad[0] = 'X';
  expect_open_error(write("magic.sttok", bad), "bad magic");
  bad = good;
  bad[8] = 7;
  expect_open_error(write("version.sttok", bad), "version 7");
  bad = good;
  bad[44] = 0x10;
  bad[45] = 0x01;  // bos 272 >= vocab 258
  expect_open_error(write("bos.sttok", bad), "bos_id 272");
  bad = good;
  bad[12] = 3;
  expect_open_error(write("width.sttok", bad), "token_bytes 3");
  bad = good;
  bad[34] = 1;  // vocab_size 65536 + 258: too large for u16 ids
  expect_open_error(write("vocab.sttok", bad), "vocab_size");
  bad = good;
  bad[40] = 0x10;
  bad[41] = 0x01;  // eos 272 >= vocab 258
  expect_open_error(write("eos.sttok", bad), "eos_id 272");
  expect_open_error(write("truncated.sttok", good.substr(0, good.size() - 1)), "truncated");
  expect_open_error(write("long.sttok", good + "xx"), "the file has 78");
  bad = good;
  bad[17] = 0x10;  // count 4096 + 14
  expect_open_error(write("count.sttok", bad), "4110 tokens");
  bad = good;
  bad[kTokenFileHeaderBytes + 3] = static_cast<char>(0xFF);  // id 1 becomes 0xFF65 >= 258
  const TokenFile f(write("id.sttok", bad));
  try {
    (void)f.read_all();
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("at index 1"), std::string::npos) << e.what();
  }
}

TEST_F(TokenFileTest, LinesJsonlAndWholeFileWithByteTokenizer) {
  ByteTokenizer t;
  const std::string text = "first line\r\n\nsecond <|end_of_text|>\nlast without newline";
  const std::string in = write("in.txt", text);
  const TokenizeFileStats stats = tokenize_file(t, in, path("lines.sttok"));
  EXPECT_EQ(stats.documents, 3u);
  EXPECT_EQ(stats.input_bytes, text.size());
  EXPECT_EQ(TokenFile(path("lines.sttok")).read_all(), expected_line_ids(t, text));

  TokenizeFileOptions whole;
  whole.format = TextFormat::kWholeFile;
  (void)tokenize_file(t, in, path("whole.sttok"), whole);
  std::vector<int32_t> expected = {ByteTokenizer::kBos};
  for (const int32_t id : t.encode(text)) expected.push_back(id);
  expected.push_back(ByteTokenizer::kEos);
  EXPECT_EQ(TokenFile(path("whole.sttok")).read_all(), expected);

  const std::string jl = write("in.jsonl",
                               "{\"text\": \"ab\", \"id\": 1}\n\n{\"text\": \"\"}\r\n"
                               "{\"text\": \"c\\n\"}\n");
  TokenizeFileOptions jsonl;
  jsonl.format = TextFormat::kJsonl;
  const TokenizeFileStats js = tokenize_file(t, jl, path("jl.sttok"), jsonl);
  EXPECT_EQ(js.documents, 2u);
  EXPECT_EQ(TokenFile(path("jl.sttok")).read_all(),
            (std::vector<int32_t>{ByteTokenizer::kBos, 'a', 'b', ByteTokenizer::kEos, ByteTokenizer::kBos, 'c', '\n',
                                  ByteTokenizer::kEos}));
}

TEST_F(TokenFileTest, ErrorsNameFileAndLine) {
  ByteTokenizer t;
  TokenizeFileOptions jsonl;
  jsonl.format = TextFormat::kJsonl;
  const std::string jl =
      write("bad.jsonl", "{\"text\": \"a\"}\n{\"body\": \"b\"}\n{\"text\": 3}\n");
  try {
    (void)tokenize_file(t, jl, path("x.sttok"), jsonl);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("bad.jsonl` line 2: no field `text`"), std::string::npos)
        << e.what();
  }
  EXPECT_FALSE(fs::exists(path("x.sttok")));
  EXPECT_FALSE(fs::exists(path("x.sttok.tmp")));
  const std::string broken = write("broken.jsonl", "{\"text\": \"a\"}\n{\"text\": \n");
  EXPECT_THROW((void)tokenize_file(t, broken, path("y.sttok"), jsonl), Error);
  EXPECT_THROW((void)tokenize_file(t, path("absent.txt"), path("z.sttok")), Error);
}

TEST_F(TokenFileTest, Llama3ThreadsAndBlocksGiveIdenticalFiles) {
  ST_REQUIRE_SHARED_DATA(dir);
  const BpeTokenizer t(dir + "/tokenizers/llama3/tokenizer.json");
  const std::string corpus = dir + "/corpus/tinyshakespeare.txt";
  TokenizeFileOptions one;
  one.num_threads = 1;
  const TokenizeFileStats s1 = tokenize_file(t, corpus, path("one.sttok"), one);
  TokenizeFileOptions many;
  many.num_threads = 4;
  many.block_bytes = 3000;  // many blocks, cut inside lines
  const TokenizeFileStats s4 = tokenize_file(t, corpus, path("four.sttok"), many);
  EXPECT_EQ(s1.documents, s4.documents);
  EXPECT_EQ(s1.tokens, s4.tokens);
  EXPECT_EQ(read_bytes(path("one.sttok")), read_bytes(path("four.sttok")));

  const TokenFile f(path("four.sttok"));
  EXPECT_EQ(f.header().token_bytes, 4u);
  EXPECT_EQ(f.header().vocab_size, 128256);
  EXPECT_EQ(f.header().eos_id, 128001);
  EXPECT_EQ(f.header().bos_id, 128000);
  EXPECT_EQ(f.read_all(), expected_line_ids(t, read_bytes(corpus)));
  std::printf(
      "tinyshakespeare: %llu documents, %llu tokens, %.1f MB/s (1 thread), "
      "%.1f MB/s (4 threads)\n",
      static_cast<unsigned long long>(s1.documents), static_cast<unsigned long long>(s1.tokens),
      s1.bytes_per_second() / 1e6, s4.bytes_per_second() / 1e6);
}

// Several files at once: each token file as tokenize_file alone writes it; a bad file's error
// is thrown naming it, the files before it stay complete and no temporary file is left.
TEST_F(TokenFileTest, ManyFilesAtOnceEqualOneByOneAndStopAtTheFirstError) {
  const ByteTokenizer t;
  std::vector<std::string> inputs;
  for (int i = 0; i < 6; ++i) {
    std::string rows;
    for (int k = 0; k <= i * 50; ++k) rows += "{\"text\": \"file " + std::to_string(i) + " row " + std::to_string(k) + "\"}\n";
    inputs.push_back(write("part-" + std::to_string(i) + ".jsonl", rows));
  }
  TokenizeFilesOptions one;
  one.files_at_once = 1;
  one.file.block_bytes = 500;  // many blocks each
  const TokenizeFilesStats s1 = tokenize_files(t, inputs, path("one"), one);
  TokenizeFilesOptions three = one;
  three.files_at_once = 3;
  three.file.num_threads = 3;
  const TokenizeFilesStats s3 = tokenize_files(t, inputs, path("three"), three);
  EXPECT_EQ(s1.files, 6u);
  EXPECT_EQ(s1.documents, s3.documents);
  EXPECT_EQ(s1.tokens, s3.tokens);
  for (int i = 0; i < 6; ++i) {
    const std::string name = "part-" + std::to_string(i) + ".tok";
    const std::string alone = path("alone.tok");
    TokenizeFileOptions o;
    o.format = TextFormat::kJsonl;
    (void)tokenize_file(t, inputs[static_cast<size_t>(i)], alone, o);
    EXPECT_EQ(read_bytes(path("one/" + name)), read_bytes(alone)) << name;
    EXPECT_EQ(read_bytes(path("three/" + name)), read_bytes(alone)) << name;
  }

  inputs[3] = write("part-3.jsonl", "{\"text\": \"fine\"}\n{\"body\": \"no text field\"}\n");
  try {
    (void)tokenize_files(t, inputs, path("bad"), three);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("part-3.jsonl` line 2: no field `text`"), std::string::npos) << e.what();
  }
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(is_token_file(path("bad/part-" + std::to_string(i) + ".tok"))) << i;
  EXPECT_FALSE(fs::exists(path("bad/part-3.tok")));
  for (const auto& entry : fs::directory_iterator(path("bad")))
    EXPECT_NE(entry.path().extension(), ".tmp") << entry.path();
}

TEST_F(TokenFileTest, InvalidUtf8NamesTheLine) {
  ST_REQUIRE_SHARED_DATA(dir);
  const BpeTokenizer t(dir + "/tokenizers/llama3/tokenizer.json");
  const std::string in = write("bad.txt", "fine\nalso fine\nbad \xff byte\n");
  try {
    (void)tokenize_file(t, in, path("bad.sttok"));
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("line 3 of"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("not valid UTF-8"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace shardtrain::data
