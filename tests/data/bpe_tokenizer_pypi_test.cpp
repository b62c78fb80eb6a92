// BpeTokenizer against PyPI's `tokenizers` (HF's Rust tokenizer) on the whole shared corpora,
// line by line and in 64 KiB chunks, and on strings built around every code point below
// U+3400 plus samples beyond (the regex classes \s, \p{L}, \p{N} and case folding). Skips when
// python3 cannot import `tokenizers` (pip install tokenizers).
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "data/bpe_tokenizer.h"
#include "data/utf8.h"
#include "testing/shared_data.h"

namespace shardtrain::data {
namespace {

namespace fs = std::filesystem;

// Reads length-prefixed UTF-8 texts, writes for each text its id count then its ids (u32 LE).
constexpr const char* kScript = R"PY(
import struct, sys
from array import array
from tokenizers import Tokenizer
tokenizer = Tokenizer.from_file(sys.argv[1])
data = open(sys.argv[2], "rb").read()
texts, pos = [], 0
while pos < len(data):
    (n,) = struct.unpack_from("<I", data, pos)
    texts.append(data[pos + 4:pos + 4 + n].decode("utf-8"))
    pos += 4 + n
out = array("I")
for e in tokenizer.encode_batch(texts, add_special_tokens=False):
    out.append(len(e.ids))
    out.extend(e.ids)
open(sys.argv[3], "wb").write(out.tobytes())
)PY";

bool python_has_tokenizers() {
  return std::system("python3 -c 'import tokenizers' > /dev/null 2>&1") == 0;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}


class PypiTokenizers : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("shardtrain_pypi_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Encodes `texts` with python's `tokenizers` and with ours; every id must agree, and (with
  // `round_trip`) decoding must give each text back.
  void compare(const std::string& tokenizer_json, const std::vector<std::string>& texts,
               const std::string& what, bool round_trip = true) {
    const std::string script = (dir_ / "encode.py").string();
    const std::string in = (dir_ / "texts.bin").string();
    const std::string out = (dir_ / "ids.bin").string();
    std::ofstream(script) << kScript;
    {
      std::ofstream f(in, std::ios::binary);
      for (const std::string& t : texts) {
        const auto n = static_cast<uint32_t>(t.size());
        f.write(reinterpret_cast<const char*>(&n), 4);
        f.write(t.data(), static_cast<std::streamsize>(t.size()));
      }
    }
    const std::string command =
        "python3 '" + script + "' '" + tokenizer_json + "' '" + in + "' '" + out + "'";
    ASSERT_EQ(std::system(command.c_str()), 0) << command;
    const std::string raw = read_file(out);
    ASSERT_EQ(raw.size() % 4, 0u);
    std::vector<uint32_t> words(raw.size() / 4);
    std::memcpy(words.data(), raw.data(), raw.size());

    if (ours_ == nullptr || ours_path_ != tokenizer_json) {
      ours_ = std::make_unique<BpeTokenizer>(tokenizer_json);
      ours_path_ = tokenizer_json;
    }
    const BpeTokenizer& ours = *ours_;
    size_t pos = 0;
    int mismatches = 0;
    size_t tokens = 0;
    for (size_t i = 0; i < texts.size(); ++i) {
      ASSERT_LT(pos, words.size()) << what << ": python output ends at text " << i;
      const uint32_t n = words[pos++];
      ASSERT_LE(pos + n, words.size()) << what << ": python output truncated at text " << i;
      const std::vector<int32_t> expected(words.begin() + pos, words.begin() + pos + n);
      pos += n;
      tokens += n;
      const std::vector<int32_t> found = ours.encode(texts[i]);
      if (found != expected && ++mismatches <= 5) {
        size_t k = 0;
        while (k < found.size() && k < expected.size() && found[k] == expected[k]) ++k;
        ADD_FAILURE() << what << " text " << i << " (" << texts[i].size()
                      << " bytes) first differs at id index " << k << ": expected "
                      << (k < expected.size() ? expected[k] : -1) << ", found "
                      << (k < found.size() ? found[k] : -1) << "; text starts \""
                      << texts[i].substr(0, 80) << "\"";
      }
      if (round_trip && ours.decode(found) != texts[i] && ++mismatches <= 5) {
        ADD_FAILURE() << what << " text " << i << ": decode(encode(text)) != text";
      }
    }
    EXPECT_EQ(pos, words.size()) << what;
    EXPECT_EQ(mismatches, 0) << what << ": " << mismatches << " of " << texts.size() << " differ";
    std::printf("%s: %zu texts, %zu tokens, all equal: %s\n", what.c_str(), texts.size(), tokens,
                mismatches == 0 ? "yes" : "no");
  }

  fs::path dir_;
  // Loaded once for all tests (loading takes about 0.5 s).
  static inline std::unique_ptr<BpeTokenizer> ours_;
  static inline std::string ours_path_;
};

// Every line of the file (split at '\n'), then chunks of about 64 KiB ending at line ends.
void corpus_texts(const std::string& text, std::vector<std::string>& lines,
                  std::vector<std::string>& chunks) {
  for (size_t pos = 0; pos < text.size();) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    lines.push_back(text.substr(pos, end - pos));
    pos = end + 1;
  }
  constexpr size_t kChunk = 64 << 10;
  for (size_t pos = 0; pos < text.size();) {
    size_t end = text.find('\n', std::min(pos + kChunk, text.size()));
    end = end == std::string::npos ? text.size() : end + 1;
    chunks.push_back(text.substr(pos, end - pos));
    pos = end;
  }
}

