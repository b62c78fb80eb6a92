// CPU AdamW against torch.optim.AdamW's formula evaluated here, over several steps.
#include <cmath>
#include <limits>

#include "ops/adamw.h"
#include "ops/elementwise.h"
#include "ops/op_testing.h"

namespace shardtrain::ops {
namespace {

TEST(AdamW, MatchesTheFormulaOverThreeSteps) {
  for (DType dt : {DType::kF64, DType::kF32}) {
    const int64_t n = 1003;
    Tensor p = testing::to_dtype(random_f64({n}, 1), dt), m = Tensor::zeros({n}, dt), v = Tensor::zeros({n}, dt);
    std::vector<double> rp(static_cast<size_t>(n)), rm(static_cast<size_t>(n), 0.0), rv(static_cast<size_t>(n), 0.0);
    const Tensor p_start = testing::to_f64(p);
    for (int64_t i = 0; i < n; ++i) rp[static_cast<size_t>(i)] = p_start.data<double>()[i];
    AdamWOptions o;
    o.lr = 3e-2;
    o.beta1 = 0.9;
    o.beta2 = 0.95;
    o.eps = 1e-8;
    o.weight_decay = 0.1;
    for (int64_t step = 1; step <= 3; ++step) {
      const Tensor g = testing::to_dtype(random_f64({n}, 10 + step, 0.05, 0.5), dt);
      o.step = step;
      cpu::adamw_step(p, m, v, g, o);
      const Tensor g64 = testing::to_f64(g);
      for (size_t i = 0; i < static_cast<size_t>(n); ++i) {
        const double gi = g64.data<double>()[i];
        rp[i] *= 1 - o.lr * o.weight_decay;
        rm[i] = o.beta1 * rm[i] + (1 - o.beta1) * gi;
        rv[i] = o.beta2 * rv[i] + (1 - o.beta2) * gi * gi;
        const double bc1 = 1 - std::pow(o.beta1, step), bc2 = 1 - std::pow(o.beta2, step);
        rp[i] -= o.lr / bc1 * rm[i] / (std::sqrt(rv[i]) / std::sqrt(bc2) + o.eps);
      }
    }
    Tensor ref = Tensor::empty({n}, DType::kF64);
    for (int64_t i = 0; i < n; ++i) ref.data<double>()[i] = rp[static_cast<size_t>(i)];
    const testing::Tolerance tol = dt == DType::kF64 ? testing::Tolerance{1e-12, 1e-12, 1e-14} : testing::kCpuF32VsF64;
    EXPECT_TRUE(testing::all_close(p, ref, tol)) << dtype_name(dt);
  }
}

TEST(AdamW, HandComputedScalar) {
  // step 1 from m = v = 0: the update is lr * g / (|g| + eps) = lr * sign(g) (+ decay)
  Tensor p = Tensor::empty({1}, DType::kF64), m = Tensor::zeros({1}, DType::kF64), v = Tensor::zeros({1}, DType::kF64),
         g = Tensor::empty({1}, DType::kF64);
  p.data<double>()[0] = 2.0;
  g.data<double>()[0] = -0.5;
  AdamWOptions o;
  o.lr = 0.1;
  o.weight_decay = 0.01;
  o.eps = 0.0;
  cpu::adamw_step(p, m, v, g, o);
  EXPECT_DOUBLE_EQ(p.data<double>()[0], 2.0 * (1 - 0.001) + 0.1);
  EXPECT_DOUBLE_EQ(m.data<double>()[0], -0.05);
  EXPECT_DOUBLE_EQ(v.data<double>()[0], 0.001 * 0.25);
}

// The multi-tensor update equals per-tensor updates of gradients scaled in place first
// (bitwise), with weight decay only where marked.
TEST(AdamW, MultiTensorEqualsScaledSingleUpdates) {
  const std::vector<int64_t> sizes = {1, 37, 4099};
  const double scale = 0.37;
  AdamWOptions o;
  o.lr = 2e-2;
  o.beta2 = 0.95;
  o.weight_decay = 0.1;
  o.step = 2;
  std::vector<AdamWTensors> multi;
  std::vector<Tensor> p1, m1, v1, g1;
  for (size_t k = 0; k < sizes.size(); ++k) {
    const int64_t n = sizes[k];
    auto make = [&](uint64_t seed, double mean, double sd, bool positive) {
      Tensor t = testing::to_dtype(random_f64({n}, seed, mean, sd), DType::kF32);
      if (positive)
        for (int64_t i = 0; i < n; ++i) t.data<float>()[i] = std::abs(t.data<float>()[i]);
      return t;
    };
    AdamWTensors t{make(10 * k + 1, 0.1, 1, false), make(10 * k + 2, 0, 0.1, false), make(10 * k + 3, 0, 0.01, true),
                   make(10 * k + 4, 0, 1, false), k != 1, Tensor()};
    // copies for the reference path
    p1.push_back(testing::to_dtype(t.param, DType::kF32));
    m1.push_back(testing::to_dtype(t.exp_avg, DType::kF32));
    v1.push_back(testing::to_dtype(t.exp_avg_sq, DType::kF32));
    g1.push_back(testing::to_dtype(t.grad, DType::kF32));
    multi.push_back(t);
  }
  cpu::adamw_step_multi(multi, o, scale);
  for (size_t k = 0; k < sizes.size(); ++k) {
    cpu::scale(g1[k], scale);
    AdamWOptions one = o;
    if (!multi[k].decay) one.weight_decay = 0;
    cpu::adamw_step(p1[k], m1[k], v1[k], g1[k], one);
    EXPECT_TRUE(testing::all_close(multi[k].param, p1[k], testing::kExact)) << "tensor " << k;
    EXPECT_TRUE(testing::all_close(multi[k].exp_avg, m1[k], testing::kExact)) << "tensor " << k;
    EXPECT_TRUE(testing::all_close(multi[k].exp_avg_sq, v1[k], testing::kExact)) << "tensor " << k;
  }
}

// A compute copy, where given, holds the updated weights rounded to its dtype: bitwise what a
// cast after the update writes. Tensors without one are updated as before.
TEST(AdamW, MultiTensorWritesComputeCopiesAsACastWould) {
  AdamWOptions o;
  o.lr = 2e-2;
  o.weight_decay = 0.1;
  std::vector<AdamWTensors> with, without;
  for (int k = 0; k < 3; ++k) {
    const int64_t n = 1000 + 37 * k;
    auto make = [&](uint64_t seed) { return testing::to_dtype(random_f64({n}, seed, 0.1, 1), DType::kF32); };
    const Tensor p = make(20 + k), g = make(30 + k);
    with.push_back({testing::to_dtype(p, DType::kF32), Tensor::zeros({n}, DType::kF32), Tensor::zeros({n}, DType::kF32),
                    g, true, k == 1 ? Tensor() : Tensor::zeros({n}, DType::kBF16)});
    without.push_back({testing::to_dtype(p, DType::kF32), Tensor::zeros({n}, DType::kF32),
                       Tensor::zeros({n}, DType::kF32), g, true, Tensor()});
  }
  for (int64_t step = 1; step <= 2; ++step) {
    o.step = step;
    cpu::adamw_step_multi(with, o, 0.5);
    cpu::adamw_step_multi(without, o, 0.5);
  }
  for (size_t k = 0; k < with.size(); ++k) {
    EXPECT_TRUE(testing::all_close(with[k].param, without[k].param, testing::kExact)) << "tensor " << k;
    if (!with[k].compute_copy.defined()) continue;
    Tensor cast_after = Tensor::empty(with[k].param.shape(), DType::kBF16);
    cpu::cast(cast_after, with[k].param);
    EXPECT_TRUE(testing::all_close(with[k].compute_copy, cast_after, testing::kExact)) << "tensor " << k;
    EXPECT_FALSE(testing::all_close(with[k].compute_copy, Tensor::zeros(with[k].param.shape(), DType::kBF16),
                                    testing::kExact))
        << "tensor " << k << ": the copy was written";
  }
}


// The host optimizer of an offloaded GPU run (host_f32): f32 arithmetic in one threaded pass
// over many tensors, against the f64 update, over three steps with clipping, per-tensor
// decay and compute copies (bitwise the cast of its own updated weights, in bf16 and f16).
TEST(AdamW, HostF32FusedPassFollowsTheF64Update) {
  AdamWOptions o;
  o.lr = 2e-2;
  o.beta2 = 0.95;
  o.weight_decay = 0.1;
  const std::vector<int64_t> sizes = {1, 37, 70001, 200003};  // pieces of 65,536 shared out, a short last one
  std::vector<AdamWTensors> fused, reference;
  for (size_t k = 0; k < sizes.size(); ++k) {
    const int64_t n = sizes[k];
    auto make = [&](uint64_t seed) { return testing::to_dtype(random_f64({n}, seed, 0.1, 1), DType::kF32); };
    const Tensor p = make(40 + k);
    const DType copy_dtype = k == 3 ? DType::kF16 : DType::kBF16;
    fused.push_back({testing::to_dtype(p, DType::kF32), Tensor::zeros({n}, DType::kF32),
                     Tensor::zeros({n}, DType::kF32), Tensor(), k != 1,
                     k == 2 ? Tensor() : Tensor::zeros({n}, copy_dtype)});
    reference.push_back({testing::to_dtype(p, DType::kF32), Tensor::zeros({n}, DType::kF32),
                         Tensor::zeros({n}, DType::kF32), Tensor(), k != 1, Tensor()});
  }
  for (int64_t step = 1; step <= 3; ++step) {
    o.step = step;
    for (size_t k = 0; k < sizes.size(); ++k) {
      fused[k].grad = testing::to_dtype(random_f64({sizes[k]}, 50 + 10 * step + k, 0.05, 0.5), DType::kF32);
      reference[k].grad = fused[k].grad;
    }
    AdamWOptions host = o;
    host.host_f32 = true;
    cpu::adamw_step_multi(fused, host, 0.7);
    cpu::adamw_step_multi(reference, o, 0.7);
  }
  for (size_t k = 0; k < sizes.size(); ++k) {
    EXPECT_TRUE(testing::all_close(fused[k].param, reference[k].param, testing::kCpuF32VsF64)) << "tensor " << k;
    EXPECT_TRUE(testing::all_close(fused[k].exp_avg, reference[k].exp_avg, testing::kCpuF32VsF64)) << "tensor " << k;
    EXPECT_TRUE(testing::all_close(fused[k].exp_avg_sq, reference[k].exp_avg_sq, testing::kCpuF32VsF64))
        << "tensor " << k;
    EXPECT_FALSE(testing::all_close(fused[k].param, testing::to_dtype(random_f64({sizes[k]}, 40 + k, 0.1, 1),
                                                                       DType::kF32), testing::kExact))
        << "tensor " << k << ": updated";
    if (!fused[k].compute_copy.defined()) continue;
    Tensor cast_after = Tensor::empty(fused[k].param.shape(), fused[k].compute_copy.dtype());
    cpu::cast(cast_after, fused[k].param);
    EXPECT_TRUE(testing::all_close(fused[k].compute_copy, cast_after, testing::kExact)) << "tensor " << k;
  }
  // a wrong dtype is named
  std::vector<AdamWTensors> bad = {{Tensor::zeros({4}, DType::kF64), Tensor::zeros({4}, DType::kF64),
                                    Tensor::zeros({4}, DType::kF64), Tensor::zeros({4}, DType::kF64), true, Tensor()}};
  AdamWOptions host = o;
  host.host_f32 = true;
  EXPECT_THROW(cpu::adamw_step_multi(bad, host, 1.0), Error);
}

// The nonfinite flags: per tensor, which of param, m and v hold NaN or inf after the update,
// OR-ed into what the flags held, in the f64 update and in the host's fused f32 pass alike.
TEST(AdamW, MultiTensorFlagsNonFiniteValuesPerTensor) {
  for (const bool host_f32 : {false, true}) {
    AdamWOptions o;
    o.lr = 1e-2;
    o.weight_decay = 0.1;
    o.host_f32 = host_f32;
    std::vector<AdamWTensors> tensors;
    const std::vector<int64_t> sizes = {37, 70001, 41, 5};
    for (size_t k = 0; k < sizes.size(); ++k) {
      const int64_t n = sizes[k];
      auto make = [&](uint64_t seed, double mean, double sd) {
        Tensor t = testing::to_dtype(random_f64({n}, seed, mean, sd), DType::kF32);
        return t;
      };
      Tensor v = make(20 * k + 3, 0.02, 0.01);
      for (int64_t i = 0; i < n; ++i) v.data<float>()[i] = std::abs(v.data<float>()[i]);
      tensors.push_back({make(20 * k + 1, 0.1, 1), make(20 * k + 2, 0, 0.1), v, make(20 * k + 4, 0, 1), true, Tensor()});
    }
    // tensor 1: an infinite second moment far past the first 65536 elements (m/inf leaves p finite);
    // tensor 2: a NaN gradient (p, m and v); tensor 3: clean, flagged by an earlier update
    tensors[1].exp_avg_sq.data<float>()[70000] = std::numeric_limits<float>::infinity();
    tensors[2].grad.data<float>()[40] = std::numeric_limits<float>::quiet_NaN();
    Tensor flags = Tensor::zeros({4}, DType::kI32);
    flags.data<int32_t>()[3] = kNonfiniteParam;
    cpu::adamw_step_multi(tensors, o, 0.5, &flags);
    const int32_t* f = flags.data<int32_t>();
    EXPECT_EQ(f[0], 0) << "host_f32 " << host_f32;
    EXPECT_EQ(f[1], kNonfiniteExpAvgSq) << "host_f32 " << host_f32;
    EXPECT_EQ(f[2], kNonfiniteParam | kNonfiniteExpAvg | kNonfiniteExpAvgSq) << "host_f32 " << host_f32;
    EXPECT_EQ(f[3], kNonfiniteParam) << "host_f32 " << host_f32;
    EXPECT_TRUE(std::isfinite(tensors[1].param.data<float>()[70000]));
    EXPECT_TRUE(std::isnan(tensors[2].param.data<float>()[40]));
  }
}

}  // namespace
}  // namespace shardtrain::ops
