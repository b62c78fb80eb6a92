// Checking a sharded store's slices against whole parameters (tests of several ranks and meshes).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "fsdp/sharded_store.h"
#include "io/hf_folder.h"
#include "ops/elementwise.h"
#include "optim/adamw.h"
#include "testing/compare.h"
#include "train/checkpoint.h"
#include "train/trainer.h"

namespace shardtrain::testing {

// A contiguous copy of a view.
inline Tensor copy_of(const Tensor& view) {
  Tensor t = Tensor::empty(view.shape(), view.dtype(), view.device(), "test copy");
  copy(t, view);
  return t;
}

// Every element of this rank's part of each parameter (in `store`'s shards, or its gradient
// shards, or optimizer state laid out as they are) against the whole parameter `whole(name)`.
template <typename Whole>
void expect_parts_match(const fsdp::ShardedUnitStore& store, const std::vector<Tensor>& shards, Whole&& whole,
                        const Tolerance& tol, const std::string& what) {
  const model::ModelLayout& layout = store.layout();
  for (size_t u = 0; u < layout.units().size(); ++u)
    for (const model::ShardRange& r : model::shard_ranges(layout.units()[u], store.unit_comm(u).rank())) {
      const Tensor full = whole(r.spec->name);
      ASSERT_EQ(full.numel(), r.spec->full_numel()) << r.spec->name;
      Tensor mine = Tensor::empty({r.count}, DType::kF64, Device::cpu(), "part");
      Tensor ref = Tensor::empty({r.count}, DType::kF64, Device::cpu(), "reference part");
      model::for_each_run(*r.spec, r.first, r.count, [&](int64_t full_first, int64_t local_first, int64_t n) {
        Tensor m = mine.flat_range(local_first - r.first, n), f = ref.flat_range(local_first - r.first, n);
        ops::cast(m, shards[u].flat_range(r.shard_offset + (local_first - r.first), n));
        ops::cast(f, full.view({full.numel()}).flat_range(full_first, n));
      });
      EXPECT_TRUE(all_close(mine, ref, tol)) << what << ": " << r.spec->name << " elements [" << r.first << ", "
                                             << r.first + r.count << ") of its part on rank " << store.rank();
    }
}

// The whole parameters of a one-rank store (its master shards, or state laid out as they are).
inline auto whole_params(const fsdp::ShardedUnitStore& s, const std::vector<Tensor>& shards) {
  return [&s, &shards](const std::string& n) {
    const model::ModelLayout::Location loc = s.layout().locate(n);
    return shards[static_cast<size_t>(loc.unit)].flat_range(loc.spec->offset, loc.spec->numel());
  };
}

// A checkpoint loaded on one rank: whole parameters and AdamW state, in f32.
struct OneRankCopy {
  std::unique_ptr<dist::Communicator> comm;
  std::unique_ptr<model::ModelLayout> layout;
  std::unique_ptr<fsdp::ShardedUnitStore> store;
  std::unique_ptr<optim::AdamW> optimizer;
  auto params() const { return whole_params(*store, store->master_shards()); }
  auto state(const std::vector<Tensor>& v) const { return whole_params(*store, v); }
};
inline OneRankCopy load_on_one_rank(const train::CheckpointInfo& info) {
  OneRankCopy one;
  one.comm = dist::make_single_rank();
  one.layout = std::make_unique<model::ModelLayout>(model::ModelLayout::llama(info.config, 1));
  one.store = std::make_unique<fsdp::ShardedUnitStore>(*one.layout, one.comm.get(), fsdp::ShardingOptions{});
  one.optimizer = std::make_unique<optim::AdamW>(*one.layout, 0, optim::AdamWConfig{}, DType::kF32, Device::cpu());
  train::load_checkpoint(info, *one.store, one.optimizer.get());
  return one;
}

// The Hugging Face folder `dir` loads into `mesh`'s shards of `layout` (this rank's part),
// by ranges and through rank 0, each equal to the file's whole tensors.
inline void expect_hf_loading_fills_shards(const model::ModelLayout& layout, const fsdp::DeviceMesh& mesh,
                                           const std::string& dir) {
  const io::HfWeights weights(dir);
  const auto whole = [&](const std::string& n) { return weights.files().front()->read_as(n, DType::kF32); };
  fsdp::ShardedUnitStore by_ranges(layout, mesh, {});
  by_ranges.load([&](const model::ParamSpec& p, int64_t first, Tensor& out) {
    ASSERT_LE(first + out.numel(), p.full_numel());
    weights.read_range(p.name, first, out);
  });
  expect_parts_match(by_ranges, by_ranges.master_shards(), whole, kExact, "by ranges");
  fsdp::ShardedUnitStore by_root(layout, mesh, {});
  std::unique_ptr<io::HfWeights> root_weights;
  if (mesh.world().rank() == 0) root_weights = std::make_unique<io::HfWeights>(dir);
  by_root.load_from_rank0(
      [&](const model::ParamSpec& p, int64_t first, Tensor& out) { root_weights->read_range(p.name, first, out); });
  expect_parts_match(by_root, by_root.master_shards(), whole, kExact, "by rank 0");
}

// `job` resumed from `step_dir` (its step 3) on `comm` continues with the losses of the run
// `all` that wrote it, exactly.
inline void expect_resume_continues(train::JobConfig job, const std::string& step_dir, const std::string& new_dir,
                                    const train::TrainSummary& all, dist::Communicator* comm) {
  job.checkpoint.resume = step_dir;
  job.checkpoint.dir = new_dir;
  job.export_.folder = "";
  const train::TrainSummary resumed = train::Trainer(job, comm).run();
  ASSERT_EQ(resumed.steps.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(resumed.steps[i].loss, all.steps[i + 3].loss) << "step " << i + 4;
}

}  // namespace shardtrain::testing
