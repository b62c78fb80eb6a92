// The byte-level tokenizer, its Hugging Face files and load_tokenizer: the tokenizer.json an
// export writes reads back through the BPE loader as the byte tokenizer's ids (every id, both
// special tokens, non-ASCII text), and load_tokenizer takes it for the byte tokenizer itself
// unless something beside it changes the tokens; a name that is not there fails listing the
// values the option takes.
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <gtest/gtest.h>

#include "data/bpe_tokenizer.h"
#include "data/byte_tokenizer.h"
#include "testing/compare.h"
#include "testing/temp_folder.h"

namespace shardtrain::data {
namespace {

using testing::throws_with;

// Valid UTF-8 with 1- to 4-byte characters, control bytes, both special tokens and pieces of them.
const std::vector<std::string> kSamples = {
    "Hello, world!",
    "  two spaces\tand a tab\nand lines\r\n",
    "caf\xc3\xa9 na\xc3\xafve \xc3\x9f \xe2\x82\xac 5",
    "\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e\xe3\x81\xae\xe6\x96\x87 "
    "\xf0\x9f\x98\x80\xf0\x9f\x8e\x89 \xd0\x9f\xd1\x80\xd0\xb8",
    "<|begin_of_text|>a document<|end_of_text|><|begin_of_text|>next",
    "<|begin_of_text <|end_of_text| <| |> <|begin_of_text|x",
    std::string("\x01\x02\x1f\x7f nul:") + std::string(1, '\0') + "end",
};

class ByteTokenizerFiles : public testing::TempFolderTest {
 protected:
  void SetUp() override {
    TempFolderTest::SetUp();
    for (const auto& [name, text] : byte_tokenizer_files()) write(name, text);
  }
  std::string read(const std::string& name) const {
    std::ifstream in(dir_ / name, std::ios::binary);
    std::ostringstream s;
    s << in.rdbuf();
    return s.str();
  }
  ByteTokenizer bytes_;
};

TEST_F(ByteTokenizerFiles, TheyAreTheThreeFilesTransformersReads) {
  std::vector<std::string> names;
  for (const auto& [name, text] : byte_tokenizer_files()) names.push_back(name);
  EXPECT_EQ(names, (std::vector<std::string>{"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"}));
  const nlohmann::json config = nlohmann::json::parse(read("tokenizer_config.json"));
  EXPECT_EQ(config["tokenizer_class"], "PreTrainedTokenizerFast");
  EXPECT_EQ(config["bos_token"], "<|begin_of_text|>");
  EXPECT_EQ(config["eos_token"], "<|end_of_text|>");
  EXPECT_EQ(config["clean_up_tokenization_spaces"], false);
  const nlohmann::json map = nlohmann::json::parse(read("special_tokens_map.json"));
  EXPECT_EQ(map, (nlohmann::json{{"bos_token", "<|begin_of_text|>"}, {"eos_token", "<|end_of_text|>"}}));
  EXPECT_TRUE(is_byte_tokenizer_json(read("tokenizer.json")));
  EXPECT_FALSE(is_byte_tokenizer_json(read("tokenizer.json") + " "));
}

TEST_F(ByteTokenizerFiles, TheBpeLoaderReadsThemAsTheByteTokenizersIds) {
  const BpeTokenizer bpe(dir_.string());
  EXPECT_EQ(bpe.vocab_size(), 258);
  EXPECT_EQ(bpe.bos_id(), ByteTokenizer::kBos);
  EXPECT_EQ(bpe.eos_id(), ByteTokenizer::kEos);
  EXPECT_TRUE(bpe.is_special(256));
  EXPECT_TRUE(bpe.is_special(257));
  EXPECT_FALSE(bpe.is_special(255));
  for (int32_t id = 0; id < 258; ++id) {  // every id, bytes 128..255 included
    const std::vector<int32_t> one = {id};
    EXPECT_EQ(bpe.decode(one), bytes_.decode(one)) << "id " << id;
  }
  for (const std::string& text : kSamples) {
    const std::vector<int32_t> ids = bytes_.encode(text);
    EXPECT_EQ(bpe.encode(text), ids) << text;
    EXPECT_EQ(bpe.decode(ids), text) << text;
  }
  EXPECT_EQ(bytes_.encode("\xc3\xa9"), (std::vector<int32_t>{0xc3, 0xa9})) << "a byte's id is the byte";
}

TEST_F(ByteTokenizerFiles, LoadTokenizerTakesThemForTheByteTokenizer) {
  for (const std::string& spec : {dir_.string(), (dir_ / "tokenizer.json").string()}) {
    const auto t = load_tokenizer(spec, "--tokenizer", "VALUES");
    EXPECT_NE(dynamic_cast<const ByteTokenizer*>(t.get()), nullptr) << spec;
    EXPECT_EQ(t->fingerprint(), "byte") << "the same token caches as the byte tokenizer";
  }
}

TEST_F(ByteTokenizerFiles, AChatTemplateOrAnEditedFileKeepsTheBpeLoader) {
  nlohmann::json config = nlohmann::json::parse(read("tokenizer_config.json"));
  config["chat_template"] = "{% for m in messages %}{{ m['content'] }}{% endfor %}";
  write("tokenizer_config.json", config.dump());
  auto t = load_tokenizer(dir_.string(), "--tokenizer", "VALUES");
  const auto* bpe = dynamic_cast<const BpeTokenizer*>(t.get());
  ASSERT_NE(bpe, nullptr) << "the chat template is kept";
  EXPECT_TRUE(bpe->has_chat_template());
  EXPECT_EQ(bpe->encode(kSamples[3]), bytes_.encode(kSamples[3]));

  for (const auto& [name, text] : byte_tokenizer_files()) write(name, text);
  write("tokenizer.json", nlohmann::json::parse(read("tokenizer.json")).dump());  // same tokens, other bytes
  t = load_tokenizer(dir_.string(), "--tokenizer", "VALUES");
  EXPECT_NE(dynamic_cast<const BpeTokenizer*>(t.get()), nullptr) << "only the file written here is recognised";
  EXPECT_EQ(t->encode(kSamples[4]), bytes_.encode(kSamples[4]));
}

class LoadTokenizer : public testing::TempFolderTest {};

TEST_F(LoadTokenizer, ByteAndErrorsThatListTheValues) {
  EXPECT_EQ(load_tokenizer("byte", "--tokenizer", "VALUES")->fingerprint(), "byte");
  EXPECT_TRUE(throws_with([] { load_tokenizer("/nonexistent/tok.json", "`data.tokenizer`", "auto, byte or a path"); },
                          "`data.tokenizer` = `/nonexistent/tok.json`: no such file or folder; it takes auto, byte "
                          "or a path"));
  EXPECT_TRUE(throws_with([] { load_tokenizer("Byte", "--tokenizer", "a tokenizer.json or `byte`"); },
                          "--tokenizer = `Byte`: no such file or folder; it takes a tokenizer.json or `byte`"));
  EXPECT_TRUE(throws_with([] { load_tokenizer("", "--tokenizer", "a tokenizer.json or `byte`"); },
                          "--tokenizer is empty; it takes a tokenizer.json or `byte`"));
  EXPECT_TRUE(throws_with([&] { load_tokenizer(dir_.string(), "--tokenizer", "a tokenizer.json or `byte`"); },
                          "the folder holds no tokenizer.json; --tokenizer takes a tokenizer.json or `byte`"));
}

}  // namespace
}  // namespace shardtrain::data
