// The KV cache's buffers and its length bookkeeping; the blocks write into it
// (block_forward with BlockContext::kv_keys_BSMH).
#include "model/kv_cache.h"

namespace shardtrain::model {

KvCache::KvCache(const LlamaConfig& config, int64_t batch, int64_t capacity, DType dtype, Device device,
                 int64_t kv_heads)
    : batch_(batch), capacity_(capacity), dtype_(dtype), device_(device) {
  ST_CHECK(batch >= 1, "KV cache: expected at least one sequence, found batch ", batch);
  ST_CHECK(capacity >= 1 && capacity <= config.max_seq_len, "KV cache: capacity ", capacity,
           " positions; the model takes 1 to max_seq_len = ", config.max_seq_len);
  const Shape shape{batch, capacity, kv_heads > 0 ? kv_heads : config.n_kv_heads, config.head_dim()};
  for (int64_t l = 0; l < config.n_layers; ++l) {
    keys_.push_back(Tensor::empty(shape, dtype, device, "kv cache keys"));
    values_.push_back(Tensor::empty(shape, dtype, device, "kv cache values"));
  }
  position_1_ = Tensor::empty({1}, DType::kI32, device, "kv cache position");
  cos_1K_ = Tensor::empty({1, config.rotary_dim() / 2}, dtype, device, "kv cache rope cos");
  sin_1K_ = Tensor::empty({1, config.rotary_dim() / 2}, dtype, device, "kv cache rope sin");
  if (config.has_local_rope()) {
    local_cos_1K_ = Tensor::empty({1, config.rotary_dim() / 2}, dtype, device, "kv cache sliding layers' rope cos");
    local_sin_1K_ = Tensor::empty({1, config.rotary_dim() / 2}, dtype, device, "kv cache sliding layers' rope sin");
  }
}

void KvCache::stage(const Tensor& cos_TK, const Tensor& sin_TK, const Tensor& local_cos_TK,
                    const Tensor& local_sin_TK, Stream stream) {
  ST_ASSERT(cos_TK.ndim() == 2 && cos_TK.size(0) > length_ && sin_TK.shape() == cos_TK.shape() &&
                cos_TK.size(1) == cos_1K_.size(1),
            "KV cache: rope tables ", cos_TK.str(), " for position ", length_);
  // the host value is read by the copy before it returns (pageable memory), so it may change after
  host_position_1_.data<int32_t>()[0] = static_cast<int32_t>(length_);
  copy(position_1_, host_position_1_, stream);
  copy(cos_1K_, cos_TK.slice(0, length_, length_ + 1), stream);
  copy(sin_1K_, sin_TK.slice(0, length_, length_ + 1), stream);
  ST_ASSERT(local_cos_TK.defined() == local_cos_1K_.defined(), "KV cache: the sliding layers' rope tables ",
            local_cos_TK.defined() ? "given to a cache without room for them" : "missing");
  if (!local_cos_1K_.defined()) return;
  copy(local_cos_1K_, local_cos_TK.slice(0, length_, length_ + 1), stream);
  copy(local_sin_1K_, local_sin_TK.slice(0, length_, length_ + 1), stream);
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
