// The Hugging Face tensor-name table (transformers' LlamaDecoderLayer and its relatives).
#include "model/hf_names.h"

#include <array>

#include "core/error.h"

namespace shardtrain::model {
namespace {

constexpr std::array<BlockParamName, 16> kBlockParamNames = {{
    {BlockParam::kAttnNorm, "input_layernorm.weight"},
    {BlockParam::kQ, "self_attn.q_proj.weight"},
    {BlockParam::kK, "self_attn.k_proj.weight"},
    {BlockParam::kV, "self_attn.v_proj.weight"},
    {BlockParam::kQBias, "self_attn.q_proj.bias"},
    {BlockParam::kKBias, "self_attn.k_proj.bias"},
    {BlockParam::kVBias, "self_attn.v_proj.bias"},
    {BlockParam::kQNorm, "self_attn.q_norm.weight"},
    {BlockParam::kKNorm, "self_attn.k_norm.weight"},
    {BlockParam::kO, "self_attn.o_proj.weight"},
    {BlockParam::kFfnNorm, "post_attention_layernorm.weight"},
    {BlockParam::kPreFfnNorm, "pre_feedforward_layernorm.weight"},
    {BlockParam::kGate, "mlp.gate_proj.weight"},
    {BlockParam::kUp, "mlp.up_proj.weight"},
    {BlockParam::kDown, "mlp.down_proj.weight"},
    {BlockParam::kPostFfnNorm, "post_feedforward_layernorm.weight"},
}};

// block_param_suffix indexes the table by the enum's value
constexpr bool in_enum_order() {
  for (size_t i = 0; i < kBlockParamNames.size(); ++i)
    if (static_cast<size_t>(kBlockParamNames[i].param) != i) return false;
  return static_cast<size_t>(BlockParam::kPostFfnNorm) + 1 == kBlockParamNames.size();
}
static_assert(in_enum_order(), "kBlockParamNames lists every BlockParam once, in the enum's order");

}  // namespace

std::span<const BlockParamName> block_param_names() { return kBlockParamNames; }

const char* block_param_suffix(BlockParam p) {
  const auto i = static_cast<size_t>(p);
  ST_ASSERT(i < kBlockParamNames.size(), "block parameter ", i, " is not in the name table");
  return kBlockParamNames[i].suffix;
}

std::string block_tensor_name(int64_t layer, const char* suffix) {
  return "model.layers." + std::to_string(layer) + "." + suffix;
}

std::string block_param_name(int64_t layer, BlockParam p) { return block_tensor_name(layer, block_param_suffix(p)); }

std::span<const FusedBlockParam> phi3_fused_params() {
  static const std::vector<FusedBlockParam> fused = {
      {"self_attn.qkv_proj.weight", {BlockParam::kQ, BlockParam::kK, BlockParam::kV}},
      {"mlp.gate_up_proj.weight", {BlockParam::kGate, BlockParam::kUp}},
  };
  return fused;
}

}  // namespace shardtrain::model
