// The KV cache of incremental decoding: per block, the keys (rotated at their absolute
// positions) and values of every position a model has seen, so that a new token's forward
// attends to them instead of recomputing the prefix (Llama::last_logits_cached). Only the M
// key/value heads are kept: grouped-query attention shares each among N / M query heads.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "model/config.h"

namespace shardtrain::model {

class KvCache {
 public:
  // Room for `capacity` positions of `batch` sequences in `dtype` on `device`: 2·L·B·capacity·M·H
  // elements, allocated at once. 1 <= capacity <= config.max_seq_len (the rope table's rows);
  // an error names both otherwise. `kv_heads`: the heads this rank keeps (0: all M; with
  // tensor parallelism M / size, Llama::kv_heads_per_rank).
  KvCache(const LlamaConfig& config, int64_t batch, int64_t capacity, DType dtype, Device device = Device::cpu(),
          int64_t kv_heads = 0);

  int64_t batch() const { return batch_; }
  int64_t capacity() const { return capacity_; }
  int64_t length() const { return length_; }  // positions filled: the next token's position
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  int64_t bytes() const;
  int64_t layers() const { return static_cast<int64_t>(keys_.size()); }

  // Block l's keys / values [B, capacity, M, H]; positions [0, length()) hold data.
  const Tensor& keys(int64_t layer) const { return keys_.at(static_cast<size_t>(layer)); }
  const Tensor& values(int64_t layer) const { return values_.at(static_cast<size_t>(layer)); }

  // Throws, naming `what` and the lengths, unless `tokens` more positions fit.
  void check_room(int64_t tokens, const char* what) const;
  // Marks `tokens` more positions as filled, once every block has written them.
  void advance(int64_t tokens);
  // Forgets every position (a new sequence); the buffers stay.
  void clear() { length_ = 0; }

  // A one-token step that reads its position from memory, so that one CUDA graph serves every
  // position (Llama::issue_decode): stage() writes length() into position_1 (one i32 on the
  // cache's device) and rows length() of rope's tables cos_TK, sin_TK [max_seq_len, H/2] into
  // rope_cos_1K, rope_sin_1K, stream-ordered; the step's blocks read those. With a sliding
  // layers' rope of their own (LlamaConfig::has_local_rope) the row of its tables
  // local_cos_TK, local_sin_TK goes to rope_local_cos_1K, rope_local_sin_1K too.
  void stage(const Tensor& cos_TK, const Tensor& sin_TK, const Tensor& local_cos_TK = {},
             const Tensor& local_sin_TK = {}, Stream stream = {});
  const Tensor& position_1() const { return position_1_; }
  const Tensor& rope_cos_1K() const { return cos_1K_; }
  const Tensor& rope_sin_1K() const { return sin_1K_; }
  const Tensor& rope_local_cos_1K() const { return local_cos_1K_; }
  const Tensor& rope_local_sin_1K() const { return local_sin_1K_; }

 private:
  int64_t batch_, capacity_, length_ = 0;
  DType dtype_;
  Device device_;
  std::vector<Tensor> keys_, values_;  // [L] of [B, capacity, M, H]
  Tensor position_1_, cos_1K_, sin_1K_, local_cos_1K_, local_sin_1K_;
  Tensor host_position_1_ = Tensor::empty({1}, DType::kI32, Device::cpu(), "kv cache position");
};

}  // namespace shardtrain::model
