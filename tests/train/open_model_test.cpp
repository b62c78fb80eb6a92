// Opening a model to sample from: a Hugging Face folder and a checkpoint (its step directory,
// or the folder holding `latest`) give back the written model's logits bit for bit; the
// tokenizer defaults to the model's own (an export of a byte model: the byte-level tokenizer
// it carries); bad paths and tokenizers are errors naming them and the values --tokenizer takes.
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "data/byte_tokenizer.h"
#include "model/llama.h"
#include "testing/compare.h"
#include "testing/model_folders.h"
#include "train/open_model.h"

namespace shardtrain::train {
namespace {

namespace fs = std::filesystem;

std::string temp_path(const std::string& name) {
  return (fs::temp_directory_path() / ("shardtrain_open_" + std::to_string(::getpid()) + "_" + name)).string();
}

using testing::throws_with;

class OpenModel : public ::testing::Test {
 protected:
  void SetUp() override {
    source_ = std::make_unique<testing::TinyStore>(config_, 41);
    model_ = std::make_unique<model::Llama>(config_, source_->layout, source_->store.get(), DType::kF32, Device::cpu());
    ids_ = Tensor::empty({1, 9}, DType::kI32);
    testing::fill_random_ints(ids_, 2, 0, config_.vocab_size);
  }
  void TearDown() override {
    for (const std::string& p : cleanup_) fs::remove_all(p);
  }
  std::string path(const std::string& name) {
    cleanup_.push_back(temp_path(name));
    return cleanup_.back();
  }

  model::LlamaConfig config_ = testing::tiny_generation_config();
  std::unique_ptr<testing::TinyStore> source_;
  std::unique_ptr<model::Llama> model_;
  Tensor ids_;
  std::vector<std::string> cleanup_;
};

TEST_F(OpenModel, HuggingFaceFolderGivesTheSameLogits) {
  const std::string hf = path("hf");
  testing::write_hf_folder(*source_, config_, hf, "", false);  // no tokenizer files
  const OpenedModel m = open_model(hf);
  EXPECT_EQ(m.source, ModelSource::kHuggingFace);
  EXPECT_EQ(m.model->config().summary(), config_.summary());
  EXPECT_TRUE(testing::all_close(m.model->last_logits(ids_), model_->last_logits(ids_), testing::kExact));
  EXPECT_TRUE(throws_with([&] { open_tokenizer("", m); },
                          "holds no tokenizer.json; name one with --tokenizer PATH, which takes a tokenizer.json, the "
                          "folder holding one, or `byte` (the byte-level tokenizer)"));
  EXPECT_EQ(open_tokenizer("byte", m)->vocab_size(), 258);
}

TEST_F(OpenModel, AnExportOfAByteModelOpensWithTheTokenizerItCarries) {
  const std::string hf = path("byte_export");
  testing::write_hf_folder(*source_, config_, hf);  // the byte-level tokenizer's files
  const OpenedModel m = open_model(hf);
  EXPECT_EQ(m.tokenizer_source, hf);
  const std::unique_ptr<data::Tokenizer> t = open_tokenizer("", m);
  EXPECT_EQ(t->fingerprint(), "byte") << "read back as the byte-level tokenizer";
  const std::string text = "na\xc3\xafve <|end_of_text|>";
  EXPECT_EQ(t->encode(text), data::ByteTokenizer().encode(text));
  EXPECT_EQ(t->bos_id(), 256);
  EXPECT_EQ(t->eos_id(), 257);
}

TEST_F(OpenModel, CheckpointGivesTheSameLogitsAndTheByteTokenizer) {
  const std::string root = path("ck");
  const std::string step_dir = testing::write_checkpoint(*source_, config_, root, 5);
  for (const std::string& p : {root, step_dir}) {
    const OpenedModel m = open_model(p);
    EXPECT_EQ(m.source, ModelSource::kCheckpoint);
    EXPECT_EQ(m.step, 5);
    EXPECT_EQ(fs::path(m.path).filename(), "step_00000005") << p;
    EXPECT_TRUE(testing::all_close(m.model->last_logits(ids_), model_->last_logits(ids_), testing::kExact)) << p;
    EXPECT_EQ(open_tokenizer("", m)->vocab_size(), 258) << "no tokenizer recorded: the byte tokenizer";
  }
}

TEST_F(OpenModel, BadPathsAndTokenizersAreNamed) {
  EXPECT_TRUE(throws_with([] { open_model("/nonexistent/model"); }, "model `/nonexistent/model` does not exist"));
  const std::string empty = path("empty");
  fs::create_directories(empty);
  EXPECT_TRUE(throws_with([&] { open_model(empty); }, "holds neither config.json"));
  const std::string file = empty + "/weights.bin";
  std::ofstream(file) << "x";
  EXPECT_TRUE(throws_with([&] { open_model(file); }, "is a file"));

  model::LlamaConfig small = config_;
  small.vocab_size = 100;  // fewer ids than the byte tokenizer's 258
  testing::TinyStore s(small, 3);
  const std::string hf = path("small");
  testing::write_hf_folder(s, small, hf, "", false);  // the byte-level tokenizer does not fit
  const OpenedModel m = open_model(hf);
  EXPECT_TRUE(throws_with([&] { open_tokenizer("byte", m); }, "has 258 tokens but the model"));
  EXPECT_TRUE(throws_with([&] { open_tokenizer("/nonexistent/tok.json", m); },
                          "--tokenizer = `/nonexistent/tok.json`: no such file or folder; it takes a tokenizer.json, "
                          "the folder holding one, or `byte`"));
}

}  // namespace
}  // namespace shardtrain::train
