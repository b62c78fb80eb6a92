// A sublayer's output into the residual stream: x + o(in), or through Granite's
// residual_multiplier and OLMo 2's and Gemma's norms after the sublayer, and its backward.
#include "model/block_internal.h"

namespace shardtrain::model::block_detail {
namespace {

// out = x + o(in) for the residual stream (summed_product).
void residual_product(Tensor& out, const Tensor& in_TK, const Tensor& weight_DK, const Tensor& x, const Dims& d,
                      const BlockContext& ctx, const ops::LinearFp8& fp8, const char* name) {
  out = Tensor::empty(residual_shape(d), x.dtype(), x.device(), name);
  Tensor out_RD = out.view({d.R, d.D});
  summed_product(out_RD, x.view({d.R, d.D}), ctx, d,
                 [&](Tensor& o, int64_t first, int64_t end, const Tensor& add) {
                   const Tensor rows = in_TK.slice(0, first, end);
                   if (add.defined()) {
                     ops::linear_forward_add(o, rows, weight_DK, add, fp8);
                   } else {
                     ops::linear_forward(o, rows, weight_DK, Tensor(), fp8);
                   }
                 });
}

}  // namespace

void add_sublayer(Tensor& out, Tensor& raw, Tensor& rstd, Tensor p_RD, const Tensor& x, const Tensor& post_norm_D,
                  const Dims& d, const BlockContext& ctx, const char* name) {
  const LlamaConfig& c = *ctx.config;
  if (output_norms(c)) {
    raw = p_RD.view(residual_shape(d));
    p_RD = norm(rstd, raw, post_norm_D, d, c, "post norm", "post norm rstd");
  }
  if (c.residual_multiplier != 1.0) ops::scale(p_RD, c.residual_multiplier);  // rounded, then added (as torch)
  out = like(residual_shape(d), x, name);
  Tensor out_RD = out.view({d.R, d.D});
  ops::add(out_RD, x.view({d.R, d.D}), p_RD);
}

void sublayer_output(Tensor& out, Tensor& raw, Tensor& rstd, const Tensor& in_TK, const Tensor& weight_DK,
                     const Tensor& x, const Tensor& post_norm_D, const Dims& d, const BlockContext& ctx,
                     const ops::LinearFp8& fp8, const char* name) {
  if (!output_norms(*ctx.config) && ctx.config->residual_multiplier == 1.0) {
    residual_product(out, in_TK, weight_DK, x, d, ctx, fp8, name);
    return;
  }
  const Tensor p_RD = product_rows(d, ctx, x, [&](Tensor& o, int64_t first, int64_t end) {
    ops::linear_forward(o, in_TK.slice(0, first, end), weight_DK, Tensor(), fp8);
  });
  add_sublayer(out, raw, rstd, p_RD, x, post_norm_D, d, ctx, name);
}

Tensor sublayer_backward(const Tensor& dout_RD, Tensor& dpost_norm_D, const Tensor& raw, const Tensor& rstd,
                         const Tensor& post_norm_D, const Dims& d, const BlockContext& ctx, bool overwrite) {
  const LlamaConfig& c = *ctx.config;
  if (!output_norms(c) && c.residual_multiplier == 1.0) return dout_RD;
  Tensor ds_RD = like({d.R, d.D}, dout_RD, "sublayer output gradient");
  copy(ds_RD, dout_RD);
  if (c.residual_multiplier != 1.0) ops::scale(ds_RD, c.residual_multiplier);
  if (!output_norms(c)) return ds_RD;
  Tensor dp_RD = like({d.R, d.D}, dout_RD, "sublayer output gradient (before its norm)");
  norm_backward(dp_RD, dpost_norm_D, ds_RD, raw.view({d.R, d.D}), post_norm_D, rstd.view({d.R}), Tensor(), ctx,
                overwrite);
  return dp_RD;
}

}  // namespace shardtrain::model::block_detail
