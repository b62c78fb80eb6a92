// A block's parameters as views into its unit's flat buffer (BlockWeights::view), by the names
// the unit layout gives them; q, k and v (gate and up) also as one stacked matrix when they lie
// back to back there.
#include "model/block.h"

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

}  // namespace

BlockWeights BlockWeights::view(const Tensor& flat, const UnitLayout& unit, const LlamaConfig& config) {
  const int64_t l = unit.layer;
  auto n = [&](BlockParam p) { return block_param_name(l, p); };
  BlockWeights w;
  w.attn_norm_D = optional_view(flat, unit, n(BlockParam::kAttnNorm));  // none with post_norms
  w.wq_QD = param_view(flat, unit, n(BlockParam::kQ));
  w.wk_KD = param_view(flat, unit, n(BlockParam::kK));
  w.wv_KD = param_view(flat, unit, n(BlockParam::kV));
  w.bq_Q = optional_view(flat, unit, n(BlockParam::kQBias));
  w.bk_K = optional_view(flat, unit, n(BlockParam::kKBias));
  w.bv_K = optional_view(flat, unit, n(BlockParam::kVBias));
  w.q_norm_H = optional_view(flat, unit, n(BlockParam::kQNorm));
  w.k_norm_H = optional_view(flat, unit, n(BlockParam::kKNorm));
  w.wo_DQ = param_view(flat, unit, n(BlockParam::kO));
  w.ffn_norm_D = param_view(flat, unit, n(BlockParam::kFfnNorm));
  w.pre_ffn_norm_D = optional_view(flat, unit, n(BlockParam::kPreFfnNorm));
  w.post_ffn_norm_D = optional_view(flat, unit, n(BlockParam::kPostFfnNorm));
  w.w_gate_FD = param_view(flat, unit, n(BlockParam::kGate));
  w.w_up_FD = param_view(flat, unit, n(BlockParam::kUp));
  w.w_down_DF = param_view(flat, unit, n(BlockParam::kDown));
  ST_ASSERT(config.post_norms ? w.post_ffn_norm_D.defined() && !w.attn_norm_D.defined() : w.attn_norm_D.defined(),
            "unit ", unit.name, ": its norms do not match the config's post_norms");
  ST_ASSERT(!config.sandwich_norms || (w.pre_ffn_norm_D.defined() && w.post_ffn_norm_D.defined()), "unit ",
            unit.name, ": its norms do not match the config's sandwich_norms");
  // the stacked projection: q, k, v (and their biases) back to back in the unit
  const ParamSpec* q = unit.find(n(BlockParam::kQ));
  const ParamSpec* k = unit.find(n(BlockParam::kK));
  const ParamSpec* v = unit.find(n(BlockParam::kV));
  if (k->offset == q->offset + q->numel() && v->offset == k->offset + k->numel()) {
    const int64_t E = q->shape[0] + k->shape[0] + v->shape[0];
    w.wqkv_ED = flat.flat_range(q->offset, E * q->shape[1]).view({E, q->shape[1]});
    const ParamSpec* bq = unit.find(n(BlockParam::kQBias));
    const ParamSpec* bk = unit.find(n(BlockParam::kKBias));
    const ParamSpec* bv = unit.find(n(BlockParam::kVBias));
    if (bq != nullptr) {
      if (bk != nullptr && bv != nullptr && bk->offset == bq->offset + bq->numel() &&
          bv->offset == bk->offset + bk->numel()) {
        w.bqkv_E = flat.flat_range(bq->offset, E).view({E});
      } else {
        w.wqkv_ED = Tensor();  // biases elsewhere: one product per projection
      }
    }
  }
  const ParamSpec* gate = unit.find(n(BlockParam::kGate));
  const ParamSpec* up = unit.find(n(BlockParam::kUp));
  if (up->offset == gate->offset + gate->numel())
    w.w_gate_up_2FD = flat.flat_range(gate->offset, 2 * gate->numel()).view({2 * gate->shape[0], gate->shape[1]});
  return w;
}

}  // namespace shardtrain::model
