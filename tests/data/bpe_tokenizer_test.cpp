// BpeTokenizer against the Llama 3 golden ids in ../shared/data/tokenizer_tests (made with HF
// `tokenizers`), round trips, special tokens, the chat template, and loader errors on small
// hand-made tokenizer.json files.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "data/bpe_tokenizer.h"
#include "testing/shared_data.h"

namespace shardtrain::data {
namespace {

using nlohmann::json;

struct Case {
  std::string text;
  std::vector<int32_t> ids;
};

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << path;
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// llama.cpp's vocab test: inputs separated by "\n__ggml_vocab_test__\n" (one after the last
// input too); one output line per input, ids space-separated.
std::vector<Case> load_llama_cpp_cases(const std::string& dir, const std::string& name = "llama-cpp-llama-bpe") {
  const std::string inp = read_all(dir + "/tokenizer_tests/" + name + ".inp");
  const std::string out = read_all(dir + "/tokenizer_tests/" + name + ".out");
  const std::string sep = "\n__ggml_vocab_test__\n";
  std::vector<Case> cases;
  for (size_t pos = 0; pos < inp.size();) {
    const size_t end = inp.find(sep, pos);
    if (end == std::string::npos) break;
    cases.push_back({inp.substr(pos, end - pos), {}});
    pos = end + sep.size();
  }
  std::istringstream lines(out);
  std::string line;
  for (Case& c : cases) {
    if (!std::getline(lines, line)) break;
    std::istringstream ids(line);
    for (int32_t id; ids >> id;) c.ids.push_back(id);
  }
  return cases;
}

std::vector<Case> load_jsonl_cases(const std::string& path) {
  std::vector<Case> cases;
  std::istringstream lines(read_all(path));
  std::string line;
  while (std::getline(lines, line)) {
    if (line.empty()) continue;
    const json j = json::parse(line);
    cases.push_back({j.at("text").get<std::string>(), j.at("ids").get<std::vector<int32_t>>()});
  }
  return cases;
}

std::string ids_string(const std::vector<int32_t>& ids) {
  std::string s;
  for (int32_t id : ids) {
    s += ' ';
    s += std::to_string(id);
  }
  return s;
}

class Llama3Tokenizer : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string dir = ::shardtrain::testing::shared_data_dir();
    if (!dir.empty()) {
      tokenizer_ = new BpeTokenizer(dir + "/tokenizers/llama3/tokenizer.json");
    }
  }
  static void TearDownTestSuite() {
    delete tokenizer_;
    tokenizer_ = nullptr;
  }
  void check_cases(const std::vector<Case>& cases, const std::string& source) {
    int failures = 0;
    for (size_t i = 0; i < cases.size(); ++i) {
      const std::vector<int32_t> ids = tokenizer_->encode(cases[i].text);
      if (ids != cases[i].ids && ++failures <= 10) {
        ADD_FAILURE() << source << " case " << i << " text " << json(cases[i].text).dump()
                      << "\n  expected" << ids_string(cases[i].ids) << "\n  found   "
                      << ids_string(ids);
      }
      EXPECT_EQ(tokenizer_->decode(ids), cases[i].text) << source << " case " << i;
    }
    EXPECT_EQ(failures, 0) << source << ": " << failures << " of " << cases.size() << " differ";
  }
  static inline BpeTokenizer* tokenizer_ = nullptr;
};

TEST_F(Llama3Tokenizer, LlamaCppVocabTest46Cases) {
  ST_REQUIRE_SHARED_DATA(dir);
  const std::vector<Case> cases = load_llama_cpp_cases(dir);
  ASSERT_EQ(cases.size(), 46u);
  check_cases(cases, "llama-cpp-llama-bpe");
}

TEST_F(Llama3Tokenizer, GoldenEdgeCases) {
  ST_REQUIRE_SHARED_DATA(dir);
  const std::vector<Case> cases =
      load_jsonl_cases(dir + "/tokenizer_tests/llama3_golden_edge.jsonl");
  ASSERT_EQ(cases.size(), 38u);
  check_cases(cases, "llama3_golden_edge");
}

