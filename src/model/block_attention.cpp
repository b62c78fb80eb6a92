// The block's attention sublayer: q, k and v from the attention norm's output (one stacked
// product or three), QK-norm and rope, the attention (by pieces beside the tensor-parallel
// gather, a ring with context parallelism, or over a KV cache), x2 = x + o(attn); and its
// backward.
#include "model/block_internal.h"
#include "ops/attention.h"
#include "ops/rope.h"

namespace shardtrain::model::block_detail {
namespace {

// Writes the new tokens' k (after rope) and v into the cache at positions kv_position.. and
// returns every cached position's keys and values, [B, kv_position + T, M, H] views.
std::pair<Tensor, Tensor> append_to_cache(const BlockActivations& a, const BlockContext& ctx, const Dims& d) {
  const int64_t p = ctx.kv_position, S = p + d.T;
  ST_ASSERT(S <= ctx.kv_keys_BSMH.size(1), "KV cache of ", ctx.kv_keys_BSMH.size(1), " positions given ", S);
  for (int64_t b = 0; b < d.B; ++b) {  // per sequence: a row of the cache is contiguous, k and v head slices
    Tensor k_dst = ctx.kv_keys_BSMH.slice(0, b, b + 1).slice(1, p, S);
    Tensor v_dst = ctx.kv_values_BSMH.slice(0, b, b + 1).slice(1, p, S);
    copy(k_dst, a.k_BTMH.slice(0, b, b + 1));
    copy(v_dst, a.v_BTMH.slice(0, b, b + 1));
  }
  return {ctx.kv_keys_BSMH.slice(1, 0, S), ctx.kv_values_BSMH.slice(1, 0, S)};
}

// Each token's rope position with packed documents or context parallelism; undefined
// (position t) without.
const Tensor& positions(const BlockContext& ctx) {
  return ctx.documents != nullptr ? ctx.documents->positions_BT : ctx.context_positions_BT;
}

// Whether attention_half runs rope and attention on each range of rows as soon as that
// range's q, k and v exist: under sequence parallelism by pieces when every rank holds whole
// sequences (R a multiple of T) of one document each, and no KV cache. This rank's own
// sequences then attend while the other ranks' rows are gathered.
bool attention_by_pieces(const BlockContext& ctx, const Dims& d) {
  return sequence_split(ctx) && ctx.tp->by_pieces() && d.R % d.T == 0 && ctx.documents == nullptr &&
         !ctx.kv_keys_BSMH.defined() && !ctx.kv_position_1.defined();
}

}  // namespace

void attention_half(BlockActivations& a, const Tensor& xn1_RD, const BlockWeights& w, const BlockContext& ctx,
                    const Dims& d) {
  const Tensor& x = a.x_BTD;
  a.attn_BTNH = like({d.B, d.T, d.N, d.H}, x, "attn");
  a.lse_BNT = Tensor::empty({d.B, d.N, d.T}, d.stats, d.dev, "lse");
  ops::AttentionOptions attention;
  attention.documents = ctx.documents;
  attention.window = ctx.window;
  attention.scale = ctx.config->attention_multiplier;  // Granite's; 0: 1 / sqrt(H)
  attention.softcap = ctx.config->attn_logit_softcapping;  // Gemma 2's; 0: none
  // the attention of sequences [b0, b1): in FP8 (which rounds q, k and v in place, for the
  // backward to read) where BlockContext::fp8_attention takes it
  const bool fp8 = ctx.fp8_attention && ctx.documents == nullptr && ctx.window == 0;
  auto attend_rows = [&](int64_t b0, int64_t b1) {
    Tensor attn = a.attn_BTNH.slice(0, b0, b1), lse = a.lse_BNT.slice(0, b0, b1);
    Tensor q = a.q_BTNH.slice(0, b0, b1), k = a.k_BTMH.slice(0, b0, b1), v = a.v_BTMH.slice(0, b0, b1);
    if (fp8)
      ops::attention_forward_fp8(attn, lse, q, k, v, attention);
    else
      ops::attention_forward(attn, lse, q, k, v, attention);
  };
  // rope on q and k of sequences [b0, b1), then their attention (attention_by_pieces)
  auto attend = [&](int64_t b0, int64_t b1, auto&& rope) {
    rope(b0, b1);
    attend_rows(b0, b1);
  };
  const bool by_pieces = attention_by_pieces(ctx, d);
  const bool whole = ctx.config->qk_norm_whole;  // one norm over all heads: one 1/rms per token
  const bool qk_norm = ctx.config->qk_norm || whole;
  if (qk_norm) {
    a.q_raw_BTNH = like({d.B, d.T, d.N, d.H}, x, "q before its norm");
    a.k_raw_BTMH = like({d.B, d.T, d.M, d.H}, x, "k before its norm");
    a.q_rstd_BTN = Tensor::empty({d.B, d.T, whole ? 1 : d.N}, d.stats, d.dev, "q norm rstd");
    a.k_rstd_BTM = Tensor::empty({d.B, d.T, whole ? 1 : d.M}, d.stats, d.dev, "k norm rstd");
  }
  // QK-norm of sequences [b0, b1), before their rope (per head, or over all heads)
  auto norm_heads = [&](int64_t b0, int64_t b1) {
    if (!qk_norm) return;
    head_norm_forward(a.q_BTNH, a.q_raw_BTNH, a.q_rstd_BTN, w.q_norm_H, *ctx.config, b0, b1);
    head_norm_forward(a.k_BTMH, a.k_raw_BTMH, a.k_rstd_BTM, w.k_norm_H, *ctx.config, b0, b1);
  };
  Tensor xn1_TD;
  if (qkv_stacked(w, ctx)) {
    // one product for q, k and v; each a slice of its heads; rope on q's and k's heads at once
    const int64_t heads = d.N + 2 * d.M;
    const Tensor qkv_BTEH = like({d.B, d.T, heads, d.H}, x, "qkv");
    const Tensor qkv_TE = qkv_BTEH.view({d.BT, heads * d.H});
    a.q_BTNH = qkv_BTEH.slice(2, 0, d.N);
    a.k_BTMH = qkv_BTEH.slice(2, d.N, d.N + d.M);
    a.v_BTMH = qkv_BTEH.slice(2, d.N + d.M, heads);
    auto rope = [&](int64_t b0, int64_t b1) {
      norm_heads(b0, b1);
      if (!ctx.rope) return;  // a NoPE layer
      Tensor qk_BTXH = qkv_BTEH.slice(0, b0, b1).slice(2, 0, d.N + d.M);
      ops::rope_forward(qk_BTXH, ctx.cos_TK, ctx.sin_TK, positions(ctx));
    };
    over_all_rows(xn1_TD, xn1_RD, ctx, d, "xn1 (all rows)", [&](const Tensor& in, int64_t first, int64_t end) {
      Tensor out = qkv_TE.slice(0, first, end);
      ops::linear_forward(out, in, w.wqkv_ED, w.bqkv_E, with_amax(ctx.fp8, a, BlockActivations::kXn1));
      if (by_pieces) attend(first / d.T, end / d.T, rope);
    });
    if (!by_pieces) rope(0, d.B);
  } else {
    a.q_BTNH = like({d.B, d.T, d.N, d.H}, x, "q");
    a.k_BTMH = like({d.B, d.T, d.M, d.H}, x, "k");
    a.v_BTMH = like({d.B, d.T, d.M, d.H}, x, "v");
    const Tensor q_TQ = a.q_BTNH.view({d.BT, d.N * d.H});
    const Tensor k_TK = a.k_BTMH.view({d.BT, d.M * d.H});
    const Tensor v_TK = a.v_BTMH.view({d.BT, d.M * d.H});
    auto rope = [&](int64_t b0, int64_t b1) {
      norm_heads(b0, b1);
      if (!ctx.rope) return;  // a NoPE layer
      Tensor q = a.q_BTNH.slice(0, b0, b1), k = a.k_BTMH.slice(0, b0, b1);
      ops::rope_forward(q, ctx.cos_TK, ctx.sin_TK, positions(ctx));
      ops::rope_forward(k, ctx.cos_TK, ctx.sin_TK, positions(ctx));
    };
    over_all_rows(xn1_TD, xn1_RD, ctx, d, "xn1 (all rows)", [&](const Tensor& in, int64_t first, int64_t end) {
      Tensor q = q_TQ.slice(0, first, end), k = k_TK.slice(0, first, end), v = v_TK.slice(0, first, end);
      ops::linear_forward(q, in, w.wq_QD, w.bq_Q, with_amax(ctx.fp8, a, BlockActivations::kXn1));
      ops::linear_forward(k, in, w.wk_KD, w.bk_K, with_amax(ctx.fp8, a, BlockActivations::kXn1));
      ops::linear_forward(v, in, w.wv_KD, w.bv_K, with_amax(ctx.fp8, a, BlockActivations::kXn1));
      if (by_pieces) attend(first / d.T, end / d.T, rope);
    });
    if (!by_pieces) rope(0, d.B);
  }
  a.xn1_BTD = xn1_TD.view({d.B, d.T, d.D});

  if (ctx.kv_position_1.defined()) {
    Tensor keys_BCMH = ctx.kv_keys_BSMH, values_BCMH = ctx.kv_values_BSMH;
    ops::attention_forward_kv_cache(a.attn_BTNH, a.lse_BNT, keys_BCMH, values_BCMH, a.q_BTNH, a.k_BTMH, a.v_BTMH,
                                    ctx.kv_position_1,
                                    {.scale = attention.scale, .window = ctx.window, .softcap = attention.softcap});
  } else if (ctx.kv_keys_BSMH.defined()) {
    const auto [keys_BSMH, values_BSMH] = append_to_cache(a, ctx, d);
    ops::attention_forward(a.attn_BTNH, a.lse_BNT, a.q_BTNH, keys_BSMH, values_BSMH,
                           {.scale = attention.scale, .window = ctx.window, .softcap = attention.softcap});
  } else if (ctx.cp != nullptr) {
    ring_attention_forward(a.attn_BTNH, a.lse_BNT, a.q_BTNH, a.k_BTMH, a.v_BTMH, attention, *ctx.cp,
                           ctx.context_documents);
  } else if (!by_pieces) {
    attend_rows(0, d.B);
  }

  sublayer_output(a.x2_BTD, a.attn_out_BTD, attn_out_rstd(a, *ctx.config), a.attn_BTNH.view({d.BT, d.N * d.H}),
                  w.wo_DQ, x, w.ffn_norm_D, d, ctx, with_amax(ctx.fp8, a, BlockActivations::kAttn, false), "x2");
}

void attention_backward(QkvGradients& dqkv, BlockWeights& g, const Tensor& dout_RD, BlockActivations& a,
                        const BlockWeights& w, const BlockContext& ctx, const Dims& d, const Tensor& dy_BTD,
                        const GradOptions& o) {
  const int64_t B = d.B, T = d.T, BT = d.BT, D = d.D, N = d.N, M = d.M, H = d.H;
  const ops::LinearBackwardOptions &dw = o.dw, &input_only = o.input_only;
  Tensor none;
  // Attention: x2 = x + o(attn); dx2 flows to x unchanged and through o_proj (over all rows:
  // with tensor parallelism gathered while this rank's rows make their part of dattn, and by
  // pieces while this rank's sequences' attention backward runs too).
  Tensor dattn_BTNH = like({B, T, N, H}, dy_BTD, "dattn");
  Tensor dattn_TQ = dattn_BTNH.view({BT, N * H});
  // dq, dk, dv: with stacked weights head slices of one tensor, so that one product makes the
  // input gradient (and one the stacked weight gradient) instead of three
  dqkv.stacked = qkv_stacked(w, ctx) && g.wqkv_ED.defined();
  const bool stacked = dqkv.stacked;
  const int64_t heads = N + 2 * M;
  Tensor &dqkv_BTEH = dqkv.dqkv_BTEH, &dq_BTNH = dqkv.dq_BTNH, &dk_BTMH = dqkv.dk_BTMH, &dv_BTMH = dqkv.dv_BTMH;
  if (stacked) {
    dqkv_BTEH = like({B, T, heads, H}, dy_BTD, "dqkv");
    dq_BTNH = dqkv_BTEH.slice(2, 0, N);
    dk_BTMH = dqkv_BTEH.slice(2, N, N + M);
    dv_BTMH = dqkv_BTEH.slice(2, N + M, heads);
  } else {
    dq_BTNH = like({B, T, N, H}, dy_BTD, "dq");
    dk_BTMH = like({B, T, M, H}, dy_BTD, "dk");
    dv_BTMH = like({B, T, M, H}, dy_BTD, "dv");
  }
  ops::AttentionOptions attention;
  attention.deterministic = ctx.deterministic;
  attention.documents = ctx.documents;
  attention.window = ctx.window;
  attention.scale = ctx.config->attention_multiplier;
  attention.softcap = ctx.config->attn_logit_softcapping;
  // the attention backward of sequences [b0, b1): FP8's where the forward was FP8's
  const bool fp8 = ctx.fp8_attention && ctx.documents == nullptr && ctx.window == 0;
  ST_ASSERT(!fp8 || ctx.fp8_attention_history_4.defined(), "the FP8 attention backward needs its layer's history");
  auto attend_backward = [&](int64_t b0, int64_t b1) {
    Tensor dq = dq_BTNH.slice(0, b0, b1), dk = dk_BTMH.slice(0, b0, b1), dv = dv_BTMH.slice(0, b0, b1);
    if (fp8) {
      Tensor history = ctx.fp8_attention_history_4;
      ops::attention_backward_fp8(dq, dk, dv, dattn_BTNH.slice(0, b0, b1), a.q_BTNH.slice(0, b0, b1),
                                  a.k_BTMH.slice(0, b0, b1), a.v_BTMH.slice(0, b0, b1), a.attn_BTNH.slice(0, b0, b1),
                                  a.lse_BNT.slice(0, b0, b1), history, ctx.fp8_attention_seed && b0 == 0, attention);
    } else {
      ops::attention_backward(dq, dk, dv, dattn_BTNH.slice(0, b0, b1), a.q_BTNH.slice(0, b0, b1),
                              a.k_BTMH.slice(0, b0, b1), a.v_BTMH.slice(0, b0, b1), a.attn_BTNH.slice(0, b0, b1),
                              a.lse_BNT.slice(0, b0, b1), attention);
    }
  };
  const bool by_pieces = attention_by_pieces(ctx, d);
  if (sequence_split(ctx)) {
    Tensor dx2_TD;
    over_all_rows(dx2_TD, dout_RD, ctx, d, "dx2 (all rows)", [&](const Tensor& in, int64_t first, int64_t end) {
      Tensor out = dattn_TQ.slice(0, first, end);
      ops::linear_backward(out, none, none, in, none, w.wo_DQ, input_only);
      if (by_pieces) attend_backward(first / T, end / T);
    });
    ops::linear_backward(none, g.wo_DQ, none, dx2_TD, a.attn_BTNH.view({BT, N * H}), w.wo_DQ, dw);
  } else {
    ops::LinearBackwardOptions o_dw = dw;
    o_dw.fp8 = with_amax(ctx.fp8, a, BlockActivations::kAttn);
    ops::linear_backward(dattn_TQ, g.wo_DQ, none, dout_RD.view({BT, D}), a.attn_BTNH.view({BT, N * H}), w.wo_DQ, o_dw);
  }
  if (ctx.cp != nullptr) {
    ring_attention_backward(dq_BTNH, dk_BTMH, dv_BTMH, dattn_BTNH, a.q_BTNH, a.k_BTMH, a.v_BTMH, a.attn_BTNH,
                            a.lse_BNT, attention, *ctx.cp, ctx.context_documents);
  } else if (!by_pieces) {
    attend_backward(0, B);
  }
  dattn_BTNH = dattn_TQ = Tensor();
  a.q_BTNH = a.k_BTMH = a.v_BTMH = a.attn_BTNH = a.lse_BNT = Tensor();
}

void qkv_backward(Tensor& dxn1_TD, Tensor& dxn1_RD, QkvGradients& dqkv, BlockWeights& g, BlockActivations& a,
                  const BlockWeights& w, const BlockContext& ctx, const Dims& d, const Tensor& dy_BTD,
                  const GradOptions& o) {
  const int64_t BT = d.BT, R = d.R, D = d.D, N = d.N, M = d.M, H = d.H;
  const ops::LinearBackwardOptions &dw = o.dw, &dw_dx = o.dw_dx, &input_only = o.input_only;
  const bool overwrite_grads = o.overwrite;
  const bool stacked = dqkv.stacked;
  const int64_t heads = N + 2 * M;
  Tensor &dqkv_BTEH = dqkv.dqkv_BTEH, &dq_BTNH = dqkv.dq_BTNH, &dk_BTMH = dqkv.dk_BTMH, &dv_BTMH = dqkv.dv_BTMH;
  Tensor none;
  // after rope's backward: the QK-norm's, turning dq and dk into the projections' gradients
  auto norm_heads_backward = [&] {
    if (!ctx.config->qk_norm && !ctx.config->qk_norm_whole) return;
    head_norm_backward(dq_BTNH, g.q_norm_H, a.q_raw_BTNH, a.q_rstd_BTN, w.q_norm_H, ctx, overwrite_grads);
    head_norm_backward(dk_BTMH, g.k_norm_H, a.k_raw_BTMH, a.k_rstd_BTM, w.k_norm_H, ctx, overwrite_grads);
    a.q_raw_BTNH = a.k_raw_BTMH = a.q_rstd_BTN = a.k_rstd_BTM = Tensor();
  };
  const Tensor xn1_TD = a.xn1_BTD.view({BT, D});
  if (stacked) {
    Tensor dqk_BTXH = dqkv_BTEH.slice(2, 0, N + M);
    if (ctx.rope) ops::rope_backward(dqk_BTXH, ctx.cos_TK, ctx.sin_TK, positions(ctx));
    norm_heads_backward();
    dxn1_TD = like({BT, D}, dy_BTD, "dxn1");
    const Tensor dqkv_TE = dqkv_BTEH.view({BT, heads * H});
    if (sequence_split(ctx)) {
      // the input gradient, its reduce-scatter beside the weight gradient
      ops::linear_backward(dxn1_TD, none, none, dqkv_TE, none, w.wqkv_ED, input_only);
      dxn1_RD = like({R, D}, dy_BTD, "dxn1");
      ctx.tp->start_reduce_scatter(dxn1_RD, dxn1_TD);
      {
        const ops::GemmSmReserve reserve(ctx.tp->overlap_sm_reserve());
        ops::linear_backward(none, g.wqkv_ED, g.bqkv_E, dqkv_TE, xn1_TD, w.wqkv_ED, dw);
      }
      ctx.tp->finish();
    } else {
      ops::LinearBackwardOptions qkv_dw = dw;
      qkv_dw.fp8 = with_amax(ctx.fp8, a, BlockActivations::kXn1);
      ops::linear_backward(dxn1_TD, g.wqkv_ED, g.bqkv_E, dqkv_TE, xn1_TD, w.wqkv_ED, qkv_dw);
    }
  } else {
    if (ctx.rope) {
      ops::rope_backward(dq_BTNH, ctx.cos_TK, ctx.sin_TK, positions(ctx));
      ops::rope_backward(dk_BTMH, ctx.cos_TK, ctx.sin_TK, positions(ctx));
    }
    norm_heads_backward();
    dxn1_TD = like({BT, D}, dy_BTD, "dxn1");
    const Tensor dq_TQ = dq_BTNH.view({BT, N * H}), dk_TK = dk_BTMH.view({BT, M * H}),
                 dv_TK = dv_BTMH.view({BT, M * H});
    if (sequence_split(ctx)) {
      // the input gradients, their reduce-scatter beside the weight gradients
      const ops::LinearBackwardOptions accumulate{.accumulate_dx = true, .fp8 = ctx.fp8};
      ops::linear_backward(dxn1_TD, none, none, dq_TQ, none, w.wq_QD, input_only);
      ops::linear_backward(dxn1_TD, none, none, dk_TK, none, w.wk_KD, accumulate);
      ops::linear_backward(dxn1_TD, none, none, dv_TK, none, w.wv_KD, accumulate);
      dxn1_RD = like({R, D}, dy_BTD, "dxn1");
      ctx.tp->start_reduce_scatter(dxn1_RD, dxn1_TD);
      {
        const ops::GemmSmReserve reserve(ctx.tp->overlap_sm_reserve());
        ops::linear_backward(none, g.wq_QD, g.bq_Q, dq_TQ, xn1_TD, w.wq_QD, dw);
        ops::linear_backward(none, g.wk_KD, g.bk_K, dk_TK, xn1_TD, w.wk_KD, dw);
        ops::linear_backward(none, g.wv_KD, g.bv_K, dv_TK, xn1_TD, w.wv_KD, dw);
      }
      ctx.tp->finish();
    } else {
      ops::LinearBackwardOptions q_dw = dw, kv_dw = dw_dx;
      q_dw.fp8 = kv_dw.fp8 = with_amax(ctx.fp8, a, BlockActivations::kXn1);
      ops::linear_backward(dxn1_TD, g.wq_QD, g.bq_Q, dq_TQ, xn1_TD, w.wq_QD, q_dw);
      ops::linear_backward(dxn1_TD, g.wk_KD, g.bk_K, dk_TK, xn1_TD, w.wk_KD, kv_dw);
      ops::linear_backward(dxn1_TD, g.wv_KD, g.bv_K, dv_TK, xn1_TD, w.wv_KD, kv_dw);
    }
  }
}

}  // namespace shardtrain::model::block_detail