TEST_F(PypiTokenizers, Corpora) {
  ST_REQUIRE_SHARED_DATA(dir);
  if (!python_has_tokenizers()) {
    GTEST_SKIP() << "python3 cannot import `tokenizers` (pip install tokenizers)";
  }
  const std::string tokenizer = dir + "/tokenizers/llama3/tokenizer.json";
  for (const char* name : {"world_english_bible.txt", "tinyshakespeare.txt"}) {
    const std::string text = read_file(dir + "/corpus/" + name);
    ASSERT_GT(text.size(), 1000000u) << name;
    std::vector<std::string> lines, chunks;
    corpus_texts(text, lines, chunks);
    compare(tokenizer, lines, std::string(name) + " lines");
    compare(tokenizer, chunks, std::string(name) + " 64KiB chunks");
  }
}

TEST_F(PypiTokenizers, CodePointClasses) {
  ST_REQUIRE_SHARED_DATA(dir);
  if (!python_has_tokenizers()) {
    GTEST_SKIP() << "python3 cannot import `tokenizers` (pip install tokenizers)";
  }
  std::vector<char32_t> code_points;
  for (char32_t c = 0; c < 0x3400; ++c) code_points.push_back(c);
  for (char32_t c = 0x3400; c < 0x110000; c += 97) {
    if (c < 0xD800 || c > 0xDFFF) code_points.push_back(c);
  }
  for (char32_t c : {0xFEFF, 0xFF21, 0xFF41, 0xFF10, 0x1D400, 0x1F600, 0x1F44D, 0xE0041}) {
    code_points.push_back(c);
  }
  // Each string puts the character where \s, \p{L}, \p{N} and (?i:'s|...) decide the split.
  std::vector<std::string> texts;
  for (char32_t c : code_points) {
    std::string s;
    for (const char* piece :
         {"a", "", "b ", "", "! 1", "23", " ", " x\n", "'", "S I'", "\n\n", ""}) {
      s += piece;
      append_utf8(s, c);
    }
    texts.push_back(std::move(s));
  }
  compare(dir + "/tokenizers/llama3/tokenizer.json", texts, "code point classes");
}

