// `shardtrain inspect`: a readable report of a safetensors file or Hugging Face folder.
#pragma once

#include <string>

namespace shardtrain::train {

// Tensors (name, dtype, shape, bytes) with totals, file metadata, and the model config
// summary when a config.json is present. Throws Error naming the file on bad input.
std::string inspect_report(const std::string& path);

}  // namespace shardtrain::train
