// Greedy generation against Hugging Face transformers: for the tiny models recorded by
// tools/make_hf_reference.py with a greedy continuation (a random 200-id prompt continued by 32
// ids with transformers' generate, f32, no sampling), shardtrain loads the folder and, in f32 on
// the CPU at temperature 0, continues the same prompt with the same 32 ids, with its KV cache
// and without it.
#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "data/tokenizer.h"
#include "io/safetensors.h"
#include "model/hf_config.h"
#include "model/llama.h"
#include "testing/shared_data.h"
#include "train/generate.h"

namespace shardtrain::train {
namespace {

// Text whose bytes are the ids themselves (every id of these models is below 128), no BOS, no EOS.
class ByteIdTokenizer final : public data::Tokenizer {
 public:
  explicit ByteIdTokenizer(int64_t vocab) : vocab_(vocab) {}
  std::vector<int32_t> encode(std::string_view text) const override {
    std::vector<int32_t> ids;
    for (char c : text) ids.push_back(static_cast<int32_t>(static_cast<unsigned char>(c)));
    return ids;
  }
  std::string decode(std::span<const int32_t> ids) const override {
    std::string s;
    for (int32_t id : ids) s += static_cast<char>(id);
    return s;
  }
  int64_t vocab_size() const override { return vocab_; }
  int32_t bos_id() const override { return -1; }
  int32_t eos_id() const override { return -1; }

 private:
  int64_t vocab_;
};

class HfGreedy : public ::testing::TestWithParam<std::string> {};

TEST_P(HfGreedy, ContinuesThePromptAsTransformers) {
  const std::string dir = testing::source_dir() + "/tests/model/hf_reference/" + GetParam();
  ASSERT_TRUE(std::filesystem::exists(dir + "/reference.safetensors"))
      << dir << " has no reference.safetensors; write it where torch and transformers are installed: "
      << "python3 tools/make_hf_reference.py --out tests/model/hf_reference " << GetParam();
  const model::LlamaConfig config = model::load_hf_config(dir + "/config.json");
  model::Llama llama(config, DType::kF32);
  const io::SafetensorsFile weights(dir + "/model.safetensors");
  for (const model::UnitLayout& u : llama.layout().units())
    for (const model::ParamSpec& p : u.params) {
      Tensor dst = llama.param(p.name);
      weights.read(p.name, dst);
    }
  const io::SafetensorsFile ref(dir + "/reference.safetensors");
  const Tensor prompt = ref.read_as("greedy.prompt", DType::kI64);
  const Tensor want = ref.read_as("greedy.continuation", DType::kI64);
  const double margin = ref.read_as("greedy.margin", DType::kF64).data<double>()[0];
  ASSERT_LT(prompt.numel() + want.numel(), config.max_seq_len) << "the reference must fit the model's positions";
  std::string text;
  for (int64_t i = 0; i < prompt.numel(); ++i) {
    ASSERT_LT(prompt.data<int64_t>()[i], 128);
    text += static_cast<char>(prompt.data<int64_t>()[i]);
  }
  std::vector<int32_t> expected;
  for (int64_t i = 0; i < want.numel(); ++i) expected.push_back(static_cast<int32_t>(want.data<int64_t>()[i]));

  const ByteIdTokenizer tok(config.vocab_size);
  SampleOptions o;
  o.prompt = text;
  o.tokens = want.numel();
  o.temperature = 0.0;
  o.add_bos = false;
  o.context_limit = ContextLimit::kStop;
  for (const bool cache : {true, false}) {
    o.kv_cache = cache;
    const SampleResult got = sample(llama, tok, o);
    EXPECT_EQ(got.prompt_tokens, prompt.numel());
    EXPECT_EQ(got.ids, expected) << (cache ? "with" : "without")
                                 << " the KV cache; the closest pick in transformers' run was " << margin
                                 << " above the runner-up";
  }
}

INSTANTIATE_TEST_SUITE_P(Transformers, HfGreedy,
                         ::testing::Values("mistral_head_dim", "qwen3_qk_norm", "mistral_sliding",
                                           "qwen2_window_layers"));

}  // namespace
}  // namespace shardtrain::train
