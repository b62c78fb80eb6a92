// InputFile against the bytes it was made from: plain, gzip (several members) and zstd (several
// frames) files larger than its buffer, read in odd-sized pieces and whole; truncated and
// corrupted files fail naming the file. The data loaders and the tokenizer read a compressed
// JSONL corpus as the plain one.
#include <unistd.h>
#include <zlib.h>
#include <zstd.h>

#include <filesystem>
#include <fstream>
#include <random>

#include <gtest/gtest.h>

#include "core/error.h"
#include "data/byte_tokenizer.h"
#include "data/corpus.h"
#include "data/sft.h"
#include "data/tokenize_file.h"
#include "io/input_file.h"
#include "testing/compare.h"
#include "train/training_data.h"

namespace shardtrain::io {
namespace {

using testing::throws_with;

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("shardtrain_input_" + std::to_string(::getpid()) + "_" + name))
      .string();
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::string gzip(const std::string& text) {
  const std::string path = temp_path("member.gz");
  gzFile f = gzopen(path.c_str(), "wb");
  EXPECT_NE(f, nullptr);
  EXPECT_EQ(gzwrite(f, text.data(), static_cast<unsigned>(text.size())), static_cast<int>(text.size()));
  gzclose(f);
  return read_bytes(path);
}

// A frame with a content checksum, as the zstd command writes it (without one, damage inside
// literals decodes to other bytes undetected).
std::string zstd(const std::string& text) {
  std::string out(ZSTD_compressBound(text.size()), '\0');
  ZSTD_CCtx* c = ZSTD_createCCtx();
  ZSTD_CCtx_setParameter(c, ZSTD_c_checksumFlag, 1);
  const size_t n = ZSTD_compress2(c, out.data(), out.size(), text.data(), text.size());
  ZSTD_freeCCtx(c);
  EXPECT_FALSE(ZSTD_isError(n));
  out.resize(n);
  return out;
}

// ~3 MB of JSONL lines (more than the reader's 1 MiB buffer), compressible but not trivially
std::string corpus_text() {
  std::mt19937 rng(3);
  const char* words[] = {"alpha", "beta", "gamma", "delta", "ünïcode", "日本語", "and", "the", "of"};
  std::string s;
  for (int line = 0; line < 20000; ++line) {
    std::string text;
    const int n = 5 + static_cast<int>(rng() % 40);
    for (int w = 0; w < n; ++w) {
      text += words[rng() % 9];
      text += ' ';
    }
    s += "{\"text\": \"" + text + std::to_string(line) + "\"}\n";
  }
  return s;
}

std::string read_in_pieces(const std::string& path, size_t piece) {
  InputFile f(path);
  std::string s;
  std::vector<char> buffer(piece);
  while (const size_t k = f.read(buffer.data(), buffer.size())) s.append(buffer.data(), k);
  EXPECT_EQ(f.bytes_read(), s.size());
  return s;
}

TEST(InputFile, PlainGzipAndZstdReadAsTheirBytes) {
  const std::string text = corpus_text();
  const size_t half = text.size() / 2;
  ASSERT_GT(text.size(), size_t{2} << 20);
  const std::string plain = temp_path("c.jsonl"), gz = temp_path("c.jsonl.gz"), zst = temp_path("c.jsonl.zst");
  write_bytes(plain, text);
  write_bytes(gz, gzip(text.substr(0, half)) + gzip(text.substr(half)));  // two members
  write_bytes(zst, zstd(text.substr(0, half)) + zstd(text.substr(half)));  // two frames
  EXPECT_EQ(InputFile(plain).compression(), InputFile::Compression::kNone);
  EXPECT_EQ(InputFile(gz).compression(), InputFile::Compression::kGzip);
  EXPECT_EQ(InputFile(zst).compression(), InputFile::Compression::kZstd);
  for (const std::string& path : {plain, gz, zst}) {
    SCOPED_TRACE(path);
    EXPECT_TRUE(InputFile(path).read_all() == text);
    EXPECT_TRUE(read_in_pieces(path, 7) == text);
    EXPECT_TRUE(read_in_pieces(path, 100003) == text);
  }
  write_bytes(temp_path("padded.gz"), gzip(text.substr(0, half)) + std::string(70000, '\0'));  // block padding
  EXPECT_TRUE(InputFile(temp_path("padded.gz")).read_all() == text.substr(0, half));
  write_bytes(temp_path("empty"), "");
  EXPECT_EQ(InputFile(temp_path("empty")).read_all(), "");
}

// read_line gives the lines split at '\n': empty ones, one longer than the read buffer, and a
// last line without its '\n'.
TEST(InputFile, LinesOneByOne) {
  const std::string text = "first\n\n" + std::string(size_t{3} << 20, 'x') + "\n" + corpus_text() + "last, unended";
  std::vector<std::string> expected;
  for (size_t pos = 0; pos <= text.size();) {
    const size_t end = std::min(text.find('\n', pos), text.size());
    expected.push_back(text.substr(pos, end - pos));
    pos = end + 1;
  }
  write_bytes(temp_path("l.txt"), text);
  write_bytes(temp_path("l.txt.gz"), gzip(text));
  write_bytes(temp_path("l.txt.zst"), zstd(text));
  for (const std::string name : {"l.txt", "l.txt.gz", "l.txt.zst"}) {
    SCOPED_TRACE(name);
    InputFile f(temp_path(name));
    std::vector<std::string> lines;
    for (std::string line; f.read_line(line);) lines.push_back(line);
    ASSERT_EQ(lines.size(), expected.size());
    EXPECT_TRUE(lines == expected);
  }
  write_bytes(temp_path("ended.txt"), "a\nb\n");
  InputFile f(temp_path("ended.txt"));
  std::string line;
  ASSERT_TRUE(f.read_line(line));
  EXPECT_EQ(line, "a");
  ASSERT_TRUE(f.read_line(line));
  EXPECT_EQ(line, "b");
  EXPECT_FALSE(f.read_line(line)) << "no empty line after the last '\\n'";
}

TEST(InputFile, TruncatedAndCorruptFilesAreNamed) {
  const std::string text = corpus_text();
  const std::string gz = gzip(text), zst = zstd(text);
  write_bytes(temp_path("cut.gz"), gz.substr(0, gz.size() / 2));
  EXPECT_TRUE(throws_with([&] { InputFile(temp_path("cut.gz")).read_all(); },
                          "cut.gz` (gzip, after "));
  EXPECT_TRUE(throws_with([&] { InputFile(temp_path("cut.gz")).read_all(); }, "ends inside compressed data"));
  write_bytes(temp_path("cut.zst"), zst.substr(0, zst.size() - 10));
  EXPECT_TRUE(throws_with([&] { InputFile(temp_path("cut.zst")).read_all(); }, "ends inside compressed data"));
  std::string bad = gz;
  for (size_t i = 100; i < 140; ++i) bad[i] = static_cast<char>(bad[i] ^ 0x5a);
  write_bytes(temp_path("bad.gz"), bad);
  EXPECT_TRUE(throws_with([&] { InputFile(temp_path("bad.gz")).read_all(); }, "bad.gz` (gzip"));
  bad = zst;
  for (size_t i = 100; i < 140; ++i) bad[i] = static_cast<char>(bad[i] ^ 0x5a);
  write_bytes(temp_path("bad.zst"), bad);
  EXPECT_TRUE(throws_with([&] { InputFile(temp_path("bad.zst")).read_all(); }, "corrupt zstd data"));
  EXPECT_TRUE(throws_with([&] { InputFile(temp_path("missing.gz")); }, "cannot open"));
  EXPECT_EQ(inner_extension("a/c4-train.00000-of-01024.json.gz"), ".json");
  EXPECT_EQ(inner_extension("x.jsonl.zst"), ".jsonl");
  EXPECT_EQ(inner_extension("x.jsonl"), ".jsonl");
}

// Documents, token files and SFT examples from compressed JSONL equal those from the plain file.
TEST(InputFile, CompressedCorporaLoadAsThePlainOnes) {
  const std::string text = corpus_text();
  const std::string plain = temp_path("d.jsonl"), gz = temp_path("d.jsonl.gz"), zst = temp_path("d.jsonl.zst");
  write_bytes(plain, text);
  write_bytes(gz, gzip(text));
  write_bytes(zst, zstd(text));
  const std::vector<std::string> docs = data::load_jsonl_documents(plain, "text");
  EXPECT_EQ(docs.size(), 20000u);
  EXPECT_EQ(data::load_jsonl_documents(gz, "text"), docs);
  EXPECT_EQ(data::load_jsonl_documents(zst, "text"), docs);

  const data::ByteTokenizer t;
  data::TokenizeFileOptions o;
  o.format = data::TextFormat::kJsonl;
  o.num_threads = 2;
  o.block_bytes = 100000;  // many blocks, each cut at a line end
  data::tokenize_file(t, plain, temp_path("plain.tok"), o);
  data::tokenize_file(t, zst, temp_path("zst.tok"), o);
  EXPECT_EQ(read_bytes(temp_path("zst.tok")), read_bytes(temp_path("plain.tok")));

  std::string sft;
  for (int i = 0; i < 200; ++i)
    sft += "{\"prompt\": \"q" + std::to_string(i) + "\", \"response\": \"a" + std::to_string(i * 7) + "\"}\n";
  write_bytes(temp_path("s.jsonl"), sft);
  write_bytes(temp_path("s.jsonl.gz"), gzip(sft));
  data::SftOptions so;
  so.seq_len = 64;
  so.val_fraction = 0.1;
  const data::SftData a(temp_path("s.jsonl"), t, so), b(temp_path("s.jsonl.gz"), t, so);
  EXPECT_EQ(a.train_sequences().ids, b.train_sequences().ids);
  EXPECT_EQ(a.held_out_sequences().ids, b.held_out_sequences().ids);

  train::DataSection d;
  d.source = gz;
  EXPECT_EQ(train::resolve_data_format(d), "jsonl");
}

}  // namespace
}  // namespace shardtrain::io
