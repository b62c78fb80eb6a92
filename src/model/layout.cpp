// Building the unit layout of a Llama model from its config.
#include "model/layout.h"

namespace shardtrain::model {
namespace {

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

void add_param(UnitLayout& unit, std::string name, Shape shape, ParamInit init) {
  ParamSpec p;
  p.name = std::move(name);
  p.shape = shape;
  p.init = init;
  p.is_matrix = shape.ndim() == 2;
  p.offset = round_up(unit.numel, kParamAlignment);
  unit.numel = p.offset + p.numel();
  unit.params.push_back(std::move(p));
}

}  // namespace

std::string block_param_name(int64_t layer, const char* suffix) {
  return "model.layers." + std::to_string(layer) + "." + suffix;
}

const ParamSpec* UnitLayout::find(const std::string& name) const {
  for (const ParamSpec& p : params)
    if (p.name == name) return &p;
  return nullptr;
}

std::vector<std::pair<int64_t, int64_t>> UnitLayout::padding() const {
  std::vector<std::pair<int64_t, int64_t>> gaps;
  int64_t end = 0;  // parameters are added in offset order
  for (const ParamSpec& p : params) {
    if (p.offset > end) gaps.emplace_back(end, p.offset);
    end = p.offset + p.numel();
  }
  if (numel > end) gaps.emplace_back(end, numel);
  return gaps;
}

ModelLayout ModelLayout::llama(const LlamaConfig& c, int world_size) {
  ST_CHECK(world_size >= 1, "world size must be >= 1, found ", world_size);
  ModelLayout layout;
  layout.world_size_ = world_size;
  const int64_t h = c.head_dim();

  UnitLayout embed;
  embed.name = "embedding";
  embed.kind = UnitKind::kEmbedding;
  add_param(embed, "model.embed_tokens.weight", {c.vocab_size, c.dim}, ParamInit::kNormal);
  layout.units_.push_back(std::move(embed));

  for (int64_t l = 0; l < c.n_layers; ++l) {
    UnitLayout b;
    b.name = "layers." + std::to_string(l);
    b.kind = UnitKind::kBlock;
    b.layer = l;
    add_param(b, block_param_name(l, "input_layernorm.weight"), {c.dim}, ParamInit::kOnes);
    add_param(b, block_param_name(l, "self_attn.q_proj.weight"), {c.n_heads * h, c.dim}, ParamInit::kNormal);
    add_param(b, block_param_name(l, "self_attn.k_proj.weight"), {c.n_kv_heads * h, c.dim}, ParamInit::kNormal);
    add_param(b, block_param_name(l, "self_attn.v_proj.weight"), {c.n_kv_heads * h, c.dim}, ParamInit::kNormal);
    if (c.attention_bias) {
      add_param(b, block_param_name(l, "self_attn.q_proj.bias"), {c.n_heads * h}, ParamInit::kZeros);
      add_param(b, block_param_name(l, "self_attn.k_proj.bias"), {c.n_kv_heads * h}, ParamInit::kZeros);
      add_param(b, block_param_name(l, "self_attn.v_proj.bias"), {c.n_kv_heads * h}, ParamInit::kZeros);
    }
    add_param(b, block_param_name(l, "self_attn.o_proj.weight"), {c.dim, c.n_heads * h}, ParamInit::kNormal);
    add_param(b, block_param_name(l, "post_attention_layernorm.weight"), {c.dim}, ParamInit::kOnes);
    add_param(b, block_param_name(l, "mlp.gate_proj.weight"), {c.ffn_dim, c.dim}, ParamInit::kNormal);
    add_param(b, block_param_name(l, "mlp.up_proj.weight"), {c.ffn_dim, c.dim}, ParamInit::kNormal);
    add_param(b, block_param_name(l, "mlp.down_proj.weight"), {c.dim, c.ffn_dim}, ParamInit::kNormal);
    layout.units_.push_back(std::move(b));
  }

  UnitLayout head;
  head.name = "head";
  head.kind = UnitKind::kHead;
  add_param(head, "model.norm.weight", {c.dim}, ParamInit::kOnes);
  if (!c.tie_embeddings) add_param(head, "lm_head.weight", {c.vocab_size, c.dim}, ParamInit::kNormal);
  layout.units_.push_back(std::move(head));

  for (UnitLayout& u : layout.units_) u.numel = round_up(u.numel, kParamAlignment * world_size);
  return layout;
}

ModelLayout::Location ModelLayout::locate(const std::string& name) const {
  for (size_t i = 0; i < units_.size(); ++i)
    if (const ParamSpec* p = units_[i].find(name)) return {static_cast<int>(i), p};
  ST_THROW("no parameter named `", name, "` in this model");
}

int64_t ModelLayout::total_numel() const {
  int64_t n = 0;
  for (const UnitLayout& u : units_) n += u.numel;
  return n;
}

}  // namespace shardtrain::model
