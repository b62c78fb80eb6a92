// Writing safetensors files and Hugging Face weight folders. Files are written under a
// temporary name, fsynced, and renamed into place, so a crash never leaves a partial file
// under the final name; the index of a sharded folder is written last.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace shardtrain::io {

// Bytes this process has written through these writers (safetensors files, HF folders,
// write_file_atomic) since it started, counted as the writes go (64 MiB at a time), and how
// long ago the last write returned: progress a hang detector can see during a long save
// (train/watchdog.h).
struct WriteActivity {
  uint64_t bytes = 0;
  double seconds_ago = 0;  // since the last write (since the process started, before the first)
};
WriteActivity write_activity();

// Writes `tensors` (host, contiguous; f32, f64, bf16, f16, i32, i64 or u8, stored as is)
// in the given order, with `metadata` plus {"format": "pt"}; data starts 8-byte aligned.
void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

// Streams tensors into model-0000i-of-0000n.safetensors shards of at most `max_shard_bytes`
// of data each (a larger tensor gets a shard of its own) plus model.safetensors.index.json;
// a single shard is named model.safetensors with no index, as save_pretrained does.
class ShardedWriter {
 public:
  ShardedWriter(std::string folder, int64_t max_shard_bytes);
  // Unfinished (an error on the way), removes the shards it wrote.
  ~ShardedWriter();
  ShardedWriter(const ShardedWriter&) = delete;
  ShardedWriter& operator=(const ShardedWriter&) = delete;
  // Buffers `tensor` (copied) and writes a shard when the limit would be exceeded.
  void add(const std::string& name, const Tensor& tensor);
  // Writes the last shard, renames every shard to its final name and writes the index.
  void finish();
  int64_t total_bytes() const { return total_bytes_; }

 private:
  void flush();

  std::string folder_;
  int64_t max_shard_bytes_;
  std::vector<std::pair<std::string, Tensor>> pending_;
  int64_t pending_bytes_ = 0;
  std::vector<std::string> temp_files_;                  // written shards, in order
  std::vector<std::vector<std::string>> shard_tensors_;  // names per shard
  int64_t total_bytes_ = 0;
  bool finished_ = false;
};

// Writes `contents` to `path` atomically (temporary file, fsync, rename, fsync the folder).
void write_file_atomic(const std::string& path, const std::string& contents);

}  // namespace shardtrain::io
