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

// inspect_report, then every tensor of every file the path stands for (a checkpoint's rank
// files, a folder's shards, or the one file) read whole: its bytes against the checksum the
// file carries (files shardtrain writes carry one per tensor; others none), its floats
// scanned for NaN and inf. Each problem is a line naming the file and tensor, and counts in
// `problems`; a file that fails to open is one problem. Ends with the bytes checked and the
// speed.
InspectReport verify_report(const std::string& path);

}  // namespace shardtrain::train