TEST_F(Llama3Tokenizer, GoldenWebCases) {
  ST_REQUIRE_SHARED_DATA(dir);
  const std::vector<Case> cases =
      load_jsonl_cases(dir + "/tokenizer_tests/llama3_golden_web.jsonl");
  ASSERT_EQ(cases.size(), 300u);
  check_cases(cases, "llama3_golden_web");
}

TEST_F(Llama3Tokenizer, VocabAndSpecialIds) {
  ST_REQUIRE_SHARED_DATA(dir);
  EXPECT_EQ(tokenizer_->vocab_size(), 128256);
  EXPECT_EQ(tokenizer_->bos_id(), 128000);
  EXPECT_EQ(tokenizer_->eos_id(), 128001);
  EXPECT_EQ(tokenizer_->token_to_id("<|eot_id|>"), 128009);
  EXPECT_EQ(tokenizer_->token_to_id("Ġthe"), 279);
  EXPECT_EQ(tokenizer_->token_to_id("no such token"), -1);
  EXPECT_TRUE(tokenizer_->is_special(128009));
  EXPECT_FALSE(tokenizer_->is_special(279));
  EXPECT_EQ(tokenizer_->id_to_bytes(279), " the");
}

TEST_F(Llama3Tokenizer, SpecialTokensInText) {
  ST_REQUIRE_SHARED_DATA(dir);
  const std::string text = "<|begin_of_text|>hello<|eot_id|>";
  const std::vector<int32_t> ids = tokenizer_->encode(text);
  EXPECT_EQ(ids, (std::vector<int32_t>{128000, 15339, 128009}));
  EXPECT_EQ(tokenizer_->decode(ids), text);
  // Split around them, longest match first; unknown "<|...|>" text is ordinary text.
  const std::vector<int32_t> a = tokenizer_->encode("a <|eot_id|> b<|end_of_text|><|nope|>");
  const std::vector<int32_t> a_expected = {64, 220, 128009, 293, 128001};
  ASSERT_GE(a.size(), a_expected.size());
  EXPECT_EQ(std::vector<int32_t>(a.begin(), a.begin() + 5), a_expected);
  EXPECT_EQ(tokenizer_->decode(a), "a <|eot_id|> b<|end_of_text|><|nope|>");
}

TEST_F(Llama3Tokenizer, DecodeRejectsUnknownIds) {
  ST_REQUIRE_SHARED_DATA(dir);
  const std::vector<int32_t> bad = {9906, 128256};
  try {
    (void)tokenizer_->decode(bad);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("id 128256 at position 1"), std::string::npos) << e.what();
  }
  const std::vector<int32_t> negative = {-1};
  EXPECT_THROW((void)tokenizer_->decode(negative), Error);
}

TEST_F(Llama3Tokenizer, EncodeRejectsInvalidUtf8) {
  ST_REQUIRE_SHARED_DATA(dir);
  const std::vector<std::string> bad_texts = {"ab\xff", "\xc3", "a\xed\xa0\x80", "\xc0\xaf",
                                              "\xf4\x90\x80\x80"};
  for (size_t i = 0; i < bad_texts.size(); ++i) {
    try {
      (void)tokenizer_->encode(bad_texts[i]);
      ADD_FAILURE() << "no error for bad text " << i;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("not valid UTF-8"), std::string::npos) << e.what();
    }
  }
}

