// The weights of a Hugging Face model folder: model.safetensors, or the shards named by
// model.safetensors.index.json (every mapped file must exist and hold its tensors). Each
// tensor is read through the file that holds it, by element range.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "io/safetensors.h"

namespace shardtrain::io {

class HfWeights {
 public:
  // `folder` holds model.safetensors or model.safetensors.index.json; a path to a single
  // .safetensors file also works.
  explicit HfWeights(const std::string& folder);

  const TensorInfo* find(const std::string& name) const;
  const TensorInfo& get(const std::string& name) const;  // throws naming the folder and tensor
  void read_range(const std::string& name, int64_t first, Tensor& out) const;
  // The tensors the files hold (views not listed).
  std::vector<std::string> names() const;
  // Makes `name` a tensor of its own: `shape`'s elements from element `offset` of the file's
  // tensor `of` (a contiguous run of it; both checked). find, get and read_range then know it.
  void add_view(const std::string& name, const std::string& of, int64_t offset, const std::vector<int64_t>& shape);
  const std::vector<std::unique_ptr<SafetensorsFile>>& files() const { return files_; }
  const std::string& source() const { return source_; }

 private:
  std::string source_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const SafetensorsFile*> where_;  // tensor -> file
  struct View {
    TensorInfo info;
    std::string of;
    int64_t offset = 0;
  };
  std::map<std::string, View> views_;
};

}  // namespace shardtrain::io
