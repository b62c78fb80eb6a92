// data.tokenizer: auto is model.hf's tokenizer.json, else the byte-level tokenizer (no model.hf,
// or a folder without tokenizer.json), and says which and why; byte and a path are taken as
// they are; what a checkpoint records and an export copies follows the choice; a value that
// names nothing fails listing the values data.tokenizer takes.
#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "data/bpe_tokenizer.h"
#include "data/byte_tokenizer.h"
#include "testing/compare.h"
#include "testing/temp_folder.h"
#include "train/training_data.h"

namespace shardtrain::train {
namespace {

using testing::throws_with;

class TokenizerChoiceTest : public testing::TempFolderTest {
 protected:
  DataSection data(const std::string& tokenizer) const {
    DataSection d;
    d.tokenizer = tokenizer;
    return d;
  }
  // A model folder with config.json only (its tokenizer is not there).
  std::string bare_model_folder() const {
    std::filesystem::create_directories(dir_ / "bare");
    std::ofstream(dir_ / "bare" / "config.json") << "{}";
    return (dir_ / "bare").string();
  }
  // A model folder with a tokenizer.json (the byte tokenizer's files with a chat template, so
  // that it loads as a BPE tokenizer).
  std::string model_folder_with_tokenizer() const {
    const std::filesystem::path f = dir_ / "with_tokenizer";
    std::filesystem::create_directories(f);
    for (const auto& [name, text] : data::byte_tokenizer_files()) std::ofstream(f / name, std::ios::binary) << text;
    std::ofstream(f / "tokenizer_config.json")
        << R"({"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>", "chat_template": "{{ 1 }}"})";
    return f.string();
  }
};

TEST_F(TokenizerChoiceTest, AutoWithoutModelHfIsTheByteTokenizer) {
  const TokenizerChoice c = choose_tokenizer(data("auto"), "");
  EXPECT_EQ(c.spec, "byte");
  EXPECT_EQ(c.source, "");
  EXPECT_EQ(c.reason, "the byte-level tokenizer (data.tokenizer = auto, and no model.hf)");
  EXPECT_EQ(load_chosen_tokenizer(c)->fingerprint(), "byte");
}

TEST_F(TokenizerChoiceTest, AutoFallsBackToTheByteTokenizerWhenModelHfHoldsNoTokenizerJson) {
  const std::string hf = bare_model_folder();
  const TokenizerChoice c = choose_tokenizer(data("auto"), hf);
  EXPECT_EQ(c.spec, "byte");
  EXPECT_EQ(c.source, "") << "a checkpoint records, and an export writes, the byte-level tokenizer";
  EXPECT_EQ(c.reason, "the byte-level tokenizer (data.tokenizer = auto, and model.hf `" + hf +
                          "` holds no tokenizer.json; another one: data.tokenizer = the path of a tokenizer.json)");
  const auto t = make_tokenizer(data("auto"), hf);
  EXPECT_NE(dynamic_cast<const data::ByteTokenizer*>(t.get()), nullptr);
}

TEST_F(TokenizerChoiceTest, AutoTakesModelHfsTokenizerJson) {
  const std::string hf = model_folder_with_tokenizer();
  const TokenizerChoice c = choose_tokenizer(data("auto"), hf);
  EXPECT_EQ(c.spec, hf);
  EXPECT_EQ(c.source, hf);
  EXPECT_EQ(c.reason, "the tokenizer `" + hf + "/tokenizer.json` (data.tokenizer = auto: model.hf's tokenizer.json)");
  const auto t = make_tokenizer(data("auto"), hf);
  EXPECT_NE(dynamic_cast<const data::BpeTokenizer*>(t.get()), nullptr);
}

TEST_F(TokenizerChoiceTest, ByteAndAPathAreTakenAsTheyAre) {
  const std::string hf = model_folder_with_tokenizer();
  const TokenizerChoice byte = choose_tokenizer(data("byte"), hf);
  EXPECT_EQ(byte.spec, "byte");
  EXPECT_EQ(byte.source, "") << "not model.hf's tokenizer: the one trained with";
  EXPECT_EQ(byte.reason, "the byte-level tokenizer (data.tokenizer = byte)");
  const std::string file = hf + "/tokenizer.json";
  const TokenizerChoice path = choose_tokenizer(data(file), bare_model_folder());
  EXPECT_EQ(path.spec, file);
  EXPECT_EQ(path.source, file) << "not model.hf: the tokenizer trained with";
  EXPECT_EQ(path.reason, "the tokenizer `" + file + "` (data.tokenizer)");
  EXPECT_NE(dynamic_cast<const data::BpeTokenizer*>(load_chosen_tokenizer(path).get()), nullptr);
}

TEST_F(TokenizerChoiceTest, ANameThatIsNotThereListsTheValues) {
  const std::string values =
      "it takes auto (model.hf's tokenizer.json, else the byte-level tokenizer), byte (the byte-level tokenizer: 256 "
      "bytes + BOS/EOS), or the path of a tokenizer.json or of the folder holding one";
  EXPECT_TRUE(throws_with([&] { make_tokenizer(data("bytes"), ""); },
                          "`data.tokenizer` = `bytes`: no such file or folder; " + values));
  EXPECT_TRUE(throws_with([&] { make_tokenizer(data("/nonexistent/tokenizer.json"), ""); },
                          "`data.tokenizer` = `/nonexistent/tokenizer.json`: no such file or folder; " + values));
  const std::string hf = bare_model_folder();
  EXPECT_TRUE(throws_with([&] { make_tokenizer(data(hf), ""); },
                          "`data.tokenizer` = `" + hf +
                              "`: the folder holds no tokenizer.json; `data.tokenizer` takes"));
}

}  // namespace
}  // namespace shardtrain::train