TEST_F(Llama3Tokenizer, ConcurrentEncodeMatchesSequential) {
  ST_REQUIRE_SHARED_DATA(dir);
  const std::vector<Case> cases =
      load_jsonl_cases(dir + "/tokenizer_tests/llama3_golden_web.jsonl");
  constexpr int kThreads = 4;
  std::vector<int> failures(kThreads, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 3; ++round) {
        for (size_t i = t; i < cases.size(); i += 1 + (round + t) % 3) {
          if (tokenizer_->encode(cases[i].text) != cases[i].ids) ++failures[t];
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(failures[t], 0) << "thread " << t;
}

TEST_F(Llama3Tokenizer, ChatTemplateTwoMessages) {
  ST_REQUIRE_SHARED_DATA(dir);
  ASSERT_TRUE(tokenizer_->has_chat_template());
  const std::vector<ChatMessage> messages = {{"user", "  What is 2+2?\n"}, {"assistant", "4."}};
  // What the template in tokenizer_config.json renders with Jinja (content is trimmed, the
  // assistant header is appended unconditionally by this template).
  const std::string expected =
      "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|>"
      "<|start_header_id|>assistant<|end_header_id|>\n\n4.<|eot_id|>"
      "<|start_header_id|>assistant<|end_header_id|>\n\n";
  EXPECT_EQ(tokenizer_->apply_chat_template(messages, false), expected);
  EXPECT_EQ(tokenizer_->apply_chat_template(messages, true), expected);
  const std::vector<int32_t> ids = tokenizer_->encode(expected);
  ASSERT_GE(ids.size(), 4u);
  EXPECT_EQ(ids[0], 128000);
  EXPECT_EQ(ids[1], 128006);  // <|start_header_id|>
  EXPECT_EQ(tokenizer_->decode(ids), expected);
}

// ---- small hand-made tokenizer.json files ----

std::string byte_level_spelling(unsigned char b) {
  const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
  char32_t c = b;
  if (!printable) {
    char32_t next = 256;
    for (int x = 0; x < b; ++x) {
      if (!((x >= 0x21 && x <= 0x7E) || (x >= 0xA1 && x <= 0xAC) || x >= 0xAE)) ++next;
    }
    c = next;
  }
  std::string s;
  if (c < 0x80) {
    s += static_cast<char>(c);
  } else {
    s += static_cast<char>(0xC0 | (c >> 6));
    s += static_cast<char>(0x80 | (c & 0x3F));
  }
  return s;
}

// 256 byte tokens, merges "h e" -> "he", "he llo"... in both merge spellings, a Llama-3-like
// pre-tokenizer and two added tokens.
json small_tokenizer() {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_level_spelling(static_cast<unsigned char>(b))] = b;
  vocab["he"] = 256;
  vocab["ll"] = 257;
  vocab["llo"] = 258;
  vocab["hello"] = 259;
  vocab["Ġw"] = 260;
  json pre = {{"type", "Sequence"},
              {"pretokenizers",
               {{{"type", "Split"},
                 {"pattern", {{"Regex", " ?\\p{L}+|\\s+(?!\\S)|\\s+|\\p{N}|[^\\s\\p{L}\\p{N}]+"}}},
                 {"behavior", "Isolated"},
                 {"invert", false}},
                {{"type", "ByteLevel"},
                 {"add_prefix_space", false},
                 {"trim_offsets", true},
                 {"use_regex", false}}}}};
  json added = json::array();
  added.push_back({{"id", 300},
                   {"content", "<eos>"},
                   {"special", true},
                   {"normalized", false},
                   {"lstrip", false},
                   {"rstrip", false},
                   {"single_word", false}});
  added.push_back({{"id", 301},
                   {"content", "[M]"},
                   {"special", true},
                   {"normalized", false},
                   {"lstrip", true},
                   {"rstrip", true},
                   {"single_word", false}});
  return {{"version", "1.0"},
          {"truncation", nullptr},
          {"padding", nullptr},
          {"added_tokens", added},
          {"normalizer", nullptr},
          {"pre_tokenizer", pre},
          {"post_processor", nullptr},
          {"decoder", {{"type", "ByteLevel"}}},
          {"model",
           {{"type", "BPE"},
            {"dropout", nullptr},
            {"unk_token", nullptr},
            {"ignore_merges", false},
            {"vocab", vocab},
            {"merges", json::array({"h e", json::array({"l", "l"}), "ll o", "he llo", "Ġ w"})}}}};
}

class SmallTokenizer : public ::testing::Test {
 protected:
  std::string write(const std::string& name, const std::string& text) {
    const std::string path = (dir_ / name).string();
    std::ofstream(path, std::ios::binary) << text;
    return path;
  }
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("shardtrain_bpe_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  // Loading `j` fails with a message containing every one of `parts`.
  void expect_load_error(const json& j, const std::vector<std::string>& parts) {
    const std::string path = write("tokenizer.json", j.dump());
    try {
      BpeTokenizer t(path, "");
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      for (const std::string& part : parts) {
        EXPECT_NE(std::string(e.what()).find(part), std::string::npos)
            << "missing `" << part << "` in: " << e.what();
      }
    }
  }
  std::filesystem::path dir_;
};

TEST_F(SmallTokenizer, MergesAddedTokensAndStrip) {
  const BpeTokenizer t(write("tokenizer.json", small_tokenizer().dump()), "");
  EXPECT_EQ(t.vocab_size(), 302);
  EXPECT_EQ(t.bos_id(), -1);
  EXPECT_EQ(t.eos_id(), -1);
  EXPECT_FALSE(t.has_chat_template());
  // "hello" -> h e l l o -> he l l o -> he ll o -> he llo -> hello; " wx" -> Ġw x.
  EXPECT_EQ(t.encode("hello wx"), (std::vector<int32_t>{259, 260, 'x'}));
  EXPECT_EQ(t.encode("hell"), (std::vector<int32_t>{256, 257}));
  // [M] strips the whitespace around it; <eos> does not.
  EXPECT_EQ(t.encode("a  [M]\t b <eos> "), (std::vector<int32_t>{'a', 301, 'b', ' ', 300, ' '}));
  EXPECT_EQ(t.decode(std::vector<int32_t>{259, 301, 300}), "hello[M]<eos>");
  const std::vector<ChatMessage> messages = {{"user", "hi"}};
  EXPECT_THROW((void)t.apply_chat_template(messages, true), Error);
}

TEST_F(SmallTokenizer, MissingFile) {
  try {
    BpeTokenizer t((dir_ / "absent" / "tokenizer.json").string());
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("absent/tokenizer.json"), std::string::npos) << e.what();
  }
}

TEST_F(SmallTokenizer, MalformedJson) {
  const std::string path = write("tokenizer.json", "{\"model\": {\"type\": \"BPE\",");
  try {
    BpeTokenizer t(path);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(path + "`: malformed JSON"), std::string::npos)
        << e.what();
  }
}

