// Learning-rate schedules at their boundary steps, gradient clipping, and the AdamW
// weight-decay policy over units.
#include <cmath>
#include <numbers>

#include <gtest/gtest.h>

#include "model/llama.h"
#include "optim/adamw.h"
#include "optim/clip.h"
#include "optim/schedule.h"
#include "testing/compare.h"

namespace shardtrain::optim {
namespace {

TEST(Schedule, CosineBoundaries) {
  ScheduleConfig c;
  c.peak_lr = 3e-3;
  c.warmup_steps = 10;
  c.total_steps = 110;
  c.min_lr_ratio = 0.1;
  EXPECT_DOUBLE_EQ(learning_rate(c, 1), 3e-4);
  EXPECT_DOUBLE_EQ(learning_rate(c, 10), 3e-3);   // end of warmup: peak
  EXPECT_DOUBLE_EQ(learning_rate(c, 60), 3e-4 + (3e-3 - 3e-4) * 0.5);  // halfway: mean of peak and min
  EXPECT_DOUBLE_EQ(learning_rate(c, 110), 3e-4);  // last step: min
  EXPECT_DOUBLE_EQ(learning_rate(c, 11), 3e-4 + (3e-3 - 3e-4) * 0.5 * (1 + std::cos(std::numbers::pi / 100)));
}

TEST(Schedule, LinearConstantAndNoWarmup) {
  ScheduleConfig c;
  c.type = ScheduleType::kLinear;
  c.peak_lr = 1.0;
  c.warmup_steps = 0;
  c.total_steps = 4;
  c.min_lr_ratio = 0.0;
  EXPECT_DOUBLE_EQ(learning_rate(c, 1), 0.75);
  EXPECT_DOUBLE_EQ(learning_rate(c, 4), 0.0);
  c.type = ScheduleType::kConstant;
  c.warmup_steps = 2;
  EXPECT_DOUBLE_EQ(learning_rate(c, 1), 0.5);
  EXPECT_DOUBLE_EQ(learning_rate(c, 2), 1.0);
  EXPECT_DOUBLE_EQ(learning_rate(c, 4), 1.0);
  EXPECT_THROW((void)parse_schedule("cosin", "schedule.type"), Error);
}

// Warmup-stable-decay: warmup to the peak, the peak until the last decay_fraction of the
// steps, then the decay's shape over those; a fraction longer than what follows warmup is cut.
TEST(Schedule, StableThenDecayAndTheSqrtShape) {
  ScheduleConfig c;
  c.type = ScheduleType::kLinear;
  c.peak_lr = 1.0;
  c.warmup_steps = 10;
  c.total_steps = 100;
  c.min_lr_ratio = 0.0;
  c.decay_fraction = 0.2;  // steps 81..100
  EXPECT_DOUBLE_EQ(learning_rate(c, 5), 0.5);
  EXPECT_DOUBLE_EQ(learning_rate(c, 10), 1.0);
  EXPECT_DOUBLE_EQ(learning_rate(c, 50), 1.0);
  EXPECT_DOUBLE_EQ(learning_rate(c, 80), 1.0);   // the last stable step
  EXPECT_DOUBLE_EQ(learning_rate(c, 81), 0.95);  // 1 of 20 decay steps
  EXPECT_DOUBLE_EQ(learning_rate(c, 90), 0.5);
  EXPECT_DOUBLE_EQ(learning_rate(c, 100), 0.0);
  c.type = ScheduleType::kSqrt;
  c.min_lr_ratio = 0.1;
  EXPECT_DOUBLE_EQ(learning_rate(c, 80), 1.0);
  EXPECT_DOUBLE_EQ(learning_rate(c, 85), 0.1 + 0.9 * (1.0 - std::sqrt(0.25)));
  EXPECT_DOUBLE_EQ(learning_rate(c, 100), 0.1);
  c.type = ScheduleType::kCosine;
  EXPECT_DOUBLE_EQ(learning_rate(c, 90), 0.1 + 0.9 * 0.5);  // halfway through the decay
  c.decay_fraction = 0.95;  // more than the 90 steps after warmup: the decay starts right after it
  EXPECT_DOUBLE_EQ(learning_rate(c, 10), 1.0);
  EXPECT_DOUBLE_EQ(learning_rate(c, 55), 0.1 + 0.9 * 0.5);
  c.decay_fraction = 1.0;  // the default: as without a stable phase
  EXPECT_DOUBLE_EQ(learning_rate(c, 55), 0.1 + 0.9 * 0.5);
  EXPECT_EQ(parse_schedule("sqrt", "schedule.type"), ScheduleType::kSqrt);
}

TEST(Clip, ScalesOnlyAboveTheLimit) {
  Tensor a = Tensor::empty({3}, DType::kF32), b = Tensor::empty({2}, DType::kF64);
  float* pa = a.data<float>();
  double* pb = b.data<double>();
  pa[0] = 3, pa[1] = 0, pa[2] = 0;
  pb[0] = 0, pb[1] = 4;
  EXPECT_DOUBLE_EQ(clip_grad_norm({&a, &b}, 10.0), 5.0);
  EXPECT_EQ(pa[0], 3.0f);  // below the limit: untouched
  EXPECT_DOUBLE_EQ(clip_grad_norm({&a, &b}, 1.0), 5.0);
  EXPECT_NEAR(global_grad_norm({&a, &b}), 1.0, 1e-6);
  EXPECT_NEAR(pb[1], 4.0 / (5.0 + 1e-6), 1e-12);
}

TEST(AdamWUnits, DecaysMatricesNotNormsAndLeavesPaddingZero) {
  model::LlamaConfig cfg;
  cfg.vocab_size = 7;
  cfg.dim = 4;
  cfg.n_layers = 1;
  cfg.n_heads = 2;
  cfg.n_kv_heads = 1;
  cfg.ffn_dim = 6;
  cfg.max_seq_len = 4;
  model::Llama m(cfg, DType::kF64);
  m.init_random(1);
  AdamWConfig oc;
  oc.weight_decay = 0.5;
  AdamW opt(m.layout(), 0, oc, DType::kF64, Device::cpu());
  std::vector<Tensor*> params;
  std::vector<const Tensor*> grads;
  for (size_t u = 0; u < m.layout().units().size(); ++u) {
    params.push_back(&m.unit_params(u));
    grads.push_back(&m.unit_grads(u));
  }
  const double w0 = m.param("model.layers.0.mlp.up_proj.weight").data<double>()[0];
  opt.step(params, grads, 0.1);  // zero gradients: only decay moves parameters
  EXPECT_DOUBLE_EQ(m.param("model.layers.0.mlp.up_proj.weight").data<double>()[0], w0 * (1 - 0.1 * 0.5));
  EXPECT_DOUBLE_EQ(m.param("model.layers.0.input_layernorm.weight").data<double>()[0], 1.0);
  const Tensor& head = m.unit_params(2);
  const model::UnitLayout& hu = m.layout().units()[2];
  const int64_t last = hu.params.back().offset + hu.params.back().numel();
  for (int64_t i = last; i < hu.numel; ++i) EXPECT_EQ(head.data<double>()[i], 0.0);
  EXPECT_EQ(opt.steps_taken(), 1);
}

}  // namespace
}  // namespace shardtrain::optim
