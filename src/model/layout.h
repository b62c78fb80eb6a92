// Where every parameter lives: sharding units (embedding, one per block, final norm + head),
// each a flat buffer in which parameters start on aligned offsets and whose padded length
// divides evenly by the number of ranks that shard it (rank r owns the contiguous slice r). A
// parameter element's global address is (name, element index in the whole parameter),
// independent of the number of ranks. With tensor parallelism a block's unit holds this
// rank's part of each product's weight: rows (q, k, v, gate, up) or columns (o, down).
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "model/config.h"
#include "model/hf_names.h"

namespace shardtrain::model {

enum class ParamInit { kNormal, kOnes, kZeros };

struct ParamSpec {
  std::string name;     // Hugging Face name, e.g. "model.layers.3.mlp.up_proj.weight"
  Shape shape;          // this rank's part (the whole parameter without tensor parallelism)
  int64_t offset = 0;   // first element inside the unit's flat buffer
  ParamInit init = ParamInit::kNormal;
  bool is_matrix = false;  // 2-D weights; norms and biases are not (weight decay policy)
  // The whole parameter's shape (the Hugging Face tensor's), and the part `shape` is of it:
  // split_dim 0: rows [split_first, split_first + shape[0]); 1: columns likewise; -1: all of it.
  Shape full_shape;
  int split_dim = -1;
  int64_t split_first = 0;
  // A whole parameter that every rank of a tensor-parallel group holds (a block's norms with
  // tensor_parallel > 1): its gradient is summed over the group, and it counts once in the
  // gradient norm, checkpoints and exports (its copy on the group's rank 0).
  bool replicated = false;
  int64_t numel() const { return shape.numel(); }
  int64_t full_numel() const { return full_shape.numel(); }
  // This parameter's part on tensor-parallel rank `t` of the group (same shape, other rows or
  // columns); itself for a whole parameter.
  ParamSpec part(int t) const;
};

// Calls fn(full_first, local_first, count) for each contiguous run of the whole parameter
// (row-major) that elements [first, first + count) of the part `p` cover, in order: one run,
// unless the part is a set of columns, then one per row it touches.
template <typename Fn>
void for_each_run(const ParamSpec& p, int64_t first, int64_t count, Fn&& fn) {
  if (count <= 0) return;
  if (p.split_dim != 1) {
    const int64_t row = p.split_dim == 0 ? p.split_first * (p.full_numel() / p.full_shape[0]) : 0;
    fn(row + first, first, count);
    return;
  }
  const int64_t cols = p.shape[1], full_cols = p.full_shape[1];
  for (int64_t e = first, end = first + count; e < end;) {
    const int64_t r = e / cols, c = e % cols, n = std::min(cols - c, end - e);
    fn(r * full_cols + p.split_first + c, e, n);
    e += n;
  }
}

enum class UnitKind { kEmbedding, kBlock, kHead };

struct UnitLayout {
  std::string name;       // "embedding", "layers.3", "head"
  UnitKind kind = UnitKind::kBlock;
  int64_t layer = -1;     // block index for kBlock
  std::vector<ParamSpec> params;
  int64_t numel = 0;      // padded: a multiple of kParamAlignment * ranks
  // The ranks that shard this unit: every rank of a replica (Mesh::replicate), or for a block
  // with tensor parallelism the replica's data-parallel ranks holding the same part
  // (ModelLayout::shard_index).
  int ranks = 1;
  // A block split by tensor parallelism: the unit holds this rank's part of it, and the
  // group's other ranks hold the other parts.
  bool tp_part = false;
  int64_t shard_numel() const { return numel / ranks; }
  const ParamSpec* find(const std::string& name) const;
  // The element ranges [first, end) of the flat buffer no parameter covers (alignment gaps
  // and the tail padding), in order.
  std::vector<std::pair<int64_t, int64_t>> padding() const;
};

// The part of parameter `spec` (its elements [first, first + count)) inside one slice of its
// unit, at `shard_offset` there.
struct ShardRange {
  const ParamSpec* spec;
  int64_t first, count, shard_offset;
};
// The parameter ranges in slice `index` of `unit` (elements [index·s, (index + 1)·s), s its
// shard_numel()), in offset order; padding has none.
std::vector<ShardRange> shard_ranges(const UnitLayout& unit, int index);

// Parameters start on multiples of this many elements: 256 bytes in bf16, 512 in f32,
// enough for 16-byte vector loads and TMA-friendly offsets.
constexpr int64_t kParamAlignment = 128;

// The ranks of a run as a mesh: `tensor_parallel` consecutive ranks form a group that splits
// each block's heads and FFN columns (Megatron-style, with sequence parallelism); the
// `data_parallel` groups split the batch. They shard the units (FSDP) in `replicate` replicas
// (HSDP; 1: one replica, plain FSDP): each replica is data_parallel / replicate consecutive
// groups holding a whole copy of the model in shards, and gradients are summed between the
// replicas. Rank r is member r % tp of group r / tp, which is group (r / tp) % shard_groups()
// of replica (r / tp) / shard_groups().
struct Mesh {
  int data_parallel = 1;
  int tensor_parallel = 1;
  int replicate = 1;
  int world() const { return data_parallel * tensor_parallel; }
  int tp_rank(int rank) const { return rank % tensor_parallel; }
  int dp_rank(int rank) const { return rank / tensor_parallel; }
  int shard_groups() const { return data_parallel / replicate; }  // data-parallel groups per replica
  int replica_ranks() const { return world() / replicate; }       // ranks per replica
  int replica(int rank) const { return dp_rank(rank) / shard_groups(); }
  // Throws, naming parallel.replicate, unless it divides the data-parallel groups.
  void check() const;
};

class ModelLayout {
 public:
  // The units of a Llama model for `world_size` ranks, data parallel only.
  static ModelLayout llama(const LlamaConfig& config, int world_size);
  // The units as tensor-parallel rank `tp_rank` of `mesh` holds them. Throws, naming
  // parallel.tensor_parallel, unless it divides the heads, kv heads and FFN width, and naming
  // parallel.replicate unless it divides the data-parallel groups.
  static ModelLayout llama(const LlamaConfig& config, const Mesh& mesh, int tp_rank);

  const std::vector<UnitLayout>& units() const { return units_; }
  int world_size() const { return mesh_.world(); }
  const Mesh& mesh() const { return mesh_; }
  int tp_rank() const { return tp_rank_; }
  // The slice of unit u that world rank `rank` owns, its place among the ranks of its replica
  // that shard the unit: for a block split by tensor parallelism its data-parallel group
  // there, else its rank there.
  int shard_index(size_t u, int rank) const;
  // Finds a parameter by name; throws naming it when absent.
  struct Location {
    int unit;
    const ParamSpec* spec;
  };
  Location locate(const std::string& name) const;
  int64_t total_numel() const;  // padded, all units

 private:
  std::vector<UnitLayout> units_;
  Mesh mesh_;
  int tp_rank_ = 0;
};

}  // namespace shardtrain::model
