// Greedy generation against Hugging Face transformers on the CPU: for the tiny models recorded
// by tools/make_hf_reference.py with a greedy continuation, shardtrain opens the folder in f32
// and continues the same 200-id prompt with transformers' 32 ids, with its KV cache and without
// it (testing/hf_greedy.h).
#include <filesystem>
#include <string>

#include <gtest/gtest.h>

#include "testing/hf_greedy.h"
#include "train/open_model.h"

namespace shardtrain::train {
namespace {

class HfGreedy : public ::testing::TestWithParam<std::string> {};

// Cases listed in tools/make_hf_reference.py whose folders are not committed yet: skipped
// until they are (the others must be there).
TEST_P(HfGreedy, ContinuesThePromptAsTransformers) {
  const OpenedModel opened = open_model(testing::hf_reference_dir(GetParam()), DType::kF32, Device::cpu());
  testing::expect_greedy_as_transformers(*opened.model, GetParam());
}

INSTANTIATE_TEST_SUITE_P(Transformers, HfGreedy,
                         ::testing::Values("mistral_head_dim", "qwen3_qk_norm", "mistral_sliding",
                                           "qwen2_window_layers", "smollm3_nope", "granite_scaled",
                                           "olmo2_post_norms", "gemma3_text_small", "gemma2_softcap"));

}  // namespace
}  // namespace shardtrain::train