TEST_F(SmallTokenizer, UnsupportedConfigurationsNameKeyAndValue) {
  json j = small_tokenizer();
  j["model"]["type"] = "Unigram";
  expect_load_error(j, {"tokenizer.json", "model.type", "\"Unigram\""});
  j = small_tokenizer();
  j["normalizer"] = {{"type", "NFKC"}};  // NFC is taken (NfcComposesBeforeEncoding)
  expect_load_error(j, {"key `normalizer`", "NFKC"});
  j = small_tokenizer();
  j["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Removed";
  expect_load_error(j, {"pre_tokenizer.pretokenizers[0].behavior", "\"Removed\""});
  j = small_tokenizer();
  j["pre_tokenizer"]["pretokenizers"][1]["use_regex"] = true;
  expect_load_error(j, {"pre_tokenizer.pretokenizers[1].use_regex", "true"});
  j = small_tokenizer();
  j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(unclosed";
  expect_load_error(j, {"pre_tokenizer.pretokenizers[0].pattern", "PCRE2"});
  j = small_tokenizer();
  j["model"]["merges"].push_back("x q r");
  expect_load_error(j, {"model.merges[5]", "x q r"});
  j = small_tokenizer();
  j["model"]["merges"].push_back("x q");
  expect_load_error(j, {"model.merges[5]", "concatenation"});
  j = small_tokenizer();
  j["model"]["vocab"].erase("A");
  expect_load_error(j, {"model.vocab", "byte 65"});
  j = small_tokenizer();
  j["added_tokens"][0]["single_word"] = true;
  expect_load_error(j, {"added_tokens[0].single_word"});
  // an id far past the vocabulary: named with its token and the valid range, not an
  // allocation of gigabytes for the token tables
  j = small_tokenizer();
  j["added_tokens"][1]["id"] = 2147483000;
  expect_load_error(j, {"key `added_tokens[1].id`: added token `[M]` has id 2147483000, outside the valid range "
                        "[0, 16777216) (the model's vocabulary has ids [0, 261))"});
  j["added_tokens"][1]["id"] = -1;
  expect_load_error(j, {"added token `[M]` has id -1"});
  j = small_tokenizer();
  j["decoder"] = {{"type", "Metaspace"}};
  expect_load_error(j, {"key `decoder`", "Metaspace"});
  j = small_tokenizer();
  j.erase("model");
  expect_load_error(j, {"key `model` is missing"});
}

TEST_F(SmallTokenizer, ConfigBosEosAndChatTemplate) {
  const std::string path = write("tokenizer.json", small_tokenizer().dump());
  const std::string tmpl =
      "{% for message in messages %}{{ bos_token if loop.first }}<|start_header_id|>"
      "{{ message['role'] }}<|end_header_id|>\n\n{{ message['content'] }}<|eot_id|>{% endfor %}"
      "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}";
  write("tokenizer_config.json",
        json({{"bos_token", {{"content", "he"}}}, {"eos_token", "<eos>"}, {"chat_template", tmpl}})
            .dump());
  const BpeTokenizer t(dir_.string());  // a folder: tokenizer.json + tokenizer_config.json
  EXPECT_EQ(t.bos_id(), 256);
  EXPECT_EQ(t.eos_id(), 300);
  const std::vector<ChatMessage> messages = {{"system", " be brief "}, {"user", "hi"}};
  EXPECT_EQ(t.apply_chat_template(messages, false),
            "he<|start_header_id|>system<|end_header_id|>\n\n be brief <|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>");
  EXPECT_EQ(t.apply_chat_template(messages, true),
            "he<|start_header_id|>system<|end_header_id|>\n\n be brief <|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");

  write("tokenizer_config.json", json({{"eos_token", "<missing>"}}).dump());
  try {
    BpeTokenizer bad(path);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("eos_token"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("<missing>"), std::string::npos) << e.what();
  }
  // any template the Jinja interpreter parses renders; one it cannot parse leaves the
  // tokenizer without one, saying why where a template is needed
  write("tokenizer_config.json", json({{"chat_template", "{{ messages | map(attribute='role') | join(',') }}"}}).dump());
  EXPECT_EQ(BpeTokenizer(path).apply_chat_template(messages, false), "system,user");
  write("tokenizer_config.json", json({{"chat_template", "a\n{% include 'other.jinja' %}"}}).dump());
  const BpeTokenizer other(path);
  EXPECT_FALSE(other.has_chat_template());
  try {
    (void)other.apply_chat_template(messages, true);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("key `chat_template`` line 2: `{% include %}` is not supported"),
              std::string::npos)
        << e.what();
  }
  write("tokenizer_config.json", json({{"chat_template", "{{ raise_exception('only ' + messages[0].role) }}"}}).dump());
  try {
    (void)BpeTokenizer(path).apply_chat_template(messages, true);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("the template raised an exception: only system"), std::string::npos)
        << e.what();
  }
}