TEST_F(PypiTokenizers, LongRunsAndRandomMixes) {
  ST_REQUIRE_SHARED_DATA(dir);
  if (!python_has_tokenizers()) {
    GTEST_SKIP() << "python3 cannot import `tokenizers` (pip install tokenizers)";
  }
  std::vector<std::string> texts = {std::string(100000, ' ') + "x",
                                    std::string(50000, 'a'),
                                    std::string(30001, '7'),
                                    std::string(20000, '!') + "\n",
                                    std::string("a").append(10000, '\n').append(" \t b"),
                                    std::string(4000, '\t') + std::string(4000, ' ') + "z"};
  // Seeded random strings over an alphabet that exercises every regex branch.
  const std::vector<std::string> alphabet = {
      "a",        "Z",           "1",   " ", "  ", "\n",       "\r",           "\t",
      "'",        "'s",          "'LL", "!", ".",  "\xc3\xa9", "\xe4\xb8\xad", "\xf0\x9f\x98\x80",
      "\xc2\xa0", "\xe2\x80\xa8"};
  uint64_t state = 0x5EED;
  for (int t = 0; t < 200; ++t) {
    std::string s;
    const int pieces = 20 + t * 10;
    for (int k = 0; k < pieces; ++k) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      s += alphabet[(state >> 33) % alphabet.size()];
    }
    texts.push_back(std::move(s));
  }
  compare(dir + "/tokenizers/llama3/tokenizer.json", texts, "long runs and random mixes");
}

// The byte-level Llama 3 vocabulary behind the NFC normalizer (as Qwen2's tokenizer.json has
// it): the corpus lines, and decomposed, composed and mixed forms (accents, Hangul jamo,
// stacked marks, singletons) between the regex's classes, against HF's NFC.
TEST_F(PypiTokenizers, NfcNormalizer) {
  ST_REQUIRE_SHARED_DATA(dir);
  if (!python_has_tokenizers()) {
    GTEST_SKIP() << "python3 cannot import `tokenizers` (pip install tokenizers)";
  }
  nlohmann::json j = nlohmann::json::parse(read_file(dir + "/tokenizers/llama3/tokenizer.json"));
  j["normalizer"] = {{"type", "NFC"}};
  const std::string path = (dir_ / "nfc.json").string();
  std::ofstream(path) << j.dump();
  std::vector<std::string> lines, chunks;
  corpus_texts(read_file(dir + "/corpus/world_english_bible.txt"), lines, chunks);
  lines.resize(5000);
  compare(path, lines, "NFC, world_english_bible.txt lines");
  std::vector<std::string> texts;
  const std::vector<std::vector<char32_t>> pieces = {
      {'e', 0x301},         {0xE9},         {'A', 0x30A},         {0x212B},          {0x1100, 0x1161, 0x11A8},
      {0xAC00, 0x11A8},     {'a', 0x323, 0x302}, {'a', 0x302, 0x323}, {0x1E9B, 0x323}, {0x0958},
      {0x2126},             {0xFB01},       {'s', 0x307, 0x323},  {0x0CC6, 0x0CC2},  {0x1F600, 0x301}};
  for (size_t i = 0; i < pieces.size(); ++i)
    for (const char* around : {"", " ", "x", "1", "'s "}) {
      std::string s = around;
      for (char32_t c : pieces[i]) append_utf8(s, c);
      s += around;
      for (char32_t c : pieces[(i + 1) % pieces.size()]) append_utf8(s, c);
      texts.push_back(std::move(s));
    }
  for (char32_t c = 0x300; c < 0x370; ++c) {  // every combining diacritic after letters and spaces
    std::string s = "e";
    append_utf8(s, c);
    s += " A";
    append_utf8(s, c);
    append_utf8(s, 0x301);
    texts.push_back(std::move(s));
  }
  // text that NFC changes does not decode back to itself
  compare(path, texts, "NFC, composing sequences", false);
}

