// One Llama decoder block with an explicit forward that records exactly what its backward
// needs, and an explicit backward. Weights are views into a sharding unit's flat buffer.
//   x2 = x + o_proj(attention(rope(q_proj(norm1(x))), rope(k_proj(..)), v_proj(..)))
//   y  = x2 + down_proj(silu(gate_proj(norm2(x2))) * up_proj(norm2(x2)))
#pragma once

#include <vector>

#include "core/tensor.h"
#include "model/config.h"
#include "model/context_parallel.h"
#include "model/layout.h"
#include "model/tensor_parallel.h"
#include "ops/attention.h"
#include "ops/linear.h"

namespace shardtrain::model {

// A block's parameters (or their gradients: same shapes). bq/bk/bv undefined without bias.
struct BlockWeights {
  Tensor attn_norm_D;
  Tensor wq_QD, wk_KD, wv_KD;  // Q = N·H, K = M·H (letters local to this file)
  Tensor bq_Q, bk_K, bv_K;
  // QK-norm weights: [H] per head (LlamaConfig::qk_norm) or [N·H] and [M·H] over the whole
  // projections (LlamaConfig::qk_norm_whole); undefined without
  Tensor q_norm_H, k_norm_H;
  Tensor wo_DQ;
  // the MLP's input norm, or with LlamaConfig::post_norms the attention's output norm
  // (`post_attention_layernorm` either way); attn_norm_D is then undefined and
  // post_ffn_norm_D (`post_feedforward_layernorm`) the MLP's output norm
  Tensor ffn_norm_D;
  Tensor post_ffn_norm_D;
  // LlamaConfig::sandwich_norms (Gemma): the MLP's input norm (`pre_feedforward_layernorm`);
  // ffn_norm_D is then the attention's output norm, post_ffn_norm_D the MLP's; undefined without
  Tensor pre_ffn_norm_D;
  Tensor w_gate_FD, w_up_FD, w_down_DF;
  // q, k and v's weights (and biases) as one [N·H + 2·M·H, D] matrix ([..] vector) when
  // they lie back to back in the unit, as shardtrain lays them out: one product makes all
  // three (undefined otherwise).
  Tensor wqkv_ED, bqkv_E;
  // gate's and up's weights as one [2F, D] matrix, when back to back (as laid out here).
  Tensor w_gate_up_2FD;

  // Views into `flat` (a unit buffer laid out by `unit`).
  static BlockWeights view(const Tensor& flat, const UnitLayout& unit, const LlamaConfig& config);
};

// With tensor parallelism (BlockContext::tp) the weights are this rank's part of the block
// (ModelLayout): N/size query heads, M/size key/value heads, F/size FFN columns; the
// activations below hold those heads and columns for all B·T token rows, except the
// residual stream's x, x2, y and rstd, which hold this rank's rows R (ResidualSplit).

// What each block keeps between forward and backward: everything (none); every matrix
// product's output, with the pointwise ops recomputed (pointwise: the two norms' outputs
// and SwiGLU's product, no GEMM); its attention half, with the norms and the MLP's inner
// products recomputed (selective); or only its input, with the whole block recomputed
// (full). Gradients are bitwise the same in all four.
enum class ActivationCheckpointing { kNone, kPointwise, kSelective, kFull };
// From the most memory (no recompute) to the least (the most recompute).
constexpr ActivationCheckpointing kCheckpointingByMemory[] = {
    ActivationCheckpointing::kNone, ActivationCheckpointing::kPointwise, ActivationCheckpointing::kSelective,
    ActivationCheckpointing::kFull};

// Everything a block's backward reads; activation checkpointing drops some of it after the
// forward (release_for) and the backward recomputes it (block_forward with recompute_part,
// and h inside the SwiGLU backward).
struct BlockActivations {
  Tensor x_BTD;                 // input (the previous block's output; shared, not copied)
  Tensor xn1_BTD, rstd1_BT;     // attention-norm output (all rows: the q|k|v product's input) and its 1/rms
  Tensor q_BTNH, k_BTMH, v_BTMH;  // after rope (q, k); head slices of one [B, T, N+2M, H] tensor when stacked
  // QK-norm (LlamaConfig::qk_norm): q and k as projected, before their norm, and the norm's
  // 1/rms of each head's row; undefined without
  Tensor q_raw_BTNH, k_raw_BTMH, q_rstd_BTN, k_rstd_BTM;
  Tensor attn_BTNH, lse_BNT;    // attention output and its log-sum-exp rows
  Tensor x2_BTD;                // residual stream after attention
  // LlamaConfig::post_norms: the attention's and the MLP's outputs before their norms (the
  // residual stream's rows), whose 1/rms are rstd1 and rstd2; xn1 and xn2 are then x and x2
  // themselves (all rows)
  Tensor attn_out_BTD, mlp_out_BTD;
  // LlamaConfig::sandwich_norms: the 1/rms of the norms after the attention and the MLP (the
  // residual stream's rows; rstd1 and rstd2 are the norms' before them); undefined without
  Tensor post_rstd1_BT, post_rstd2_BT;
  Tensor xn2_BTD, rstd2_BT;     // MLP-norm output (all rows) and its 1/rms
  Tensor gate_BTF, up_BTF, h_BTF;  // h = act(gate) * up (LlamaConfig::mlp_activation)
  Tensor gate_up_BT2F;             // when stacked: one product, gate and up its halves (views)
  Tensor y_BTD;                 // block output
  // training.fp8 = tensorwise on a block whose products see all their rows at once (no tensor
  // parallelism): the amax of each product's input and of the gate|up product's output
  // gradient (u32 bits, ops/fp8.h), made by the op that makes the tensor (the norms, SwiGLU) or,
  // for the attention output, by its forward product's quantisation, and read by every later
  // quantisation of it instead of a pass of its own. Recomputation writes the same values again.
  enum Fp8Amax { kXn1, kAttn, kXn2, kH, kGateUpGrads, kFp8Amaxes };
  Tensor fp8_amax_S;  // [kFp8Amaxes] i32 on the block's device
  Tensor fp8_amax(Fp8Amax which) const { return fp8_amax_S.defined() ? fp8_amax_S.slice(0, which, which + 1) : Tensor(); }

