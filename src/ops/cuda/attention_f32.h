// Attention in f32 on CUDA (cuDNN's flash kernels take bf16/f16 only): exact, deterministic,
// O(T^2 H) per head; for f32 check runs, not for speed. Same contract as ops::attention_*.
#pragma once

#include "core/tensor.h"
#include "ops/attention.h"

namespace shardtrain::ops::cuda {

void attention_forward_f32(Tensor& out_BTNH, Tensor& lse_BNT, const Tensor& q_BTNH, const Tensor& k_BTMH,
                           const Tensor& v_BTMH, const AttentionOptions& options, Stream stream);

void attention_backward_f32(Tensor& dq_BTNH, Tensor& dk_BTMH, Tensor& dv_BTMH, const Tensor& dout_BTNH,
                            const Tensor& q_BTNH, const Tensor& k_BTMH, const Tensor& v_BTMH, const Tensor& out_BTNH,
                            const Tensor& lse_BNT, const AttentionOptions& options, Stream stream);

}  // namespace shardtrain::ops::cuda
