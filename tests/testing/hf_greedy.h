// The greedy continuations tools/make_hf_reference.py records (a random 200-id prompt continued
// by 32 ids with transformers' generate, f32, no sampling) and the check that shardtrain's
// `sample` at temperature 0 continues the prompt with the same ids, with its KV cache and
// without it; for hf_greedy_test (CPU) and hf_greedy_cuda_test (GPU).
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "data/tokenizer.h"
#include "io/safetensors.h"
#include "model/llama.h"
#include "testing/shared_data.h"
#include "train/generate.h"

namespace shardtrain::testing {

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

// The reference folder of case `name` (tests/model/hf_reference/NAME).
inline std::string hf_reference_dir(const std::string& name) {
  return source_dir() + "/tests/model/hf_reference/" + name;
}

// Continues the case's prompt greedily with `model` and expects transformers' ids, with the KV
// cache and recomputing the context for every token.
inline void expect_greedy_as_transformers(model::Llama& model, const std::string& name) {
  const std::string dir = hf_reference_dir(name);
  ASSERT_TRUE(std::filesystem::exists(dir + "/reference.safetensors"))
      << dir << " has no reference.safetensors; write it where torch and transformers are installed: "
      << "python3 tools/make_hf_reference.py --out tests/model/hf_reference " << name;
  const io::SafetensorsFile ref(dir + "/reference.safetensors");
  const Tensor prompt = ref.read_as("greedy.prompt", DType::kI64);
  const Tensor want = ref.read_as("greedy.continuation", DType::kI64);
  const double margin = ref.read_as("greedy.margin", DType::kF64).data<double>()[0];
  ASSERT_LT(prompt.numel() + want.numel(), model.config().max_seq_len) << "the reference must fit the positions";
  std::string text;
  for (int64_t i = 0; i < prompt.numel(); ++i) {
    ASSERT_LT(prompt.data<int64_t>()[i], 128);
    text += static_cast<char>(prompt.data<int64_t>()[i]);
  }
  std::vector<int32_t> expected;
  for (int64_t i = 0; i < want.numel(); ++i) expected.push_back(static_cast<int32_t>(want.data<int64_t>()[i]));

  const ByteIdTokenizer tok(model.config().vocab_size);
  train::SampleOptions o;
  o.prompt = text;
  o.tokens = want.numel();
  o.temperature = 0.0;
  o.add_bos = false;
  o.context_limit = train::ContextLimit::kStop;
  for (const bool cache : {true, false}) {
    o.kv_cache = cache;
    const train::SampleResult got = train::sample(model, tok, o);
    EXPECT_EQ(got.prompt_tokens, prompt.numel());
    EXPECT_EQ(got.ids, expected) << (cache ? "with" : "without")
                                 << " the KV cache; the closest pick in transformers' run was " << margin
                                 << " above the runner-up";
  }
}

}  // namespace shardtrain::testing