  // After the block's forward: drops what `checkpointing` recomputes (and y, the next
  // block's input, kept there): pointwise: xn1, xn2, their rstd and h; selective: also gate
  // and up; full: everything but x.
  void release_for(ActivationCheckpointing checkpointing);
  // Every member above (defined or not), for code that moves them all (activation offload).
  std::vector<Tensor*> tensors();
};

// What block_forward computes. The output y is never needed by the block's own backward
// (it is the next block's input, kept there), so recomputation skips its product.
enum class BlockPart {
  kAll,            // the forward
  kAllButOutput,   // full recompute before the backward
  kNormsAndMlp,    // selective recompute: xn1/rstd1 from x, then xn2/rstd2, gate, up, h from x2
  kNorms,          // pointwise recompute: xn1/rstd1 from x, xn2/rstd2 from x2 (h: block_backward)
};

// The part block_forward recomputes before the backward of a block checkpointed with
// `checkpointing` (not kNone).
BlockPart recompute_part(ActivationCheckpointing checkpointing);

// Whether `checkpointing` keeps none of the MLP's inner tensors (selective and full), so the
// MLP may run in pieces of tokens (BlockContext::mlp_chunk_tokens).
constexpr bool mlp_recomputed(ActivationCheckpointing checkpointing) {
  return checkpointing == ActivationCheckpointing::kSelective || checkpointing == ActivationCheckpointing::kFull;
}

struct BlockContext {
  const LlamaConfig* config = nullptr;
  int64_t batch = 0;   // B
  int64_t seq = 0;     // T
  Tensor cos_TK, sin_TK;  // rope tables with at least T rows, in the compute dtype
  bool deterministic = false;  // the attention backward's bitwise-reproducible algorithm (StepOptions)
  // One product per projection even where q, k and v's (gate and up's) weights are stacked:
  // for comparison only (train_bench --separate-projections); same math, other rounding.
  bool separate_projections = false;
  // Tokens per piece of the MLP where its inner [tokens, F] tensors (gate, up, h) are not
  // kept between forward and backward (selective and full checkpointing): 0 computes them for
  // every token at once; C > 0 runs the MLP C token rows at a time in the forward (keeping
  // none of them) and again, recomputed piece by piece, in the backward, so at most C rows of
  // them exist at once. For long sequences, where those tensors are most of a block's memory.
  int64_t mlp_chunk_tokens = 0;
  // Incremental decoding (model/kv_cache.h): this block's cached keys (after rope) and values
  // [B, S, M, H], S the cache's capacity, positions [0, kv_position) filled. Defined, the T
  // tokens of x are positions kv_position..kv_position + T - 1 (cos_TK and sin_TK must start
  // at row kv_position); their k and v are written into the cache after the cached ones and
  // the attention reads all kv_position + T of them. Forward only (Pass::kEval).
  Tensor kv_keys_BSMH, kv_values_BSMH;
  int64_t kv_position = 0;
  // Defined (one i32 on the block's device): the position is read from there when the kernels
  // run instead of kv_position (model/kv_cache.h's stage()), kv_keys_BSMH and kv_values_BSMH are
  // the whole cache, and cos_TK, sin_TK the position's rope rows: one CUDA graph of the step
  // serves every position (ops::attention_forward_kv_cache writes the cache and attends).
  Tensor kv_position_1;
  // This block's sliding window (LlamaConfig::window_of its layer; 0: full attention): each
  // token attends to the last `window` positions only, itself included, with a KV cache too.
  int64_t window = 0;
  // Whether this block rotates q and k (LlamaConfig::uses_rope of its layer; false on a NoPE
  // layer: no rope in the forward, the backward or the KV cache).
  bool rope = true;
  // Documents packed into the rows (not owned; null: none): each attends only to itself and
  // its rope positions count from its first token (ops::PackedDocuments). Not with a KV cache.
  const ops::PackedDocuments* documents = nullptr;
  // Tensor parallelism (not owned; null: none): the weights are this rank's part, and the
  // residual stream x, x2, y (and rstd) holds the rows `residual` says: with kSequence, rows
  // [rank·R, (rank + 1)·R) of the B·T rows (B, T row-major), R = B·T / size.
  TensorParallel* tp = nullptr;
  ResidualSplit residual = ResidualSplit::kSequence;
  // Context parallelism (not owned; null: none): the T tokens of a row are this rank's two
  // chunks of a longer sequence (model/context_parallel.h), the attention is the group's ring
  // (ring_attention_forward / backward), and rope reads each token's true position from
  // context_positions_BT (i32 [B, T] on the block's device). Packed documents come as
  // context_documents (their positions are then context_positions_BT), not `documents`. Not
  // with tensor parallelism, a sliding window, FP8 attention or a KV cache (the model refuses them).
  ContextParallel* cp = nullptr;
  Tensor context_positions_BT;
  const ContextDocuments* context_documents = nullptr;
  // FP8 products for every linear of the block (q/k/v, o, gate/up, down), forward and both
  // backward products (training.fp8); off: products in the activations' dtype.
  ops::LinearFp8 fp8;
  // The attention in FP8 (training.fp8_attention): ops::attention_forward_fp8, which rounds q,
  // k and v in place to the e4m3 values it reads, and its backward. Not with packed documents
  // or a sliding window: those layers attend in the compute dtype.
  bool fp8_attention = false;
  // With fp8_attention, in the backward: this layer's gradient history (f32 [4] on the device),
  // and the attention backward is FP8's too (ops::attention_backward_fp8) where the forward was.
  Tensor fp8_attention_history_4;
  bool fp8_attention_seed = false;  // the layer's first FP8 backward (ops::attention_backward_fp8's seed)
  // Token rows of the residual stream on this rank (R).
  int64_t residual_rows() const;
};

// Fills the members of `acts` that `part` names from x_BTD (which it keeps a reference to);
// kNormsAndMlp and kNorms read the kept acts.x2_BTD. Recomputed members are bitwise the
// forward's. With ctx.mlp_chunk_tokens (parts kAll, kAllButOutput, kNormsAndMlp only) gate,
// up and h are never filled: kAll makes y piece by piece and block_backward recomputes them.
void block_forward(BlockActivations& acts, const BlockWeights& w, const Tensor& x_BTD, const BlockContext& ctx,
                   BlockPart part = BlockPart::kAll);

// dx_BTD (overwrites) from dy_BTD (both the residual stream's rows); parameter gradients
// accumulate into `grads`, or
// overwrite them with `overwrite_grads` (each parameter gets one gradient per call).
// dx_BTD may not alias dy_BTD. Consumes `acts`: gate and up are overwritten with their
// gradients, and the MLP's [tokens, F] tensors are released once read. Without acts.h_BTF
// (pointwise checkpointing) the SwiGLU backward recomputes h for the down projection's
// weight gradient. Without gate and up (a chunked MLP, BlockContext::mlp_chunk_tokens) the
// MLP's backward recomputes them from xn2 piece by piece.
void block_backward(Tensor& dx_BTD, BlockWeights& grads, const Tensor& dy_BTD, BlockActivations& acts,
                    const BlockWeights& w, const BlockContext& ctx, bool overwrite_grads = false);

}  // namespace shardtrain::model
