// OptimizerStep (train/step.h) on a tiny CPU model: micro-batches add up to their whole batch,
// clearing the gradients first gives the same steps as overwriting them, and a skipped update
// leaves the weights as they were.
#include "train/step.h"

#include <cmath>
#include <memory>
#include <vector>

#include <gtest/gtest.h>

#include "core/random.h"
#include "optim/clip.h"

namespace shardtrain::train {
namespace {

constexpr int64_t kSeq = 16, kVocab = 64;

// A 2-block model on one CPU rank, f32 throughout, with its store, optimizer and step.
struct TinyRun {
  explicit TinyRun(const OptimizerStepOptions& options) {
    config.vocab_size = kVocab;
    config.dim = 32;
    config.n_layers = 2;
    config.n_heads = 4;
    config.n_kv_heads = 2;
    config.ffn_dim = 64;
    config.max_seq_len = kSeq;
    config.validate("step_test.");
    comm = dist::make_single_rank();
    mesh = std::make_unique<fsdp::DeviceMesh>(comm.get(), model::Mesh{1, 1, 1});
    layout = std::make_unique<model::ModelLayout>(model::ModelLayout::llama(config, mesh->shape(), 0));
    fsdp::ShardingOptions sharding;
    sharding.compute_dtype = DType::kF32;
    store = std::make_unique<fsdp::ShardedUnitStore>(*layout, *mesh, sharding, Device::cpu());
    store->init_random(1234, config.init_std);
    model = std::make_unique<model::Llama>(config, *layout, store.get(), DType::kF32, Device::cpu());
    optimizer = std::make_unique<optim::AdamW>(*layout, 0, optim::AdamWConfig{}, DType::kF32, Device::cpu());
    step = std::make_unique<OptimizerStep>(*model, *store, *optimizer, *mesh, options);
  }

  model::LlamaConfig config;
  std::unique_ptr<dist::Communicator> comm;
  std::unique_ptr<fsdp::DeviceMesh> mesh;
  std::unique_ptr<model::ModelLayout> layout;
  std::unique_ptr<fsdp::ShardedUnitStore> store;
  std::unique_ptr<model::Llama> model;
  std::unique_ptr<optim::AdamW> optimizer;
  std::unique_ptr<OptimizerStep> step;
};

OptimizerStepOptions options_of(int64_t batch, int64_t micro_batches, bool zero_fill) {
  OptimizerStepOptions options;
  options.batch_size = batch;
  options.seq_len = kSeq;
  options.micro_batches = micro_batches;
  options.zero_fill = zero_fill;
  return options;
}

// `rows` random sequences of ids and targets, as `micro_batches` tensors of rows / micro_batches rows each.
void random_batches(uint64_t seed, int64_t rows, int64_t micro_batches, std::vector<Tensor>& ids,
                    std::vector<Tensor>& targets) {
  CounterRng rng(seed);
  const int64_t per = rows / micro_batches;
  ids.clear();
  targets.clear();
  for (int64_t m = 0; m < micro_batches; ++m) {
    ids.push_back(Tensor::empty({per, kSeq}, DType::kI32, Device::cpu(), "ids"));
    targets.push_back(Tensor::empty({per, kSeq}, DType::kI32, Device::cpu(), "targets"));
  }
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t t = 0; t < kSeq; ++t) {
      const size_t m = static_cast<size_t>(r / per);
      const int64_t i = (r % per) * kSeq + t;
      ids[m].data<int32_t>()[i] = static_cast<int32_t>(rng.next_below(kVocab));
      targets[m].data<int32_t>()[i] = static_cast<int32_t>(rng.next_below(kVocab));
    }
}

struct StepFigures {
  double loss = 0, grad_norm = 0;
};

// Three steps of 4 sequences in `micro_batches` micro-batches; each step's mean loss and norm.
std::vector<StepFigures> three_steps(int64_t micro_batches, bool zero_fill) {
  TinyRun run(options_of(4 / micro_batches, micro_batches, zero_fill));
  std::vector<StepFigures> figures;
  std::vector<Tensor> ids, targets;
  for (uint64_t s = 1; s <= 3; ++s) {
    random_batches(s, 4, micro_batches, ids, targets);
    const double tokens = 4.0 * kSeq;
    const ForwardBackward passes = run.step->forward_backward(ids, targets, 1.0 / tokens);
    StepFigures f;
    f.loss = passes.loss_sum / tokens;
    f.grad_norm = run.step->gradient_norm();
    run.step->update(1e-3, optim::clip_coefficient(f.grad_norm, 1.0), false, false);
    figures.push_back(f);
  }
  return figures;
}

TEST(OptimizerStep, TwoMicroBatchesMakeTheStepOfTheirWholeBatch) {
  const std::vector<StepFigures> whole = three_steps(1, false), halves = three_steps(2, false);
  ASSERT_EQ(whole.size(), halves.size());
  for (size_t s = 0; s < whole.size(); ++s) {
    // the same sums in another order (f32 gradients)
    EXPECT_NEAR(halves[s].loss, whole[s].loss, 1e-5 * whole[s].loss) << "step " << s + 1;
    EXPECT_NEAR(halves[s].grad_norm, whole[s].grad_norm, 1e-5 * whole[s].grad_norm) << "step " << s + 1;
  }
  EXPECT_LT(whole[2].loss, whole[0].loss + 0.5);  // the updates ran: the loss stays near ln V
  EXPECT_GT(whole[0].loss, std::log(static_cast<double>(kVocab)) - 0.5);
}

TEST(OptimizerStep, ClearingTheGradientsFirstGivesTheSameSteps) {
  const std::vector<StepFigures> overwrite = three_steps(2, false), zero_fill = three_steps(2, true);
  for (size_t s = 0; s < overwrite.size(); ++s) {
    EXPECT_EQ(zero_fill[s].loss, overwrite[s].loss) << "step " << s + 1;  // 0 + x is x: the same bits
    EXPECT_EQ(zero_fill[s].grad_norm, overwrite[s].grad_norm) << "step " << s + 1;
  }
}

TEST(OptimizerStep, ASkippedUpdateLeavesTheWeightsAndATakenOneChangesThem) {
  TinyRun run(options_of(2, 1, false));
  std::vector<Tensor> ids, targets;
  random_batches(7, 2, 1, ids, targets);
  const Tensor& first = *run.store->optimizer_targets().params[0];
  const std::vector<float> before(first.data<float>(), first.data<float>() + first.numel());
  const auto changed = [&] {
    int64_t n = 0;
    for (int64_t i = 0; i < first.numel(); ++i) n += first.data<float>()[i] != before[static_cast<size_t>(i)];
    return n;
  };
  (void)run.step->forward_backward(ids, targets, 1.0 / (2.0 * kSeq));
  const double norm = run.step->gradient_norm();
  EXPECT_GT(norm, 0.0);
  run.step->update(1e-2, optim::clip_coefficient(norm, 1.0), true, false);
  EXPECT_EQ(changed(), 0);
  (void)run.step->forward_backward(ids, targets, 1.0 / (2.0 * kSeq));
  run.step->update(1e-2, optim::clip_coefficient(run.step->gradient_norm(), 1.0), false, false);
  EXPECT_GT(changed(), first.numel() / 2);
}

}  // namespace
}  // namespace shardtrain::train
