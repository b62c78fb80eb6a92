// `shardtrain inspect`: a readable report of a safetensors file, a Hugging Face folder or a
// Parquet file.
#pragma once

#include <string>

namespace shardtrain::train {

// Tensors (name, dtype, shape, bytes) with totals, file metadata, and the model config
// summary when a config.json is present; for a Parquet file its rows, fields with their types
// and its first row. `problems` counts what the report names as wrong (tensors missing or
// misshapen, a checkpoint's pieces incomplete); 0 for a healthy file or folder. Throws Error
// naming the file on bad input.
struct InspectReport {
  std::string text;
  int problems = 0;
};
InspectReport inspect_report(const std::string& path);

}  // namespace shardtrain::train