// Llama 2's vocabulary (scripts/llama2_tokenizer.py builds its tokenizer.json at set-up from
// llama.cpp's vocab file on PyPI and checks it with HF `tokenizers`) against llama.cpp's 46
// expected Llama 2 encodings, made with HF's Llama 2 tokenizer; decoding gives the text back.
TEST(Llama2Tokenizer, LlamaCppVocabTest46Cases) {
  ST_REQUIRE_SHARED_DATA(dir);
  const std::string path = testing::source_dir() + "/.deps/llama2-tokenizer";
  if (!std::filesystem::exists(path + "/tokenizer.json"))
    GTEST_SKIP() << path << "/tokenizer.json not found (scripts/setup.sh --tests builds it)";
  const BpeTokenizer t(path);
  EXPECT_EQ(t.vocab_size(), 32000);
  EXPECT_EQ(t.bos_id(), 1);
  EXPECT_EQ(t.eos_id(), 2);
  const std::vector<Case> cases = load_llama_cpp_cases(dir, "llama-cpp-llama-spm");
  ASSERT_EQ(cases.size(), 46u);
  int failures = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::vector<int32_t> ids = t.encode(cases[i].text);
    if (ids != cases[i].ids) {
      ++failures;
      ADD_FAILURE() << "case " << i << " \"" << cases[i].text << "\": " << ids.size() << " ids, expected "
                    << cases[i].ids.size();
    }
    EXPECT_EQ(t.decode(ids), cases[i].text) << "case " << i;
  }
  EXPECT_EQ(failures, 0);
}

