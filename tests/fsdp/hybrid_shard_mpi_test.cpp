// Hybrid sharding (HSDP, parallel.replicate) under mpirun (2, 3 and 4 ranks): replicas of
// the sharded model, each over its own consecutive ranks, with the reduced gradient shards
// summed between them, compute what one rank computes with the whole batch. The model in f64
// on every mesh the run allows (DDP, replicas of FSDP groups, replicas of tensor-parallel
// groups); the trainer against one rank (f32, 1e-5), with the replicas' weights bitwise equal;
// checkpoints written by the first replica that load on one rank and resume the run.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "core/random.h"
#include "dist/mpi_communicator.h"
#include "fsdp/sharded_store.h"
#include "fsdp/tensor_parallel.h"
#include "io/hf_folder.h"
#include "io/safetensors.h"
#include "model/hf_config.h"
#include "model/llama.h"
#include "optim/adamw.h"
#include "testing/compare.h"
#include "testing/mesh_jobs.h"
#include "testing/shard_parts.h"
#include "testing/shared_data.h"
#include "testing/training_curves.h"
#include "train/checkpoint.h"
#include "train/trainer.h"

namespace shardtrain {
namespace {

using testing::copy_of;
using testing::expect_parts_match;

constexpr testing::Tolerance kRanksF64{1e-12, 1e30, 1e30};

// Every (tensor_parallel, replicate) with more than one replica that `world` ranks allow.
std::vector<std::pair<int, int>> hybrid_meshes(int world) {
  std::vector<std::pair<int, int>> out;
  for (int tp = 1; tp <= world; ++tp)
    for (int rep = 2; world % tp == 0 && rep <= world / tp; ++rep)
      if ((world / tp) % rep == 0 && (tp == 1 || tp == 2)) out.emplace_back(tp, rep);
  return out;
}

// Heads, kv heads and FFN width that split over a tensor-parallel group of 2.
model::LlamaConfig small_config() {
  model::LlamaConfig c;
  c.vocab_size = 97;
  c.dim = 48;
  c.n_layers = 2;
  c.n_heads = 12;
  c.n_kv_heads = 4;
  c.ffn_dim = 36;
  c.max_seq_len = 16;
  c.attention_bias = true;
  return c;
}

std::string describe(const model::Mesh& m) {
  return std::to_string(m.replicate) + " replicas of " + std::to_string(m.shard_groups()) + " x " +
         std::to_string(m.tensor_parallel);
}

// The replicas' copies of this rank's slices: bitwise equal (every rank calls it).
void expect_replicas_equal(const fsdp::DeviceMesh& mesh, const std::vector<Tensor>& shards, const std::string& what) {
  dist::Communicator* across = mesh.across_replicas();
  ASSERT_NE(across, nullptr);
  for (size_t u = 0; u < shards.size(); ++u) {
    const Tensor mine = copy_of(shards[u]);
    Tensor all = Tensor::empty({across->world_size() * mine.numel()}, mine.dtype());
    across->all_gather(all, mine);
    for (int q = 0; q < across->world_size(); ++q)
      EXPECT_TRUE(testing::all_close(all.flat_range(q * mine.numel(), mine.numel()), mine, testing::kExact))
          << what << " of unit " << u << ": replica " << q << " differs";
  }
}

// Each data-parallel rank takes its own rows of a global batch; the model's gradients, summed
// over the replicas, are the resident model's on the whole batch.
TEST(HybridSharding, ModelMatchesOneRankInF64) {
  auto comm = dist::make_mpi_world();
  const int w = comm->world_size();
  for (const auto& [tp, rep] : hybrid_meshes(w)) {
    const model::Mesh shape{w / tp, tp, rep};
    SCOPED_TRACE(describe(shape));
    fsdp::DeviceMesh mesh(comm.get(), shape);
    auto group = fsdp::make_tensor_parallel(&mesh.tensor_parallel());
    const model::LlamaConfig c = small_config();
    model::Llama ref(c, DType::kF64);
    ref.init_random(5);
    ref.zero_grads();
    const model::ModelLayout layout = model::ModelLayout::llama(c, shape, mesh.tp_rank());
    for (const model::UnitLayout& u : layout.units())
      EXPECT_EQ(u.ranks, u.kind == model::UnitKind::kBlock && tp > 1 ? shape.shard_groups() : shape.replica_ranks())
          << u.name;
    fsdp::ShardingOptions so;
    so.compute_dtype = so.grad_dtype = so.master_dtype = so.reduce_dtype = DType::kF64;
    fsdp::ShardedUnitStore store(layout, mesh, so, Device::cpu());
    store.init_random(5, c.init_std);
    model::Llama m(c, layout, &store, DType::kF64, Device::cpu());
    if (tp > 1) m.set_tensor_parallel(group.get());

    const int64_t B = 2, T = 12, dp = shape.data_parallel;
    Tensor ids = Tensor::empty({B * dp, T}, DType::kI32), targets = Tensor::empty({B * dp, T}, DType::kI32);
    testing::fill_random_ints(ids, 11, 0, c.vocab_size);
    testing::fill_random_ints(targets, 12, 0, c.vocab_size);
    targets.data<int32_t>()[3] = targets.data<int32_t>()[2 * T + 5] = -100;
    model::StepOptions o;
    o.grad_scale = 1.0 / static_cast<double>(B * dp * T - 2);
    const model::LossSum want = ref.forward_backward(ids, targets, o);
    const int64_t d = mesh.dp_rank();
    const Tensor my_ids = copy_of(ids.slice(0, d * B, d * B + B)), my_targets = copy_of(targets.slice(0, d * B, d * B + B));
    store.zero_grad_shards();
    const model::LossSum got = m.forward_backward(my_ids, my_targets, o);
    Tensor sum = Tensor::empty({1}, DType::kF64);
    sum.data<double>()[0] = got.loss_sum;
    comm->all_reduce(sum, dist::ReduceOp::kSum);  // each rank's rows
    EXPECT_NEAR(sum.data<double>()[0], want.loss_sum, 1e-12 * want.loss_sum);
    expect_parts_match(store, store.grad_shards(), [&](const std::string& n) { return ref.grad(n); }, kRanksF64,
                       "gradient");
    expect_parts_match(store, store.master_shards(), [&](const std::string& n) { return ref.param(n); },
                       testing::kExact, "initial weights");
    expect_replicas_equal(mesh, store.grad_shards(), "gradient shard");
  }
}

// Gradient accumulation: a backward with set_sync_replicas(false) keeps its sums on the
// replica (the replicas' shards then differ); the next backward with it on sums both micro-
// batches between the replicas, giving the resident model's gradients of the two batches.
TEST(HybridSharding, AccumulatedGradientsAreSummedBetweenReplicasOnce) {
  auto comm = dist::make_mpi_world();
  const int w = comm->world_size();
  const model::Mesh shape{w, 1, w % 2 == 0 ? 2 : w};
  SCOPED_TRACE(describe(shape));
  fsdp::DeviceMesh mesh(comm.get(), shape);
  const model::LlamaConfig c = small_config();
  model::Llama ref(c, DType::kF64);
  ref.init_random(5);
  ref.zero_grads();
  const model::ModelLayout layout = model::ModelLayout::llama(c, shape, 0);
  fsdp::ShardingOptions so;
  so.compute_dtype = so.grad_dtype = so.master_dtype = so.reduce_dtype = DType::kF64;
  fsdp::ShardedUnitStore store(layout, mesh, so, Device::cpu());
  store.init_random(5, c.init_std);
  model::Llama m(c, layout, &store, DType::kF64, Device::cpu());
  const int64_t B = 2, T = 12, dp = shape.data_parallel, d = mesh.dp_rank();
  model::StepOptions o;
  o.grad_scale = 1.0 / static_cast<double>(2 * B * dp * T);
  store.zero_grad_shards();
  for (int micro = 0; micro < 2; ++micro) {
    Tensor ids = Tensor::empty({B * dp, T}, DType::kI32), targets = Tensor::empty({B * dp, T}, DType::kI32);
    testing::fill_random_ints(ids, 20 + micro, 0, c.vocab_size);
    testing::fill_random_ints(targets, 30 + micro, 0, c.vocab_size);
    (void)ref.forward_backward(ids, targets, o);
    store.set_sync_replicas(micro == 1);
    (void)m.forward_backward(copy_of(ids.slice(0, d * B, d * B + B)), copy_of(targets.slice(0, d * B, d * B + B)), o);
    if (micro == 0) {
      // each replica holds only its own rows' sums so far
      const Tensor mine = copy_of(store.grad_shards()[1]);
      Tensor all = Tensor::empty({shape.replicate * mine.numel()}, mine.dtype());
      mesh.across_replicas()->all_gather(all, mine);
      EXPECT_FALSE(testing::all_close(all.flat_range(0, mine.numel()), all.flat_range(mine.numel(), mine.numel()),
                                      testing::kExact))
          << "the first micro-batch's gradients were summed between the replicas";
      EXPECT_TRUE(testing::throws_with([&] { (void)store.grad_norm_parts(); }, "never summed between the replicas"));
    }
  }
  expect_parts_match(store, store.grad_shards(), [&](const std::string& n) { return ref.grad(n); }, kRanksF64,
                     "accumulated gradient");
  expect_replicas_equal(mesh, store.grad_shards(), "accumulated gradient shard");
  // summed now: the norm's parts come from the first replica alone
  EXPECT_EQ(store.grad_norm_parts().empty(), shape.replica(comm->rank()) != 0);
}

TEST(HybridSharding, RejectsReplicasThatDoNotDivideTheRun) {
  auto comm = dist::make_mpi_world();
  const int w = comm->world_size();
  EXPECT_TRUE(testing::throws_with([&] { fsdp::DeviceMesh mesh(comm.get(), model::Mesh{w, 1, w + 1}); },
                                   "`parallel.replicate` = " + std::to_string(w + 1) + " must divide the " +
                                       std::to_string(w) + " data-parallel groups"));
}

std::string corpus_file(int rank) { return testing::mesh_corpus_file("hsdp", rank); }

TEST(HybridSharding, TrainerRejectsReplicasThatDoNotDivideTheRun) {
  auto comm = dist::make_mpi_world();
  const int w = comm->world_size();
  const std::string corpus = corpus_file(comm->rank());
  EXPECT_TRUE(testing::throws_with([&] { train::Trainer t(testing::mesh_job(corpus, 2, 1, w + 1), comm.get()); },
                                   "`parallel.replicate` (" + std::to_string(w + 1) + ") must divide the " +
                                       std::to_string(w) + " data-parallel groups of this run"));
  std::filesystem::remove(corpus);
}

// Replicas train as one rank with the whole global batch (the same losses, gradient norms,
// held-out loss and weights), and stay bitwise equal to each other.
TEST(HybridSharding, TrainerMatchesOneRank) {
  auto comm = dist::make_mpi_world();
  const int w = comm->world_size();
  const std::string corpus = corpus_file(comm->rank());
  const int64_t B = 2;
  auto single = dist::make_single_rank();
  for (const auto& [tp, rep] : hybrid_meshes(w)) {
    // one rank with the whole global batch: B sequences per data-parallel group
    const int dp = w / tp;
    train::Trainer ref(testing::mesh_job(corpus, B * dp, 1, 1), single.get());
    const train::TrainSummary a = ref.run();
    SCOPED_TRACE(describe(model::Mesh{dp, tp, rep}));
    for (const char* checkpointing : {"none", "full"}) {
      SCOPED_TRACE(checkpointing);
      train::JobConfig c = testing::mesh_job(corpus, B, tp, rep);
      c.training.activation_checkpointing = checkpointing;
      train::Trainer t(c, comm.get());
      EXPECT_EQ(t.mesh().shape().replicate, rep);
      const train::TrainSummary b = t.run();
      EXPECT_TRUE(testing::expect_same_curves(a, b, 1e-5, 0.5)) << "the test should exercise clipping";
      expect_parts_match(t.store(), t.store().master_shards(),
                         testing::whole_params(ref.store(), ref.store().master_shards()), testing::kRanksF32,
                         "trained weights");
      expect_replicas_equal(t.mesh(), t.store().master_shards(), "trained weights");
      expect_replicas_equal(t.mesh(), t.optimizer().exp_avg_sq(), "AdamW exp_avg_sq");
    }
  }
  std::filesystem::remove(corpus);
}

// The first replica writes the checkpoint (the other replicas' rank files hold no pieces):
// one rank loads it, a run without replicas loads it, and the replicated run resumed from it
// continues as it would have.
TEST(HybridSharding, CheckpointsLoadAnywhereAndResume) {
  auto comm = dist::make_mpi_world();
  const int r = comm->rank(), w = comm->world_size();
  const int rep = w % 2 == 0 ? 2 : w;  // 2 replicas of 2 ranks on 4: sharded inside each replica
  const std::string corpus = corpus_file(r);
  const std::string root =
      (std::filesystem::temp_directory_path() / ("shardtrain_hsdp_ckpt_np" + std::to_string(w))).string();
  if (r == 0) std::filesystem::remove_all(root);
  comm->barrier();
  train::JobConfig c = testing::mesh_job(corpus, 2, 1, rep);
  c.training.steps = 6;
  c.checkpoint.interval_steps = 3;
  c.checkpoint.keep = 0;
  c.checkpoint.dir = root + "/hsdp";
  train::Trainer straight(c, comm.get());
  const train::TrainSummary all = straight.run();
  comm->barrier();

  const train::CheckpointInfo info = train::read_checkpoint_info(root + "/hsdp/step_00000006");
  EXPECT_EQ(info.world_size, w);
  const testing::OneRankCopy one = testing::load_on_one_rank(info);
  const auto whole = one.params();
  expect_parts_match(straight.store(), straight.store().master_shards(), whole, testing::kExact, "replicas -> 1");
  expect_parts_match(straight.store(), straight.optimizer().exp_avg(), one.state(one.optimizer->exp_avg()),
                     testing::kExact, "replicas -> 1, exp_avg");
  if (straight.mesh().shape().replica(r) != 0) {
    const io::SafetensorsFile mine(root + "/hsdp/step_00000006/" + fmt::format("rank_{:05}-of-{:05}.safetensors", r, w));
    EXPECT_TRUE(mine.tensors().empty()) << "only the first replica saves pieces";
  }

  // every rank sharding the whole model (no replicas) loads it
  const model::ModelLayout flat = model::ModelLayout::llama(info.config, w);
  fsdp::ShardedUnitStore flat_store(flat, comm.get(), {});
  train::load_checkpoint(info, flat_store, nullptr);
  expect_parts_match(flat_store, flat_store.master_shards(), whole, testing::kExact, "replicas -> FSDP");

  testing::expect_resume_continues(c, root + "/hsdp/step_00000003", root + "/resumed", all, comm.get());
  comm->barrier();
  if (r == 0) std::filesystem::remove_all(root);
  std::filesystem::remove(corpus);
}

// A Hugging Face folder loads into every replica's shards, by ranges or through rank 0.
TEST(HybridSharding, HfLoadingFillsEveryReplica) {
  auto comm = dist::make_mpi_world();
  const int w = comm->world_size();
  const model::Mesh shape{w, 1, w % 2 == 0 ? 2 : w};
  fsdp::DeviceMesh mesh(comm.get(), shape);
  const std::string dir = testing::source_dir() + "/tests/model/hf_reference/qwen2_bias";
  const model::LlamaConfig c = model::load_hf_config(dir + "/config.json");
  testing::expect_hf_loading_fills_shards(model::ModelLayout::llama(c, shape, 0), mesh, dir);
}

}  // namespace
}  // namespace shardtrain