// Llama 2's SentencePiece-style tokenizer.json (built at set-up by scripts/llama2_tokenizer.py):
// the corpora by lines and 64 KiB chunks (each one stretch merged whole), every code point
// below U+3400 and samples beyond (byte fallback), runs of spaces, and special tokens inside
// words.
TEST_F(PypiTokenizers, Llama2CorporaCodePointsAndSpecialTokens) {
  ST_REQUIRE_SHARED_DATA(dir);
  if (!python_has_tokenizers()) {
    GTEST_SKIP() << "python3 cannot import `tokenizers` (pip install tokenizers)";
  }
  const std::string tokenizer = testing::source_dir() + "/.deps/llama2-tokenizer/tokenizer.json";
  if (!fs::exists(tokenizer)) GTEST_SKIP() << tokenizer << " not found (scripts/setup.sh --tests builds it)";
  for (const char* name : {"world_english_bible.txt", "tinyshakespeare.txt"}) {
    const std::string text = read_file(dir + "/corpus/" + name);
    std::vector<std::string> lines, chunks;
    corpus_texts(text, lines, chunks);
    std::string what = "Llama 2, ";
    what += name;
    compare(tokenizer, lines, what + " lines");
    compare(tokenizer, chunks, what + " 64KiB chunks");
  }
  std::vector<std::string> texts;
  for (char32_t c = 1; c < 0x3400; ++c) {
    if (c == 0x2581) continue;  // "▁" decodes to a space (below)
    std::string s = "a";
    append_utf8(s, c);
    s += " b";
    append_utf8(s, c);
    append_utf8(s, c);
    texts.push_back(std::move(s));
  }
  for (char32_t c = 0x3400; c < 0x110000; c += 97)
    if (c < 0xD800 || c > 0xDFFF) {
      std::string s = " ";
      append_utf8(s, c);
      texts.push_back(std::move(s));
    }
  for (const char* t : {"", " ", "   ", "\n", " \n ", "\t\t  tabs", "end "}) texts.push_back(t);
  texts.push_back(std::string(20000, ' ') + "x");
  compare(tokenizer, texts, "Llama 2, code points");
  // Not given back by decoding, by HF either: "▁" is a space there, and the text after a
  // special token gets its own "▁" (a space once decoded).
  compare(tokenizer, {"a\u2581 b\u2581\u2581", "<s>", "a<s>b", " <s> </s>  x", "<unk><s>", "hello</s>"},
          "Llama 2, special tokens and \u2581", false);

  // The same vocabulary with the Metaspace pre-tokenizer instead of the normalizer (transformers'
  // newer conversions), prepend_scheme "first" and "always"
  nlohmann::json j = nlohmann::json::parse(read_file(tokenizer));
  j["normalizer"] = nullptr;
  std::vector<std::string> bible_lines, bible_chunks;
  corpus_texts(read_file(dir + "/corpus/world_english_bible.txt"), bible_lines, bible_chunks);
  std::vector<std::string> mixed = {"", " ", "   ", " x", "x ", "\n", "<s>", "<s>x", "<s> x", "a<s>b", " <s> </s>  x"};
  for (size_t i = 0; i < bible_lines.size(); i += 97) {
    std::string line(1, ' ');
    line += bible_lines[i];
    mixed.push_back(std::move(line));
  }
  for (const char* scheme : {"first", "always"}) {
    j["pre_tokenizer"] = {
        {"type", "Metaspace"}, {"replacement", "\u2581"}, {"prepend_scheme", scheme}, {"split", false}};
    std::string what = "Llama 2 with Metaspace ";
    what += scheme;
    std::string file = "metaspace_";  // a name of its own: compare() keeps the last tokenizer loaded
    file += scheme;
    const std::string path = (dir_ / file).string();
    std::ofstream(path) << j.dump();
    compare(path, bible_lines, what + ", world_english_bible.txt lines");
    compare(path, mixed, what + ", spaces and special tokens", false);
  }
}

}  // namespace
}  // namespace shardtrain::data