// The NFC normalizer (Qwen2's): "e" + U+0301 is encoded as the composed U+00E9 is; without it
// as its own two characters.
TEST_F(SmallTokenizer, NfcComposesBeforeEncoding) {
  json j = small_tokenizer();
  const BpeTokenizer plain(write("plain.json", j.dump()), "");
  j["normalizer"] = {{"type", "NFC"}};
  const BpeTokenizer nfc(write("nfc.json", j.dump()), "");
  EXPECT_EQ(nfc.encode("e\u0301 [M]"), nfc.encode("\u00e9 [M]"));
  EXPECT_EQ(nfc.encode("e\u0301"), plain.encode("\u00e9"));
  EXPECT_NE(plain.encode("e\u0301"), plain.encode("\u00e9"));
  j["normalizer"] = {{"type", "NFKC"}};
  expect_load_error(j, {"key `normalizer`", "NFKC", "NFC"});
}

// A SentencePiece-style (Llama 2) tokenizer.json in miniature: <unk> <s> </s>, the 256
// byte-fallback tokens, a few characters and merges; Llama 2's normalizer and decoder.
json small_sentencepiece() {
  json vocab = json::object();
  vocab["<unk>"] = 0;
  vocab["<s>"] = 1;
  vocab["</s>"] = 2;
  const char* hex = "0123456789ABCDEF";
  for (int b = 0; b < 256; ++b) vocab[std::string("<0x") + hex[b >> 4] + hex[b & 15] + ">"] = 3 + b;
  int32_t next = 259;
  for (const char* piece : {"\u2581", "h", "e", "l", "o", "he", "ll", "llo", "hello", "\u2581hello", "w", "\u2581w"})
    vocab[piece] = next++;
  json added = json::array();
  for (auto [content, id] : {std::pair<const char*, int>{"<unk>", 0}, {"<s>", 1}, {"</s>", 2}})
    added.push_back({{"id", id}, {"content", content}, {"special", true}, {"normalized", false}, {"lstrip", false},
                     {"rstrip", false}, {"single_word", false}});
  return {{"version", "1.0"},
          {"truncation", nullptr},
          {"padding", nullptr},
          {"added_tokens", added},
          {"normalizer", json::parse(R"({"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "▁"},
                                         {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]})")},
          {"pre_tokenizer", nullptr},
          {"post_processor", nullptr},
          {"decoder", json::parse(R"({"type": "Sequence", "decoders": [
                                      {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
                                      {"type": "ByteFallback"}, {"type": "Fuse"},
                                      {"type": "Strip", "content": " ", "start": 1, "stop": 0}]})")},
          {"model",
           {{"type", "BPE"},
            {"dropout", nullptr},
            {"unk_token", "<unk>"},
            {"fuse_unk", true},
            {"byte_fallback", true},
            {"ignore_merges", false},
            {"vocab", vocab},
            {"merges", json::array({json::array({"h", "e"}), json::array({"l", "l"}), json::array({"ll", "o"}),
                                    json::array({"he", "llo"}), json::array({"\u2581", "hello"}),
                                    json::array({"\u2581", "w"})})}}}};
}

