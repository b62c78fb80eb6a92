// Fused output projection + cross-entropy, forward and backward in one pass over chunks of
// tokens, so only [chunk x V] logits ever exist (never [T x V]). Loss math in stats_dtype.
#pragma once

#include <cstdint>

#include "core/profile.h"
#include "core/tensor.h"
#include "ops/dispatch.h"
#include "ops/linear.h"

namespace shardtrain::ops {

struct CrossEntropyOptions {
  int32_t ignore_index = -100;  // targets equal to this contribute no loss and no gradient
  // Multiplies the gradients: pass 1 / (number of counted tokens over the whole global
  // batch) to get the gradient of the mean loss across micro-batches and ranks.
  double grad_scale = 1.0;
  // CUDA: when defined (1 element, f32, on the device), the scale is read from here when the
  // kernel runs instead of grad_scale (a CUDA graph replays with a new value each step).
  Tensor grad_scale_device;
  int64_t chunk_tokens = 256;  // tokens per logits chunk
  bool compute_grad = true;    // false: loss only (evaluation)
  // CUDA: check every target on the device and read the verdict back before computing (a
  // synchronisation). false: the caller has checked them (the model checks its host
  // targets), and a bad target turns the loss into NaN instead of an error.
  bool check_targets = true;
  // dweight_VD overwritten instead of accumulated: the first gradient a micro-batch writes
  // into a buffer whose old contents are not wanted (no zero-fill needed before).
  bool overwrite_dweight = false;
  // With a recipe (training.fp8_head): the head's three products (the logits, dh and dW) are
  // FP8 products of quantised operands (ops/linear.h's LinearFp8: h and the weight in e4m3, the
  // logits' gradient in fp8.gradient_format), each chunk quantised on its own (the amax slots
  // are not used). The softmax and loss math is unchanged.
  LinearFp8 fp8 = {};
  // > 0: the logits soft-capped before the softmax, z -> logit_softcap · tanh(z / logit_softcap)
  // (Gemma 2's final_logit_softcapping), held capped in the logits' dtype; the gradient through
  // the cap, grad_scale · (softmax - onehot) · (1 - (capped / logit_softcap)^2).
  double logit_softcap = 0.0;
};

namespace cpu {
void linear_cross_entropy(Tensor& loss_sum_1, Tensor& dh_TD, Tensor& dweight_VD, const Tensor& h_TD,
                          const Tensor& weight_VD, const Tensor& targets_T, const CrossEntropyOptions& options);
}  // namespace cpu

namespace cuda {
void linear_cross_entropy(Tensor& loss_sum_1, Tensor& dh_TD, Tensor& dweight_VD, const Tensor& h_TD,
                          const Tensor& weight_VD, const Tensor& targets_T, const CrossEntropyOptions& options,
                          Stream stream);
}  // namespace cuda

// The chunked op's least work: its products (the logits, and with the gradient dh and dW:
// 2·T·D·V FLOPs each) and its traffic: h, weight, dh, dweight (read and written), and per
// logit written and read once, with the gradient also written once and read by both products.
inline profile::Cost linear_cross_entropy_cost(const Tensor& dh_TD, const Tensor& dweight_VD, const Tensor& h_TD,
                                               const Tensor& weight_VD, const CrossEntropyOptions& options) {
  if (h_TD.ndim() != 2 || weight_VD.ndim() != 2) return {};  // the op's own checks report it
  const double logits = static_cast<double>(h_TD.size(0)) * static_cast<double>(weight_VD.size(0));
  const double product = 2 * logits * static_cast<double>(h_TD.size(1));
  const double e = static_cast<double>(dtype_size(h_TD.dtype()));
  if (!options.compute_grad) return {product, profile::bytes_of({&h_TD, &weight_VD}) + 2 * e * logits};
  return {3 * product, profile::bytes_of({&h_TD, &weight_VD, &dh_TD}) +
                           (options.overwrite_dweight ? 1 : 2) * profile::bytes_of({&dweight_VD}) + 5 * e * logits};
}

// For logits = h_TD · weight_VD^T and integer targets_T (i32, each in [0, V) or ignore_index):
//   loss_sum_1 += sum over counted t of (logsumexp(logits[t]) - logits[t, target[t]])
//     (accumulates; 1-element tensor of stats_dtype(h))
//   if compute_grad:
//     dh_TD = grad_scale · (softmax(logits) - onehot(target)) · weight   (overwrites; rows of
//             ignored tokens are zero)
//     dweight_VD += grad_scale · (softmax(logits) - onehot(target))^T · h (accumulates, or
//                  overwrites with options.overwrite_dweight)
// The logits and their gradient are held in h's dtype (bf16 logits for a bf16 model, as a
// bf16 LlamaForCausalLM computes them); the softmax and loss math is f32 (CUDA) or f64 (CPU).
// CPU: h, weight, dh, dweight share one dtype (f32/f64). CUDA: h and weight f32 or bf16; dh
// of h's dtype or f32, dweight of h's dtype or f32; loss_sum_1 f32 on the device.
inline void linear_cross_entropy(Tensor& loss_sum_1, Tensor& dh_TD, Tensor& dweight_VD, const Tensor& h_TD,
                                 const Tensor& weight_VD, const Tensor& targets_T,
                                 const CrossEntropyOptions& options, [[maybe_unused]] Stream stream = {}) {
  profile::ScopedTimer profile_timer("linear_cross_entropy", loss_sum_1.device(),
                                     linear_cross_entropy_cost(dh_TD, dweight_VD, h_TD, weight_VD, options));
  if (h_TD.device().is_cpu())
    return cpu::linear_cross_entropy(loss_sum_1, dh_TD, dweight_VD, h_TD, weight_VD, targets_T, options);
#ifdef SHARDTRAIN_WITH_CUDA
  return cuda::linear_cross_entropy(loss_sum_1, dh_TD, dweight_VD, h_TD, weight_VD, targets_T, options, stream);
#else
  no_kernel("linear_cross_entropy", h_TD);
#endif
}

}  // namespace shardtrain::ops
