// Llama block forward and backward as a fixed sequence of ops (HF LlamaDecoderLayer).
#include "model/block.h"

#include <algorithm>
#include <functional>
#include <optional>
#include <utility>
#include <vector>

#include "ops/attention.h"
#include "ops/elementwise.h"
#include "ops/linear.h"
#include "ops/rmsnorm.h"
#include "ops/rope.h"
#include "ops/swiglu.h"

namespace shardtrain::model {
namespace {

Tensor param_view(const Tensor& flat, const UnitLayout& unit, const std::string& name) {
  const ParamSpec* p = unit.find(name);
  ST_ASSERT(p != nullptr, "unit ", unit.name, " has no ", name);
  return flat.flat_range(p->offset, p->numel()).view(p->shape);
}

Tensor optional_view(const Tensor& flat, const UnitLayout& unit, const std::string& name) {
  const ParamSpec* p = unit.find(name);
  return p ? flat.flat_range(p->offset, p->numel()).view(p->shape) : Tensor();
}

Tensor like(const Shape& shape, const Tensor& proto, const char* what) {
  return Tensor::empty(shape, proto.dtype(), proto.device(), what);
}

}  // namespace

BlockWeights BlockWeights::view(const Tensor& flat, const UnitLayout& unit, const LlamaConfig& config) {
  const int64_t l = unit.layer;
  auto n = [&](const char* suffix) { return block_param_name(l, suffix); };
  BlockWeights w;
  w.attn_norm_D = optional_view(flat, unit, n("input_layernorm.weight"));  // none with post_norms
  w.wq_QD = param_view(flat, unit, n("self_attn.q_proj.weight"));
  w.wk_KD = param_view(flat, unit, n("self_attn.k_proj.weight"));
  w.wv_KD = param_view(flat, unit, n("self_attn.v_proj.weight"));
  w.bq_Q = optional_view(flat, unit, n("self_attn.q_proj.bias"));
  w.bk_K = optional_view(flat, unit, n("self_attn.k_proj.bias"));
  w.bv_K = optional_view(flat, unit, n("self_attn.v_proj.bias"));
  w.q_norm_H = optional_view(flat, unit, n("self_attn.q_norm.weight"));
  w.k_norm_H = optional_view(flat, unit, n("self_attn.k_norm.weight"));
  w.wo_DQ = param_view(flat, unit, n("self_attn.o_proj.weight"));
  w.ffn_norm_D = param_view(flat, unit, n("post_attention_layernorm.weight"));
  w.pre_ffn_norm_D = optional_view(flat, unit, n("pre_feedforward_layernorm.weight"));
  w.post_ffn_norm_D = optional_view(flat, unit, n("post_feedforward_layernorm.weight"));
  w.w_gate_FD = param_view(flat, unit, n("mlp.gate_proj.weight"));
  w.w_up_FD = param_view(flat, unit, n("mlp.up_proj.weight"));
  w.w_down_DF = param_view(flat, unit, n("mlp.down_proj.weight"));
  ST_ASSERT(config.post_norms ? w.post_ffn_norm_D.defined() && !w.attn_norm_D.defined() : w.attn_norm_D.defined(),
            "unit ", unit.name, ": its norms do not match the config's post_norms");
  ST_ASSERT(!config.sandwich_norms || (w.pre_ffn_norm_D.defined() && w.post_ffn_norm_D.defined()), "unit ",
            unit.name, ": its norms do not match the config's sandwich_norms");
  // the stacked projection: q, k, v (and their biases) back to back in the unit
  const ParamSpec* q = unit.find(n("self_attn.q_proj.weight"));
  const ParamSpec* k = unit.find(n("self_attn.k_proj.weight"));
  const ParamSpec* v = unit.find(n("self_attn.v_proj.weight"));
  if (k->offset == q->offset + q->numel() && v->offset == k->offset + k->numel()) {
    const int64_t E = q->shape[0] + k->shape[0] + v->shape[0];
    w.wqkv_ED = flat.flat_range(q->offset, E * q->shape[1]).view({E, q->shape[1]});
    const ParamSpec* bq = unit.find(n("self_attn.q_proj.bias"));
    const ParamSpec* bk = unit.find(n("self_attn.k_proj.bias"));
    const ParamSpec* bv = unit.find(n("self_attn.v_proj.bias"));
    if (bq != nullptr) {
      if (bk != nullptr && bv != nullptr && bk->offset == bq->offset + bq->numel() &&
          bv->offset == bk->offset + bk->numel()) {
        w.bqkv_E = flat.flat_range(bq->offset, E).view({E});
      } else {
        w.wqkv_ED = Tensor();  // biases elsewhere: one product per projection
      }
    }
  }
  const ParamSpec* gate = unit.find(n("mlp.gate_proj.weight"));
  const ParamSpec* up = unit.find(n("mlp.up_proj.weight"));
  if (up->offset == gate->offset + gate->numel())
    w.w_gate_up_2FD = flat.flat_range(gate->offset, 2 * gate->numel()).view({2 * gate->shape[0], gate->shape[1]});
  return w;
}

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

int64_t BlockContext::residual_rows() const {
  const int64_t rows = batch * seq;
  if (tp == nullptr || residual == ResidualSplit::kReplicated) return rows;
  ST_ASSERT(rows % tp->size() == 0, "sequence parallelism: ", rows, " token rows over ", tp->size(), " ranks");
  return rows / tp->size();
}

namespace {

// BT: all token rows; R: the residual stream's rows on this rank (BT without tensor
// parallelism). N, M, F: this rank's query heads, kv heads and FFN columns.
struct Dims {
  int64_t B, T, BT, R, D, N, M, H, F;
  DType stats;
  Device dev;
};

Dims dims_of(const BlockContext& ctx, const Tensor& x_BTD) {
  const LlamaConfig& c = *ctx.config;
  const int64_t parts = ctx.tp != nullptr ? ctx.tp->size() : 1;
  return {ctx.batch,          ctx.seq,         ctx.batch * ctx.seq, ctx.residual_rows(),
          c.dim,              c.n_heads / parts, c.n_kv_heads / parts, c.head_dim(),
          c.ffn_dim / parts,  ops::stats_dtype(x_BTD.dtype()), x_BTD.device()};
}

// The shape of a residual-stream tensor: [B, T, D] when this rank holds every row.
Shape residual_shape(const Dims& d) { return d.R == d.BT ? Shape{d.B, d.T, d.D} : Shape{d.R, d.D}; }

bool sequence_split(const BlockContext& ctx) {
  return ctx.tp != nullptr && ctx.residual == ResidualSplit::kSequence;
}

// A product's input from the residual stream's rows [R, D]: all B·T rows [BT, D], gathered
// over the group under sequence parallelism (Megatron's f / g-bar), else the rows themselves.
Tensor all_rows(const Tensor& rows_RD, const BlockContext& ctx, const Dims& d, const char* name) {
  if (!sequence_split(ctx)) return rows_RD.view({d.BT, d.D});
  Tensor all_TD = Tensor::empty({d.BT, d.D}, rows_RD.dtype(), rows_RD.device(), name);
  ctx.tp->all_gather(all_TD, rows_RD);
  return all_TD;
}

// A row-parallel product's partial output over all rows [BT, D], summed over the group into
// this rank's rows [R, D]: reduce-scattered under sequence parallelism, else all-reduced in
// place (Megatron's g / f-bar). Without tensor parallelism the output itself.
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

// ctx.fp8 with x's amax slot from `a` (BlockActivations::fp8_amax_S), which the op that made x
// has filled (the norms, SwiGLU) unless `ready` is false (the attention output, whose first
// product's pass fills it); plain ctx.fp8 where the block keeps no slots.
ops::LinearFp8 with_amax(const ops::LinearFp8& fp8, const BlockActivations& a, BlockActivations::Fp8Amax x,
                         bool ready = true) {
  ops::LinearFp8 f = fp8;
  f.x_amax = a.fp8_amax(x);
  f.x_amax_ready = ready && f.x_amax.defined();
  return f;
}

// Whether q, k and v (gate and up) come from one product: their weights stacked, and not
// told otherwise.
bool qkv_stacked(const BlockWeights& w, const BlockContext& ctx) {
  return w.wqkv_ED.defined() && !ctx.separate_projections;
}
bool gate_up_stacked(const BlockWeights& w, const BlockContext& ctx) {
  return w.w_gate_up_2FD.defined() && !ctx.separate_projections;
}

// xn = norm(x) over the residual stream's rows [R, D], with its f32 1/rms. The products that
// take it need all rows: over_all_rows or all_rows. With `amax_1` defined (an FP8 amax slot,
// BlockActivations::fp8_amax_S) the norm also writes the output's amax there.
Tensor norm(Tensor& rstd_BT, const Tensor& x_BTD, const Tensor& weight_D, const Dims& d, const LlamaConfig& c,
            const char* name, const char* rstd_name, const Tensor& amax_1 = {}) {
  Tensor xn_RD = like({d.R, d.D}, x_BTD, name);
  rstd_BT = Tensor::empty(d.R == d.BT ? Shape{d.B, d.T} : Shape{d.R}, d.stats, d.dev, rstd_name);
  Tensor rstd_R = rstd_BT.view({d.R});
  ops::rmsnorm_forward(xn_RD, rstd_R, x_BTD.view({d.R, d.D}), weight_D,
                       {.eps = c.norm_eps, .weight_offset = c.norm_weight_offset, .amax_y_1 = amax_1});
  return xn_RD;
}

// The norm's backward over the residual stream's rows: dx (overwrites) = d(norm)/dx · dxn +
// dresidual. With tensor parallelism the weight's gradient over this rank's rows is summed
// over the group before it reaches `dweight` (every rank's copy then gets the same).
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

// A row-parallel product's output for this rank's rows of the residual stream [R, D]:
// `partial(out, first, end)` writes rows [first, end) of all B·T rows' product (with tensor
// parallelism a partial sum over the group, summed here).
template <typename Partial>
Tensor product_rows(const Dims& d, const BlockContext& ctx, const Tensor& proto, Partial&& partial) {
  Tensor all_TD = like({d.BT, d.D}, proto, ctx.tp == nullptr ? "sublayer output" : "partial sums over the group");
  partial(all_TD, int64_t{0}, d.BT);
  return summed_rows(all_TD, ctx, d, "sublayer output (this rank's rows)");
}

// Whether each sublayer's output goes through a norm before the residual add: OLMo 2's
// post_norms and Gemma's sandwich_norms.
bool output_norms(const LlamaConfig& c) { return c.post_norms || c.sandwich_norms; }

// The 1/rms of the norms after the attention and the MLP: rstd1 and rstd2 with post_norms
// (no norms before), post_rstd1 and post_rstd2 with sandwich_norms.
Tensor& attn_out_rstd(BlockActivations& a, const LlamaConfig& c) {
  return c.sandwich_norms ? a.post_rstd1_BT : a.rstd1_BT;
}
Tensor& mlp_out_rstd(BlockActivations& a, const LlamaConfig& c) {
  return c.sandwich_norms ? a.post_rstd2_BT : a.rstd2_BT;
}

// out = x + s(p) for the residual stream, p_RD a sublayer's output (this rank's rows), where s
// scales by Granite's residual_multiplier and, with output norms (output_norms), first takes
// the RMSNorm of p with `post_norm_D` (OLMo 2, Gemma): p is then kept in `raw` and its 1/rms in
// `rstd`.
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

// out = x + o(in) (residual_product, x added in the product's epilogue), or with Granite's
// residual_multiplier or OLMo 2's post_norms x + s(o(in)) (add_sublayer).
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

// The backward of add_sublayer's s: the gradient of the sublayer's output p from out's dout_RD
// (the residual stream's rows). With post_norms the norm weight's gradient goes to
// `dpost_norm_D` (accumulated, or overwritten with `overwrite`). dout itself where s is the
// identity.
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

// With post_norms, a kept sublayer output's 1/rms recomputed into `rstd` (the norm's output,
// which the backward does not read, dropped): bitwise the forward's.
void post_norm_rstd(Tensor& rstd, const Tensor& raw, const Tensor& post_norm_D, const Dims& d,
                    const BlockContext& ctx) {
  ST_ASSERT(raw.defined(), "block_forward: recomputing a norm after its sublayer needs the kept sublayer output");
  norm(rstd, raw, post_norm_D, d, *ctx.config, "post norm (recomputed)", "post norm rstd");
}

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

// QK-norm of sequences [b0, b1): each row of `weight_H`'s width in `x_BTXH` (q or k as
// projected; a head slice of the stacked product, or a tensor of its own) is kept in
// `raw_BTXH` and replaced by its RMSNorm with `weight_H`, whose 1/rms goes to `rstd_BTX`. The
// weight's width is a head's H (Qwen3: a norm per head) or all X·H of a token's heads (OLMo 2:
// one norm over the whole projection, `rstd_BTX` then [B, T, 1]).
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

// The QK-norm's backward on every row of `dx_BTXH` (the gradient of the normed q or k, a head
// slice or a tensor of its own), replaced by the gradient of the projected values; the weight's
// gradient accumulates into `dweight_H` (or overwrites it). With tensor parallelism a rank
// holds its own heads' rows, and the weight, whole on every rank, gets the sum over the group
// of their gradients (every rank's copy then gets the same), as the block's norms do.
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

// q, k, v (rope applied), attention, and x2 = x + o(attn), from the attention norm's output
// xn1_RD (this rank's rows; a.xn1_BTD receives all rows). With a KV cache the attention reads
// the cached positions' keys and values too.
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
    ring_attention_forward(a.attn_BTNH, a.lse_BNT, a.q_BTNH, a.k_BTMH, a.v_BTMH, attention, *ctx.cp);
  } else if (!by_pieces) {
    attend_rows(0, d.B);
  }

