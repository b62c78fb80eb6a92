// Greedy generation against Hugging Face transformers on a GPU: the recorded tiny models opened
// on CUDA in f32 (the exact attention kernels; the KV cache's steps replayed as CUDA graphs)
// continue the same 200-id prompt with transformers' 32 ids, with the KV cache and without it
// (testing/hf_greedy.h); the sliding-window cases attend to the last positions only, and Gemma 2's
// soft-caps its attention scores and logits. Skips without a device.
#include <gtest/gtest.h>

#include "testing/cuda_util.h"
#include "testing/hf_greedy.h"
#include "train/open_model.h"

namespace shardtrain::train {
namespace {

class HfGreedyCuda : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override { ST_REQUIRE_CUDA(); }
};

TEST_P(HfGreedyCuda, ContinuesThePromptAsTransformers) {
  const OpenedModel opened = open_model(testing::hf_reference_dir(GetParam()), DType::kF32, generation_device("cuda"));
  testing::expect_greedy_as_transformers(*opened.model, GetParam());
}

INSTANTIATE_TEST_SUITE_P(Transformers, HfGreedyCuda,
                         ::testing::Values("mistral_head_dim", "qwen3_qk_norm", "mistral_sliding",
                                           "qwen2_window_layers", "phi3_longrope", "phi4_partial_rotary",
                                           "gemma2_softcap"));

}  // namespace
}  // namespace shardtrain::train
