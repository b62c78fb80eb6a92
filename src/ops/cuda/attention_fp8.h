// The passes of the FP8 attention (ops/attention.h, attention_forward_fp8 and
// attention_backward_fp8) that are ours: the operands to e4m3 with their scales, and cuDNN's
// e4m3 results back to bf16. They read and write their scales on the device, so a CUDA graph
// can replay them.
#pragma once

#include "core/tensor.h"

namespace shardtrain::ops::cuda {

// The f32 entries of the scales buffer (kFp8Count of them) the passes share with cuDNN's graphs.
// A factor multiplies a value into its e4m3 code's range, a descale multiplies the code back.
enum Fp8AttentionScale : int64_t {
  // the operands' factors, in the order the passes take them: q, k, v, out, dout
  kFp8FactorQ, kFp8FactorK, kFp8FactorV, kFp8FactorOut, kFp8FactorDOut,
  // their descales (q, k, v, out: the forward's test reads these four together)
  kFp8DescaleQ, kFp8DescaleK, kFp8DescaleV, kFp8DescaleOut, kFp8DescaleDOut,
  // the backward's: dP = dout v^T, and its outputs dq, dk, dv
  kFp8FactorDP, kFp8DescaleDP, kFp8FactorDQ, kFp8DescaleDQ, kFp8FactorDK, kFp8DescaleDK, kFp8FactorDV,
  kFp8DescaleDV,
  // the probabilities' (ops::kFp8AttentionProbScale), for the backward's graph
  kFp8FactorP, kFp8DescaleP,
  kFp8Count
};

// The forward's inputs: q8, k8, v8 (f8e4m3, contiguous [B, T, heads, H]) = q, k, v (bf16
// [B, T, heads, H], each token's heads contiguous, tokens a pitch apart) times the power-of-two
// factor of each one's amax; q, k and v are then overwritten with the values their codes stand
// for. Fills the factors and descales of q, k, v and out in scales_F (f32 [kFp8Count]).
void fp8_attention_inputs(Tensor& q8, Tensor& k8, Tensor& v8, Tensor& scales_F, Tensor& q, Tensor& k, Tensor& v,
                          Stream stream);

// The backward's inputs: q8, k8, v8, out8, dout8 (f8e4m3, contiguous) of q, k, v (already
// rounded by the forward: their codes come out as the forward's), out (the forward's, whose
// codes come back exactly under v's output factor) and dout (a factor from its amax). Fills
// every entry of scales_F: the outputs' factors from history_4 (f32 [4] on the device: the
// largest |dq|, |dk|, |dv|, |dP| of earlier calls, 0 for none yet) with two powers of two of
// headroom, or where that is 0 (a first call) from bounds: |dP| <= H max|dout| max|v|, and the
// sums dq, dk and dv make of it (softmax_scale: the scores' scale).
void fp8_attention_backward_inputs(Tensor& q8, Tensor& k8, Tensor& v8, Tensor& out8, Tensor& dout8,
                                   Tensor& scales_F, const Tensor& q, const Tensor& k, const Tensor& v,
                                   const Tensor& out, const Tensor& dout, const Tensor& history_4,
                                   double softmax_scale, Stream stream);

// out (bf16, contiguous) = out8 (f8e4m3, as many elements) times scales_F[kFp8DescaleOut].
void fp8_attention_output(Tensor& out, const Tensor& out8, const Tensor& scales_F, Stream stream);

// dx (bf16 [B, T, heads, H], each token's heads contiguous) = dx8 (f8e4m3, contiguous) times
// scales_F[descale].
void fp8_attention_gradient(Tensor& dx, const Tensor& dx8, const Tensor& scales_F, Fp8AttentionScale descale,
                            Stream stream);

// history_4 = max(amax_4, history_4 / 2) element by element (amax_4: f32 [4], cuDNN's largest
// |dq|, |dk|, |dv|, |dP| of this call): the scales of the next call follow the gradients down
// as well as up.
void fp8_attention_update_history(Tensor& history_4, const Tensor& amax_4, Stream stream);

}  // namespace shardtrain::ops::cuda
