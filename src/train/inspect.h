// `shardtrain inspect`: a readable report of a safetensors file, a Hugging Face folder or a
// Parquet file.
#pragma once

#include <string>

namespace shardtrain::train {

// Tensors (name, dtype, shape, bytes) with totals, file metadata, and the model config
// summary when a config.json is present; for a Parquet file its rows, fields with their types
// and its first row. Throws Error naming the file on bad input.
std::string inspect_report(const std::string& path);

}  // namespace shardtrain::train
