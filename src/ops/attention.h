// Causal grouped-query attention that never forms the T x T score matrix: tiles of keys are
// visited with an online softmax (FlashAttention's recurrence), keeping per-row log-sum-exp
// for the backward, which recomputes the probabilities tile by tile. Memory O(T).
// Query head n reads kv head n / (N / M); K/V are never replicated.
#pragma once

#include <cstdint>

#include "core/tensor.h"
#include "ops/dispatch.h"

namespace shardtrain::ops {

struct AttentionOptions {
  bool causal = true;
  double scale = 0.0;          // softmax scale; 0 means 1 / sqrt(H)
  int64_t block_queries = 64;  // CPU tile sizes (any positive values give the same result
  int64_t block_keys = 64;     // up to rounding)
};

namespace cpu {
void attention_forward(Tensor& out_BTNH, Tensor& lse_BNT, const Tensor& q_BTNH, const Tensor& k_BTMH,
                       const Tensor& v_BTMH, const AttentionOptions& options);
void attention_backward(Tensor& dq_BTNH, Tensor& dk_BTMH, Tensor& dv_BTMH, const Tensor& dout_BTNH,
                        const Tensor& q_BTNH, const Tensor& k_BTMH, const Tensor& v_BTMH,
                        const Tensor& out_BTNH, const Tensor& lse_BNT, const AttentionOptions& options);
}  // namespace cpu

// out_BTNH = softmax(scale · q k^T + causal mask) v (overwrites); lse_BNT (overwrites,
// stats_dtype(q)) = log-sum-exp of each query row's scaled scores. N % M == 0. q, k, v, out
// share one dtype (f32/f64 on the CPU); softmax math in stats_dtype. No aliasing.
inline void attention_forward(Tensor& out_BTNH, Tensor& lse_BNT, const Tensor& q_BTNH, const Tensor& k_BTMH,
                              const Tensor& v_BTMH, const AttentionOptions& options = {}, Stream = {}) {
  if (q_BTNH.device().is_cpu()) return cpu::attention_forward(out_BTNH, lse_BNT, q_BTNH, k_BTMH, v_BTMH, options);
  no_kernel("attention_forward", q_BTNH);
}

// dq_BTNH, dk_BTMH, dv_BTMH (all overwrite; dk/dv sum over the N/M query heads of a group)
// from dout_BTNH and the forward's q, k, v, out and lse.
inline void attention_backward(Tensor& dq_BTNH, Tensor& dk_BTMH, Tensor& dv_BTMH, const Tensor& dout_BTNH,
                               const Tensor& q_BTNH, const Tensor& k_BTMH, const Tensor& v_BTMH,
                               const Tensor& out_BTNH, const Tensor& lse_BNT,
                               const AttentionOptions& options = {}, Stream = {}) {
  if (q_BTNH.device().is_cpu())
    return cpu::attention_backward(dq_BTNH, dk_BTMH, dv_BTMH, dout_BTNH, q_BTNH, k_BTMH, v_BTMH, out_BTNH,
                                   lse_BNT, options);
  no_kernel("attention_backward", q_BTNH);
}

}  // namespace shardtrain::ops
