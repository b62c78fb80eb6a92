// Sharded training under mpirun equals one rank: the same loss at every step and the same
// final parameters (f32, relative 1e-5), with padding, gradient accumulation and clipping;
// initialisation is identical for any number of ranks.
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "dist/mpi_communicator.h"
#include "io/hf_folder.h"
#include "model/hf_config.h"
#include "testing/shared_data.h"
#include "model/llama.h"
#include "optim/adamw.h"
#include "optim/clip.h"
#include "core/allocator.h"
#include "core/random.h"
#include "testing/compare.h"
#include "testing/training_curves.h"
#include "train/checkpoint.h"
#include "train/trainer.h"

namespace shardtrain {
namespace {

std::string corpus_file(int rank) {
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("shardtrain_fsdp_corpus_" + std::to_string(::getpid()) + "_" + std::to_string(rank) + ".txt"))
                               .string();
  std::ofstream out(path);
  for (int i = 0; i < 300; ++i)
    out << "Document " << i << " talks about sharded parameters, gathered units and reduced gradients number "
        << i * 7 % 13 << ".\n\n";
  return path;
}

train::JobConfig job(const std::string& corpus, int64_t batch_size) {
  // Widths chosen so no unit is a multiple of 128 x ranks: every unit needs padding.
  train::LoadedConfig c = train::load_config(
      "", {"--model.dim=40", "--model.n_layers=2", "--model.n_heads=4", "--model.n_kv_heads=2", "--model.ffn_dim=52",
           "--model.max_seq_len=32", "--model.tie_embeddings=false", "--training.seq_len=24", "--training.device=cpu",
           "--training.batch_size=" + std::to_string(batch_size), "--training.grad_accum_steps=2",
           "--training.steps=20", "--training.max_grad_norm=0.5", "--schedule.warmup_steps=3", "--optimizer.lr=3e-3",
           "--eval.interval_steps=0", "--eval.batches=2", "--sample.tokens=0", "--logging.progress=off",
           "--logging.level=warn", "--logging.metrics_file=", "--data.source=" + corpus, "--data.val_fraction=0.1",
           "--run.output_dir=" + std::filesystem::temp_directory_path().string() + "/shardtrain_fsdp_run"});
  return c.config;
}

TEST(ShardedTraining, MatchesOneRank) {
  auto comm = dist::make_mpi_world();
  const int r = comm->rank(), w = comm->world_size();
  const std::string corpus = corpus_file(r);
  const int64_t B = 2;

  // The reference: one rank with the whole global batch (w x B sequences per micro-batch).
  auto single = dist::make_single_rank();
  train::Trainer ref(job(corpus, B * w), single.get());
  const train::TrainSummary a = ref.run();

  train::Trainer sharded(job(corpus, B), comm.get());
  const train::TrainSummary b = sharded.run();
  EXPECT_EQ(sharded.store().gathered_units(), 0) << "nothing stays gathered after a step";

  // ZeRO-2-like: units stay gathered from forward to backward; the numbers do not change
  train::JobConfig zero2 = job(corpus, B);
  zero2.parallel.reshard_after_forward = false;
  zero2.training.steps = 3;
  train::Trainer kept(zero2, comm.get());
  const train::TrainSummary z = kept.run();
  for (size_t i = 0; i < z.steps.size(); ++i) EXPECT_EQ(z.steps[i].loss, b.steps[i].loss) << "step " << i + 1;

  EXPECT_TRUE(testing::expect_same_curves(a, b, 1e-5, 0.5)) << "the test should exercise clipping";
  EXPECT_LT(a.steps.back().loss, a.steps.front().loss - 0.5);

  const model::ModelLayout& layout = sharded.store().layout();
  for (size_t u = 0; u < layout.units().size(); ++u) {
    const Tensor& mine = sharded.store().master_shards()[u];
    const Tensor& full = ref.store().master_shards()[u];  // one rank: the whole (differently padded) unit
    for (const model::ParamSpec& p : layout.units()[u].params) {
      const int64_t s = mine.numel(), lo = r * s, hi = lo + s;
      const int64_t x = std::max(lo, p.offset), y = std::min(hi, p.offset + p.numel());
      if (x >= y) continue;
      const model::ParamSpec* q = ref.store().layout().units()[u].find(p.name);
      ASSERT_NE(q, nullptr);
      EXPECT_TRUE(testing::all_close(mine.flat_range(x - lo, y - x), full.flat_range(q->offset + (x - p.offset), y - x),
                                     testing::kRanksF32))
          << "rank " << r << " of " << w << ": " << p.name;
    }
  }
  std::filesystem::remove(corpus);
}

// FP8 products under FSDP: blockwise scales (1x128 groups of a row, 128x128 weight blocks, and
// for the weight gradients 1x128 groups of tokens, which never straddle two sequences when
// sequences are 128 tokens long) group the same values on one rank and on N, so N ranks compute
// what one rank does, up to the order of f32 sums. Unlike bf16 or f32, that order can then move
// a value across an FP8 rounding midpoint, changing its code by one step (up to 2^-3 of it in
// e4m3), so after the first update the curves may part by more than the order of sums alone:
// at 4 ranks the gradient norm moved by 3e-6 at step 4 and 2.6e-5 at step 5 (2 and 3 ranks: at
// most 2e-8). The first step's loss and gradient norm must agree to f32 rounding (1e-5), later
// steps to 1e-4 (loss) and 1e-3 (gradient norm). (Tensorwise and rowwise scales of a rank's
// activations see only its own sequences: those recipes part from one rank by FP8 rounding.)
TEST(ShardedTraining, Fp8BlockwiseMatchesOneRank) {
  auto comm = dist::make_mpi_world();
  const int r = comm->rank(), w = comm->world_size();
  const std::string corpus = corpus_file(r);
  auto fp8_job = [&](int64_t batch_size) {
    train::JobConfig c = job(corpus, batch_size);
    c.model.dim = 64;
    c.model.ffn_dim = 96;
    c.model.max_seq_len = 128;
    c.training.seq_len = 128;
    c.training.steps = 5;
    c.training.fp8 = "blockwise";
    return c;
  };
  auto single = dist::make_single_rank();
  const train::TrainSummary a = train::Trainer(fp8_job(w), single.get()).run();
  const train::TrainSummary b = train::Trainer(fp8_job(1), comm.get()).run();
  ASSERT_EQ(a.steps.size(), b.steps.size());
  for (size_t i = 0; i < a.steps.size(); ++i) {
    const double loss_tol = i == 0 ? 1e-5 : 1e-4, norm_tol = i == 0 ? 1e-5 : 1e-3;
    EXPECT_NEAR(b.steps[i].loss, a.steps[i].loss, loss_tol * a.steps[i].loss) << "step " << i + 1 << " of " << w;
    EXPECT_NEAR(b.steps[i].grad_norm, a.steps[i].grad_norm, norm_tol * a.steps[i].grad_norm)
        << "step " << i + 1 << " of " << w;
  }
  EXPECT_LT(a.steps.back().loss, a.steps.front().loss - 0.2);
  std::filesystem::remove(corpus);
}

// Compute shards (parallel.compute_shards) change where the compute copies come from, not
// their values. With f64 master weights and f32 compute on the CPU (the GPU's f32/bf16 pair,
// one level up), three steps with AdamW writing the copies equal three steps casting the
// masters at every gather, bitwise: on all ranks (gathers send the copies) and on one rank
// (the copies used in place, never gathered).
struct ShardRun {
  std::vector<double> losses, grad_norms;
  std::vector<Tensor> masters;
};

ShardRun train_small(dist::Communicator* comm, bool compute_shards, bool overwrite_grads = false,
                     DType master = DType::kF64) {
  model::LlamaConfig c;
  c.vocab_size = 97;
  c.dim = 40;  // no unit a multiple of 128 x ranks: every shard is padded
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.ffn_dim = 52;
  c.max_seq_len = 16;
  c.tie_embeddings = false;
  const model::ModelLayout layout = model::ModelLayout::llama(c, comm->world_size());
  fsdp::ShardingOptions so;
  so.compute_dtype = so.grad_dtype = so.reduce_dtype = DType::kF32;
  so.master_dtype = master;
  so.compute_shards = compute_shards;
  fsdp::ShardedUnitStore store(layout, comm, so, Device::cpu());
  EXPECT_EQ(store.has_compute_shards(), compute_shards && master != so.compute_dtype);
  store.init_random(21, c.init_std);
  model::Llama m(c, layout, &store, DType::kF32, Device::cpu());
  optim::AdamW opt(layout, comm->rank(), optim::AdamWConfig{}, master, Device::cpu());
  const int64_t B = 2, T = 16;
  model::StepOptions o;
  o.grad_scale = 1.0 / static_cast<double>(2 * B * T * comm->world_size());
  Tensor ids = Tensor::empty({B, T}, DType::kI32), targets = Tensor::empty({B, T}, DType::kI32);
  // two micro-batches per step: clearing the gradients before each step and adding both, or
  // as the trainer, the first writing over the last step's (model::gradient_writes)
  const model::GradientWrites writes =
      overwrite_grads ? model::gradient_writes(false, 2, store.grads_in_shards()) : model::GradientWrites{};
  ShardRun run;
  for (int step = 0; step < 3; ++step) {
    if (writes.zero_shards) store.zero_grad_shards();
    double loss = 0;
    for (int mb = 0; mb < 2; ++mb) {
      CounterRng rng(100 * static_cast<uint64_t>(step) + 10 * static_cast<uint64_t>(mb) +
                     static_cast<uint64_t>(comm->rank()));
      for (int64_t i = 0; i < B * T; ++i) {
        ids.data<int32_t>()[i] = static_cast<int32_t>(rng.next_below(97));
        targets.data<int32_t>()[i] = static_cast<int32_t>(rng.next_below(97));
      }
      o.overwrite_grads = writes.overwrites(mb);
      loss += m.forward_backward(ids, targets, o).loss_sum;
    }
    run.losses.push_back(loss);
    run.grad_norms.push_back(optim::global_grad_norm(store.optimizer_targets().grads, comm));  // padding included
    const fsdp::ShardedUnitStore::OptimizerTargets t = store.optimizer_targets();
    EXPECT_EQ(t.compute_copies.size(), compute_shards ? layout.units().size() : 0u);
    opt.step(t.params, t.grads, 2e-2, 1.0, t.compute_copies);
  }
  const fsdp::ShardedUnitStore& read_only = store;
  for (const Tensor& shard : read_only.master_shards()) run.masters.push_back(testing::to_dtype(shard, DType::kF64));
  return run;
}

// Fine-tuning examples over ranks: each rank reads its share of every global batch of the
// epoch's order, and the loss is the mean over the counted tokens of all ranks (they differ
// from rank to rank): the same losses and gradient norms as one rank with the whole batch.
TEST(ShardedTraining, FineTuningExamplesMatchOneRank) {
  auto comm = dist::make_mpi_world();
  const int r = comm->rank(), w = comm->world_size();
  const std::string path = (std::filesystem::temp_directory_path() / ("shardtrain_fsdp_sft_" +
                                                                      std::to_string(::getpid()) + "_" +
                                                                      std::to_string(r) + ".jsonl"))
                               .string();
  {
    std::ofstream out(path);
    for (int i = 0; i < 240; ++i)
      out << "{\"prompt\": \"Question " << i << "? \", \"response\": \"" << std::string(1 + i % 9, 'x') << i % 4
          << ".\"}\n";
  }
  const int64_t B = 2;
  auto sft_job = [&](int64_t batch) {
    train::JobConfig c = job(path, batch);
    c.data.format = "sft";
    c.data.val_fraction = 0.2;
    c.training.steps = 6;
    return c;
  };
  auto single = dist::make_single_rank();
  const train::TrainSummary a = train::Trainer(sft_job(B * w), single.get()).run();
  const train::TrainSummary b = train::Trainer(sft_job(B), comm.get()).run();
  (void)testing::expect_same_curves(a, b, 1e-5, 0.5);
  std::filesystem::remove(path);
}

TEST(ShardedTraining, ComputeShardsEqualCastingAtEveryGather) {
  auto world = dist::make_mpi_world();
  auto single = dist::make_single_rank();
  for (dist::Communicator* comm : {world.get(), single.get()}) {
    const ShardRun cast = train_small(comm, false), shards = train_small(comm, true);
    const std::string what = comm == single.get() ? "one rank (in place)" : "all ranks (gathered)";
    ASSERT_EQ(cast.losses.size(), shards.losses.size());
    for (size_t i = 0; i < cast.losses.size(); ++i)
      EXPECT_EQ(shards.losses[i], cast.losses[i]) << what << ", step " << i + 1;
    for (size_t u = 0; u < cast.masters.size(); ++u)
      EXPECT_TRUE(testing::all_close(shards.masters[u], cast.masters[u], testing::kExact)) << what << ", unit " << u;
  }
}

// The trainer's gradient writes (model::gradient_writes): one rank overwrites its gradient
// shards in the first micro-batch and adds in the second; several ranks overwrite fresh
// buffers whose padding the store clears, reduced into cleared shards. Both bitwise equal
// clearing the gradients and adding every micro-batch. The units are padded (width 40), so
// padding that reached the reductions uncleared would show in the masters.
TEST(ShardedTraining, OverwritingGradientsEqualsClearingThem) {
  set_host_allocation_poison(true);  // fresh buffers hold NaN, not zeros by luck
  auto world = dist::make_mpi_world();
  auto single = dist::make_single_rank();
  struct Variant {
    const char* name;
    bool compute_shards;
    DType master;
  };
  // f32 masters: one rank's store hands out the gradient shards themselves
  for (dist::Communicator* comm : {world.get(), single.get()}) {
    for (Variant v : {Variant{"f64 masters", false, DType::kF64}, Variant{"compute shards", true, DType::kF64},
                      Variant{"f32 masters", false, DType::kF32}}) {
      const ShardRun cleared = train_small(comm, v.compute_shards, false, v.master),
                     overwritten = train_small(comm, v.compute_shards, true, v.master);
      const std::string what = std::string(comm == single.get() ? "one rank, " : "all ranks, ") + v.name;
      ASSERT_EQ(cleared.losses.size(), overwritten.losses.size());
      for (size_t i = 0; i < cleared.losses.size(); ++i) {
        EXPECT_EQ(overwritten.losses[i], cleared.losses[i]) << what << ", step " << i + 1;
        EXPECT_EQ(overwritten.grad_norms[i], cleared.grad_norms[i]) << what << ", step " << i + 1;
      }
      for (size_t u = 0; u < cleared.masters.size(); ++u)
        EXPECT_TRUE(testing::all_close(overwritten.masters[u], cleared.masters[u], testing::kExact))
            << what << ", unit " << u;
    }
  }
  set_host_allocation_poison(false);
}

// Every parameter of `store` (collective gather) equals `single`'s (a one-rank store).
void expect_same_model(fsdp::ShardedUnitStore& store, fsdp::ShardedUnitStore& single, const std::string& what) {
  const model::ModelLayout& layout = store.layout();
  for (size_t u = 0; u < layout.units().size(); ++u) {
    const Tensor full = store.acquire_params(u, model::Pass::kEval);
    for (const model::ParamSpec& p : layout.units()[u].params) {
      const model::ParamSpec* q = single.layout().units()[u].find(p.name);
      EXPECT_TRUE(testing::all_close(full.flat_range(p.offset, p.numel()),
                                     single.master_shards()[u].flat_range(q->offset, q->numel()), testing::kExact))
          << what << ": " << p.name;
    }
    store.release_params(u, model::Pass::kEval);
  }
}

// NaN on one rank is decided alike by all: a NaN gradient on the last rank makes every rank
// skip that step (the norm is all-reduced), and an infinite second moment on the last rank
// only stops every rank before the save, the last naming the parameter.
TEST(ShardedTraining, NonFiniteOnOneRankIsDecidedByAll) {
  auto comm = dist::make_mpi_world();
  const int r = comm->rank(), w = comm->world_size();
  const std::string corpus = corpus_file(r);
  const std::string root =
      (std::filesystem::temp_directory_path() / ("shardtrain_nonfinite_mpi_np" + std::to_string(w))).string();
  if (r == 0) std::filesystem::remove_all(root);
  comm->barrier();
  train::JobConfig c = job(corpus, 2);
  c.training.steps = 4;
  // the first element of a parameter in this rank's shard of the first block (not padding)
  const auto first_element = [r](train::Trainer& t) {
    const model::ModelLayout& layout = t.store().layout();
    const std::vector<model::ShardRange> ranges = model::shard_ranges(layout.units()[1], layout.shard_index(1, r));
    EXPECT_FALSE(ranges.empty());
    return ranges.empty() ? int64_t{0} : ranges.front().shard_offset;
  };
  {
    train::Trainer t(c, comm.get());
    t.set_after_backward([&](int64_t step) {
      if (step == 2 && r == w - 1) t.store().grad_shards()[1].data<float>()[first_element(t)] = std::nanf("");
    });
    const train::TrainSummary s = t.run();
    ASSERT_EQ(s.steps.size(), 4u);
    EXPECT_TRUE(s.steps[1].skipped_nonfinite) << "rank " << r;
    EXPECT_EQ(s.skipped_nonfinite, 1) << "rank " << r;
    EXPECT_EQ(t.optimizer().steps_taken(), 3) << "rank " << r;
  }
  c.checkpoint.interval_steps = 4;
  c.checkpoint.dir = root;
  train::Trainer t(c, comm.get());
  t.set_after_backward([&](int64_t step) {
    if (step == 3 && r == w - 1) t.optimizer().exp_avg_sq()[1].data<float>()[first_element(t)] = INFINITY;
  });
  std::string e;
  try {
    t.run();
  } catch (const std::exception& x) {
    e = x.what();
  }
  EXPECT_NE(e.find("step 3: the AdamW update left NaN or inf in "), std::string::npos) << "rank " << r << ": " << e;
  EXPECT_NE(e.find(fmt::format("(1 of the {} ranks found some)", w)), std::string::npos) << "rank " << r << ": " << e;
  if (r == w - 1) {
    EXPECT_NE(e.find("(exp_avg_sq)"), std::string::npos) << e;
  }
  comm->barrier();
  EXPECT_FALSE(std::filesystem::exists(root + "/step_00000004")) << "rank " << r;
}

TEST(ShardedCheckpoint, WrittenByNRanksLoadsOnOneAndBack) {
  auto comm = dist::make_mpi_world();
  auto single = dist::make_single_rank();
  const int r = comm->rank(), w = comm->world_size();
  const std::string corpus = corpus_file(r);
  const std::string root =
      (std::filesystem::temp_directory_path() / ("shardtrain_ckpt_mpi_np" + std::to_string(w))).string();
  if (r == 0) std::filesystem::remove_all(root);
  comm->barrier();

  // N ranks train 4 steps and save; one rank reads that checkpoint.
  train::JobConfig c = job(corpus, 2);
  c.training.steps = 4;
  c.checkpoint.interval_steps = 4;
  c.checkpoint.dir = root + "/by_n";
  train::Trainer sharded(c, comm.get());
  sharded.run();
  comm->barrier();
  const train::CheckpointInfo info = train::read_checkpoint_info(root + "/by_n/step_00000004");
  EXPECT_EQ(info.world_size, w);
  EXPECT_EQ(info.step, 4);
  const model::ModelLayout one = model::ModelLayout::llama(info.config, 1);
  fsdp::ShardedUnitStore single_store(one, single.get(), {});
  optim::AdamW single_opt(one, 0, {}, DType::kF32, Device::cpu());
  train::load_checkpoint(info, single_store, &single_opt);
  EXPECT_EQ(single_opt.steps_taken(), 4);
  expect_same_model(sharded.store(), single_store, "N ranks -> 1");

  // One rank writes it again; N ranks load that and hold the same model.
  if (r == 0)
    train::save_checkpoint(root + "/by_one", 4, info.config, "", single_store, &single_opt, *single, 2);
  comm->barrier();
  const train::CheckpointInfo info1 = train::read_checkpoint_info(root + "/by_one/step_00000004");
  EXPECT_EQ(info1.world_size, 1);
  fsdp::ShardedUnitStore reloaded(sharded.store().layout(), comm.get(), {});
  optim::AdamW reloaded_opt(sharded.store().layout(), r, {}, DType::kF32, Device::cpu());
  train::load_checkpoint(info1, reloaded, &reloaded_opt);
  expect_same_model(reloaded, single_store, "1 rank -> N");
  for (size_t u = 0; u < sharded.optimizer().exp_avg().size(); ++u) {
    EXPECT_TRUE(testing::all_close(reloaded_opt.exp_avg()[u], sharded.optimizer().exp_avg()[u], testing::kExact));
    EXPECT_TRUE(
        testing::all_close(reloaded_opt.exp_avg_sq()[u], sharded.optimizer().exp_avg_sq()[u], testing::kExact));
  }

  // checkpoint.async on N ranks (files written on a thread while the ranks step on, committed
  // a step later): every rank's file and the metadata equal the synchronous save's
  train::JobConfig a = c;
  a.checkpoint.dir = root + "/async";
  a.checkpoint.interval_steps = 2;
  a.checkpoint.async = true;
  train::Trainer async_run(a, comm.get());
  async_run.run();
  comm->barrier();
  const auto bytes = [](const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  };
  const std::string rank_file = "/step_00000004/rank_" + fmt::format("{:05d}-of-{:05d}", r, w) + ".safetensors";
  EXPECT_FALSE(bytes(root + "/by_n" + rank_file).empty());
  EXPECT_TRUE(bytes(root + "/async" + rank_file) == bytes(root + "/by_n" + rank_file)) << rank_file;
  EXPECT_TRUE(bytes(root + "/async/step_00000004/metadata.json") == bytes(root + "/by_n/step_00000004/metadata.json"));
  EXPECT_TRUE(std::filesystem::is_directory(root + "/async/step_00000002"));
  comm->barrier();
  if (r == 0) std::filesystem::remove_all(root);
  std::filesystem::remove(corpus);
}

TEST(ShardedInit, IdenticalForAnyNumberOfRanks) {
  auto comm = dist::make_mpi_world();
  model::LlamaConfig c;
  c.vocab_size = 37;
  c.dim = 24;
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.ffn_dim = 30;
  c.max_seq_len = 8;
  c.attention_bias = true;
  model::Llama resident(c, DType::kF32);
  resident.init_random(99);

  const model::ModelLayout layout = model::ModelLayout::llama(c, comm->world_size());
  fsdp::ShardedUnitStore store(layout, comm.get(), {});
  store.init_random(99, c.init_std);
  for (size_t u = 0; u < layout.units().size(); ++u) {
    const Tensor full = store.acquire_params(u, model::Pass::kEval);
    for (const model::ParamSpec& p : layout.units()[u].params)
      EXPECT_TRUE(testing::all_close(full.flat_range(p.offset, p.numel()).view(p.shape), resident.param(p.name),
                                     testing::kExact))
          << p.name << " with " << comm->world_size() << " ranks";
    store.release_params(u, model::Pass::kEval);
  }
  EXPECT_EQ(store.gathered_units(), 0);
}

TEST(ShardedInit, HfLoadingReadsOnlyOwnRangesAndEqualsUnsharded) {
  auto comm = dist::make_mpi_world();
  const std::string dir = testing::source_dir() + "/tests/model/hf_reference/qwen2_bias";
  const model::LlamaConfig c = model::load_hf_config(dir + "/config.json");
  const io::HfWeights weights(dir);
  const model::ModelLayout layout = model::ModelLayout::llama(c, comm->world_size());
  fsdp::ShardedUnitStore store(layout, comm.get(), {});
  int64_t elements_read = 0;
  store.load([&](const model::ParamSpec& p, int64_t first, Tensor& out) {
    elements_read += out.numel();
    weights.read_range(p.name, first, out);
  });
  // every rank reads at most its slice of each unit
  int64_t slice_total = 0;
  for (const model::UnitLayout& u : layout.units()) slice_total += u.shard_numel();
  EXPECT_LE(elements_read, slice_total);
  for (size_t u = 0; u < layout.units().size(); ++u) {
    const Tensor full = store.acquire_params(u, model::Pass::kEval);
    for (const model::ParamSpec& p : layout.units()[u].params)
      EXPECT_TRUE(testing::all_close(full.flat_range(p.offset, p.numel()).view(p.shape),
                                     weights.files().front()->read_as(p.name, DType::kF32), testing::kExact))
          << p.name;
    store.release_params(u, model::Pass::kEval);
  }
}

TEST(ShardedInit, HfLoadingByRankZeroEqualsRanges) {
  auto comm = dist::make_mpi_world();
  const std::string dir = testing::source_dir() + "/tests/model/hf_reference/gqa_untied";
  const model::LlamaConfig c = model::load_hf_config(dir + "/config.json");
  const model::ModelLayout layout = model::ModelLayout::llama(c, comm->world_size());
  // only rank 0 opens the folder, as when the other ranks cannot see it
  std::unique_ptr<io::HfWeights> weights;
  if (comm->rank() == 0) weights = std::make_unique<io::HfWeights>(dir);
  fsdp::ShardedUnitStore by_root(layout, comm.get(), {});
  int calls = 0;
  by_root.load_from_rank0([&](const model::ParamSpec& p, int64_t first, Tensor& out) {
    ++calls;
    weights->read_range(p.name, first, out);
  });
  if (comm->rank() != 0) {
    EXPECT_EQ(calls, 0);
  }
  const io::HfWeights mine(dir);
  fsdp::ShardedUnitStore by_ranges(layout, comm.get(), {});
  by_ranges.load([&](const model::ParamSpec& p, int64_t first, Tensor& out) { mine.read_range(p.name, first, out); });
  for (size_t u = 0; u < layout.units().size(); ++u) {
    EXPECT_TRUE(testing::all_close(by_root.master_shards()[u], by_ranges.master_shards()[u], testing::kExact))
        << layout.units()[u].name << " on rank " << comm->rank();
  }
}

}  // namespace
}  // namespace shardtrain
