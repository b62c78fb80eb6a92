// ZeRO-3 with CPU offload (ShardingOptions::offload) against the same store with its shards
// on the GPU: the weights, gradients and AdamW state live in page-locked host memory, every
// unit comes up for each use and every gradient shard goes down, and AdamW runs on the host
// in f32. Both engines start from the same master weights, so the first step's losses and
// gradients agree bit for bit (deterministic attention backward). The host AdamW rounds a
// few weights differently from the kernel (contracted multiply-adds on the GPU: 1e-8 of the
// masters, under 1e-6 of the bf16 copies), and one flipped bf16 weight changes roundings
// all through a bf16 forward and backward, so from the second step the gradients differ at
// bf16's precision (measured on an H100: 2e-3 to 7e-3 relative norm) while a lost or doubled
// update would move the weights by ~lr against weights of ~0.02 (5 %). With two
// micro-batches the second gradient lands in a host buffer and is added there. The GPU
// engine's own gradients, written over the last step's as the trainer does, equal a
// zero-filled and accumulated engine's bit for bit at every step. Skips without a device.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>
#include <vector>

#include <gtest/gtest.h>

#include "core/random.h"
#include "dist/communicator.h"
#include "fsdp/sharded_store.h"
#include "model/llama.h"
#include "optim/adamw.h"
#include "optim/clip.h"
#include "testing/compare.h"
#include "testing/cuda_util.h"
#include "testing/gpu_engine.h"
#include "testing/model_shapes.h"

