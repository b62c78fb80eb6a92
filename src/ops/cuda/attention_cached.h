// Attention forward over a KV cache on CUDA (T queries, S >= T keys, bottom-right causal):
// the decoding step's attention, which cuDNN's flash kernels (as many keys as queries) do not
// cover. Same contract as ops::attention_forward's S > T case; exact f32 math, not fast.
#pragma once

#include "core/tensor.h"
#include "ops/attention.h"

namespace shardtrain::ops::cuda {

void attention_forward_cached(Tensor& out_BTNH, Tensor& lse_BNT, const Tensor& q_BTNH, const Tensor& k_BSMH,
                              const Tensor& v_BSMH, const AttentionOptions& options, Stream stream);

}  // namespace shardtrain::ops::cuda
