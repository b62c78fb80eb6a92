// One rank's training engine on GPU 0 for the CUDA tests: a sharded store in bf16 compute
// over f32 masters, the model over it and AdamW, from the counter-based init.
#pragma once

#include <cstdint>
#include <memory>

#include "core/random.h"
#include "dist/communicator.h"
#include "fsdp/sharded_store.h"
#include "model/llama.h"
#include "optim/adamw.h"

namespace shardtrain::testing {

inline fsdp::ShardingOptions bf16_sharding(bool compute_shards = false, bool offload = false) {
  fsdp::ShardingOptions so;
  so.compute_dtype = DType::kBF16;
  so.compute_shards = compute_shards;
  so.offload = offload;
  return so;
}

struct GpuEngine {
  std::unique_ptr<dist::Communicator> comm = dist::make_single_rank();
  model::ModelLayout layout;
  std::unique_ptr<fsdp::ShardedUnitStore> store;
  std::unique_ptr<model::Llama> model;
  std::unique_ptr<optim::AdamW> opt;

  // Offloaded shards (so.offload) get the host AdamW, as in the trainer.
  explicit GpuEngine(const model::LlamaConfig& c, const fsdp::ShardingOptions& so = bf16_sharding(),
                     uint64_t seed = 11)
      : layout(model::ModelLayout::llama(c, 1)) {
    store = std::make_unique<fsdp::ShardedUnitStore>(layout, comm.get(), so, Device::cuda(0));
    store->init_random(seed, c.init_std);
    model = std::make_unique<model::Llama>(c, layout, store.get(), DType::kBF16, Device::cuda(0));
    optim::AdamWConfig oc;
    oc.host_f32 = so.offload;
    opt = std::make_unique<optim::AdamW>(layout, 0, oc, DType::kF32, store->shard_device());
  }
  // AdamW at lr 1e-3, the gradients scaled by `clip` (1: unclipped).
  void update(double clip = 1.0) {
    const fsdp::ShardedUnitStore::OptimizerTargets t = store->optimizer_targets();
    opt->step(t.params, t.grads, 1e-3, clip, t.compute_copies);
  }
};

// Random ids and targets below `vocab`; with ignore_every > 0, every ignore_every-th target
// is the ignore index (-100).
inline void random_batch(CounterRng& rng, Tensor& ids, Tensor& targets, int64_t vocab = 1000,
                         int64_t ignore_every = 0) {
  for (int64_t i = 0; i < ids.numel(); ++i) {
    ids.data<int32_t>()[i] = static_cast<int32_t>(rng.next_below(static_cast<uint64_t>(vocab)));
    const int32_t t = static_cast<int32_t>(rng.next_below(static_cast<uint64_t>(vocab)));
    targets.data<int32_t>()[i] = ignore_every > 0 && i % ignore_every == 0 ? -100 : t;
  }
}

}  // namespace shardtrain::testing
