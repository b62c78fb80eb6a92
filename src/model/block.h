// One Llama decoder block with an explicit forward that records exactly what its backward
// needs, and an explicit backward. Weights are views into a sharding unit's flat buffer.
//   x2 = x + o_proj(attention(rope(q_proj(norm1(x))), rope(k_proj(..)), v_proj(..)))
//   y  = x2 + down_proj(silu(gate_proj(norm2(x2))) * up_proj(norm2(x2)))
#pragma once

#include "core/tensor.h"
#include "model/config.h"
#include "model/layout.h"

namespace shardtrain::model {

// A block's parameters (or their gradients: same shapes). bq/bk/bv undefined without bias.
struct BlockWeights {
  Tensor attn_norm_D;
  Tensor wq_QD, wk_KD, wv_KD;  // Q = N·H, K = M·H (letters local to this file)
  Tensor bq_Q, bk_K, bv_K;
  Tensor wo_DQ;
  Tensor ffn_norm_D;
  Tensor w_gate_FD, w_up_FD, w_down_DF;

  // Views into `flat` (a unit buffer laid out by `unit`).
  static BlockWeights view(const Tensor& flat, const UnitLayout& unit, const LlamaConfig& config);
};

// Everything a block's backward reads. With full activation checkpointing only x_BTD is
// kept between forward and backward, and the rest is recomputed; with selective
// checkpointing the attention half (q, k, v, the attention output and its statistics, x2)
// is kept, and the norms and the MLP's gate, up and h are recomputed.
struct BlockActivations {
  Tensor x_BTD;                 // input (the previous block's output; shared, not copied)
  Tensor xn1_BTD, rstd1_BT;     // attention-norm output and its 1/rms
  Tensor q_BTNH, k_BTMH, v_BTMH;  // after rope (q, k)
  Tensor attn_BTNH, lse_BNT;    // attention output and its log-sum-exp rows
  Tensor x2_BTD;                // residual stream after attention
  Tensor xn2_BTD, rstd2_BT;
  Tensor gate_BTF, up_BTF, h_BTF;  // h = silu(gate) * up
  Tensor y_BTD;                 // block output

  void release_all_but_input();  // for full activation checkpointing
  void release_recomputable();   // for selective checkpointing: the norms and the MLP (and y)
};

// What block_forward computes. The output y is never needed by the block's own backward
// (it is the next block's input, kept there), so recomputation skips its product.
enum class BlockPart {
  kAll,            // the forward
  kAllButOutput,   // full recompute before the backward
  kNormsAndMlp,    // selective recompute: xn1/rstd1 from x, then xn2/rstd2, gate, up, h from x2
};

struct BlockContext {
  const LlamaConfig* config = nullptr;
  int64_t batch = 0;   // B
  int64_t seq = 0;     // T
  Tensor cos_TK, sin_TK;  // rope tables with at least T rows, in the compute dtype
};

// Fills the members of `acts` that `part` names from x_BTD (which it keeps a reference to);
// kNormsAndMlp reads the kept acts.x2_BTD. Recomputed members are bitwise the forward's.
void block_forward(BlockActivations& acts, const BlockWeights& w, const Tensor& x_BTD, const BlockContext& ctx,
                   BlockPart part = BlockPart::kAll);

// dx_BTD (overwrites) from dy_BTD; parameter gradients accumulate into `grads`.
// dx_BTD may not alias dy_BTD.
void block_backward(Tensor& dx_BTD, BlockWeights& grads, const Tensor& dy_BTD, const BlockActivations& acts,
                    const BlockWeights& w, const BlockContext& ctx);

}  // namespace shardtrain::model
