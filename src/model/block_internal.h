// The block's internal pieces, shared by its files (block.cpp: the forward and backward in
// order; block_rows.cpp: token rows over the tensor-parallel group; block_norms.cpp: the
// RMSNorms; block_sublayer.cpp: a sublayer's output into the residual stream;
// block_attention.cpp and block_mlp.cpp: the two sublayers). Internal to model/.
#pragma once

#include <optional>
#include <utility>
#include <vector>

#include "model/block.h"
#include "ops/elementwise.h"
#include "ops/linear.h"

namespace shardtrain::model::block_detail {

// A new tensor of `shape` with `proto`'s dtype and device.
Tensor like(const Shape& shape, const Tensor& proto, const char* what);

// BT: all token rows; R: the residual stream's rows on this rank (BT without tensor
// parallelism). N, M, F: this rank's query heads, kv heads and FFN columns.
struct Dims {
  int64_t B, T, BT, R, D, N, M, H, F;
  DType stats;
  Device dev;
};

Dims dims_of(const BlockContext& ctx, const Tensor& x_BTD);

// The shape of a residual-stream tensor: [B, T, D] when this rank holds every row.
Shape residual_shape(const Dims& d);

// Whether the residual stream's rows are split over a tensor-parallel group (kSequence).
bool sequence_split(const BlockContext& ctx);

// A product's input from the residual stream's rows [R, D]: all B·T rows [BT, D], gathered
// over the group under sequence parallelism (Megatron's f / g-bar), else the rows themselves.
Tensor all_rows(const Tensor& rows_RD, const BlockContext& ctx, const Dims& d, const char* name);

// A row-parallel product's partial output over all rows [BT, D], summed over the group into
// this rank's rows [R, D]: reduce-scattered under sequence parallelism, else all-reduced in
// place (Megatron's g / f-bar). Without tensor parallelism the output itself.
Tensor summed_rows(Tensor partial_TD, const BlockContext& ctx, const Dims& d, const char* name);

// A product over all B·T rows of a residual-stream tensor: `product(in, first, end)` computes
// the output rows [first, end) from `in`, those rows of the input. Under sequence parallelism
// the rows this rank holds go first while the other ranks' arrive (the gather overlaps that
// product), then the rows gathered; `all_TD` receives every row [BT, D] (kept for the weight
// gradients). Otherwise one product of all rows, `all_TD` the rows themselves.
template <typename Product>
void over_all_rows(Tensor& all_TD, const Tensor& rows_RD, const BlockContext& ctx, const Dims& d, const char* name,
                   Product&& product) {
  if (!sequence_split(ctx)) {
    all_TD = rows_RD.view({d.BT, d.D});
    product(all_TD, int64_t{0}, d.BT);
    return;
  }
  all_TD = Tensor::empty({d.BT, d.D}, rows_RD.dtype(), rows_RD.device(), name);
  const Tensor mine_RD = rows_RD.view({d.R, d.D});
  ctx.tp->start_all_gather(all_TD, mine_RD);
  const int64_t first = ctx.tp->rank() * d.R, end = first + d.R;
  {
    const ops::GemmSmReserve reserve(ctx.tp->overlap_sm_reserve());  // the gather gets SMs at once
    product(mine_RD, first, end);
  }
  ctx.tp->finish();
  if (first > 0) product(all_TD.slice(0, 0, first), int64_t{0}, first);
  if (end < d.BT) product(all_TD.slice(0, end, d.BT), end, d.BT);
}

// out_RD = x_RD + this rank's rows of a row-parallel product, summed over the group.
// `partial(out, first, end, add)` writes the product of rows [first, end) of all B·T rows
// into `out` [end - first, D], plus `add` (same rows) when it is defined. Without tensor
// parallelism one product with x added in its epilogue; with replicated rows one product of
// every row, all-reduced (and one reduce-scatter without TensorParallel::by_pieces). Under
// sequence parallelism the reduce-scatter is decomposed: each other rank's rows are made
// first and sent to it while the next rows' product runs (and the other ranks' pieces of this
// rank's rows arrive), this rank's own rows last, x added in their epilogue, then the pieces
// received are added.
template <typename Partial>
void summed_product(Tensor& out_RD, const Tensor& x_RD, const BlockContext& ctx, const Dims& d, Partial&& partial) {
  if (ctx.tp == nullptr) {
    partial(out_RD, int64_t{0}, d.BT, x_RD);
    return;
  }
  if (!sequence_split(ctx) || !ctx.tp->by_pieces()) {
    Tensor partial_TD = Tensor::empty({d.BT, d.D}, x_RD.dtype(), x_RD.device(), "partial sums over the group");
    partial(partial_TD, int64_t{0}, d.BT, Tensor());
    ops::add(out_RD, summed_rows(partial_TD, ctx, d, "partial sums of this rank's rows"), x_RD);
    return;
  }
  const int P = ctx.tp->size(), r = ctx.tp->rank();
  std::vector<Tensor> received;
  for (int s = 1; s <= P; ++s) {
    // step s makes rank (r + s)'s rows (its own at s = P) beside step s - 1's exchange
    const int owner = (r + s) % P;
    const int64_t first = owner * d.R, end = first + d.R;
    std::optional<ops::GemmSmReserve> reserve;
    if (s > 1) reserve.emplace(ctx.tp->overlap_sm_reserve());
    if (owner == r) {
      partial(out_RD, first, end, x_RD);
      reserve.reset();
      ctx.tp->finish();
      break;
    }
    Tensor piece = Tensor::empty({d.R, d.D}, x_RD.dtype(), x_RD.device(), "partial sums for another rank");
    partial(piece, first, end, Tensor());
    reserve.reset();
    ctx.tp->finish();
    received.push_back(Tensor::empty({d.R, d.D}, x_RD.dtype(), x_RD.device(), "partial sums from another rank"));
    ctx.tp->start_send_recv(piece, owner, received.back(), (r - s + P) % P);
  }
  for (const Tensor& part : received) ops::add(out_RD, out_RD, part);
}

// A row-parallel product's output for this rank's rows of the residual stream [R, D]:
// `partial(out, first, end)` writes rows [first, end) of all B·T rows' product (with tensor
// parallelism a partial sum over the group, summed here).
template <typename Partial>
Tensor product_rows(const Dims& d, const BlockContext& ctx, const Tensor& proto, Partial&& partial) {
  Tensor all_TD = like({d.BT, d.D}, proto, ctx.tp == nullptr ? "sublayer output" : "partial sums over the group");
  partial(all_TD, int64_t{0}, d.BT);
  return summed_rows(all_TD, ctx, d, "sublayer output (this rank's rows)");
}

// ctx.fp8 with x's amax slot from `a` (BlockActivations::fp8_amax_S), which the op that made x
// has filled (the norms, SwiGLU) unless `ready` is false (the attention output, whose first
// product's pass fills it); plain ctx.fp8 where the block keeps no slots.
inline ops::LinearFp8 with_amax(const ops::LinearFp8& fp8, const BlockActivations& a, BlockActivations::Fp8Amax x,
                                bool ready = true) {
  ops::LinearFp8 f = fp8;
  f.x_amax = a.fp8_amax(x);
  f.x_amax_ready = ready && f.x_amax.defined();
  return f;
}

// Whether q, k and v (gate and up) come from one product: their weights stacked, and not
// told otherwise.
inline bool qkv_stacked(const BlockWeights& w, const BlockContext& ctx) {
  return w.wqkv_ED.defined() && !ctx.separate_projections;
}
inline bool gate_up_stacked(const BlockWeights& w, const BlockContext& ctx) {
  return w.w_gate_up_2FD.defined() && !ctx.separate_projections;
}

// Whether each sublayer's output goes through a norm before the residual add: OLMo 2's
// post_norms and Gemma's sandwich_norms.
inline bool output_norms(const LlamaConfig& c) { return c.post_norms || c.sandwich_norms; }

// The 1/rms of the norms after the attention and the MLP: rstd1 and rstd2 with post_norms
// (no norms before), post_rstd1 and post_rstd2 with sandwich_norms.
inline Tensor& attn_out_rstd(BlockActivations& a, const LlamaConfig& c) {
  return c.sandwich_norms ? a.post_rstd1_BT : a.rstd1_BT;
}
inline Tensor& mlp_out_rstd(BlockActivations& a, const LlamaConfig& c) {
  return c.sandwich_norms ? a.post_rstd2_BT : a.rstd2_BT;
}

// The products' backward options of one block_backward: each parameter receives one gradient
// there, the first write replacing it when asked to (`overwrite`).
struct GradOptions {
  ops::LinearBackwardOptions dw;          // a product's input and weight gradients
  ops::LinearBackwardOptions dw_dx;       // the same, the input gradient added to an earlier one
  ops::LinearBackwardOptions input_only;  // a call for dx alone
  bool overwrite = false;
};
GradOptions grad_options(const BlockContext& ctx, bool overwrite_grads);

// ---- block_norms.cpp

// xn = norm(x) over the residual stream's rows [R, D], with its f32 1/rms. The products that
// take it need all rows: over_all_rows or all_rows. With `amax_1` defined (an FP8 amax slot,
// BlockActivations::fp8_amax_S) the norm also writes the output's amax there.
Tensor norm(Tensor& rstd_BT, const Tensor& x_BTD, const Tensor& weight_D, const Dims& d, const LlamaConfig& c,
            const char* name, const char* rstd_name, const Tensor& amax_1 = {});

// The norm's backward over the residual stream's rows: dx (overwrites) = d(norm)/dx · dxn +
// dresidual. With tensor parallelism the weight's gradient over this rank's rows is summed
// over the group before it reaches `dweight` (every rank's copy then gets the same).
void norm_backward(Tensor& dx_RD, Tensor& dweight_D, const Tensor& dxn_RD, const Tensor& x_RD, const Tensor& weight_D,
                   const Tensor& rstd_R, const Tensor& dresidual_RD, const BlockContext& ctx, bool overwrite);

// With post_norms, a kept sublayer output's 1/rms recomputed into `rstd` (the norm's output,
// which the backward does not read, dropped): bitwise the forward's.
void post_norm_rstd(Tensor& rstd, const Tensor& raw, const Tensor& post_norm_D, const Dims& d,
                    const BlockContext& ctx);

// QK-norm of sequences [b0, b1): each row of `weight_H`'s width in `x_BTXH` (q or k as
// projected; a head slice of the stacked product, or a tensor of its own) is kept in
// `raw_BTXH` and replaced by its RMSNorm with `weight_H`, whose 1/rms goes to `rstd_BTX`. The
// weight's width is a head's H (Qwen3: a norm per head) or all X·H of a token's heads (OLMo 2:
// one norm over the whole projection, `rstd_BTX` then [B, T, 1]).
void head_norm_forward(Tensor& x_BTXH, Tensor& raw_BTXH, Tensor& rstd_BTX, const Tensor& weight_H,
                       const LlamaConfig& c, int64_t b0, int64_t b1);

// The QK-norm's backward on every row of `dx_BTXH` (the gradient of the normed q or k, a head
// slice or a tensor of its own), replaced by the gradient of the projected values; the weight's
// gradient accumulates into `dweight_H` (or overwrites it). With tensor parallelism a rank
// holds its own heads' rows, and the weight, whole on every rank, gets the sum over the group
// of their gradients (every rank's copy then gets the same), as the block's norms do.
void head_norm_backward(Tensor& dx_BTXH, Tensor& dweight_H, const Tensor& raw_BTXH, const Tensor& rstd_BTX,
                        const Tensor& weight_H, const BlockContext& ctx, bool overwrite);

// ---- block_sublayer.cpp

// out = x + s(p) for the residual stream, p_RD a sublayer's output (this rank's rows), where s
// scales by Granite's residual_multiplier and, with output norms (output_norms), first takes
// the RMSNorm of p with `post_norm_D` (OLMo 2, Gemma): p is then kept in `raw` and its 1/rms in
// `rstd`.
void add_sublayer(Tensor& out, Tensor& raw, Tensor& rstd, Tensor p_RD, const Tensor& x, const Tensor& post_norm_D,
                  const Dims& d, const BlockContext& ctx, const char* name);

// out = x + o(in) (residual_product, x added in the product's epilogue), or with Granite's
// residual_multiplier or OLMo 2's post_norms x + s(o(in)) (add_sublayer).
void sublayer_output(Tensor& out, Tensor& raw, Tensor& rstd, const Tensor& in_TK, const Tensor& weight_DK,
                     const Tensor& x, const Tensor& post_norm_D, const Dims& d, const BlockContext& ctx,
                     const ops::LinearFp8& fp8, const char* name);

// The backward of add_sublayer's s: the gradient of the sublayer's output p from out's dout_RD
// (the residual stream's rows). With post_norms the norm weight's gradient goes to
// `dpost_norm_D` (accumulated, or overwritten with `overwrite`). dout itself where s is the
// identity.
Tensor sublayer_backward(const Tensor& dout_RD, Tensor& dpost_norm_D, const Tensor& raw, const Tensor& rstd,
                         const Tensor& post_norm_D, const Dims& d, const BlockContext& ctx, bool overwrite);

// ---- block_attention.cpp

// q, k, v (rope applied), attention, and x2 = x + o(attn), from the attention norm's output
// xn1_RD (this rank's rows; a.xn1_BTD receives all rows). With a KV cache the attention reads
// the cached positions' keys and values too.
void attention_half(BlockActivations& a, const Tensor& xn1_RD, const BlockWeights& w, const BlockContext& ctx,
                    const Dims& d);

// q's, k's and v's gradients (after the attention's backward, before rope's): with stacked
// weights head slices of one tensor (dqkv_BTEH), so that one product makes the input gradient
// (and one the stacked weight gradient) instead of three.
struct QkvGradients {
  bool stacked = false;
  Tensor dqkv_BTEH, dq_BTNH, dk_BTMH, dv_BTMH;
};

// The attention's backward from dout_RD (the gradient of x2 = x + o(attn) reaching o, the
// residual stream's rows): o_proj's weight gradient and, through the attention, `dqkv`
// (allocated here). Frees the attention's kept q, k, v, output and lse.
void attention_backward(QkvGradients& dqkv, BlockWeights& g, const Tensor& dout_RD, BlockActivations& a,
                        const BlockWeights& w, const BlockContext& ctx, const Dims& d, const Tensor& dy_BTD,
                        const GradOptions& o);

// The backward of q, k and v from `dqkv`: rope's and the QK-norm's backward (in place), the
// projections' weight gradients, and the attention norm's output gradient dxn1_TD (all rows)
// and, when tensor parallelism has reduce-scattered it beside the weight gradients, dxn1_RD
// (this rank's rows; else left undefined).
void qkv_backward(Tensor& dxn1_TD, Tensor& dxn1_RD, QkvGradients& dqkv, BlockWeights& g, BlockActivations& a,
                  const BlockWeights& w, const BlockContext& ctx, const Dims& d, const Tensor& dy_BTD,
                  const GradOptions& o);

// ---- block_mlp.cpp

// gate, up and h = silu(gate) * up from the MLP norm's output xn2_RD (this rank's rows;
// a.xn2_BTD receives all rows), kept in `a`.
void mlp_inner(BlockActivations& a, const Tensor& xn2_RD, const BlockWeights& w, const BlockContext& ctx,
               const Dims& d);

// y = x2 + down(h) piece by piece: each piece's gate, up and h are dropped once its rows of
// y (with tensor parallelism: of the partial sums, summed_product) are written, so the block
// keeps none of them.
void mlp_output_by_pieces(BlockActivations& a, const BlockWeights& w, const BlockContext& ctx, const Dims& d);

// The MLP's backward from dmlp_RD (the gradient of its output, the residual stream's rows):
// its weight gradients, and the MLP norm's output gradient dxn2_TD (all rows; with tensor
// parallelism partial sums over the group) and dxn2_RD (this rank's rows, summed over the
// group). Reads the kept gate, up and h (overwritten and released once read), or without them
// (a chunked MLP) recomputes them piece by piece from xn2_TD.
void mlp_backward(Tensor& dxn2_TD, Tensor& dxn2_RD, BlockWeights& g, const Tensor& dmlp_RD, const Tensor& xn2_TD,
                  BlockActivations& a, const BlockWeights& w, const BlockContext& ctx, const Dims& d,
                  const Tensor& dy_BTD, const GradOptions& o);

}  // namespace shardtrain::model::block_detail
