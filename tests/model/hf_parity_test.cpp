// The model against Hugging Face transformers: for each tiny model recorded by
// tools/make_hf_reference.py (GQA/MHA, tied/untied, llama3 rope scaling, Qwen2 biases,
// Mistral with a head_dim of its own, Qwen3's QK-norm, sliding windows: Mistral's on every layer
// and Qwen2's from max_window_layers on, SmolLM3's NoPE layers, Granite's scalings, OLMo 2's
// norms after each sublayer and whole-projection QK-norm, Gemma 3's text model with its (1 + w)
// norms before and after each sublayer, GeGLU, scaled embeddings and two ropes, Gemma 2's
// soft-capped scores and logits, Phi-3's LongRoPE (short factors for the 13-token rows) over
// fused qkv_proj and gate_up_proj with a sliding window, Phi-4-mini's partial rotary; a case
// whose files are missing is skipped),
// shardtrain loads config.json and model.safetensors and must reproduce transformers'
// logits and loss (f32, relative 1e-5), every parameter gradient and every parameter after
// one AdamW step from transformers' gradients (relative 1e-4).
#include <filesystem>

#include <gtest/gtest.h>

#include "io/hf_folder.h"
#include "io/safetensors.h"
#include "model/hf_config.h"
#include "model/llama.h"
#include "optim/adamw.h"
#include "testing/compare.h"
#include "testing/hf_reference.h"
#include "testing/shared_data.h"
#include "train/hf_fused.h"

namespace shardtrain::model {
namespace {

const testing::Tolerance kLogits{1e-5, 1e-4, 1e-5};
const testing::Tolerance kGrads{1e-4, 1e-3, 1e-6};

class HfParity : public ::testing::TestWithParam<std::string> {};

TEST_P(HfParity, LogitsLossGradientsAndAdamWStep) {
  const std::string dir = testing::source_dir() + "/tests/model/hf_reference/" + GetParam();
  // a case listed in tools/make_hf_reference.py whose files are not generated yet
  if (!std::filesystem::exists(dir + "/reference.safetensors"))
    GTEST_SKIP() << dir << " has no reference.safetensors; write it where torch and transformers are installed: "
                 << "python3 tools/make_hf_reference.py --out tests/model/hf_reference " << GetParam();
  const LlamaConfig config = load_hf_config(dir + "/config.json");
  Llama model(config, DType::kF32);
  io::HfWeights weights(dir);
  train::expose_fused_tensors(weights, config);  // Phi-3's qkv_proj and gate_up_proj, split
  const io::SafetensorsFile ref(dir + "/reference.safetensors");
  const testing::ParamReference params_ref(dir + "/reference.safetensors", config);
  for (const UnitLayout& u : model.layout().units())
    for (const ParamSpec& p : u.params) {
      Tensor dst = model.param(p.name);
      weights.read_range(p.name, 0, dst);
    }

  const Tensor ids64 = ref.read_as("input_ids", DType::kI64), targets64 = ref.read_as("targets", DType::kI64);
  const int64_t B = ids64.size(0), T = ids64.size(1);
  Tensor ids = Tensor::empty({B, T}, DType::kI32), targets = Tensor::empty({B, T}, DType::kI32);
  int64_t counted = 0;
  for (int64_t i = 0; i < B * T; ++i) {
    ids.data<int32_t>()[i] = static_cast<int32_t>(ids64.data<int64_t>()[i]);
    targets.data<int32_t>()[i] = static_cast<int32_t>(targets64.data<int64_t>()[i]);
    counted += targets.data<int32_t>()[i] != -100;
  }

  const Tensor logits = model.logits(ids);
  EXPECT_TRUE(testing::all_close(logits, ref.read_as("logits", DType::kF32).view({B * T, config.vocab_size}), kLogits))
      << "logits";

  StepOptions o;
  o.grad_scale = 1.0 / static_cast<double>(counted);
  model.zero_grads();
  const LossSum ls = model.forward_backward(ids, targets, o);
  const double loss = ls.loss_sum / static_cast<double>(counted);
  const double ref_loss = ref.read_as("loss", DType::kF64).data<double>()[0];
  EXPECT_NEAR(loss, ref_loss, 1e-5 * ref_loss) << "loss";

  for (const UnitLayout& u : model.layout().units())
    for (const ParamSpec& p : u.params)
      EXPECT_TRUE(testing::all_close(model.grad(p.name), params_ref.read("grad." + p.name), kGrads))
          << "gradient of " << p.name;

  // torch.optim.AdamW(lr 1e-2, betas (0.9, 0.95), eps 1e-8, weight decay 0.1 on every parameter),
  // from transformers' gradients, which the gradients above are checked against: the first step
  // moves each weight by lr·g/(|g| + eps), so a gradient near eps (a few in ten thousand are
  // near 1e-7) turns the f32 rounding of our gradients (about 1e-6 of the tensor's scale) into
  // percent-sized differences of its step; from the same gradients the update rule itself is
  // compared.
  for (const UnitLayout& u : model.layout().units())
    for (const ParamSpec& p : u.params) {
      Tensor g = model.grad(p.name);
      params_ref.read("grad." + p.name, g);
    }
  optim::AdamWConfig oc;
  oc.beta1 = 0.9;
  oc.beta2 = 0.95;
  oc.eps = 1e-8;
  oc.weight_decay = 0.1;
  oc.decay_1d = true;
  optim::AdamW opt(model.layout(), 0, oc, DType::kF32, Device::cpu());
  std::vector<Tensor*> params;
  std::vector<const Tensor*> grads;
  for (size_t u = 0; u < model.layout().units().size(); ++u) {
    params.push_back(&model.unit_params(u));
    grads.push_back(&model.unit_grads(u));
  }
  opt.step(params, grads, 1e-2);
  for (const UnitLayout& u : model.layout().units())
    for (const ParamSpec& p : u.params)
      EXPECT_TRUE(testing::all_close(model.param(p.name), params_ref.read("adamw." + p.name), kGrads))
          << "parameter after AdamW: " << p.name;
}

INSTANTIATE_TEST_SUITE_P(Transformers, HfParity,
                         ::testing::Values("gqa_untied", "mha_tied", "gqa4_llama3_rope", "qwen2_bias", "mistral_gqa",
                                           "mistral_head_dim", "qwen3_qk_norm", "mistral_sliding",
                                           "ministral_layers", "qwen2_window_layers", "smollm3_nope",
                                           "granite_scaled", "olmo2_post_norms", "gemma3_text_small",
                                           "gemma2_softcap", "phi3_longrope", "phi4_partial_rotary"));

}  // namespace
}  // namespace shardtrain::model