  sublayer_output(a.x2_BTD, a.attn_out_BTD, attn_out_rstd(a, *ctx.config), a.attn_BTNH.view({d.BT, d.N * d.H}),
                  w.wo_DQ, x, w.ffn_norm_D, d, ctx, with_amax(ctx.fp8, a, BlockActivations::kAttn, false), "x2");
}

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

// gate, up and h = silu(gate) * up from the MLP norm's output xn2_RD (this rank's rows;
// a.xn2_BTD receives all rows), kept in `a`.
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

// Token rows per MLP piece: ctx.mlp_chunk_tokens, or every row at once.
int64_t mlp_piece_rows(const BlockContext& ctx, int64_t rows) {
  return ctx.mlp_chunk_tokens > 0 ? std::min(ctx.mlp_chunk_tokens, rows) : rows;
}

// y = x2 + down(h) piece by piece: each piece's gate, up and h are dropped once its rows of
// y (with tensor parallelism: of the partial sums, summed_product) are written, so the block
// keeps none of them.
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

// Tensor parallelism's overlap inside the MLP's backward: how dh = dy · W_down is made (by
// default one product of dy, every row at hand), and what runs once dxn2 is complete, before
// gate's and up's weight gradients (a reduce-scatter of dxn2 started there overlaps them).
struct MlpBackwardHooks {
  std::function<void(Tensor& dh_RF)> down_input_gradient;
  std::function<void()> after_input_gradient;
};

