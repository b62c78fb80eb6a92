// The per-parameter tensors of a reference.safetensors written by tools/make_hf_reference.py
// (grad.<name>, adamw.<name>) under shardtrain's parameter names: Phi-3's references record
// them under the fused tensors' names (qkv_proj, gate_up_proj), whose rows are read as the
// part's.
#pragma once

#include <string>

#include "io/hf_folder.h"
#include "model/hf_config.h"

namespace shardtrain::testing {

class ParamReference {
 public:
  ParamReference(const std::string& file, const model::LlamaConfig& config) : file_(file) {
    for (const model::FusedTensor& f : model::hf_fused_tensors(config))
      for (const char* prefix : {"grad.", "adamw."})
        for (size_t i = 0; i < f.parts.size(); ++i)
          file_.add_view(prefix + f.parts[i], prefix + f.name, f.offsets[i],
                         {f.part_shapes[i][0], f.part_shapes[i][1]});
  }
  // `name` (e.g. "grad.model.layers.0.self_attn.q_proj.weight") as f32 of its shape
  Tensor read(const std::string& name) const {
    const io::TensorInfo& t = file_.get(name);
    Tensor out = Tensor::empty(Shape(t.shape.begin(), t.shape.end()), DType::kF32);
    file_.read_range(name, 0, out);
    return out;
  }
  void read(const std::string& name, Tensor& out) const { file_.read_range(name, 0, out); }

 private:
  io::HfWeights file_;
};

}  // namespace shardtrain::testing
