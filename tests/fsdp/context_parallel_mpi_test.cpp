// Context parallelism at the model level under mpirun (2, 3 and 4 ranks; at 4 also 2 context
// x 2 data parallel): the units sharded over every rank (the context group included), each
// rank given its head-tail chunks of its data-parallel rank's sequences, give one rank's loss
// and held-out loss (summed over the run) and every parameter gradient (the reduce-scatter sums
// the ranks' partial gradients): in f32 within 1e-5 relative; in f64 also over 3 AdamW steps,
// with the same weights after them.
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "dist/mpi_communicator.h"
#include "fsdp/context_parallel.h"
#include "fsdp/sharded_store.h"
#include "model/context_parallel.h"
#include "model/llama.h"
#include "optim/adamw.h"
#include "testing/compare.h"
#include "testing/shard_parts.h"

namespace shardtrain {
namespace {

using testing::expect_parts_match;

struct Variant {
  const char* name;
  bool tie = false, bias = false, separate = false, qk_norm = false;
  model::ActivationCheckpointing checkpointing = model::ActivationCheckpointing::kNone;
};

model::LlamaConfig small_config(const Variant& v) {
  model::LlamaConfig c;
  c.vocab_size = 97;
  c.dim = 48;
  c.n_layers = 2;
  c.n_heads = 6;
  c.n_kv_heads = 2;  // 3 query heads per kv head: only the 2 kv heads travel
  c.ffn_dim = 40;
  c.max_seq_len = 48;
  c.tie_embeddings = v.tie;
  c.attention_bias = v.bias;
  c.qk_norm = v.qk_norm;
  return c;
}

// A global batch of `rows` sequences of T tokens for step `step`, some targets ignored.
std::pair<Tensor, Tensor> batch(int64_t rows, int64_t T, int step, int64_t V) {
  Tensor ids = Tensor::empty({rows, T}, DType::kI32), targets = Tensor::empty({rows, T}, DType::kI32);
  testing::fill_random_ints(ids, 20 + static_cast<uint64_t>(step), 0, V);
  testing::fill_random_ints(targets, 40 + static_cast<uint64_t>(step), 0, V);
  targets.data<int32_t>()[3] = targets.data<int32_t>()[T + 7] = -100;
  return {ids, targets};
}

int64_t counted(const Tensor& targets) {
  int64_t n = 0;
  for (int64_t i = 0; i < targets.numel(); ++i) n += targets.data<int32_t>()[i] != -100;
  return n;
}

fsdp::ShardingOptions sharding(DType dt) {
  fsdp::ShardingOptions so;
  so.compute_dtype = so.grad_dtype = so.master_dtype = so.reduce_dtype = dt;
  return so;
}

// One rank's model: a one-rank store (whole units) and its AdamW, as a one-rank run has them.
struct OneRank {
  std::unique_ptr<dist::Communicator> comm = dist::make_single_rank();
  model::ModelLayout layout;
  fsdp::ShardedUnitStore store;
  model::Llama model;
  optim::AdamW adamw;
  OneRank(const model::LlamaConfig& c, DType dt)
      : layout(model::ModelLayout::llama(c, 1)),
        store(layout, comm.get(), sharding(dt)),
        model(c, layout, &store, dt, Device::cpu()),
        adamw(layout, 0, optim::AdamWConfig{}, dt, Device::cpu()) {}
  Tensor whole(const std::vector<Tensor>& shards, const std::string& name) const {
    const model::ModelLayout::Location loc = layout.locate(name);
    return shards[static_cast<size_t>(loc.unit)].flat_range(loc.spec->offset, loc.spec->numel());
  }
};

void step_adamw(optim::AdamW& adamw, fsdp::ShardedUnitStore& store) {
  const fsdp::ShardedUnitStore::OptimizerTargets t = store.optimizer_targets();
  adamw.step(t.params, t.grads, 1e-2);
}

TEST(ContextParallel, ModelMatchesOneRank) {
  auto comm = dist::make_mpi_world();
  const int w = comm->world_size();
  std::vector<int> degrees{w};
  if (w == 4) degrees.push_back(2);  // 2 context x 2 data parallel
  const Variant variants[] = {
      {"plain"},
      {"tied, biased, full checkpointing", true, true, false, false, model::ActivationCheckpointing::kFull},
      {"QK-norm, separate projections, selective checkpointing", false, false, true, true,
       model::ActivationCheckpointing::kSelective},
  };
  for (int degree : degrees) {
    for (DType dt : {DType::kF32, DType::kF64}) {
      fsdp::ContextGroups groups = fsdp::split_context_groups(*comm, degree);
      auto cp = fsdp::make_context_parallel(groups.group.get());
      const int cp_rank = cp->rank(), dp_rank = groups.data_rank(), dp = groups.data_ranks();
      // f32: the first step's loss and gradients. AdamW divides each gradient element by its
      // own size, so an element whose gradient is a sum that nearly cancels (k's bias, whose
      // exact gradient is small) carries its rounding, relative to itself, into the weight:
      // after 3 f32 steps weights part by up to 8e-4 (k's bias; 7e-5 for matrices; relative
      // norm) for any change in the order of sums. In f64 (as the tensor-parallel tests) the
      // steps are compared too: the weights agree to 1.5e-12 after 3 steps (4 ranks), checked
      // within 1e-10.
      const bool f32 = dt == DType::kF32;
      const testing::Tolerance tol = f32 ? testing::kRanksF32 : testing::Tolerance{1e-10, 1e30, 1e30};
      const int steps = f32 ? 1 : 3;
      for (const Variant& v : variants) {
        SCOPED_TRACE(std::string(v.name) + ", context " + std::to_string(degree) + " x data " + std::to_string(dp) +
                     ", " + std::string(dtype_name(dt)) + ", rank " + std::to_string(comm->rank()));
        const model::LlamaConfig c = small_config(v);
        OneRank one(c, dt);
        one.store.init_random(5, c.init_std);
        one.model.set_separate_projections(v.separate);

        // every rank's shards of the same units; the context group shards them too
        const model::ModelLayout layout = model::ModelLayout::llama(c, w);
        fsdp::ShardedUnitStore store(layout, comm.get(), sharding(dt));
        store.init_random(5, c.init_std);
        model::Llama m(c, layout, &store, dt, Device::cpu());
        m.set_separate_projections(v.separate);
        m.set_context_parallel(cp.get());
        optim::AdamW adamw(layout, comm->rank(), optim::AdamWConfig{}, dt, Device::cpu());

        const int64_t B = 2, T = 24;  // T cuts into 2 x (2, 3, 4) chunks
        for (int step = 0; step < steps; ++step) {
          SCOPED_TRACE("step " + std::to_string(step));
          const auto [ids, targets] = batch(B * dp, T, step, c.vocab_size);
          model::StepOptions o;
          o.checkpointing = v.checkpointing;
          o.grad_scale = 1.0 / static_cast<double>(counted(targets));  // the mean over the global batch
          one.store.zero_grad_shards();
          const model::LossSum want = one.model.forward_backward(ids, targets, o);

          // this rank: its data-parallel rank's sequences, its chunks of each
          const Tensor my_ids = testing::copy_of(ids.slice(0, dp_rank * B, (dp_rank + 1) * B));
          const Tensor my_targets = testing::copy_of(targets.slice(0, dp_rank * B, (dp_rank + 1) * B));
          const Tensor local_ids = model::context_shard(my_ids, degree, cp_rank);
          const Tensor local_targets = model::context_shard(my_targets, degree, cp_rank);
          store.zero_grad_shards();
          const model::LossSum got = m.forward_backward(local_ids, local_targets, o);
          Tensor sums = Tensor::empty({2}, DType::kF64);
          sums.data<double>()[0] = got.loss_sum;
          sums.data<double>()[1] = static_cast<double>(got.tokens);
          comm->all_reduce(sums, dist::ReduceOp::kSum);
          EXPECT_NEAR(sums.data<double>()[0], want.loss_sum, tol.rel_norm * want.loss_sum) << "loss sum";
          EXPECT_EQ(sums.data<double>()[1], static_cast<double>(want.tokens)) << "counted tokens";
          expect_parts_match(
              store, store.grad_shards(), [&](const std::string& n) { return one.whole(one.store.grad_shards(), n); },
              tol, "gradient");
          if (f32) continue;
          step_adamw(one.adamw, one.store);
          step_adamw(adamw, store);
        }
        if (!f32)
          expect_parts_match(
              store, store.master_shards(),
              [&](const std::string& n) { return one.whole(one.store.master_shards(), n); }, tol,
              "weights after 3 AdamW steps");

        // held-out loss of this rank's tokens, summed over the run
        const auto [ids, targets] = batch(B * dp, T, 7, c.vocab_size);
        const model::LossSum want = one.model.evaluate(ids, targets, {});
        const Tensor my_ids = testing::copy_of(ids.slice(0, dp_rank * B, (dp_rank + 1) * B));
        const Tensor my_targets = testing::copy_of(targets.slice(0, dp_rank * B, (dp_rank + 1) * B));
        const model::LossSum got = m.evaluate(model::context_shard(my_ids, degree, cp_rank),
                                              model::context_shard(my_targets, degree, cp_rank), {});
        Tensor sums = Tensor::empty({2}, DType::kF64);
        sums.data<double>()[0] = got.loss_sum;
        sums.data<double>()[1] = static_cast<double>(got.tokens);
        comm->all_reduce(sums, dist::ReduceOp::kSum);
        EXPECT_NEAR(sums.data<double>()[0], want.loss_sum, tol.rel_norm * want.loss_sum) << "held-out loss sum";
        EXPECT_EQ(sums.data<double>()[1], static_cast<double>(want.tokens));
      }
    }
  }
}

}  // namespace
}  // namespace shardtrain
