// Building the unit layout of a Llama model from its config.
#include "model/layout.h"

namespace shardtrain::model {
namespace {

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// Adds part `t` of `tp` of a parameter of shape `full`: split along `dim` (-1: whole; with
// tp > 1 every rank of the group then holds it).
void add_param(UnitLayout& unit, std::string name, Shape full, ParamInit init, int dim = -1, int tp = 1, int t = 0) {
  ParamSpec p;
  p.name = std::move(name);
  p.full_shape = full;
  p.shape = full;
  if (dim >= 0 && tp > 1) {
    const int64_t part = full[dim] / tp;
    p.split_dim = dim;
    p.split_first = t * part;
    p.shape[dim] = part;
  }
  p.replicated = dim < 0 && tp > 1;
  p.init = init;
  p.is_matrix = full.ndim() == 2;
  p.offset = round_up(unit.numel, kParamAlignment);
  unit.numel = p.offset + p.numel();
  unit.params.push_back(std::move(p));
}

}  // namespace

ParamSpec ParamSpec::part(int t) const {
  ParamSpec p = *this;
  if (split_dim >= 0) p.split_first = t * shape[split_dim];
  return p;
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

std::vector<ShardRange> shard_ranges(const UnitLayout& unit, int index) {
  ST_ASSERT(index >= 0 && index < unit.ranks, "slice ", index, " of unit ", unit.name, " sharded over ", unit.ranks);
  const int64_t s = unit.shard_numel(), lo = index * s, hi = lo + s;
  std::vector<ShardRange> out;
  for (const ParamSpec& p : unit.params) {
    const int64_t a = std::max(lo, p.offset), b = std::min(hi, p.offset + p.numel());
    if (a < b) out.push_back({&p, a - p.offset, b - a, a - lo});
  }
  return out;
}

void Mesh::check() const {
  ST_CHECK(replicate >= 1 && data_parallel % replicate == 0, "`parallel.replicate` = ", replicate,
           " must divide the ", data_parallel, " data-parallel groups of this run");
}

ModelLayout ModelLayout::llama(const LlamaConfig& c, int world_size) {
  ST_CHECK(world_size >= 1, "world size must be >= 1, found ", world_size);
  return llama(c, Mesh{world_size, 1}, 0);
}

ModelLayout ModelLayout::llama(const LlamaConfig& c, const Mesh& mesh, int tp_rank) {
  const int tp = mesh.tensor_parallel;
  ST_CHECK(mesh.data_parallel >= 1 && tp >= 1, "the mesh needs >= 1 rank in each dimension, found ",
           mesh.data_parallel, " x ", tp);
  ST_ASSERT(tp_rank >= 0 && tp_rank < tp, "tensor-parallel rank ", tp_rank, " of ", tp);
  mesh.check();
  ST_CHECK(c.n_heads % tp == 0 && c.n_kv_heads % tp == 0 && c.ffn_dim % tp == 0, "`parallel.tensor_parallel` = ",
           tp, " must divide the model's query heads (", c.n_heads, "), key/value heads (", c.n_kv_heads,
           ") and FFN width (", c.ffn_dim, ")");
  ST_CHECK(tp == 1 || !c.qk_norm_whole, "`parallel.tensor_parallel` = ", tp,
           " with OLMo 2's QK-norm over the whole q and k (whose heads the ranks split) is not supported; train "
           "this model with parallel.tensor_parallel = 1");
  ModelLayout layout;
  layout.mesh_ = mesh;
  layout.tp_rank_ = tp_rank;
  const int64_t h = c.head_dim();
  // norms scale by weight + offset: Gemma's (1 + w) weights start at 0, the others' at 1
  const ParamInit norm_init = c.norm_weight_offset != 0 ? ParamInit::kZeros : ParamInit::kOnes;

  UnitLayout embed;
  embed.name = "embedding";
  embed.kind = UnitKind::kEmbedding;
  add_param(embed, kEmbeddingName, {c.vocab_size, c.dim}, ParamInit::kNormal);
  layout.units_.push_back(std::move(embed));

  // Column-parallel products (q, k, v, gate, up) keep rows of their weights, row-parallel
  // ones (o, down) columns: a block's first products need no exchange, its last end in a sum
  // over the group.
  constexpr int kRows = 0, kColumns = 1, kWhole = -1;
  const int t = tp_rank;
  for (int64_t l = 0; l < c.n_layers; ++l) {
    UnitLayout b;
    b.name = "layers." + std::to_string(l);
    b.kind = UnitKind::kBlock;
    b.layer = l;
    auto add = [&](BlockParam param, Shape full, ParamInit init, int dim) {
      add_param(b, block_param_name(l, param), full, init, dim, tp, t);
    };
    if (!c.post_norms) add(BlockParam::kAttnNorm, {c.dim}, norm_init, kWhole);
    add(BlockParam::kQ, {c.n_heads * h, c.dim}, ParamInit::kNormal, kRows);
    add(BlockParam::kK, {c.n_kv_heads * h, c.dim}, ParamInit::kNormal, kRows);
    add(BlockParam::kV, {c.n_kv_heads * h, c.dim}, ParamInit::kNormal, kRows);
    if (c.attention_bias) {
      add(BlockParam::kQBias, {c.n_heads * h}, ParamInit::kZeros, kRows);
      add(BlockParam::kKBias, {c.n_kv_heads * h}, ParamInit::kZeros, kRows);
      add(BlockParam::kVBias, {c.n_kv_heads * h}, ParamInit::kZeros, kRows);
    }
    if (c.qk_norm) {
      // one [H] weight for every head: whole on each tensor-parallel rank
      add(BlockParam::kQNorm, {h}, norm_init, kWhole);
      add(BlockParam::kKNorm, {h}, norm_init, kWhole);
    }
    if (c.qk_norm_whole) {
      // one weight over all of q's (k's) values: split with their heads
      add(BlockParam::kQNorm, {c.n_heads * h}, norm_init, kRows);
      add(BlockParam::kKNorm, {c.n_kv_heads * h}, norm_init, kRows);
    }
    add(BlockParam::kO, {c.dim, c.n_heads * h}, ParamInit::kNormal, kColumns);
    add(BlockParam::kFfnNorm, {c.dim}, norm_init, kWhole);
    if (c.sandwich_norms) add(BlockParam::kPreFfnNorm, {c.dim}, norm_init, kWhole);
    add(BlockParam::kGate, {c.ffn_dim, c.dim}, ParamInit::kNormal, kRows);
    add(BlockParam::kUp, {c.ffn_dim, c.dim}, ParamInit::kNormal, kRows);
    add(BlockParam::kDown, {c.dim, c.ffn_dim}, ParamInit::kNormal, kColumns);
    if (c.post_norms || c.sandwich_norms) add(BlockParam::kPostFfnNorm, {c.dim}, norm_init, kWhole);
    b.ranks = mesh.shard_groups();
    b.tp_part = tp > 1;
    layout.units_.push_back(std::move(b));
  }

  UnitLayout head;
  head.name = "head";
  head.kind = UnitKind::kHead;
  add_param(head, kFinalNormName, {c.dim}, norm_init);
  if (!c.tie_embeddings) add_param(head, kHeadName, {c.vocab_size, c.dim}, ParamInit::kNormal);
  layout.units_.push_back(std::move(head));

  for (UnitLayout& u : layout.units_) {
    if (u.kind != UnitKind::kBlock) u.ranks = mesh.replica_ranks();  // the embedding and head: a replica's every rank
    u.numel = round_up(u.numel, kParamAlignment * u.ranks);
  }
  return layout;
}

int ModelLayout::shard_index(size_t u, int rank) const {
  ST_ASSERT(rank >= 0 && rank < mesh_.world() && mesh_.tp_rank(rank) == tp_rank_, "rank ", rank,
            " does not hold tensor-parallel part ", tp_rank_);
  return units_[u].tp_part ? mesh_.dp_rank(rank) % mesh_.shard_groups() : rank % mesh_.replica_ranks();
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
