// Llama block forward and backward as a fixed sequence of ops (HF LlamaDecoderLayer): the
// attention sublayer (block_attention.cpp), then the MLP (block_mlp.cpp), each between its
// norms (block_norms.cpp) and the residual stream (block_sublayer.cpp); and what activation
// checkpointing keeps of them between the two passes.
#include "model/block.h"

#include "model/block_internal.h"
#include "ops/elementwise.h"

namespace shardtrain::model {

void BlockActivations::release_for(ActivationCheckpointing checkpointing) {
  switch (checkpointing) {
    case ActivationCheckpointing::kNone:
      return;
    case ActivationCheckpointing::kFull:
      {
        const Tensor keep = x_BTD;
        *this = BlockActivations();
        x_BTD = keep;
      }
      return;
    case ActivationCheckpointing::kSelective:
      gate_BTF = up_BTF = gate_up_BT2F = Tensor();
      [[fallthrough]];
    case ActivationCheckpointing::kPointwise:
      xn1_BTD = rstd1_BT = Tensor();
      xn2_BTD = rstd2_BT = Tensor();
      h_BTF = y_BTD = Tensor();
      return;
  }
}

std::vector<Tensor*> BlockActivations::tensors() {
  return {&x_BTD,      &xn1_BTD,    &rstd1_BT,  &q_BTNH,  &k_BTMH,       &v_BTMH,       &q_raw_BTNH,    &k_raw_BTMH,
          &q_rstd_BTN, &k_rstd_BTM, &attn_BTNH, &lse_BNT, &x2_BTD,       &attn_out_BTD, &post_rstd1_BT, &mlp_out_BTD,
          &xn2_BTD,    &rstd2_BT,   &gate_BTF,  &up_BTF,  &h_BTF,        &gate_up_BT2F, &post_rstd2_BT, &y_BTD};
}

BlockPart recompute_part(ActivationCheckpointing checkpointing) {
  switch (checkpointing) {
    case ActivationCheckpointing::kPointwise: return BlockPart::kNorms;
    case ActivationCheckpointing::kSelective: return BlockPart::kNormsAndMlp;
    case ActivationCheckpointing::kFull: return BlockPart::kAllButOutput;
    case ActivationCheckpointing::kNone: break;
  }
  ST_THROW("recompute_part: nothing is recomputed without checkpointing");
}

using namespace block_detail;

void block_forward(BlockActivations& a, const BlockWeights& w, const Tensor& x_BTD, const BlockContext& ctx,
                   BlockPart part) {
  const LlamaConfig& c = *ctx.config;
  const Dims d = dims_of(ctx, x_BTD);
  ST_ASSERT(x_BTD.numel() == d.R * d.D, "block input ", x_BTD.str(), " for ", d.R, " token rows of ", d.D);
  a.x_BTD = x_BTD;
  const bool post = ctx.config->post_norms;
  ST_ASSERT(!(ctx.config->qk_norm || ctx.config->qk_norm_whole) || (w.q_norm_H.defined() && w.k_norm_H.defined()),
            "QK-norm without q_norm / k_norm weights");
  // the amax slots are the norms' outputs': with post_norms no norm makes the products' inputs,
  // and each quantisation finds its own amax
  if (ctx.fp8.recipe == ops::Fp8Recipe::kTensorwise && ctx.tp == nullptr && ctx.mlp_chunk_tokens == 0 && !post &&
      !a.fp8_amax_S.defined()) {
    a.fp8_amax_S = Tensor::empty({BlockActivations::kFp8Amaxes}, DType::kI32, d.dev, "FP8 amaxes");
    ops::fill(a.fp8_amax_S, 0.0);
  }
  // with post_norms the sublayers read the residual stream itself, and rstd1 / rstd2 are the
  // norms' after them
  const Tensor xn1_RD =
      post ? x_BTD.view({d.R, d.D})
           : norm(a.rstd1_BT, x_BTD, w.attn_norm_D, d, c, "xn1", "rstd1", a.fp8_amax(BlockActivations::kXn1));
  if (part == BlockPart::kNormsAndMlp || part == BlockPart::kNorms) {
    ST_ASSERT(a.x2_BTD.defined() && a.attn_BTNH.defined(), "block_forward: recomputing the norms needs the kept "
              "attention half");
    a.xn1_BTD = all_rows(xn1_RD, ctx, d, "xn1 (all rows)").view({d.B, d.T, d.D});
    if (post) {
      post_norm_rstd(a.rstd1_BT, a.attn_out_BTD, w.ffn_norm_D, d, ctx);
      post_norm_rstd(a.rstd2_BT, a.mlp_out_BTD, w.post_ffn_norm_D, d, ctx);
    }
  } else {
    attention_half(a, xn1_RD, w, ctx, d);
  }
  const Tensor xn2_RD =
      post ? a.x2_BTD.view({d.R, d.D})
           : norm(a.rstd2_BT, a.x2_BTD, c.sandwich_norms ? w.pre_ffn_norm_D : w.ffn_norm_D, d, c, "xn2", "rstd2",
                  a.fp8_amax(BlockActivations::kXn2));
  if (part == BlockPart::kNorms || ctx.mlp_chunk_tokens > 0)
    a.xn2_BTD = all_rows(xn2_RD, ctx, d, "xn2 (all rows)").view({d.B, d.T, d.D});
  if (part == BlockPart::kNorms) {
    ST_ASSERT(a.gate_BTF.defined() && a.up_BTF.defined(), "block_forward: pointwise recompute needs the kept gate "
              "and up");
    return;
  }
  // y is the next block's input, kept there: recomputation skips it, except that with
  // output norms the full recompute needs the MLP's output and its norm's 1/rms
  const bool output = part == BlockPart::kAll || (output_norms(c) && part == BlockPart::kAllButOutput);
  if (ctx.mlp_chunk_tokens > 0) {
    // a chunked MLP keeps none of its inner tensors: the backward recomputes them by pieces
    if (output) mlp_output_by_pieces(a, w, ctx, d);
    return;
  }
  mlp_inner(a, xn2_RD, w, ctx, d);
  if (!output) return;

  sublayer_output(a.y_BTD, a.mlp_out_BTD, mlp_out_rstd(a, c), a.h_BTF.view({d.BT, d.F}), w.w_down_DF, a.x2_BTD,
                  w.post_ffn_norm_D, d, ctx, with_amax(ctx.fp8, a, BlockActivations::kH), "y");
  if (part != BlockPart::kAll) a.y_BTD = Tensor();
}

void block_backward(Tensor& dx_BTD, BlockWeights& g, const Tensor& dy_BTD, BlockActivations& a, const BlockWeights& w,
                    const BlockContext& ctx, bool overwrite_grads) {
  const Dims d = dims_of(ctx, dy_BTD);
  const int64_t R = d.R, D = d.D;
  ST_ASSERT(!ctx.tp || sequence_split(ctx), "the backward of a tensor-parallel block splits the rows (kSequence)");
  const Tensor dy_RD = dy_BTD.view({R, D});
  const bool post = ctx.config->post_norms;
  // the MLP's output gradient: dy, or through Granite's residual_multiplier and OLMo 2's norm
  const Tensor dmlp_RD = sublayer_backward(dy_RD, g.post_ffn_norm_D, a.mlp_out_BTD, mlp_out_rstd(a, *ctx.config),
                                           w.post_ffn_norm_D, d, ctx, overwrite_grads);
  a.mlp_out_BTD = Tensor();
  const GradOptions o = grad_options(ctx, overwrite_grads);

  Tensor dxn2_TD;  // all rows; with tensor parallelism partial sums over the group
  Tensor dxn2_RD;  // this rank's rows of dxn2, summed over the group
  // a view holds its storage: dropped with a.xn2_BTD below, not at the function's end
  Tensor xn2_TD = a.xn2_BTD.view({d.BT, D});
  mlp_backward(dxn2_TD, dxn2_RD, g, dmlp_RD, xn2_TD, a, w, ctx, d, dy_BTD, o);
  Tensor dx2_RD = like({R, D}, dy_BTD, "dx2");
  if (post) {
    ops::add(dx2_RD, dxn2_RD, dy_RD);  // the MLP read x2 itself
  } else {
    const bool sandwich = ctx.config->sandwich_norms;  // the MLP's input norm: its own weight
    norm_backward(dx2_RD, sandwich ? g.pre_ffn_norm_D : g.ffn_norm_D, dxn2_RD, a.x2_BTD.view({R, D}),
                  sandwich ? w.pre_ffn_norm_D : w.ffn_norm_D, a.rstd2_BT.view({R}), dy_RD, ctx, overwrite_grads);
  }
  // read for the last time: freed before the attention's backward, the block's other peak
  dxn2_TD = dxn2_RD = xn2_TD = Tensor();
  a.xn2_BTD = a.rstd2_BT = a.x2_BTD = Tensor();

  // the attention's output gradient: dx2, or through Granite's residual_multiplier and OLMo 2's norm
  const Tensor dout_RD = sublayer_backward(dx2_RD, g.ffn_norm_D, a.attn_out_BTD, attn_out_rstd(a, *ctx.config),
                                           w.ffn_norm_D, d, ctx, overwrite_grads);
  a.attn_out_BTD = Tensor();
  // through o_proj and the attention to dq, dk and dv; then through rope, the QK-norm and the
  // q, k and v products to xn1's gradient, allocated once the attention backward has freed its
  // inputs (that moment is the peak)
  QkvGradients dqkv;
  attention_backward(dqkv, g, dout_RD, a, w, ctx, d, dy_BTD, o);
  Tensor dxn1_TD, dxn1_RD;
  qkv_backward(dxn1_TD, dxn1_RD, dqkv, g, a, w, ctx, d, dy_BTD, o);
  if (!dxn1_RD.defined()) dxn1_RD = summed_rows(dxn1_TD, ctx, d, "dxn1");
  Tensor dx_RD = dx_BTD.view({R, D});
  if (post) {
    ops::add(dx_RD, dxn1_RD, dx2_RD);  // q, k and v read x itself
    return;
  }
  norm_backward(dx_RD, g.attn_norm_D, dxn1_RD, a.x_BTD.view({R, D}), w.attn_norm_D, a.rstd1_BT.view({R}), dx2_RD, ctx,
                overwrite_grads);
}

}  // namespace shardtrain::model
