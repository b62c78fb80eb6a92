// Activation offload (model/activation_offload.h) against the run that keeps everything on
// the GPU: with the attention backward's deterministic algorithm both are the same kernels on
// the same values, so losses and every gradient must match bit for bit under every
// checkpointing policy, across AdamW updates, with two micro-batches per step, and captured
// as a CUDA graph. The offloaded run must also hold less: what all but the last two blocks
// keep leaves the GPU. Skips without a device.
#include <memory>
#include <vector>

#include <gtest/gtest.h>

#include "core/allocator.h"
#include "core/random.h"
#include "model/captured_step.h"
#include "model/llama.h"
#include "testing/compare.h"
#include "testing/cuda_util.h"
#include "testing/gpu_engine.h"
#include "testing/model_shapes.h"

namespace shardtrain::model {
namespace {

// Another seed than the other GPU engine tests'.
struct Engine : testing::GpuEngine {
  explicit Engine(const LlamaConfig& c) : GpuEngine(c, testing::bf16_sharding(), 21) {}
};

LlamaConfig five_blocks(bool tied) {
  LlamaConfig c = testing::small_gqa(tied);
  c.n_layers = 5;  // three offloaded, two resident
  return c;
}

void expect_same_grads(const Engine& got, const Engine& want, const char* what, int step) {
  for (size_t u = 0; u < want.layout.units().size(); ++u)
    EXPECT_TRUE(testing::all_close(testing::to_host(got.store->grad_shards()[u]),
                                   testing::to_host(want.store->grad_shards()[u]), testing::kExact))
        << what << ", step " << step << ", unit " << want.layout.units()[u].name;
}

// training.offload_activations_blocks: only the first blocks offload (here 1 of the 5; the
// others stay), the same values bit for bit, and only that block's input leaves the GPU.
TEST(ActivationOffloadCuda, ALimitOffloadsOnlyTheFirstBlocks) {
  ST_REQUIRE_CUDA();
  const int64_t B = 2, T = 128;
  const LlamaConfig c = five_blocks(false);
  Engine resident(c), offloaded(c);
  StepOptions o;
  o.grad_scale = 1.0 / static_cast<double>(B * T);
  o.loss_chunk_tokens = 96;
  o.deterministic = true;
  o.checkpointing = ActivationCheckpointing::kFull;
  StepOptions off = o;
  off.offload_activations = true;
  off.offload_activation_blocks = 1;
  CounterRng rng(37);
  Tensor ids = Tensor::empty({B, T}, DType::kI32), targets = Tensor::empty({B, T}, DType::kI32);
  for (int s = 0; s < 2; ++s) {
    testing::random_batch(rng, ids, targets, c.vocab_size, 13);
    resident.store->zero_grad_shards();
    offloaded.store->zero_grad_shards();
    EXPECT_EQ(resident.model->forward_backward(ids, targets, o).loss_sum,
              offloaded.model->forward_backward(ids, targets, off).loss_sum) << "step " << s;
    expect_same_grads(offloaded, resident, "one block offloaded", s);
    resident.update();
    offloaded.update();
  }
  EXPECT_EQ(offloaded.model->activation_offload()->bytes_offloaded(), B * T * c.dim * 2) << "block 0's bf16 input";
}

TEST(ActivationOffloadCuda, EveryPolicyMatchesTheResidentRunBitForBit) {
  ST_REQUIRE_CUDA();
  const int64_t B = 2, T = 128;
  for (bool tied : {true, false}) {
    const LlamaConfig c = five_blocks(tied);
    for (ActivationCheckpointing ac : kCheckpointingByMemory) {
      SCOPED_TRACE(std::string(checkpointing_name(ac)) + (tied ? ", tied" : ", untied"));
      Engine resident(c), offloaded(c);
      StepOptions o;
      o.grad_scale = 1.0 / static_cast<double>(2 * B * T);
      o.loss_chunk_tokens = 96;
      o.deterministic = true;
      o.checkpointing = ac;
      StepOptions off = o;
      off.offload_activations = true;
      CounterRng rng(31);
      Tensor ids = Tensor::empty({B, T}, DType::kI32), targets = Tensor::empty({B, T}, DType::kI32);
      for (int s = 0; s < 3; ++s) {
        resident.store->zero_grad_shards();
        offloaded.store->zero_grad_shards();
        for (int micro = 0; micro < 2; ++micro) {  // the second adds to the first's gradients
          testing::random_batch(rng, ids, targets, c.vocab_size, 13);
          const LossSum a = resident.model->forward_backward(ids, targets, o);
          const LossSum b = offloaded.model->forward_backward(ids, targets, off);
          EXPECT_EQ(a.loss_sum, b.loss_sum) << "step " << s << ", micro-batch " << micro;
        }
        expect_same_grads(offloaded, resident, "eager", s);
        resident.update();
        offloaded.update();
      }
      ActivationOffload* ao = offloaded.model->activation_offload();
      ASSERT_NE(ao, nullptr);
      const double waited = ao->take_wait_seconds();  // the timed waits of 6 eager micro-batches
      EXPECT_TRUE(waited >= 0 && waited < 10) << waited;
      EXPECT_EQ(ao->take_wait_seconds(), 0.0) << "taken: the next call starts from zero";
      if (ac == ActivationCheckpointing::kFull) {
        EXPECT_EQ(ao->bytes_offloaded(), 3 * B * T * c.dim * 2) << "three blocks' bf16 inputs";
      }
      EXPECT_GE(ao->host_bytes(), ao->bytes_offloaded());
      EXPECT_GT(ao->bytes_offloaded(), 0);
      EXPECT_EQ(resident.model->activation_offload(), nullptr);
    }
  }
}

// A CUDA graph captures the copies and the waits between the streams: its replays, which
// copy into the same host buffers, follow the eager resident run bit for bit.
TEST(ActivationOffloadCuda, CapturedStepMatchesTheEagerResidentRun) {
  ST_REQUIRE_CUDA();
  const int64_t B = 2, T = 128;
  const LlamaConfig c = five_blocks(true);
  for (ActivationCheckpointing ac : {ActivationCheckpointing::kFull, ActivationCheckpointing::kSelective}) {
    SCOPED_TRACE(checkpointing_name(ac));
    Engine resident(c), graphed(c);
    StepOptions o;
    o.grad_scale = 1.0 / static_cast<double>(B * T);
    o.loss_chunk_tokens = 96;
    o.deterministic = true;
    o.checkpointing = ac;
    StepOptions off = o;
    off.offload_activations = true;
    CapturedStep step(*graphed.model, B, T, off);
    CounterRng rng(37);
    Tensor ids = Tensor::empty({B, T}, DType::kI32), targets = Tensor::empty({B, T}, DType::kI32);
    for (int s = 0; s < 4; ++s) {
      testing::random_batch(rng, ids, targets, c.vocab_size, 13);
      resident.store->zero_grad_shards();
      graphed.store->zero_grad_shards();
      const LossSum a = resident.model->forward_backward(ids, targets, o);
      const LossSum b = step.run(ids, targets, o.grad_scale);
      EXPECT_EQ(step.captured(), s >= 1);
      EXPECT_EQ(a.loss_sum, b.loss_sum) << "step " << s;
      expect_same_grads(graphed, resident, "graph", s);
      resident.update();
      graphed.update();
    }
  }
}

// With full checkpointing the peak comes inside a block's backward, where the blocks' inputs
// are all held: offloaded, six of eight leave, and the peak drops by their size (2 MiB each,
// a multiple of the caching allocator's rounding of large blocks).
TEST(ActivationOffloadCuda, ThePeakDropsByTheOffloadedInputs) {
  ST_REQUIRE_CUDA();
  LlamaConfig c = testing::small_gqa(true);
  c.n_layers = 8;
  c.max_seq_len = 1024;
  const int64_t B = 4, T = 1024;
  StepOptions o;
  o.grad_scale = 1.0 / static_cast<double>(B * T);
  o.checkpointing = ActivationCheckpointing::kFull;
  CounterRng rng(41);
  Tensor ids = Tensor::empty({B, T}, DType::kI32), targets = Tensor::empty({B, T}, DType::kI32);
  testing::random_batch(rng, ids, targets, c.vocab_size, 13);
  int64_t peak[2] = {0, 0};
  for (int offload = 0; offload < 2; ++offload) {
    Engine e(c);
    StepOptions so = o;
    so.offload_activations = offload == 1;
    e.model->forward_backward(ids, targets, so);  // warm-up: workspaces, cached plans
    synchronize(Device::cuda(0));
    allocator_for(Device::cuda(0)).reset_peak();
    const int64_t base = allocator_for(Device::cuda(0)).stats().allocated_bytes;
    e.model->forward_backward(ids, targets, so);
    synchronize(Device::cuda(0));
    peak[offload] = allocator_for(Device::cuda(0)).stats().peak_allocated_bytes - base;
  }
  const int64_t offloaded = 6 * B * T * c.dim * 2;
  EXPECT_GE(peak[0] - peak[1], offloaded * 9 / 10) << "resident peak " << peak[0] << ", offloaded " << peak[1];
  EXPECT_LE(peak[0] - peak[1], offloaded) << "resident peak " << peak[0] << ", offloaded " << peak[1];
}

}  // namespace
}  // namespace shardtrain::model
