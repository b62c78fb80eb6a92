// A block's token rows: its dimensions, and the residual stream's rows on this rank against
// all B·T rows that the products see (gathered and summed over the tensor-parallel group).
#include "model/block_internal.h"

namespace shardtrain::model {

int64_t BlockContext::residual_rows() const {
  const int64_t rows = batch * seq;
  if (tp == nullptr || residual == ResidualSplit::kReplicated) return rows;
  ST_ASSERT(rows % tp->size() == 0, "sequence parallelism: ", rows, " token rows over ", tp->size(), " ranks");
  return rows / tp->size();
}

namespace block_detail {

Tensor like(const Shape& shape, const Tensor& proto, const char* what) {
  return Tensor::empty(shape, proto.dtype(), proto.device(), what);
}

Dims dims_of(const BlockContext& ctx, const Tensor& x_BTD) {
  const LlamaConfig& c = *ctx.config;
  const int64_t parts = ctx.tp != nullptr ? ctx.tp->size() : 1;
  return {ctx.batch,          ctx.seq,         ctx.batch * ctx.seq, ctx.residual_rows(),
          c.dim,              c.n_heads / parts, c.n_kv_heads / parts, c.head_dim(),
          c.ffn_dim / parts,  ops::stats_dtype(x_BTD.dtype()), x_BTD.device()};
}

Shape residual_shape(const Dims& d) { return d.R == d.BT ? Shape{d.B, d.T, d.D} : Shape{d.R, d.D}; }

bool sequence_split(const BlockContext& ctx) {
  return ctx.tp != nullptr && ctx.residual == ResidualSplit::kSequence;
}

Tensor all_rows(const Tensor& rows_RD, const BlockContext& ctx, const Dims& d, const char* name) {
  if (!sequence_split(ctx)) return rows_RD.view({d.BT, d.D});
  Tensor all_TD = Tensor::empty({d.BT, d.D}, rows_RD.dtype(), rows_RD.device(), name);
  ctx.tp->all_gather(all_TD, rows_RD);
  return all_TD;
}

Tensor summed_rows(Tensor partial_TD, const BlockContext& ctx, const Dims& d, const char* name) {
  if (ctx.tp == nullptr) return partial_TD;
  if (!sequence_split(ctx)) {
    ctx.tp->all_reduce(partial_TD);
    return partial_TD;
  }
  Tensor rows_RD = Tensor::empty({d.R, d.D}, partial_TD.dtype(), partial_TD.device(), name);
  ctx.tp->reduce_scatter(rows_RD, partial_TD);
  return rows_RD;
}

GradOptions grad_options(const BlockContext& ctx, bool overwrite_grads) {
  // each parameter receives one gradient here: the first write replaces when asked to
  return {.dw = {.overwrite_dweight = overwrite_grads, .fp8 = ctx.fp8},
          .dw_dx = {.accumulate_dx = true, .overwrite_dweight = overwrite_grads, .fp8 = ctx.fp8},
          .input_only = {.fp8 = ctx.fp8},
          .overwrite = overwrite_grads};
}

}  // namespace block_detail
}  // namespace shardtrain::model
