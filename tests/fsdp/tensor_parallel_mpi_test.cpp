// Tensor parallelism under mpirun (2, 3 and 4 ranks): a block's heads and FFN columns split
// over a group, with the token rows between its products split too (sequence parallelism),
// computes what one rank computes. The model in f64 against the resident model (loss, every
// gradient, held-out loss, logits, the KV cache's steps); the trainer on a data-parallel x
// tensor-parallel mesh against one rank with the whole batch (f32, 1e-5), with checkpoints
// that cross meshes, HF loading and export. With QK-norm the heads' norms are local and their
// weights, whole on every rank, get the group's summed gradient; so do Gemma's norms around each
// sublayer and OLMo 2-style norms after them (with Gemma 2's soft caps too).
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "core/random.h"
#include "dist/mpi_communicator.h"
#include "fsdp/sharded_store.h"
#include "fsdp/tensor_parallel.h"
#include "io/hf_folder.h"
#include "io/safetensors.h"
#include "model/hf_config.h"
#include "model/kv_cache.h"
#include "model/llama.h"
#include "ops/attention.h"
#include "ops/elementwise.h"
#include "optim/adamw.h"
#include "testing/compare.h"
#include "testing/mesh_jobs.h"
#include "testing/shard_parts.h"
#include "testing/shared_data.h"
#include "testing/training_curves.h"
#include "train/checkpoint.h"
#include "train/export.h"
#include "train/trainer.h"

