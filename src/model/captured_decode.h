// One token per sequence over a KV cache (incremental decoding) on a GPU, captured once into
// a CUDA graph and replayed at every later position: the host then issues a few copies and one
// launch per token instead of ~10 launches per block. The position and its rope rows are read
// from the cache's staged buffers (KvCache::stage), so the same graph serves every position.
// The first call runs eagerly (it fills the GEMM and allocator caches), the second captures
// and replays, later calls replay. The graph's temporaries come from its stream's free lists in
// the caching allocator, a pool no eager work draws from.
#pragma once

#include <memory>

#include "model/kv_cache.h"
#include "model/llama.h"

namespace shardtrain::model {

class CapturedDecode {
 public:
  // `model` (on a GPU over a one-rank store) and `cache` (on the model's device) must outlive
  // this; every call continues the same cache.
  CapturedDecode(Llama& model, KvCache& cache);
  ~CapturedDecode();
  CapturedDecode(const CapturedDecode&) = delete;
  CapturedDecode& operator=(const CapturedDecode&) = delete;

  // Llama::last_logits_cached for one new token per sequence: ids_B1 (i32 on the host, each
  // in [0, V)) at position cache.length(); advances the cache. Returns the logits [B, V] in
  // the model's dtype on its device, in a buffer of the graph's that the next call overwrites.
  const Tensor& run(const Tensor& ids_B1);
  bool captured() const;

 private:
  struct State;
  std::unique_ptr<State> s_;
};

}  // namespace shardtrain::model
