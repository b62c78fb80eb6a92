// The passes of the FP8 attention forward that are ours (ops/attention.h,
// attention_forward_fp8): q, k and v to e4m3 with their scales, and cuDNN's e4m3 output back to
// bf16. They read their scales on the device, so a CUDA graph can replay them.
#pragma once

#include "core/tensor.h"

namespace shardtrain::ops::cuda {

// The f32 entries of the scales buffer (kFp8AttentionScaleCount of them) the passes share with
// cuDNN's graph: dequantisation factors of q, k, v and the output, and the output's
// quantisation factor.
enum Fp8AttentionScale : int64_t {
  kFp8DescaleQ, kFp8DescaleK, kFp8DescaleV, kFp8DescaleOut, kFp8ScaleOut, kFp8AttentionScaleCount
};

// q8, k8, v8 (f8e4m3, contiguous [B, T, heads, H]) = q, k, v (bf16 [B, T, heads, H], each
// token's heads contiguous, tokens a pitch apart) times the power-of-two factor of each one's
// amax; q, k and v are then overwritten with the values their codes stand for. Fills scales_F
// (f32 [kFp8AttentionScaleCount]).
void fp8_attention_inputs(Tensor& q8, Tensor& k8, Tensor& v8, Tensor& scales_F, Tensor& q, Tensor& k, Tensor& v,
                          Stream stream);

// out (bf16, contiguous) = out8 (f8e4m3, as many elements) times scales_F[kFp8DescaleOut].
void fp8_attention_output(Tensor& out, const Tensor& out8, const Tensor& scales_F, Stream stream);

}  // namespace shardtrain::ops::cuda
