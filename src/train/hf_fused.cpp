// Phi-3's fused tensors split into views of the Hugging Face files.
#include "train/hf_fused.h"

#include <string>

#include "core/error.h"
#include "model/hf_config.h"

namespace shardtrain::train {

void expose_fused_tensors(io::HfWeights& weights, const model::LlamaConfig& config) {
  for (const model::FusedTensor& f : model::hf_fused_tensors(config)) {
    if (weights.find(f.name) == nullptr) {
      bool split = true;
      for (const std::string& part : f.parts) split = split && weights.find(part) != nullptr;
      if (split) continue;  // written part by part: read as they are
    }
    const io::TensorInfo& t = weights.get(f.name);  // absent: named
    const Shape found(t.shape.begin(), t.shape.end());
    std::string rows;
    for (size_t i = 0; i < f.parts.size(); ++i) {
      rows += (i == 0 ? "" : ", ") + std::to_string(f.part_shapes[i][0]) + " rows of " + f.parts[i];
    }
    ST_CHECK(found == f.shape, "`", weights.source(), "`: tensor `", f.name, "` has shape ", found.str(),
             ", but config.json implies ", f.shape.str(), " (", rows, ", each of hidden_size ", config.dim,
             " columns); the weights do not match config.json: check num_attention_heads, num_key_value_heads, ",
             "head_dim, intermediate_size and hidden_size");
    for (size_t i = 0; i < f.parts.size(); ++i) {
      std::vector<int64_t> dims;
      for (int d = 0; d < f.part_shapes[i].ndim(); ++d) dims.push_back(f.part_shapes[i][d]);
      weights.add_view(f.parts[i], f.name, f.offsets[i], dims);
    }
  }
}

}  // namespace shardtrain::train