// The MLP's backward over some token rows: dxn2_RD (overwrites; allocated here when
// undefined, after dh is freed) from dy_RD. gate and up (gate_up_R2F their stacked tensor,
// when the gradient has the stacked weight too) are overwritten with their gradients; h,
// when undefined, is recomputed by the SwiGLU backward for the down projection's weight
// gradient. Weight gradients per `dw` (and `dw_dx` for the second product into dxn2). With
// hooks.down_input_gradient, dy_RD is read only after that hook ran (it may fill it).
// The amax slots the MLP's backward uses (BlockActivations::fp8_amax_S; undefined without): h's
// and xn2's, ready from the forward, and the gate|up gradients', which the SwiGLU backward fills.
struct MlpAmax {
  Tensor h, xn2, grads;
};

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
  const int64_t B = d.B, T = d.T, BT = d.BT, R = d.R, D = d.D, N = d.N, M = d.M, H = d.H, F = d.F;
  ST_ASSERT(!ctx.tp || sequence_split(ctx), "the backward of a tensor-parallel block splits the rows (kSequence)");
  const Tensor dy_RD = dy_BTD.view({R, D});
  const bool post = ctx.config->post_norms;
  // the MLP's output gradient: dy, or through Granite's residual_multiplier and OLMo 2's norm
  const Tensor dmlp_RD = sublayer_backward(dy_RD, g.post_ffn_norm_D, a.mlp_out_BTD, mlp_out_rstd(a, *ctx.config),
                                           w.post_ffn_norm_D, d, ctx, overwrite_grads);
  a.mlp_out_BTD = Tensor();
  Tensor none;
  // each parameter receives one gradient here: the first write replaces when asked to
  const ops::LinearBackwardOptions dw{.overwrite_dweight = overwrite_grads, .fp8 = ctx.fp8};
  const ops::LinearBackwardOptions dw_dx{.accumulate_dx = true, .overwrite_dweight = overwrite_grads, .fp8 = ctx.fp8};
  const ops::LinearBackwardOptions input_only{.fp8 = ctx.fp8};  // a call for dx alone

  // The MLP's products see every row: dy gathered over the group (tensor parallelism), while
  // this rank's rows make their part of dh; the reduce-scatter of dxn2's partial sums runs
  // beside gate's and up's weight gradients.
  Tensor dy_TD;
  Tensor dxn2_TD;  // all rows; with tensor parallelism partial sums over the group
  Tensor dxn2_RD;  // this rank's rows of dxn2, summed over the group
  // a view holds its storage: dropped with a.xn2_BTD below, not at the function's end
  Tensor xn2_TD = a.xn2_BTD.view({BT, D});
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
  // Attention: x2 = x + o(attn); dx2 flows to x unchanged and through o_proj (over all rows:
  // with tensor parallelism gathered while this rank's rows make their part of dattn, and by
  // pieces while this rank's sequences' attention backward runs too).
  Tensor dattn_BTNH = like({B, T, N, H}, dy_BTD, "dattn");
  Tensor dattn_TQ = dattn_BTNH.view({BT, N * H});
  // dq, dk, dv: with stacked weights head slices of one tensor, so that one product makes the
  // input gradient (and one the stacked weight gradient) instead of three
  const bool stacked = qkv_stacked(w, ctx) && g.wqkv_ED.defined();
  const int64_t heads = N + 2 * M;
  Tensor dqkv_BTEH, dq_BTNH, dk_BTMH, dv_BTMH;
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
                            a.lse_BNT, attention, *ctx.cp);
  } else if (!by_pieces) {
    attend_backward(0, B);
  }
  dattn_BTNH = dattn_TQ = Tensor();
  a.q_BTNH = a.k_BTMH = a.v_BTMH = a.attn_BTNH = a.lse_BNT = Tensor();
  // after rope's backward: the QK-norm's, turning dq and dk into the projections' gradients
  auto norm_heads_backward = [&] {
    if (!ctx.config->qk_norm && !ctx.config->qk_norm_whole) return;
    head_norm_backward(dq_BTNH, g.q_norm_H, a.q_raw_BTNH, a.q_rstd_BTN, w.q_norm_H, ctx, overwrite_grads);
    head_norm_backward(dk_BTMH, g.k_norm_H, a.k_raw_BTMH, a.k_rstd_BTM, w.k_norm_H, ctx, overwrite_grads);
    a.q_raw_BTNH = a.k_raw_BTMH = a.q_rstd_BTN = a.k_rstd_BTM = Tensor();
  };
  // allocated once the attention backward has freed its inputs (that moment is the peak)
  Tensor dxn1_TD, dxn1_RD;
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
