// Phi-3's fused tensors in a Hugging Face folder, read as shardtrain's own parameters.
#pragma once

#include "io/hf_folder.h"
#include "model/config.h"

namespace shardtrain::train {

// Makes each part of the fused tensors of `config` (model::hf_fused_tensors: Phi-3's
// qkv_proj and gate_up_proj) readable from `weights` under its own name (q_proj, k_proj, v_proj,
// gate_proj, up_proj), a view of its rows of the fused tensor. A fused tensor whose shape
// differs from the one config.json implies is refused, naming it and both shapes; one that is
// absent while its parts are present under their own names is left alone.
void expose_fused_tensors(io::HfWeights& weights, const model::LlamaConfig& config);

}  // namespace shardtrain::train
