// The KV cache's buffers and its length bookkeeping; the blocks write into it
// (block_forward with BlockContext::kv_keys_BSMH).
#include "model/kv_cache.h"

namespace shardtrain::model {

KvCache::KvCache(const LlamaConfig& config, int64_t batch, int64_t capacity, DType dtype, Device device)
    : batch_(batch), capacity_(capacity), dtype_(dtype), device_(device) {
  ST_CHECK(batch >= 1, "KV cache: expected at least one sequence, found batch ", batch);
  ST_CHECK(capacity >= 1 && capacity <= config.max_seq_len, "KV cache: capacity ", capacity,
           " positions; the model takes 1 to max_seq_len = ", config.max_seq_len);
  const Shape shape{batch, capacity, config.n_kv_heads, config.head_dim()};
  for (int64_t l = 0; l < config.n_layers; ++l) {
    keys_.push_back(Tensor::empty(shape, dtype, device, "kv cache keys"));
    values_.push_back(Tensor::empty(shape, dtype, device, "kv cache values"));
  }
}

int64_t KvCache::bytes() const {
  int64_t n = 0;
  for (const Tensor& t : keys_) n += 2 * static_cast<int64_t>(t.nbytes());
  return n;
}

void KvCache::check_room(int64_t tokens, const char* what) const {
  ST_CHECK(tokens >= 1, what, ": expected at least one new token, found ", tokens);
  ST_CHECK(length_ + tokens <= capacity_, what, ": ", tokens, " new token", tokens == 1 ? "" : "s",
           " after the ", length_, " cached do not fit in the KV cache's ", capacity_, " positions");
}

void KvCache::advance(int64_t tokens) {
  ST_ASSERT(tokens >= 0 && length_ + tokens <= capacity_, "KV cache: advancing ", tokens, " past ", length_, " of ",
            capacity_);
  length_ += tokens;
}

}  // namespace shardtrain::model
