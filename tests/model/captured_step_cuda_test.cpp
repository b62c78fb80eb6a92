// The captured step (one CUDA graph per micro-batch) against the eager step on the same
// model state: equal losses (the forward's kernels are the same and deterministic), equal
// gradients up to the attention backward's atomic-order noise, over several steps with
// AdamW updates between them, so each replay must read the updated weights and accumulate
// into the same gradient buffers. Selective and full activation checkpointing (one captured,
// one eager) follow the step that keeps every activation the same way. Skips without a
// device.
#include <cmath>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "core/random.h"
#include "dist/communicator.h"
#include "fsdp/sharded_store.h"
#include "model/captured_step.h"
#include "model/llama.h"
#include "ops/elementwise.h"
#include "optim/adamw.h"
#include "testing/compare.h"
#include "testing/cuda_util.h"
#include "testing/gpu_engine.h"
#include "testing/model_shapes.h"

namespace shardtrain::model {
namespace {

using Engine = testing::GpuEngine;
using testing::random_batch;

LlamaConfig small_config(bool tied) { return testing::small_gqa(tied); }

// Every gradient shard of `got` within 2e-3 relative norm of `want`'s: the attention
// backward's atomic-order noise after step `step`.
void expect_grads_near(const Engine& got, const Engine& want, int step) {
  for (size_t u = 0; u < want.layout.units().size(); ++u)
    EXPECT_TRUE(testing::all_close(testing::to_host(got.store->grad_shards()[u]),
                                   testing::to_host(want.store->grad_shards()[u]),
                                   testing::Tolerance{2e-3, 1e30, 1e30}))  // relative norm alone
        << "step " << step << " unit " << u;
}

// Also as the trainer runs it (overwrite): the graph writes its gradients over the last
// step's, never cleared, while the eager step clears them and adds.
void replays_follow_the_eager_step(bool overwrite) {
  SCOPED_TRACE(overwrite ? "graph overwrites the gradients" : "graph adds to cleared gradients");
  const LlamaConfig c = small_config(true);
  const int64_t B = 2, T = 128;  // a different gradient scale every step reaches the graph
  Engine eager(c), graph(c);
  StepOptions o;
  o.grad_scale = 1.0 / static_cast<double>(B * T);
  o.loss_chunk_tokens = 96;  // several chunks, the last one short
  StepOptions graph_options = o;
  graph_options.overwrite_grads = overwrite;
  CapturedStep step(*graph.model, B, T, graph_options);
  CounterRng rng(5);
  Tensor ids = Tensor::empty({B, T}, DType::kI32), targets = Tensor::empty({B, T}, DType::kI32);
  for (int s = 0; s < 5; ++s) {
    random_batch(rng, ids, targets, 1000, 17);
    o.grad_scale = 1.0 / static_cast<double>(B * T - s * 7);
    eager.store->zero_grad_shards();
    if (!overwrite) graph.store->zero_grad_shards();
    const LossSum a = eager.model->forward_backward(ids, targets, o);
    const LossSum b = step.run(ids, targets, o.grad_scale);
    EXPECT_EQ(step.captured(), s >= 1) << "step " << s;
    EXPECT_EQ(a.tokens, b.tokens);
    EXPECT_NEAR(b.loss_sum, a.loss_sum, 1e-5 * a.loss_sum) << "step " << s;
    EXPECT_GT(graph.model->last_phase_times().backward_s, 0.0) << "phase events inside the graph";
    expect_grads_near(graph, eager, s);
    eager.update();
    graph.update();
  }
}

TEST(CapturedStepCuda, ReplaysFollowTheEagerStep) {
  ST_REQUIRE_CUDA();
  replays_follow_the_eager_step(false);
  replays_follow_the_eager_step(true);
}

// Recomputation runs the forward's kernels on the forward's inputs, so the losses are equal
// and the gradients differ only by the attention backward's atomic-order noise. Pointwise
// and selective run as CUDA graphs, full eagerly.
TEST(CheckpointingCuda, EveryPolicyFollowsNone) {
  ST_REQUIRE_CUDA();
  const LlamaConfig c = small_config(false);
  const int64_t B = 2, T = 128;
  StepOptions o;
  o.grad_scale = 1.0 / static_cast<double>(B * T);
  o.loss_chunk_tokens = 96;
  Engine none(c);
  struct Policy {
    ActivationCheckpointing ac;
    bool graph;
    std::unique_ptr<Engine> engine;  // not moved: the model refers to the engine's layout
    StepOptions options;
    std::unique_ptr<CapturedStep> step;
  };
  std::vector<std::unique_ptr<Policy>> policies;
  for (auto [ac, graph] : {std::pair{ActivationCheckpointing::kPointwise, true},
                           {ActivationCheckpointing::kSelective, true}, {ActivationCheckpointing::kFull, false}}) {
    auto p = std::make_unique<Policy>(Policy{ac, graph, std::make_unique<Engine>(c), o, nullptr});
    p->options.checkpointing = ac;
    if (graph) p->step = std::make_unique<CapturedStep>(*p->engine->model, B, T, p->options);
    policies.push_back(std::move(p));
  }
  CounterRng rng(9);
  Tensor ids = Tensor::empty({B, T}, DType::kI32), targets = Tensor::empty({B, T}, DType::kI32);
  for (int s = 0; s < 3; ++s) {
    random_batch(rng, ids, targets);
    none.store->zero_grad_shards();
    const LossSum a = none.model->forward_backward(ids, targets, o);
    for (auto& p : policies) {
      const char* name = checkpointing_name(p->ac);
      p->engine->store->zero_grad_shards();
      const LossSum b = p->graph ? p->step->run(ids, targets, o.grad_scale)
                                 : p->engine->model->forward_backward(ids, targets, p->options);
      EXPECT_NEAR(b.loss_sum, a.loss_sum, 1e-5 * a.loss_sum) << name << ", step " << s;
      {
        SCOPED_TRACE(name);
        expect_grads_near(*p->engine, none, s);
      }
      p->engine->update();
    }
    none.update();
  }
}

// Compute shards (parallel.compute_shards): on one GPU the graph reads AdamW's bf16 copies of
// the masters in place instead of casting them each step. They hold exactly what the cast
// would (so the step follows the gathered engine's), also after the masters were written
// from outside (a checkpoint load), which marks them for a fresh cast.
TEST(CapturedStepCuda, ComputeShardsFollowTheCastCopies) {
  ST_REQUIRE_CUDA();
  const LlamaConfig c = small_config(true);
  const int64_t B = 2, T = 128;
  Engine cast_each_step(c), shards(c, testing::bf16_sharding(/*compute_shards=*/true));
  ASSERT_TRUE(shards.store->has_compute_shards());
  StepOptions o;
  o.grad_scale = 1.0 / static_cast<double>(B * T);
  o.loss_chunk_tokens = 96;
  CapturedStep step(*shards.model, B, T, o);
  CounterRng rng(13);
  Tensor ids = Tensor::empty({B, T}, DType::kI32), targets = Tensor::empty({B, T}, DType::kI32);
  auto shards_hold_the_cast = [&](const char* when) {
    for (size_t u = 0; u < shards.layout.units().size(); ++u) {
      const fsdp::ShardedUnitStore& read_only = *shards.store;  // the const overload marks nothing stale
      const Tensor& master = read_only.master_shards()[u];
      Tensor cast_now = Tensor::empty(master.shape(), DType::kBF16, master.device());
      ops::cast(cast_now, master);
      EXPECT_TRUE(testing::all_close(testing::to_host(shards.store->compute_shards()[u]), testing::to_host(cast_now),
                                     testing::kExact))
          << when << ", unit " << u;
    }
  };
  for (int s = 0; s < 4; ++s) {
    random_batch(rng, ids, targets);
    if (s == 2) {  // an outside write of the masters, as a checkpoint load makes
      for (fsdp::ShardedUnitStore* st : {cast_each_step.store.get(), shards.store.get()})
        for (Tensor& m : st->master_shards()) ops::scale(m, 0.5);
    }
    cast_each_step.store->zero_grad_shards();
    shards.store->zero_grad_shards();
    const LossSum a = cast_each_step.model->forward_backward(ids, targets, o);
    const LossSum b = step.run(ids, targets, o.grad_scale);
    EXPECT_NEAR(b.loss_sum, a.loss_sum, 1e-5 * a.loss_sum) << "step " << s;
    if (s == 2) shards_hold_the_cast("after the outside write");
    expect_grads_near(shards, cast_each_step, s);
    cast_each_step.update();
    shards.update();
    shards_hold_the_cast("after an update");
  }
}

// StepOptions::deterministic: the attention backward takes cuDNN's deterministic algorithm,
// so with the heuristic's GEMM algorithms a step repeats bit for bit: two eager engines and a
// captured one (the same kernels), all from the same init, give the same losses and
// gradients over steps with AdamW updates between them. At this size cuDNN's default backward
// happened to repeat too (H100); tests/ops/attention_cuda_test.cpp holds the deterministic
// backward to bitwise repetition at a size where the default does not.
TEST(CapturedStepCuda, DeterministicStepsRepeatBitForBit) {
  ST_REQUIRE_CUDA();
  LlamaConfig c = small_config(false);
  c.max_seq_len = 2048;
  const int64_t B = 2, T = 2048;
  Engine first(c), second(c), graph(c);
  StepOptions o;
  o.grad_scale = 1.0 / static_cast<double>(B * T);
  o.loss_chunk_tokens = 1536;
  o.overwrite_grads = true;
  o.deterministic = true;
  CapturedStep step(*graph.model, B, T, o);
  for (Engine* e : {&first, &second, &graph}) e->store->zero_grad_shards();  // padding, never written
  CounterRng rng(17);
  Tensor ids = Tensor::empty({B, T}, DType::kI32), targets = Tensor::empty({B, T}, DType::kI32);
  for (int s = 0; s < 3; ++s) {
    random_batch(rng, ids, targets, 1000, 23);
    const LossSum a = first.model->forward_backward(ids, targets, o);
    const LossSum b = second.model->forward_backward(ids, targets, o);
    const LossSum g = step.run(ids, targets, o.grad_scale);
    EXPECT_EQ(a.loss_sum, b.loss_sum) << "step " << s;
    EXPECT_EQ(a.loss_sum, g.loss_sum) << "step " << s;
    for (size_t u = 0; u < first.layout.units().size(); ++u) {
      const Tensor ha = testing::to_host(first.store->grad_shards()[u]);
      for (Engine* e : {&second, &graph}) {
        const Tensor he = testing::to_host(e->store->grad_shards()[u]);
        EXPECT_EQ(std::memcmp(ha.raw_data(), he.raw_data(), ha.nbytes()), 0)
            << (e == &second ? "second eager run" : "captured step") << ", step " << s << ", unit " << u;
      }
    }
    first.update();
    second.update();
    graph.update();
  }
}

}  // namespace
}  // namespace shardtrain::model