// The SentencePiece pipeline: "▁" prepended to each stretch between added tokens and spaces
// made "▁", merges over characters, characters outside the vocab as their bytes' tokens;
// decoding turns "▁" into spaces and bytes back into text and drops the first space.
TEST_F(SmallTokenizer, SentencePieceNormalizesMergesAndFallsBackToBytes) {
  const BpeTokenizer t(write("tokenizer.json", small_sentencepiece().dump()), "");
  EXPECT_EQ(t.vocab_size(), 271);
  EXPECT_EQ(t.bos_id(), 1);  // <s> and </s> without a tokenizer_config.json
  EXPECT_EQ(t.eos_id(), 2);
  const int32_t hello = 268, w = 270, sp = 259;
  auto byte = [](unsigned char b) { return 3 + static_cast<int32_t>(b); };
  // "hello wx" -> "▁hello▁wx": ▁hello ▁w and x (not in the vocab) as <0x78>
  EXPECT_EQ(t.encode("hello wx"), (std::vector<int32_t>{hello, w, byte('x')}));
  EXPECT_EQ(t.decode(t.encode("hello wx")), "hello wx");
  // "é" is two bytes; each stretch after <s> starts with its own "▁"
  EXPECT_EQ(t.encode("\xc3\xa9<s> hello"), (std::vector<int32_t>{sp, byte(0xc3), byte(0xa9), 1, sp, hello}));
  EXPECT_EQ(t.decode(t.encode("\xc3\xa9<s> hello")), "\xc3\xa9<s>  hello");
  EXPECT_EQ(t.decode(std::vector<int32_t>{hello, w}), "hello w");  // the first space dropped
  EXPECT_EQ(t.id_to_bytes(hello), " hello");                       // not inside a sequence
  EXPECT_EQ(t.token_to_id("\u2581hello"), hello);
  EXPECT_TRUE(t.encode("").empty());
  EXPECT_EQ(t.encode(" "), (std::vector<int32_t>{sp, sp}));
}

// HF's Metaspace pre-tokenizer ("▁" for spaces, not split) with `scheme` as its prepend_scheme.
json metaspace(const char* scheme) {
  return {{"type", "Metaspace"}, {"replacement", "\u2581"}, {"prepend_scheme", scheme}, {"split", false}};
}

// The Metaspace pre-tokenizer in place of the normalizer (transformers' newer conversions):
// a stretch that starts with a space gets no second "▁", and with prepend_scheme "first" only
// the text's first stretch gets one.
TEST_F(SmallTokenizer, SentencePieceWithTheMetaspacePreTokenizer) {
  for (const char* scheme : {"first", "always"}) {
    SCOPED_TRACE(scheme);
    json j = small_sentencepiece();
    j["normalizer"] = nullptr;
    j["pre_tokenizer"] = metaspace(scheme);
    const BpeTokenizer t(write("tokenizer.json", j.dump()), "");
    const int32_t hello = 268, plain_hello = 267, w = 270, sp = 259;
    EXPECT_EQ(t.encode("hello wx"), (std::vector<int32_t>{hello, w, 3 + 'x'}));
    EXPECT_EQ(t.encode(" hello"), (std::vector<int32_t>{hello}));  // the Prepend normalizer: ▁ ▁hello
    EXPECT_EQ(t.encode("  hello"), (std::vector<int32_t>{sp, hello}));
    const bool first = std::string(scheme) == "first";
    EXPECT_EQ(t.encode("<s>hello"), (std::vector<int32_t>{1, first ? plain_hello : hello}));
    EXPECT_EQ(t.decode(t.encode("hello wx")), "hello wx");
  }
}

TEST_F(SmallTokenizer, SentencePieceConfigurationsOutsideLlama2AreNamed) {
  json j = small_sentencepiece();
  j["normalizer"] = {{"type", "Lowercase"}};
  expect_load_error(j, {"key `normalizer`", "Lowercase", "Prepend"});
  j = small_sentencepiece();
  j["pre_tokenizer"] = {{"type", "Metaspace"}};
  expect_load_error(j, {"key `pre_tokenizer`", "Metaspace"});
  j = small_sentencepiece();
  j["decoder"]["decoders"].erase(3);
  expect_load_error(j, {"key `decoder`", "Strip"});
  j = small_sentencepiece();
  j["normalizer"] = nullptr;
  j["pre_tokenizer"] = metaspace("never");
  expect_load_error(j, {"key `pre_tokenizer`", "prepend_scheme \"first\" or \"always\"", "never"});
  j["pre_tokenizer"]["prepend_scheme"] = "first";
  j["added_tokens"][1]["normalized"] = true;
  expect_load_error(j, {"key `added_tokens[1].normalized`", "Metaspace"});
  j = small_sentencepiece();
  j["model"]["byte_fallback"] = false;
  expect_load_error(j, {"key `model.byte_fallback`", "true"});
  j = small_sentencepiece();
  j["model"]["vocab"].erase("<0x41>");
  expect_load_error(j, {"no byte-fallback token <0x41>"});
}

}  // namespace
}  // namespace shardtrain::data
