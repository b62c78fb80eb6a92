// The block's RMSNorms: over the residual stream's rows (before or after a sublayer) and over
// q's and k's heads (QK-norm), forward and backward; with tensor parallelism a norm weight's
// gradient is summed over the group.
#include "model/block_internal.h"
#include "ops/rmsnorm.h"

namespace shardtrain::model::block_detail {

Tensor norm(Tensor& rstd_BT, const Tensor& x_BTD, const Tensor& weight_D, const Dims& d, const LlamaConfig& c,
            const char* name, const char* rstd_name, const Tensor& amax_1) {
  Tensor xn_RD = like({d.R, d.D}, x_BTD, name);
  rstd_BT = Tensor::empty(d.R == d.BT ? Shape{d.B, d.T} : Shape{d.R}, d.stats, d.dev, rstd_name);
  Tensor rstd_R = rstd_BT.view({d.R});
  ops::rmsnorm_forward(xn_RD, rstd_R, x_BTD.view({d.R, d.D}), weight_D,
                       {.eps = c.norm_eps, .weight_offset = c.norm_weight_offset, .amax_y_1 = amax_1});
  return xn_RD;
}

void norm_backward(Tensor& dx_RD, Tensor& dweight_D, const Tensor& dxn_RD, const Tensor& x_RD, const Tensor& weight_D,
                   const Tensor& rstd_R, const Tensor& dresidual_RD, const BlockContext& ctx, bool overwrite) {
  if (!sequence_split(ctx)) {
    ops::rmsnorm_backward(dx_RD, dweight_D, dxn_RD, x_RD, weight_D, rstd_R, dresidual_RD,
                          {.weight_offset = ctx.config->norm_weight_offset, .overwrite_dweight = overwrite});
    return;
  }
  Tensor part_D = Tensor::empty(dweight_D.shape(), dweight_D.dtype(), dweight_D.device(), "norm weight gradient");
  ops::rmsnorm_backward(dx_RD, part_D, dxn_RD, x_RD, weight_D, rstd_R, dresidual_RD,
                        {.weight_offset = ctx.config->norm_weight_offset, .overwrite_dweight = true});
  ctx.tp->all_reduce(part_D);
  if (overwrite) {
    copy(dweight_D, part_D);
  } else {
    ops::add(dweight_D, dweight_D, part_D);
  }
}

void post_norm_rstd(Tensor& rstd, const Tensor& raw, const Tensor& post_norm_D, const Dims& d,
                    const BlockContext& ctx) {
  ST_ASSERT(raw.defined(), "block_forward: recomputing a norm after its sublayer needs the kept sublayer output");
  norm(rstd, raw, post_norm_D, d, *ctx.config, "post norm (recomputed)", "post norm rstd");
}

void head_norm_forward(Tensor& x_BTXH, Tensor& raw_BTXH, Tensor& rstd_BTX, const Tensor& weight_H,
                       const LlamaConfig& c, int64_t b0, int64_t b1) {
  const ops::RmsNormOptions options{.eps = c.norm_eps, .weight_offset = c.norm_weight_offset};
  Tensor x = x_BTXH.slice(0, b0, b1), raw = raw_BTXH.slice(0, b0, b1), rstd = rstd_BTX.slice(0, b0, b1);
  const int64_t H = weight_H.numel(), rows = x.numel() / H;
  copy(raw, x);
  Tensor rstd_rows = rstd.view({rows});
  if (x.is_contiguous()) {
    Tensor y = x.view({rows, H});
    ops::rmsnorm_forward(y, rstd_rows, raw.view({rows, H}), weight_H, options);
    return;
  }
  Tensor y = like(x.shape(), x, "normed heads");
  Tensor y_rows = y.view({rows, H});
  ops::rmsnorm_forward(y_rows, rstd_rows, raw.view({rows, H}), weight_H, options);
  copy(x, y);
}

void head_norm_backward(Tensor& dx_BTXH, Tensor& dweight_H, const Tensor& raw_BTXH, const Tensor& rstd_BTX,
                        const Tensor& weight_H, const BlockContext& ctx, bool overwrite) {
  const int64_t H = weight_H.numel(), rows = dx_BTXH.numel() / H;
  const Tensor dy = contiguous(dx_BTXH);
  Tensor dx = like(dx_BTXH.shape(), dx_BTXH, "head norm input gradient");
  Tensor dx_rows = dx.view({rows, H});
  Tensor part_H = ctx.tp == nullptr ? dweight_H
                                    : Tensor::empty(dweight_H.shape(), dweight_H.dtype(), dweight_H.device(),
                                                    "head norm weight gradient");
  ops::rmsnorm_backward(dx_rows, part_H, dy.view({rows, H}), raw_BTXH.view({rows, H}), weight_H,
                        rstd_BTX.view({rows}), Tensor(),
                        {.weight_offset = ctx.config->norm_weight_offset,
                         .overwrite_dweight = overwrite || ctx.tp != nullptr});
  copy(dx_BTXH, dx);
  if (ctx.tp == nullptr) return;
  ctx.tp->all_reduce(part_H);
  if (overwrite) {
    copy(dweight_H, part_H);
  } else {
    ops::add(dweight_H, dweight_H, part_H);
  }
}

}  // namespace shardtrain::model::block_detail
