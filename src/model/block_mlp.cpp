// The block's MLP: y = x2 + down_proj(act(gate_proj(xn2)) * up_proj(xn2)), its inner tensors
// kept for the backward or, with BlockContext::mlp_chunk_tokens, made piece by piece in the
// forward and again in the backward; and its backward.
#include <algorithm>
#include <functional>

#include "model/block_internal.h"
#include "ops/swiglu.h"

namespace shardtrain::model::block_detail {
namespace {

// The MLP's inner tensors for R token rows: gate and up (the halves of one stacked product
// when the weights are stacked) and, with `with_h`, h = silu(gate) * up (allocated first).
struct MlpRows {
  Tensor gate_up_R2F, gate_RF, up_RF, h_RF;
};
MlpRows mlp_tensors(int64_t R, const Tensor& like_RD, const BlockWeights& w, const BlockContext& ctx, int64_t F,
                    bool with_h) {
  MlpRows m;
  if (with_h) m.h_RF = like({R, F}, like_RD, "h");
  if (gate_up_stacked(w, ctx)) {
    // one product for both; gate and up the halves of each token's row
    m.gate_up_R2F = like({R, 2 * F}, like_RD, "gate|up");
    m.gate_RF = m.gate_up_R2F.slice(1, 0, F);
    m.up_RF = m.gate_up_R2F.slice(1, F, 2 * F);
  } else {
    m.gate_RF = like({R, F}, like_RD, "gate");
    m.up_RF = like({R, F}, like_RD, "up");
  }
  return m;
}

// gate and up of rows [first, end) of `m` from those rows of the MLP norm's output.
void gate_up_products(const MlpRows& m, const Tensor& xn2_rows, int64_t first, int64_t end, const BlockWeights& w,
                      const ops::LinearFp8& fp8) {
  if (m.gate_up_R2F.defined()) {
    Tensor out = m.gate_up_R2F.slice(0, first, end);
    ops::linear_forward(out, xn2_rows, w.w_gate_up_2FD, Tensor(), fp8);
    return;
  }
  Tensor gate = m.gate_RF.slice(0, first, end), up = m.up_RF.slice(0, first, end);
  ops::linear_forward(gate, xn2_rows, w.w_gate_FD, Tensor(), fp8);
  ops::linear_forward(up, xn2_rows, w.w_up_FD, Tensor(), fp8);
}

MlpRows mlp_products(const Tensor& xn2_RD, const BlockWeights& w, const BlockContext& ctx, int64_t F, bool with_h) {
  const int64_t R = xn2_RD.size(0);
  MlpRows m = mlp_tensors(R, xn2_RD, w, ctx, F, with_h);
  gate_up_products(m, xn2_RD, 0, R, w, ctx.fp8);
  if (with_h) ops::swiglu_forward(m.h_RF, m.gate_RF, m.up_RF, {}, ctx.config->mlp_activation);
  return m;
}

// Token rows per MLP piece: ctx.mlp_chunk_tokens, or every row at once.
int64_t mlp_piece_rows(const BlockContext& ctx, int64_t rows) {
  return ctx.mlp_chunk_tokens > 0 ? std::min(ctx.mlp_chunk_tokens, rows) : rows;
}

// Tensor parallelism's overlap inside the MLP's backward: how dh = dy · W_down is made (by
// default one product of dy, every row at hand), and what runs once dxn2 is complete, before
// gate's and up's weight gradients (a reduce-scatter of dxn2 started there overlaps them).
struct MlpBackwardHooks {
  std::function<void(Tensor& dh_RF)> down_input_gradient;
  std::function<void()> after_input_gradient;
};

// The amax slots the MLP's backward uses (BlockActivations::fp8_amax_S; undefined without): h's
// and xn2's, ready from the forward, and the gate|up gradients', which the SwiGLU backward fills.
struct MlpAmax {
  Tensor h, xn2, grads;
};

// The MLP's backward over some token rows: dxn2_RD (overwrites; allocated here when
// undefined, after dh is freed) from dy_RD. gate and up (gate_up_R2F their stacked tensor,
// when the gradient has the stacked weight too) are overwritten with their gradients; h,
// when undefined, is recomputed by the SwiGLU backward for the down projection's weight
// gradient. Weight gradients per `dw` (and `dw_dx` for the second product into dxn2). With
// hooks.down_input_gradient, dy_RD is read only after that hook ran (it may fill it).
void mlp_backward_rows(Tensor& dxn2_RD, BlockWeights& g, const Tensor& dy_RD, const Tensor& xn2_RD, Tensor gate_up_R2F,
                       Tensor gate_RF, Tensor up_RF, Tensor h_RF, const BlockWeights& w,
                       const ops::LinearBackwardOptions& dw, const ops::LinearBackwardOptions& dw_dx,
                       ops::GluActivation act, const MlpBackwardHooks& hooks = {}, const MlpAmax& amax = {}) {
  const int64_t R = gate_RF.size(0), F = gate_RF.size(1), D = xn2_RD.size(1);
  Tensor none;
  const ops::LinearBackwardOptions input_only{.fp8 = dw.fp8};  // the products' FP8 recipe, if any
  // the options with x's and dy's amax slots (ready) set
  auto with = [](ops::LinearBackwardOptions o, const Tensor& x_amax, const Tensor& dy_amax) {
    o.fp8.x_amax = x_amax;
    o.fp8.x_amax_ready = x_amax.defined();
    o.fp8.dy_amax = dy_amax;
    return o;
  };
  // y = x2 + down(h): dy flows to x2 unchanged and through down_proj. gate and up are read
  // for the last time by the SwiGLU backward, so their gradients overwrite them. h feeds the
  // down projection's weight gradient, which therefore comes after.
  Tensor dh_RF = like({R, F}, gate_RF, "dh");
  if (hooks.down_input_gradient) {
    hooks.down_input_gradient(dh_RF);
  } else {
    ops::linear_backward(dh_RF, none, none, dy_RD, none, w.w_down_DF, input_only);
  }
  const bool stacked = gate_up_R2F.defined() && g.w_gate_up_2FD.defined();
  const bool recompute_h = !h_RF.defined();
  if (recompute_h) h_RF = like({R, F}, gate_RF, "h (recomputed)");
  Tensor h_out_RF = recompute_h ? h_RF : Tensor();
  // the amax of the stacked gradients is the gate|up product's dy's (apart, each has its own)
  const Tensor grads_amax = stacked ? amax.grads : Tensor();
  ops::swiglu_backward(gate_RF, up_RF, h_out_RF, dh_RF, gate_RF, up_RF, grads_amax, act);
  dh_RF = Tensor();
  ops::linear_backward(none, g.w_down_DF, none, dy_RD, h_RF, w.w_down_DF, with(dw, amax.h, Tensor()));
  h_RF = h_out_RF = Tensor();
  if (!dxn2_RD.defined()) dxn2_RD = like({R, D}, xn2_RD, "dxn2");
  if (!hooks.after_input_gradient) {
    if (stacked) {
      ops::linear_backward(dxn2_RD, g.w_gate_up_2FD, none, gate_up_R2F, xn2_RD, w.w_gate_up_2FD,
                           with(dw, amax.xn2, grads_amax));
    } else {
      ops::linear_backward(dxn2_RD, g.w_gate_FD, none, gate_RF, xn2_RD, w.w_gate_FD, with(dw, amax.xn2, Tensor()));
      ops::linear_backward(dxn2_RD, g.w_up_FD, none, up_RF, xn2_RD, w.w_up_FD, with(dw_dx, amax.xn2, Tensor()));
    }
    return;
  }
  // the input gradient first, then the hook, then the weight gradients beside it
  const ops::LinearBackwardOptions accumulate{.accumulate_dx = true, .fp8 = dw.fp8};
  if (stacked) {
    ops::linear_backward(dxn2_RD, none, none, gate_up_R2F, none, w.w_gate_up_2FD, input_only);
    hooks.after_input_gradient();
    ops::linear_backward(none, g.w_gate_up_2FD, none, gate_up_R2F, xn2_RD, w.w_gate_up_2FD, dw);
  } else {
    ops::linear_backward(dxn2_RD, none, none, gate_RF, none, w.w_gate_FD, input_only);
    ops::linear_backward(dxn2_RD, none, none, up_RF, none, w.w_up_FD, accumulate);
    hooks.after_input_gradient();
    ops::linear_backward(none, g.w_gate_FD, none, gate_RF, xn2_RD, w.w_gate_FD, dw);
    ops::linear_backward(none, g.w_up_FD, none, up_RF, xn2_RD, w.w_up_FD, dw);
  }
}

}  // namespace

void mlp_inner(BlockActivations& a, const Tensor& xn2_RD, const BlockWeights& w, const BlockContext& ctx,
               const Dims& d) {
  MlpRows m = mlp_tensors(d.BT, xn2_RD, w, ctx, d.F, true);
  Tensor xn2_TD;
  over_all_rows(xn2_TD, xn2_RD, ctx, d, "xn2 (all rows)", [&](const Tensor& in, int64_t first, int64_t end) {
    gate_up_products(m, in, first, end, w, with_amax(ctx.fp8, a, BlockActivations::kXn2));
  });
  a.xn2_BTD = xn2_TD.view({d.B, d.T, d.D});
  ops::swiglu_forward(m.h_RF, m.gate_RF, m.up_RF, a.fp8_amax(BlockActivations::kH), ctx.config->mlp_activation);
  a.h_BTF = m.h_RF.view({d.B, d.T, d.F});
  if (m.gate_up_R2F.defined()) {
    a.gate_up_BT2F = m.gate_up_R2F.view({d.B, d.T, 2 * d.F});
    a.gate_BTF = a.gate_up_BT2F.slice(2, 0, d.F);
    a.up_BTF = a.gate_up_BT2F.slice(2, d.F, 2 * d.F);
  } else {
    a.gate_BTF = m.gate_RF.view({d.B, d.T, d.F});
    a.up_BTF = m.up_RF.view({d.B, d.T, d.F});
  }
}

void mlp_output_by_pieces(BlockActivations& a, const BlockWeights& w, const BlockContext& ctx, const Dims& d) {
  const int64_t C = mlp_piece_rows(ctx, d.BT);
  const Tensor xn2_TD = a.xn2_BTD.view({d.BT, d.D});
  if (output_norms(*ctx.config) || ctx.config->residual_multiplier != 1.0) {
    // the MLP's output p piece by piece, then y = x2 + s(p) (add_sublayer)
    const Tensor p_RD = product_rows(d, ctx, a.x_BTD, [&](Tensor& out, int64_t first, int64_t end) {
      for (int64_t r0 = first; r0 < end; r0 += C) {
        const int64_t r1 = std::min(end, r0 + C);
        const MlpRows m = mlp_products(xn2_TD.slice(0, r0, r1), w, ctx, d.F, true);
        Tensor out_piece = out.slice(0, r0 - first, r1 - first);
        ops::linear_forward(out_piece, m.h_RF, w.w_down_DF, Tensor(), ctx.fp8);
      }
    });
    add_sublayer(a.y_BTD, a.mlp_out_BTD, mlp_out_rstd(a, *ctx.config), p_RD, a.x2_BTD, w.post_ffn_norm_D, d, ctx, "y");
    return;
  }
  a.y_BTD = like(residual_shape(d), a.x_BTD, "y");
  Tensor y_RD = a.y_BTD.view({d.R, d.D});
  summed_product(y_RD, a.x2_BTD.view({d.R, d.D}), ctx, d,
                 [&](Tensor& out, int64_t first, int64_t end, const Tensor& add) {
                   for (int64_t r0 = first; r0 < end; r0 += C) {
                     const int64_t r1 = std::min(end, r0 + C);
                     const MlpRows m = mlp_products(xn2_TD.slice(0, r0, r1), w, ctx, d.F, true);
                     Tensor out_piece = out.slice(0, r0 - first, r1 - first);
                     if (add.defined()) {
                       ops::linear_forward_add(out_piece, m.h_RF, w.w_down_DF, add.slice(0, r0 - first, r1 - first), ctx.fp8);
                     } else {
                       ops::linear_forward(out_piece, m.h_RF, w.w_down_DF, Tensor(), ctx.fp8);
                     }
                   }
                 });
}

void mlp_backward(Tensor& dxn2_TD, Tensor& dxn2_RD, BlockWeights& g, const Tensor& dmlp_RD, const Tensor& xn2_TD,
                  BlockActivations& a, const BlockWeights& w, const BlockContext& ctx, const Dims& d,
                  const Tensor& dy_BTD, const GradOptions& o) {
  const int64_t BT = d.BT, R = d.R, D = d.D, F = d.F;
  const ops::LinearBackwardOptions &dw = o.dw, &dw_dx = o.dw_dx, &input_only = o.input_only;
  const bool overwrite_grads = o.overwrite;
  Tensor none;
  // The MLP's products see every row: dy gathered over the group (tensor parallelism), while
  // this rank's rows make their part of dh; the reduce-scatter of dxn2's partial sums runs
  // beside gate's and up's weight gradients.
  Tensor dy_TD;
  if (a.gate_BTF.defined()) {
    // the kept (or recomputed) gate and up of every token
    const bool stacked = a.gate_up_BT2F.defined();
    Tensor gate_up = stacked ? a.gate_up_BT2F.view({BT, 2 * F}) : Tensor();
    Tensor gate = stacked ? gate_up.slice(1, 0, F) : a.gate_BTF.view({BT, F});
    Tensor up = stacked ? gate_up.slice(1, F, 2 * F) : a.up_BTF.view({BT, F});
    Tensor h = a.h_BTF.defined() ? a.h_BTF.view({BT, F}) : Tensor();
    a.gate_BTF = a.up_BTF = a.gate_up_BT2F = a.h_BTF = Tensor();  // freed inside, once read
    MlpBackwardHooks hooks;
    std::optional<ops::GemmSmReserve> reserve;  // while the reduce-scatter runs beside the weight gradients
    if (sequence_split(ctx)) {
      hooks.down_input_gradient = [&](Tensor& dh_TF) {
        over_all_rows(dy_TD, dmlp_RD, ctx, d, "dy (all rows)", [&](const Tensor& in, int64_t first, int64_t end) {
          Tensor out = dh_TF.slice(0, first, end);
          ops::linear_backward(out, none, none, in, none, w.w_down_DF, input_only);
        });
      };
      hooks.after_input_gradient = [&] {
        dxn2_RD = like({R, D}, dy_BTD, "dxn2");
        ctx.tp->start_reduce_scatter(dxn2_RD, dxn2_TD);
        reserve.emplace(ctx.tp->overlap_sm_reserve());
      };
    } else {
      dy_TD = dmlp_RD.view({BT, D});
    }
    const MlpAmax mlp_amax{a.fp8_amax(BlockActivations::kH), a.fp8_amax(BlockActivations::kXn2),
                           a.fp8_amax(BlockActivations::kGateUpGrads)};
    mlp_backward_rows(dxn2_TD, g, dy_TD, xn2_TD, std::move(gate_up), std::move(gate), std::move(up), std::move(h), w,
                      dw, dw_dx, ctx.config->mlp_activation, hooks, mlp_amax);
    reserve.reset();
    if (sequence_split(ctx)) ctx.tp->finish();
  } else {
    // a chunked MLP (BlockContext::mlp_chunk_tokens): gate and up recomputed piece by piece;
    // each weight gradient gets one piece's product after another (the first may overwrite)
    dy_TD = all_rows(dmlp_RD, ctx, d, "dy (all rows)");
    const int64_t C = mlp_piece_rows(ctx, BT);
    dxn2_TD = like({BT, D}, dy_BTD, "dxn2");
    for (int64_t r0 = 0; r0 < BT; r0 += C) {
      const int64_t r1 = std::min(BT, r0 + C);
      const bool first = overwrite_grads && r0 == 0;
      const ops::LinearBackwardOptions piece_dw{.overwrite_dweight = first, .fp8 = ctx.fp8};
      const ops::LinearBackwardOptions piece_dw_dx{.accumulate_dx = true, .overwrite_dweight = first, .fp8 = ctx.fp8};
      const Tensor xn2_piece = xn2_TD.slice(0, r0, r1);
      MlpRows m = mlp_products(xn2_piece, w, ctx, F, false);
      Tensor dxn2_piece = dxn2_TD.slice(0, r0, r1);
      mlp_backward_rows(dxn2_piece, g, dy_TD.slice(0, r0, r1), xn2_piece, std::move(m.gate_up_R2F),
                        std::move(m.gate_RF), std::move(m.up_RF), Tensor(), w, piece_dw, piece_dw_dx,
                        ctx.config->mlp_activation);
    }
  }
  dy_TD = Tensor();
  if (!dxn2_RD.defined()) dxn2_RD = summed_rows(dxn2_TD, ctx, d, "dxn2");
}

}  // namespace shardtrain::model::block_detail
