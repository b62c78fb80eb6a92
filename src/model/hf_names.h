// The Hugging Face names of a model's tensors, in one table: each block parameter's name inside
// its layer, the names outside the blocks, and the tensors Phi-3 stores fused. The unit layout
// names every parameter from here, the block finds its weights by these names, and loading and
// exporting read and write the names the layout gives (and the fused ones).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace shardtrain::model {

// A block's parameters (BlockWeights' members). Every family names them alike; which of them
// a model has its config decides (ModelLayout::llama): the biases with attention_bias, the
// QK-norm weights with qk_norm (Qwen3, Gemma 3) or qk_norm_whole (OLMo 2), no attention input
// norm with post_norms (OLMo 2), the MLP's own input norm with sandwich_norms (Gemma) and the
// MLP's output norm with either.
enum class BlockParam {
  kAttnNorm,     // input_layernorm.weight
  kQ,            // self_attn.q_proj.weight
  kK,            // self_attn.k_proj.weight
  kV,            // self_attn.v_proj.weight
  kQBias,        // self_attn.q_proj.bias
  kKBias,        // self_attn.k_proj.bias
  kVBias,        // self_attn.v_proj.bias
  kQNorm,        // self_attn.q_norm.weight
  kKNorm,        // self_attn.k_norm.weight
  kO,            // self_attn.o_proj.weight
  kFfnNorm,      // post_attention_layernorm.weight: the MLP's input norm, or the attention's output norm
  kPreFfnNorm,   // pre_feedforward_layernorm.weight
  kGate,         // mlp.gate_proj.weight
  kUp,           // mlp.up_proj.weight
  kDown,         // mlp.down_proj.weight
  kPostFfnNorm,  // post_feedforward_layernorm.weight
};

struct BlockParamName {
  BlockParam param;
  const char* suffix;  // the name inside layer l: model.layers.<l>.<suffix>
};
// Every block parameter with its name, in BlockParam's order.
std::span<const BlockParamName> block_param_names();

// A block parameter's name inside its layer, e.g. "mlp.up_proj.weight".
const char* block_param_suffix(BlockParam p);
// Its whole name in layer `layer`, e.g. "model.layers.3.mlp.up_proj.weight".
std::string block_param_name(int64_t layer, BlockParam p);
// The whole name of a tensor of layer `layer` named `suffix` inside it.
std::string block_tensor_name(int64_t layer, const char* suffix);

// The parameters outside the blocks.
inline constexpr const char* kEmbeddingName = "model.embed_tokens.weight";
inline constexpr const char* kFinalNormName = "model.norm.weight";
inline constexpr const char* kHeadName = "lm_head.weight";  // none with tied embeddings

// A tensor that a family's files store in place of several block parameters, their rows back
// to back in `parts`' order (Phi-3 and Phi-4-mini: LlamaConfig::phi3_features).
struct FusedBlockParam {
  const char* suffix;  // the name inside layer l, as BlockParamName::suffix
  std::vector<BlockParam> parts;
};
// Phi-3's: self_attn.qkv_proj.weight (q, k, v) and mlp.gate_up_proj.weight (gate, up).
std::span<const FusedBlockParam> phi3_fused_params();

}  // namespace shardtrain::model