namespace shardtrain {
namespace {

// f64 on both sides: the group's partial sums add the same products in another order.
constexpr testing::Tolerance kRanksF64{1e-12, 1e30, 1e30};

using testing::copy_of;
using testing::expect_parts_match;

// Ranks per tensor-parallel group in the trainer tests: 2 where it divides the run, else all.
int group_size(int world) { return world % 2 == 0 ? 2 : world; }

struct ModelVariant {
  const char* name;
  bool tie = false, bias = false, separate = false;
  model::ActivationCheckpointing checkpointing = model::ActivationCheckpointing::kNone;
  int64_t mlp_chunk = 0;
  bool documents = false;  // rows packed with documents that attend only to themselves
  int64_t head_dim = 0;    // 0: dim / n_heads (4)
  bool qk_norm = false;    // Qwen3's per-head norms of q and k, their weights whole on every rank
  int64_t window = 0;      // > 0: a sliding window of this many positions on layer 0 (layer 1 full)
  bool nope = false;       // SmolLM3's NoPE layers: layer 1 without rope
  bool granite = false;    // Granite's embedding, residual, attention and logits scalings
  bool gemma = false;      // Gemma 3's norms around each sublayer ((1 + w), QK-norm), GeGLU, scaled embeddings
  bool caps = false;       // with gemma: Gemma 2's soft-capped attention scores and logits
  bool post_norms = false; // OLMo 2's norms after each sublayer (per-head QK-norm beside them)
};

model::LlamaConfig small_config(int world, const ModelVariant& v) {
  model::LlamaConfig c;
  c.vocab_size = 97;
  c.dim = 48;
  c.n_layers = 2;
  c.n_heads = 12;                         // 12 / (2, 3, 4) query heads per rank
  c.n_kv_heads = world == 3 ? 3 : 4;      // grouped: 4 or 3 query heads per kv head
  c.ffn_dim = 36;
  c.max_seq_len = 16;
  c.tie_embeddings = v.tie;
  c.attention_bias = v.bias;
  c.head_dim_override = v.head_dim;
  c.qk_norm = v.qk_norm;
  if (v.window > 0) {
    c.sliding_window = v.window;
    c.sliding_layers = {true, false};
  }
  if (v.nope) c.nope_layers = {false, true};
  if (v.granite) {
    c.embedding_multiplier = 3.0;
    c.residual_multiplier = 0.4;
    c.attention_multiplier = 0.3;
    c.logits_scaling = 2.5;
  }
  if (v.gemma) {
    c.norm_weight_offset = 1.0;
    c.sandwich_norms = true;
    c.mlp_activation = ops::GluActivation::kGeluTanh;
    c.scale_embeddings = true;
    c.attention_multiplier = 0.35;  // query_pre_attn_scalar^-1/2 of its own
  }
  if (v.caps) {
    c.attn_logit_softcapping = 2.0;
    c.final_logit_softcapping = 3.0;
  }
  c.post_norms = v.post_norms;
  return c;
}

// The whole group is one tensor-parallel group (data parallel 1): its model in f64 gives the
// resident model's loss, gradients, held-out loss, logits and cached decoding.
TEST(TensorParallel, ModelMatchesOneRankInF64) {
  auto comm = dist::make_mpi_world();
  const int r = comm->rank(), w = comm->world_size();
  const model::Mesh shape{1, w};
  fsdp::DeviceMesh mesh(comm.get(), shape);
  auto tp = fsdp::make_tensor_parallel(&mesh.tensor_parallel());
  const ModelVariant variants[] = {
      {"plain"},
      {"tied, biased", true, true},
      {"separate projections", false, false, true},
      {"full checkpointing, MLP by pieces", false, true, false, model::ActivationCheckpointing::kFull, 5},
      {"selective checkpointing", true, false, false, model::ActivationCheckpointing::kSelective},
      {"pointwise checkpointing", false, false, false, model::ActivationCheckpointing::kPointwise},
      {"packed documents", false, true, false, model::ActivationCheckpointing::kFull, 0, true},
      {"heads of 6 (attention 72 wide in a width of 48)", false, true, false, model::ActivationCheckpointing::kNone, 0,
       false, 6},
      {"QK-norm", false, false, false, model::ActivationCheckpointing::kNone, 0, false, 0, true},
      {"QK-norm, separate projections, full checkpointing", true, false, true, model::ActivationCheckpointing::kFull, 0,
       false, 0, true},
      {"QK-norm, heads of 6, biased, selective checkpointing", false, true, false,
       model::ActivationCheckpointing::kSelective, 0, false, 6, true},
      {"QK-norm, packed documents", false, false, false, model::ActivationCheckpointing::kPointwise, 0, true, 0, true},
      {"sliding window of 3 on layer 0", true, false, false, model::ActivationCheckpointing::kNone, 0, false, 0, false,
       3},
      {"sliding window of 4 on layer 0, packed documents", false, true, false, model::ActivationCheckpointing::kFull, 0,
       true, 0, false, 4},
      {"no rope on layer 1", true, false, false, model::ActivationCheckpointing::kNone, 0, false, 0, false, 0, true},
      // (no k bias: without rope its gradient is zero, q·b the same for every key, and only rounding remains)
      {"no rope on layer 1, packed documents, selective checkpointing", false, false, false,
       model::ActivationCheckpointing::kSelective, 0, true, 0, false, 0, true},
      {"Granite's scalings", false, true, false, model::ActivationCheckpointing::kNone, 0, false, 0, false, 0, false,
       true},
      {"Granite's scalings, full checkpointing, MLP by pieces", true, false, true,
       model::ActivationCheckpointing::kFull, 5, false, 0, false, 0, false, true},
      {.name = "Gemma 3's norms, GeGLU and QK-norm, sliding layer 0", .tie = true, .qk_norm = true, .window = 4,
       .gemma = true},
      {.name = "Gemma 3's norms, full checkpointing, MLP by pieces, packed documents",
       .separate = true,
       .checkpointing = model::ActivationCheckpointing::kFull,
       .mlp_chunk = 5,
       .documents = true,
       .qk_norm = true,
       .gemma = true},
      {.name = "Gemma 2's soft caps, selective checkpointing", .tie = true,
       .checkpointing = model::ActivationCheckpointing::kSelective, .gemma = true, .caps = true},
      {.name = "OLMo 2's norms after each sublayer", .bias = true, .qk_norm = true, .post_norms = true},
      {.name = "OLMo 2's norms, pointwise checkpointing", .checkpointing = model::ActivationCheckpointing::kPointwise,
       .post_norms = true},
  };
  for (const ModelVariant& v : variants) {
    SCOPED_TRACE(std::string(v.name) + ", " + std::to_string(w) + " ranks");
    const model::LlamaConfig c = small_config(w, v);
    model::Llama ref(c, DType::kF64);
    ref.init_random(5);
    ref.zero_grads();
    // the norms' weights away from their initial ones, so that each one's scale matters
    const bool norms_moved = v.qk_norm || v.gemma || v.post_norms;
    if (v.qk_norm) {
      for (int l = 0; l < c.n_layers; ++l)
        for (const char* which : {"q_norm", "k_norm"}) {
          Tensor weight = ref.param(fmt::format("model.layers.{}.self_attn.{}.weight", l, which));
          testing::fill_random(weight, 40 + l, 1.0, 0.5);
        }
    }
    if (v.gemma || v.post_norms) {
      std::vector<const char*> norms = {"post_attention_layernorm", "post_feedforward_layernorm"};
      if (v.gemma) norms.push_back("pre_feedforward_layernorm");
      for (int l = 0; l < c.n_layers; ++l)
        for (size_t i = 0; i < norms.size(); ++i) {
          Tensor weight = ref.param(fmt::format("model.layers.{}.{}.weight", l, norms[i]));
          testing::fill_random(weight, static_cast<uint64_t>(60 + 10 * l) + i, v.gemma ? 0.0 : 1.0, 0.5);
        }
    }
    const model::ModelLayout layout = model::ModelLayout::llama(c, shape, r);
    fsdp::ShardingOptions so;
    so.compute_dtype = so.grad_dtype = so.master_dtype = so.reduce_dtype = DType::kF64;
    fsdp::ShardedUnitStore store(layout, comm.get(), so, Device::cpu(), &mesh.data_parallel());
    store.init_random(5, c.init_std);
    if (norms_moved)  // the resident model's weights, its norms' changed ones included
      store.load([&](const model::ParamSpec& p, int64_t first, Tensor& dst) {
        copy(dst, ref.param(p.name).view({p.full_numel()}).flat_range(first, dst.numel()));
      });
    model::Llama m(c, layout, &store, DType::kF64, Device::cpu());
    m.set_tensor_parallel(tp.get());
    ref.set_separate_projections(v.separate);
    m.set_separate_projections(v.separate);
    ref.set_mlp_chunk_tokens(v.mlp_chunk);
    m.set_mlp_chunk_tokens(v.mlp_chunk);

    // the same batch on every rank; some targets ignored. 4 sequences: 2 ranks hold 2 whole
    // sequences each (attention by pieces splits a rank's own), 4 ranks one, 3 ranks split them
    const int64_t B = 4, T = 12;
    Tensor ids = Tensor::empty({B, T}, DType::kI32), targets = Tensor::empty({B, T}, DType::kI32);
    testing::fill_random_ints(ids, 11, 0, c.vocab_size);
    testing::fill_random_ints(targets, 12, 0, c.vocab_size);
    targets.data<int32_t>()[3] = targets.data<int32_t>()[17] = -100;
    Tensor positions;  // documents start at token 96 (BOS): rope positions from each one's start
    if (v.documents) {
      for (const int at : {4, 9, 15, 20}) ids.data<int32_t>()[at] = 96;
      positions = ops::document_positions(ids, 96);
    }
    model::StepOptions o;
    o.checkpointing = v.checkpointing;
    o.grad_scale = 1.0 / 22;
    const model::LossSum want = ref.forward_backward(ids, targets, o, positions);
    store.zero_grad_shards();
    const model::LossSum got = m.forward_backward(ids, targets, o, positions);
    Tensor sums = Tensor::empty({2}, DType::kF64);
    sums.data<double>()[0] = got.loss_sum;
    sums.data<double>()[1] = static_cast<double>(got.tokens);
    comm->all_reduce(sums, dist::ReduceOp::kSum);  // each rank's share of the rows
    EXPECT_NEAR(sums.data<double>()[0], want.loss_sum, 1e-12 * want.loss_sum);
    EXPECT_EQ(sums.data<double>()[1], static_cast<double>(want.tokens));
    expect_parts_match(store, store.grad_shards(), [&](const std::string& n) { return ref.grad(n); }, kRanksF64,
                       "gradient");
    expect_parts_match(store, store.master_shards(), [&](const std::string& n) { return ref.param(n); },
                       testing::kExact, "initial weights");

    if (v.documents) {  // the documents' own held-out loss; the rest needs no documents
      const model::LossSum e = m.evaluate(ids, targets, o, positions);
      const model::LossSum e_ref = ref.evaluate(ids, targets, o, positions);
      sums.data<double>()[0] = e.loss_sum;
      comm->all_reduce(sums, dist::ReduceOp::kSum);
      EXPECT_NEAR(sums.data<double>()[0], e_ref.loss_sum, 1e-12 * e_ref.loss_sum);
      continue;
    }
    // held-out loss: rows split over the group, and (B·T not divisible) every row on every rank
    const model::LossSum eval_want = ref.evaluate(ids, targets, o);
    for (int64_t t : {T, T - 1}) {
      const Tensor ids_t = copy_of(ids.slice(1, 0, t)), targets_t = copy_of(targets.slice(1, 0, t));
      const model::LossSum e = m.evaluate(ids_t, targets_t, o);
      const model::LossSum e_ref = t == T ? eval_want : ref.evaluate(ids_t, targets_t, o);
      sums.data<double>()[0] = e.loss_sum;
      sums.data<double>()[1] = static_cast<double>(e.tokens);
      comm->all_reduce(sums, dist::ReduceOp::kSum);
      EXPECT_NEAR(sums.data<double>()[0], e_ref.loss_sum, 1e-12 * e_ref.loss_sum) << "T = " << t;
      EXPECT_EQ(sums.data<double>()[1], static_cast<double>(e_ref.tokens)) << "T = " << t;
    }

    // every rank gets all the logits, and the KV cache holds its share of the kv heads
    EXPECT_TRUE(testing::all_close(m.logits(ids), ref.logits(ids), kRanksF64));
    model::KvCache cache(c, 1, 10, DType::kF64, Device::cpu(), m.kv_heads_per_rank());
    model::KvCache ref_cache(c, 1, 10, DType::kF64, Device::cpu());
    EXPECT_EQ(cache.keys(0).size(2), c.n_kv_heads / w);
    const Tensor prompt = copy_of(ids.slice(0, 0, 1).slice(1, 0, 5));
    EXPECT_TRUE(testing::all_close(m.last_logits_cached(prompt, cache), ref.last_logits_cached(prompt, ref_cache),
                                   kRanksF64));
    for (int64_t p = 5; p < 7; ++p) {
      const Tensor one = copy_of(ids.slice(0, 1, 2).slice(1, p, p + 1));
      EXPECT_TRUE(testing::all_close(m.last_logits_cached(one, cache), ref.last_logits_cached(one, ref_cache),
                                     kRanksF64))
          << "position " << p;
    }
  }
}

TEST(TensorParallel, RejectsWhatDoesNotSplit) {
  auto comm = dist::make_mpi_world();
  const int r = comm->rank(), w = comm->world_size();
  fsdp::DeviceMesh mesh(comm.get(), model::Mesh{1, w});
  auto tp = fsdp::make_tensor_parallel(&mesh.tensor_parallel());
  model::LlamaConfig c = small_config(w, {"plain"});
  c.n_kv_heads = 1;
  EXPECT_TRUE(testing::throws_with([&] { (void)model::ModelLayout::llama(c, model::Mesh{1, w}, r); },
                                   "must divide the model's query heads (12), key/value heads (1)"));
  // OLMo 2's QK-norm over the whole q and k needs every head, which the ranks split
  c = small_config(w, {"plain"});
  c.post_norms = c.qk_norm_whole = true;
  if (w > 1) {
    EXPECT_TRUE(testing::throws_with(
        [&] {
          (void)model::ModelLayout::llama(c, model::Mesh{1, w}, r);
        },
        "with OLMo 2's QK-norm over the whole q and k"));
  }
  c = small_config(w, {"plain"});
  const model::ModelLayout layout = model::ModelLayout::llama(c, model::Mesh{1, w}, r);
  fsdp::ShardedUnitStore store(layout, comm.get(), {}, Device::cpu(), &mesh.data_parallel());
  store.init_random(1, c.init_std);
  model::Llama m(c, layout, &store, DType::kF32, Device::cpu());
  m.set_tensor_parallel(tp.get());
  // 1 x 13 rows do not split over 2, 3 or 4 ranks
  Tensor ids = Tensor::empty({1, 13}, DType::kI32), targets = Tensor::empty({1, 13}, DType::kI32);
  testing::fill_random_ints(ids, 1, 0, c.vocab_size);
  testing::fill_random_ints(targets, 2, 0, c.vocab_size);
  EXPECT_TRUE(testing::throws_with([&] { (void)m.forward_backward(ids, targets, {}); },
                                   "make training.batch_size x training.seq_len a multiple of "
                                   "parallel.tensor_parallel"));
}

std::string corpus_file(int rank) { return testing::mesh_corpus_file("tp", rank); }

TEST(TensorParallel, TrainerRejectsAGroupLargerThanTheRun) {
  auto comm = dist::make_mpi_world();
  if (comm->world_size() != 2) GTEST_SKIP() << "a 3-rank group (which the test model allows) on 2 ranks";
  const std::string corpus = corpus_file(comm->rank());
  EXPECT_TRUE(testing::throws_with([&] { train::Trainer t(testing::mesh_job(corpus, 2, 3), comm.get()); },
                                   "`parallel.tensor_parallel` (3) must divide the 2 ranks of this run"));
  std::filesystem::remove(corpus);
}

// A data-parallel x tensor-parallel run trains as one rank with the whole global batch: the
// same losses, gradient norms (replicated norms counted once), held-out loss and weights; the
// group's copies of its replicated parameters stay identical.
TEST(TensorParallel, TrainerMatchesOneRank) {
  auto comm = dist::make_mpi_world();
  const int r = comm->rank(), w = comm->world_size(), tp = group_size(w), dp = w / tp;
  const std::string corpus = corpus_file(r);
  const int64_t B = 2;
  auto single = dist::make_single_rank();
  train::JobConfig one = testing::mesh_job(corpus, B * dp, tp);
  one.parallel.tensor_parallel = 1;
  train::Trainer ref(one, single.get());
  const train::TrainSummary a = ref.run();
  // with QK-norm: the q_norm / k_norm weights whole on every rank, like the block's norms
  train::JobConfig one_qk = one;
  one_qk.model.qk_norm = true;
  train::Trainer ref_qk(one_qk, single.get());
  const train::TrainSummary a_qk = ref_qk.run();

  struct Case {
    const char* checkpointing;
    bool qk_norm;
  };
  for (const Case k : {Case{"none", false}, Case{"full", false}, Case{"selective", true}}) {
    const char* checkpointing = k.checkpointing;
    SCOPED_TRACE(std::string(checkpointing) + " checkpointing" + (k.qk_norm ? ", QK-norm, " : ", ") +
                 std::to_string(dp) + " x " + std::to_string(tp));
    train::JobConfig c = testing::mesh_job(corpus, B, tp);
    c.training.activation_checkpointing = checkpointing;
    c.model.qk_norm = k.qk_norm;
    train::Trainer t(c, comm.get());
    EXPECT_EQ(t.mesh().shape().tensor_parallel, tp);
    const train::TrainSummary b = t.run();
    EXPECT_TRUE(testing::expect_same_curves(k.qk_norm ? a_qk : a, b, 1e-5, 0.5))
        << "the test should exercise clipping";
    const fsdp::ShardedUnitStore& ref_store = k.qk_norm ? ref_qk.store() : ref.store();
    expect_parts_match(
        t.store(), t.store().master_shards(),
        [&](const std::string& n) {
          const model::ModelLayout::Location loc = ref_store.layout().locate(n);
          return ref_store.master_shards()[static_cast<size_t>(loc.unit)].flat_range(loc.spec->offset,
                                                                                      loc.spec->numel());
        },
        testing::kRanksF32, "trained weights");

    // the group's copies of a block's norms (QK-norm's too): bitwise the same on every rank of it
    const model::ModelLayout& layout = t.store().layout();
    for (size_t u = 0; u < layout.units().size(); ++u)
      for (const model::ShardRange& s : model::shard_ranges(layout.units()[u], t.store().unit_comm(u).rank())) {
        if (!s.spec->replicated) continue;
        Tensor mine = copy_of(t.store().master_shards()[u].flat_range(s.shard_offset, s.count));
        Tensor all = Tensor::empty({tp * s.count}, mine.dtype());
        t.mesh().tensor_parallel().all_gather(all, mine);
        for (int q = 1; q < tp; ++q)
          EXPECT_TRUE(testing::all_close(all.flat_range(q * s.count, s.count), mine, testing::kExact))
              << s.spec->name << " on group rank " << q;
      }
  }
  std::filesystem::remove(corpus);
}

// FP8 products under tensor parallelism: each rank quantises its part of a weight (tensorwise:
// from the part's own amax) and of the output gradients, so the run is one rank's computation
// only where every part's amax lies in the same power of two as the whole tensor's (the scales
// are powers of two); elsewhere a part's codes differ by FP8 rounding. Measured on 2 and 4
// ranks in groups of 2 and on 3 in a group of 3: within 1.3e-5 of one rank's loss over 12 steps.
// The bounds allow FP8 rounding differences: 1e-3 at the first step, 5 % at the last.
TEST(TensorParallel, Fp8TrainsNearOneRank) {
  auto comm = dist::make_mpi_world();
  const int r = comm->rank(), w = comm->world_size(), tp = group_size(w), dp = w / tp;
  const std::string corpus = corpus_file(r);
  // 6 heads of 16 and an FFN of 96: every rank's widths are multiples of 16 in groups of 2 or 3
  auto fp8_job = [&](int64_t batch, int group) {
    train::JobConfig c = testing::mesh_job(corpus, batch, group);
    c.model.dim = 96;
    c.model.n_kv_heads = tp == 3 ? 3 : 2;
    c.model.ffn_dim = 96;
    c.training.fp8 = "tensorwise";
    return c;
  };
  train::JobConfig one = fp8_job(2 * dp, tp);
  one.parallel.tensor_parallel = 1;
  auto single = dist::make_single_rank();
  const train::TrainSummary a = train::Trainer(one, single.get()).run();
  const train::TrainSummary b = train::Trainer(fp8_job(2, tp), comm.get()).run();
  ASSERT_EQ(a.steps.size(), b.steps.size());
  for (size_t i = 0; i < a.steps.size(); ++i)
    if (r == 0)
      std::printf("%d x %d, step %zu: loss %.5f (one rank %.5f, %+.2e)\n", dp, tp, i + 1, b.steps[i].loss,
                  a.steps[i].loss, b.steps[i].loss / a.steps[i].loss - 1);
  EXPECT_NEAR(b.steps[0].loss, a.steps[0].loss, 1e-3 * a.steps[0].loss) << "the first step";
  EXPECT_NEAR(b.steps.back().loss, a.steps.back().loss, 0.05 * a.steps.back().loss) << "the last step";
  EXPECT_LT(b.steps.back().loss, b.steps.front().loss - 0.5) << "it learns";
  std::filesystem::remove(corpus);
}

// Checkpoints cross meshes: written by a 2-D run (its row-parallel parts as strided pieces)
// they load on one rank; written by one rank they load on the 2-D mesh; a 2-D run resumed
// from its checkpoint continues as it would have. The export joins the parts into whole
// tensors, equal to the checkpoint's.
TEST(TensorParallel, CheckpointsAndExportCrossMeshes) {
  auto comm = dist::make_mpi_world();
  const int r = comm->rank(), w = comm->world_size(), tp = group_size(w);
  const std::string corpus = corpus_file(r);
  const std::string root =
      (std::filesystem::temp_directory_path() / ("shardtrain_tp_ckpt_np" + std::to_string(w))).string();
  if (r == 0) std::filesystem::remove_all(root);
  comm->barrier();

  train::JobConfig c = testing::mesh_job(corpus, 2, tp);
  c.training.steps = 6;
  c.checkpoint.interval_steps = 3;
  c.checkpoint.keep = 0;
  c.checkpoint.dir = root + "/tp";
  c.export_.folder = root + "/export";
  c.export_.dtype = "f32";
  train::Trainer straight(c, comm.get());
  const train::TrainSummary all = straight.run();
  comm->barrier();

  // one rank reads what the group wrote
  const train::CheckpointInfo info = train::read_checkpoint_info(root + "/tp/step_00000006");
  EXPECT_EQ(info.world_size, w);
  // `shardtrain inspect` finds every element once among the strided pieces
  const std::string report = train::checkpoint_report(root + "/tp/step_00000006").text;
  EXPECT_NE(report.find("complete: master weights, AdamW m and v of all"), std::string::npos) << report;
  EXPECT_NE(report.find(fmt::format("written by {} rank", w)), std::string::npos) << report;
  const testing::OneRankCopy one_rank = testing::load_on_one_rank(info);
  const model::ModelLayout& one = *one_rank.layout;
  const auto whole = one_rank.params();
  expect_parts_match(straight.store(), straight.store().master_shards(), whole, testing::kExact, "2-D -> 1");
  expect_parts_match(straight.store(), straight.optimizer().exp_avg(), one_rank.state(one_rank.optimizer->exp_avg()),
                     testing::kExact, "2-D -> 1, exp_avg");
  expect_parts_match(straight.store(), straight.optimizer().exp_avg_sq(),
                     one_rank.state(one_rank.optimizer->exp_avg_sq()), testing::kExact, "2-D -> 1, exp_avg_sq");

  // the export holds the same whole tensors
  const io::HfWeights exported(root + "/export");
  for (const model::UnitLayout& u : one.units())
    for (const model::ParamSpec& p : u.params)
      EXPECT_TRUE(testing::all_close(exported.files().front()->read_as(p.name, DType::kF32).view({p.numel()}),
                                     whole(p.name), testing::kExact))
          << "exported " << p.name;

  // one rank writes it again; the 2-D mesh loads that
  if (r == 0)
    train::save_checkpoint(root + "/one", 6, info.config, "", *one_rank.store, one_rank.optimizer.get(),
                           *one_rank.comm, 0);
  comm->barrier();
  fsdp::ShardedUnitStore reloaded(straight.store().layout(), comm.get(), {}, Device::cpu(),
                                  &straight.mesh().data_parallel());
  train::load_checkpoint(train::read_checkpoint_info(root + "/one/step_00000006"), reloaded, nullptr);
  expect_parts_match(reloaded, reloaded.master_shards(), whole, testing::kExact, "1 -> 2-D");

  // resumed at step 3, the 2-D run continues with the same losses
  testing::expect_resume_continues(c, root + "/tp/step_00000003", root + "/resumed", all, comm.get());
  comm->barrier();
  if (r == 0) std::filesystem::remove_all(root);
  std::filesystem::remove(corpus);
}

// A Hugging Face folder loads into the group's parts, by ranges or through rank 0.
TEST(TensorParallel, HfLoadingFillsEachRanksPart) {
  auto comm = dist::make_mpi_world();
  const int w = comm->world_size();
  if (w % 2 != 0) GTEST_SKIP() << "the reference folder's 4 heads, 2 kv heads and FFN 40 split over 2 ranks";
  const model::Mesh shape{w / 2, 2};
  fsdp::DeviceMesh mesh(comm.get(), shape);
  const std::string dir = testing::source_dir() + "/tests/model/hf_reference/qwen2_bias";
  const model::LlamaConfig c = model::load_hf_config(dir + "/config.json");
  testing::expect_hf_loading_fills_shards(model::ModelLayout::llama(c, shape, mesh.tp_rank()), mesh, dir);
}

}  // namespace
}  // namespace shardtrain