namespace shardtrain::fsdp {
namespace {

struct Engine : testing::GpuEngine {
  Engine(const model::LlamaConfig& c, bool offload) : GpuEngine(c, testing::bf16_sharding(true, offload)) {}
  Engine(const model::LlamaConfig& c, const ShardingOptions& so) : GpuEngine(c, so) {}
  // As the trainer: grad-norm clipping at 0.5 (every step of this test clips), then AdamW.
  double update() {
    const double norm = optim::global_grad_norm(store->optimizer_targets().grads, comm.get());
    GpuEngine::update(optim::clip_coefficient(norm, 0.5));
    synchronize(Device::cuda(0));
    return norm;
  }
};

model::LlamaConfig small_config() { return testing::small_gqa(true); }

// sqrt(sum (a - b)^2) / sqrt(sum b^2) over two host tensors of any float dtype.
double rel_norm(const Tensor& a, const Tensor& b) {
  const Tensor x = testing::to_f64(a), y = testing::to_f64(b);
  double num = 0, den = 0;
  for (int64_t i = 0; i < x.numel(); ++i) {
    const double d = x.data<double>()[i] - y.data<double>()[i];
    num += d * d;
    den += y.data<double>()[i] * y.data<double>()[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

void random_batch(CounterRng& rng, Tensor& ids, Tensor& targets) {
  for (int64_t i = 0; i < ids.numel(); ++i) {
    ids.data<int32_t>()[i] = static_cast<int32_t>(rng.next_below(1000));
    targets.data<int32_t>()[i] = i % 23 == 0 ? -100 : static_cast<int32_t>(rng.next_below(1000));
  }
}

// One optimizer step of `accum` micro-batches, as the trainer writes the gradients.
double forward_backward(Engine& e, const std::vector<Tensor>& ids, const std::vector<Tensor>& targets,
                        model::StepOptions o, bool zero_fill = false) {
  const model::GradientWrites writes =
      zero_fill ? model::GradientWrites{}
                : model::gradient_writes(false, static_cast<int64_t>(ids.size()), e.store->grads_in_shards());
  if (writes.zero_shards) e.store->zero_grad_shards();
  double loss = 0;
  for (size_t m = 0; m < ids.size(); ++m) {
    o.overwrite_grads = writes.overwrites(static_cast<int64_t>(m));
    loss += e.model->forward_backward(ids[m], targets[m], o).loss_sum;
  }
  return loss;
}

void offload_follows_the_gpu_shards(int64_t accum) {
  SCOPED_TRACE(::testing::Message() << accum << " micro-batch(es)");
  const model::LlamaConfig c = small_config();
  Engine gpu(c, false), host(c, true), zeroed(c, false);
  ASSERT_TRUE(host.store->offloaded());
  ASSERT_TRUE(host.store->shard_device().is_cpu());
  for (size_t u = 0; u < host.layout.units().size(); ++u) {
    ASSERT_TRUE(host.store->master_shards()[u].device().is_cpu()) << "unit " << u;
    ASSERT_TRUE(host.opt->exp_avg()[u].device().is_cpu()) << "unit " << u;
    // the same starting weights (the host drew its own with the CPU kernels)
    copy(host.store->master_shards()[u], gpu.store->master_shards()[u]);
    copy(zeroed.store->master_shards()[u], gpu.store->master_shards()[u]);
  }
  EXPECT_GT(host.store->pinned_bytes(), 0);
  EXPECT_EQ(gpu.store->pinned_bytes(), 0);

  const int64_t B = 2, T = 96;
  model::StepOptions o;
  o.grad_scale = 1.0 / static_cast<double>(B * T * accum);
  o.loss_chunk_tokens = 64;
  o.deterministic = true;  // bitwise-repeatable attention backward: the first step's gradients agree exactly
  CounterRng rng(3);
  std::vector<Tensor> ids, targets;
  for (int64_t m = 0; m < accum; ++m) {
    ids.push_back(Tensor::empty({B, T}, DType::kI32));
    targets.push_back(Tensor::empty({B, T}, DType::kI32));
  }
  for (int step = 0; step < 4; ++step) {
    for (int64_t m = 0; m < accum; ++m) random_batch(rng, ids[static_cast<size_t>(m)], targets[static_cast<size_t>(m)]);
    const double a = forward_backward(gpu, ids, targets, o), b = forward_backward(host, ids, targets, o);
    const double z = forward_backward(zeroed, ids, targets, o, true);
    EXPECT_EQ(z, a) << "step " << step << ": zero-filled and overwritten GPU gradients, losses";
    for (size_t u = 0; u < gpu.layout.units().size(); ++u)
      EXPECT_TRUE(testing::all_close(testing::to_host(gpu.store->grad_shards()[u]),
                                     testing::to_host(zeroed.store->grad_shards()[u]), testing::kExact))
          << "step " << step << " unit " << u << ": overwritten against zero-filled GPU gradients";
    zeroed.update();
    double worst = 0;
    for (size_t u = 0; u < gpu.layout.units().size(); ++u) {
      const Tensor want = testing::to_host(gpu.store->grad_shards()[u]);
      worst = std::max(worst, rel_norm(host.store->grad_shards()[u], want));
      const Tensor& got = host.store->grad_shards()[u];
      // step 0: the same weights and kernels (one micro-batch: bit for bit; two: the second
      // adds on the host instead of in the GPU's epilogues); later, rounding of the update
      const testing::Tolerance tol = step == 0 ? (accum == 1 ? testing::kExact : testing::Tolerance{1e-6, 1e-5, 1e-9})
                                               : testing::Tolerance{1.5e-2, 1e30, 1e30};
      EXPECT_TRUE(testing::all_close(got, want, tol)) << "step " << step << " unit " << u;
    }
    std::printf("step %d: loss sums %.9g (GPU shards) %.9g (offloaded); gradients differ by up to %.2e (relative "
                "norm of a unit)\n", step, a, b, worst);
    if (step == 0)
      EXPECT_EQ(a, b) << "the first step's losses";
    else
      EXPECT_NEAR(b, a, 1e-4 * a) << "step " << step;  // measured: up to 3e-5
    // the sums of squares the GPU took of the reduced shards as they went down: the host's own
    // sum over the landed shards (in another order), with one micro-batch; none with two
    EXPECT_FALSE(gpu.store->landed_grad_sum_squares().has_value()) << "not offloaded";
    const std::optional<double> landed = host.store->landed_grad_sum_squares();
    if (accum == 1) {
      double host_sum = 0;
      for (const Tensor& g : host.store->grad_shards())
        for (int64_t i = 0; i < g.numel(); ++i)
          host_sum += static_cast<double>(g.data<float>()[i]) * static_cast<double>(g.data<float>()[i]);
      ASSERT_TRUE(landed.has_value()) << "step " << step;
      EXPECT_NEAR(*landed, host_sum, 1e-12 * host_sum) << "step " << step;
    } else {
      EXPECT_FALSE(landed.has_value()) << "step " << step << ": the second micro-batch added on the host";
    }
    const double na = gpu.update(), nb = host.update();
    EXPECT_NEAR(nb, na, 1e-3 * na) << "step " << step << ": gradient norm";
    EXPECT_GT(na, 0.5) << "every step clips";
  }
  for (size_t u = 0; u < gpu.layout.units().size(); ++u) {
    // an update lost or applied twice moves a weight by ~lr = 1e-3 against weights of ~0.02
    EXPECT_TRUE(testing::all_close(host.store->master_shards()[u], testing::to_host(gpu.store->master_shards()[u]),
                                   testing::Tolerance{2e-3, 1e30, 1e30}))
        << "unit " << u << ": master weights after 4 steps";  // measured: up to 4e-4 after 3
    EXPECT_TRUE(testing::all_close(host.opt->exp_avg_sq()[u], testing::to_host(gpu.opt->exp_avg_sq()[u]),
                                   testing::Tolerance{3e-2, 1e30, 1e30}))
        << "unit " << u << ": AdamW's second moment (squares of gradients that differ at bf16 precision)";
  }
}

TEST(OffloadCuda, FollowsTheShardsOnTheGpu) {
  ST_REQUIRE_CUDA();
  offload_follows_the_gpu_shards(1);
  offload_follows_the_gpu_shards(2);
}

// The trainer's offloaded step: the host update runs on a worker thread while the next step's
// forward gathers each unit once it is written (and the backward lands each gradient once the
// update has read the old one). The same arithmetic in another schedule: losses, gradients,
// weights and AdamW state equal the synchronous update's bit for bit.
TEST(OffloadCuda, OverlappedHostUpdateIsTheSameUpdate) {
  ST_REQUIRE_CUDA();
  const model::LlamaConfig c = small_config();
  Engine sync(c, true), overlapped(c, true);
  const int64_t B = 2, T = 96;
  model::StepOptions o;
  o.grad_scale = 1.0 / static_cast<double>(B * T);
  o.loss_chunk_tokens = 64;
  o.deterministic = true;
  CounterRng rng(29);
  std::vector<Tensor> ids{Tensor::empty({B, T}, DType::kI32)}, targets{Tensor::empty({B, T}, DType::kI32)};
  for (int step = 0; step < 4; ++step) {
    random_batch(rng, ids[0], targets[0]);
    const double a = forward_backward(sync, ids, targets, o), b = forward_backward(overlapped, ids, targets, o);
    EXPECT_EQ(a, b) << "step " << step << ": losses";
    for (size_t u = 0; u < sync.layout.units().size(); ++u)
      EXPECT_TRUE(testing::all_close(overlapped.store->grad_shards()[u], sync.store->grad_shards()[u], testing::kExact))
          << "step " << step << " unit " << u;
    const double na = sync.update();
    const ShardedUnitStore::OptimizerTargets t = overlapped.store->optimizer_targets();
    const double nb = optim::global_grad_norm(t.grads, overlapped.comm.get());
    EXPECT_EQ(na, nb) << "step " << step;
    const double clip = optim::clip_coefficient(nb, 0.5);
    overlapped.store->run_host_update([&overlapped, t, clip](const ShardedUnitStore::UnitDone& done) {
      overlapped.opt->step_units(t.params, t.grads, 1e-3, clip, t.compute_copies, done);
    });
  }
  overlapped.store->wait_for_host_update();
  for (size_t u = 0; u < sync.layout.units().size(); ++u) {
    EXPECT_TRUE(testing::all_close(overlapped.store->master_shards()[u], sync.store->master_shards()[u],
                                   testing::kExact)) << "unit " << u;
    EXPECT_TRUE(testing::all_close(overlapped.store->compute_shards()[u], sync.store->compute_shards()[u],
                                   testing::kExact)) << "unit " << u;
    EXPECT_TRUE(testing::all_close(overlapped.opt->exp_avg_sq()[u], sync.opt->exp_avg_sq()[u], testing::kExact))
        << "unit " << u;
  }
  EXPECT_EQ(overlapped.opt->steps_taken(), 4);
}

// The host update runs on a thread of its own, whose OpenMP thread count would be the process
// default (OMP_NUM_THREADS: 1 under torchrun) rather than the rank's (training.threads or its
// share of the machine): it takes the count of the thread that starts it.
TEST(OffloadCuda, HostUpdateRunsOnTheStartingThreadsThreadCount) {
  ST_REQUIRE_CUDA();
  Engine e(small_config(), true);
  const int before = omp_get_max_threads();
  const int wanted = before == 3 ? 5 : 3;  // not the process default
  omp_set_num_threads(wanted);
  int seen = 0;
  e.store->run_host_update([&seen](const ShardedUnitStore::UnitDone&) { seen = omp_get_max_threads(); });
  e.store->wait_for_host_update();
  omp_set_num_threads(before);
  EXPECT_EQ(seen, wanted);
}

// Offloaded with the gradient shards left on the GPU (ShardingOptions::offload_grads off, no
// compute shards on the host): the backward writes the shards in place, each gather copies the
// f32 master shard up and casts it on the GPU, and the host update copies each unit's gradient
// down into one of two page-locked buffers as it goes. Against the fully offloaded store (its
// bf16 copies are the host's rounding of the same masters, its gradients the same kernels'):
// losses, gradients, norms, masters and AdamW state bit for bit over 4 overlapped steps with one
// micro-batch; with two, the second micro-batch adds in the GPU's epilogues instead of on the
// host (f32 rounding), and the masters follow within the bf16 drift of the first test.
void gpu_gradients_follow_the_full_offload(int64_t accum) {
  SCOPED_TRACE(::testing::Message() << accum << " micro-batch(es)");
  const model::LlamaConfig c = small_config();
  ShardingOptions kept = testing::bf16_sharding(false, true);
  kept.offload_grads = false;
  Engine full(c, true), gpu_grads(c, kept);
  ASSERT_FALSE(gpu_grads.store->has_compute_shards()) << "no bf16 copies on the host unless asked for";
  ASSERT_TRUE(gpu_grads.store->grads_in_shards()) << "one rank: the backward writes the shards on the GPU";
  for (size_t u = 0; u < full.layout.units().size(); ++u) {
    ASSERT_TRUE(gpu_grads.store->master_shards()[u].device().is_cpu()) << "unit " << u;
    ASSERT_TRUE(gpu_grads.store->grad_shards()[u].device().is_cuda()) << "unit " << u;
    ASSERT_TRUE(gpu_grads.store->optimizer_targets().grads[u]->device().is_cpu()) << "unit " << u;
    copy(gpu_grads.store->master_shards()[u], full.store->master_shards()[u]);
  }
  // master weights and two gradient buffers against master, gradients and bf16 copies
  EXPECT_LT(gpu_grads.store->pinned_bytes(), full.store->pinned_bytes() * 2 / 3);

  const int64_t B = 2, T = 96;
  model::StepOptions o;
  o.grad_scale = 1.0 / static_cast<double>(B * T * accum);
  o.loss_chunk_tokens = 64;
  o.deterministic = true;
  CounterRng rng(41);
  std::vector<Tensor> ids, targets;
  for (int64_t m = 0; m < accum; ++m) {
    ids.push_back(Tensor::empty({B, T}, DType::kI32));
    targets.push_back(Tensor::empty({B, T}, DType::kI32));
  }
  const bool exact = accum == 1;
  auto run_update = [](Engine& e, double clip) {
    const ShardedUnitStore::OptimizerTargets t = e.store->optimizer_targets();
    e.store->run_host_update([&e, t, clip](const ShardedUnitStore::UnitDone& done) {
      e.opt->step_units(t.params, t.grads, 1e-3, clip, t.compute_copies, done);
    });
  };
  for (int step = 0; step < 4; ++step) {
    for (int64_t m = 0; m < accum; ++m) random_batch(rng, ids[static_cast<size_t>(m)], targets[static_cast<size_t>(m)]);
    const double a = forward_backward(full, ids, targets, o), b = forward_backward(gpu_grads, ids, targets, o);
    if (exact)
      EXPECT_EQ(a, b) << "step " << step << ": losses";
    else
      EXPECT_NEAR(b, a, 1e-4 * a) << "step " << step << ": losses";
    for (size_t u = 0; u < full.layout.units().size(); ++u)
      EXPECT_TRUE(testing::all_close(testing::to_host(gpu_grads.store->grad_shards()[u]), full.store->grad_shards()[u],
                                     exact ? testing::kExact : testing::Tolerance{1.5e-2, 1e30, 1e30}))
          << "step " << step << " unit " << u;
    const std::optional<double> sa = full.store->landed_grad_sum_squares();
    const std::optional<double> sb = gpu_grads.store->landed_grad_sum_squares();
    ASSERT_TRUE(sb.has_value()) << "the GPU sums its own shards";
    double host_sum = 0;  // the full offload's gradients, summed here
    for (const Tensor& g : full.store->grad_shards())
      for (int64_t i = 0; i < g.numel(); ++i)
        host_sum += static_cast<double>(g.data<float>()[i]) * static_cast<double>(g.data<float>()[i]);
    if (exact) {
      ASSERT_TRUE(sa.has_value());
      EXPECT_EQ(*sa, *sb) << "step " << step << ": sums of squares of the same gradients, on the GPU";
    } else {
      EXPECT_NEAR(*sb, host_sum, 3e-2 * host_sum) << "step " << step;
    }
    const double na = optim::grad_norm_from_sum_squares(sa ? *sa : host_sum, full.comm.get());
    const double nb = optim::grad_norm_from_sum_squares(*sb, gpu_grads.comm.get());
    EXPECT_GT(na, 0.5) << "every step clips";
    run_update(full, optim::clip_coefficient(na, 0.5));
    run_update(gpu_grads, optim::clip_coefficient(nb, 0.5));
  }
  full.store->wait_for_host_update();
  gpu_grads.store->wait_for_host_update();
  for (size_t u = 0; u < full.layout.units().size(); ++u) {
    EXPECT_TRUE(testing::all_close(gpu_grads.store->master_shards()[u], full.store->master_shards()[u],
                                   exact ? testing::kExact : testing::Tolerance{2e-3, 1e30, 1e30}))
        << "unit " << u << ": master weights after 4 steps";
    EXPECT_TRUE(testing::all_close(gpu_grads.opt->exp_avg_sq()[u], full.opt->exp_avg_sq()[u],
                                   exact ? testing::kExact : testing::Tolerance{3e-2, 1e30, 1e30}))
        << "unit " << u << ": AdamW's second moment";
  }
  EXPECT_EQ(gpu_grads.opt->steps_taken(), 4);
}

TEST(OffloadCuda, GradientsOnTheGpuFollowTheFullOffload) {
  ST_REQUIRE_CUDA();
  gpu_gradients_follow_the_full_offload(1);
  gpu_gradients_follow_the_full_offload(2);
}

// zero_grad_shards clears lazily when offloaded: a shard no gradient reaches still reads zero.
TEST(OffloadCuda, ClearedShardsReadZeroWithoutABackward) {
  ST_REQUIRE_CUDA();
  Engine host(small_config(), true);
  for (Tensor& g : host.store->grad_shards()) g.data<float>()[0] = 5.0f;
  host.store->zero_grad_shards();
  for (const Tensor& g : host.store->grad_shards()) {
    double sum = 0;
    for (int64_t i = 0; i < g.numel(); ++i) sum += std::abs(g.data<float>()[i]);
    EXPECT_EQ(sum, 0.0);
  }
}

TEST(OffloadCuda, NeedsAGpu) {
  const model::LlamaConfig c = small_config();
  const model::ModelLayout layout = model::ModelLayout::llama(c, 1);
  auto comm = dist::make_single_rank();
  ShardingOptions so;
  so.offload = true;
  try {
    ShardedUnitStore store(layout, comm.get(), so, Device::cpu());
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("parallel.offload"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace shardtrain::fsdp
