// Where every parameter lives: sharding units (embedding, one per block, final norm + head),
// each a flat buffer in which parameters start on aligned offsets and whose padded length
// divides evenly by the number of ranks (rank r owns the contiguous slice r). A parameter
// element's global address is (name, element index), independent of the number of ranks.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "model/config.h"

namespace shardtrain::model {

enum class ParamInit { kNormal, kOnes, kZeros };

struct ParamSpec {
  std::string name;     // Hugging Face name, e.g. "model.layers.3.mlp.up_proj.weight"
  Shape shape;
  int64_t offset = 0;   // first element inside the unit's flat buffer
  ParamInit init = ParamInit::kNormal;
  bool is_matrix = false;  // 2-D weights; norms and biases are not (weight decay policy)
  int64_t numel() const { return shape.numel(); }
};

enum class UnitKind { kEmbedding, kBlock, kHead };

struct UnitLayout {
  std::string name;       // "embedding", "layers.3", "head"
  UnitKind kind = UnitKind::kBlock;
  int64_t layer = -1;     // block index for kBlock
  std::vector<ParamSpec> params;
  int64_t numel = 0;      // padded: a multiple of kParamAlignment * world_size
  int64_t shard_numel(int world_size) const { return numel / world_size; }
  const ParamSpec* find(const std::string& name) const;
  // The element ranges [first, end) of the flat buffer no parameter covers (alignment gaps
  // and the tail padding), in order.
  std::vector<std::pair<int64_t, int64_t>> padding() const;
};

// Parameters start on multiples of this many elements: 256 bytes in bf16, 512 in f32,
// enough for 16-byte vector loads and TMA-friendly offsets.
constexpr int64_t kParamAlignment = 128;

class ModelLayout {
 public:
  // The units of a Llama model for `world_size` ranks.
  static ModelLayout llama(const LlamaConfig& config, int world_size);

  const std::vector<UnitLayout>& units() const { return units_; }
  int world_size() const { return world_size_; }
  // Finds a parameter by name; throws naming it when absent.
  struct Location {
    int unit;
    const ParamSpec* spec;
  };
  Location locate(const std::string& name) const;
  int64_t total_numel() const;  // padded, all units

 private:
  std::vector<UnitLayout> units_;
  int world_size_ = 1;
};

// The HF names of one block's parameters, in layout order (a table, not code paths).
std::string block_param_name(int64_t layer, const char* suffix);

}  // namespace shardtrain::model
