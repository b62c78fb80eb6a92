// CPU RMSNorm: forward against a direct f64 computation in f32 and f64, backward against
// finite differences, and the overwrite (dx) / accumulate (dweight) contract.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "ops/op_testing.h"
#include "ops/rmsnorm.h"

namespace shardtrain::ops {
namespace {

Tensor direct(const Tensor& x, const Tensor& w, double eps) {
  const int64_t T = x.size(0), D = x.size(1);
  const Tensor x64 = testing::to_f64(x), w64 = testing::to_f64(w);
  Tensor y = Tensor::empty({T, D}, DType::kF64);
  for (int64_t t = 0; t < T; ++t) {
    double ss = 0;
    for (int64_t i = 0; i < D; ++i) ss += x64.data<double>()[t * D + i] * x64.data<double>()[t * D + i];
    const double r = 1 / std::sqrt(ss / D + eps);
    for (int64_t i = 0; i < D; ++i) y.data<double>()[t * D + i] = w64.data<double>()[i] * x64.data<double>()[t * D + i] * r;
  }
  return y;
}

// The FP8 amax output: the largest |y| written, max-ed into the slot as u32 bits.
TEST(RmsNorm, AmaxOfWhatItWrites) {
  const Tensor x = testing::to_dtype(random_f64({37, 67}, 3, 0.3, 2.0), DType::kF32);
  const Tensor w = testing::to_dtype(random_f64({67}, 4, 1.0, 0.3), DType::kF32);
  Tensor y = Tensor::empty({37, 67}, DType::kF32), rstd = Tensor::empty({37}, DType::kF32);
  Tensor slot = Tensor::zeros({1}, DType::kI32);
  cpu::rmsnorm_forward(y, rstd, x, w, {.eps = 1e-5, .amax_y_1 = slot});
  float largest = 0, got;
  for (int64_t i = 0; i < y.numel(); ++i) largest = std::max(largest, std::fabs(y.data<float>()[i]));
  std::memcpy(&got, slot.raw_data(), sizeof got);
  EXPECT_EQ(got, largest);
}

TEST(RmsNorm, ForwardMatchesDirect) {
  for (auto [T, D] : {std::pair<int64_t, int64_t>{37, 67}, {64, 128}, {300, 512}}) {
    for (DType dt : {DType::kF32, DType::kF64}) {
      const Tensor x = testing::to_dtype(random_f64({T, D}, 1, 0.3, 2.0), dt);
      const Tensor w = testing::to_dtype(random_f64({D}, 2, 1.0, 0.3), dt);
      Tensor y = Tensor::empty({T, D}, dt), rstd = Tensor::empty({T}, stats_dtype(dt));
      cpu::rmsnorm_forward(y, rstd, x, w, {1e-5});
      EXPECT_TRUE(testing::all_close(y, direct(x, w, 1e-5), testing::kCpuF32VsF64))
          << dtype_name(dt) << " T=" << T << " D=" << D;
    }
  }
}

TEST(RmsNorm, BackwardMatchesFiniteDifferences_f64_T5_D13) {
  const int64_t T = 5, D = 13;
  Tensor x = random_f64({T, D}, 3, 0.3, 2.0), w = random_f64({D}, 4, 1.0, 0.3);
  const Tensor dy = random_f64({T, D}, 5);
  Tensor y = Tensor::empty({T, D}, DType::kF64), rstd = Tensor::empty({T}, DType::kF64);
  cpu::rmsnorm_forward(y, rstd, x, w, {1e-5});
  Tensor dx = random_f64({T, D}, 6);  // garbage: must be overwritten
  const Tensor dw0 = random_f64({D}, 7);
  Tensor dw = testing::to_f64(dw0);
  cpu::rmsnorm_backward(dx, dw, dy, x, w, rstd);
  Tensor dw_only = Tensor::empty({D}, DType::kF64);
  for (int64_t i = 0; i < D; ++i) dw_only.data<double>()[i] = dw.data<double>()[i] - dw0.data<double>()[i];
  expect_gradients({{"x", &x, dx}, {"weight", &w, dw_only}}, [&] {
    cpu::rmsnorm_forward(y, rstd, x, w, {1e-5});
    return testing::dot(dy, y);
  });
}

// overwrite_dweight: the weight's gradient replaces what its buffer held, bitwise what
// accumulating onto zeros gives (also with no rows: zero).
TEST(RmsNorm, OverwriteDweightEqualsAccumulatingOntoZeros) {
  for (int64_t T : {0, 6}) {
    const int64_t D = 13;
    const Tensor x = random_f64({T, D}, 31, 0.3, 2.0), w = random_f64({D}, 32, 1.0, 0.3), dy = random_f64({T, D}, 33);
    Tensor y = Tensor::empty({T, D}, DType::kF64), rstd = Tensor::empty({T}, DType::kF64);
    cpu::rmsnorm_forward(y, rstd, x, w, {1e-5});
    Tensor dx = Tensor::empty({T, D}, DType::kF64), dw_zero = Tensor::zeros({D}, DType::kF64);
    Tensor dw_over = random_f64({D}, 34);  // garbage to be replaced
    cpu::rmsnorm_backward(dx, dw_zero, dy, x, w, rstd);
    cpu::rmsnorm_backward(dx, dw_over, dy, x, w, rstd, {.overwrite_dweight = true});
    EXPECT_TRUE(testing::all_close(dw_over, dw_zero, testing::kExact)) << "T=" << T;
  }
}

// Gemma's (1 + w) norm: the weight offset is added inside the op, forward and backward; the
// weight's gradient is the plain one (d/dw of (w + 1) xhat is xhat).
TEST(RmsNorm, WeightOffsetScalesByWeightPlusOffset) {
  const int64_t T = 9, D = 24;
  for (DType dt : {DType::kF32, DType::kF64}) {
    const Tensor x = testing::to_dtype(random_f64({T, D}, 41, 0.3, 2.0), dt);
    const Tensor w = testing::to_dtype(random_f64({D}, 42, 0.0, 0.3), dt);  // near 0, as Gemma's
    Tensor w_plus = Tensor::empty({D}, DType::kF64);
    const Tensor w64 = testing::to_f64(w);
    for (int64_t i = 0; i < D; ++i) w_plus.data<double>()[i] = w64.data<double>()[i] + 1.0;
    Tensor y = Tensor::empty({T, D}, dt), rstd = Tensor::empty({T}, stats_dtype(dt));
    cpu::rmsnorm_forward(y, rstd, x, w, {.eps = 1e-6, .weight_offset = 1.0});
    EXPECT_TRUE(testing::all_close(y, direct(x, w_plus, 1e-6), testing::kCpuF32VsF64)) << dtype_name(dt);
  }
  Tensor x = random_f64({T, D}, 43, 0.3, 2.0), w = random_f64({D}, 44, 0.0, 0.3);
  const Tensor dy = random_f64({T, D}, 45);
  Tensor y = Tensor::empty({T, D}, DType::kF64), rstd = Tensor::empty({T}, DType::kF64);
  cpu::rmsnorm_forward(y, rstd, x, w, {.eps = 1e-6, .weight_offset = 1.0});
  Tensor dx = random_f64({T, D}, 46), dw = Tensor::zeros({D}, DType::kF64);
  cpu::rmsnorm_backward(dx, dw, dy, x, w, rstd, {.weight_offset = 1.0});
  expect_gradients({{"x", &x, dx}, {"weight", &w, dw}}, [&] {
    cpu::rmsnorm_forward(y, rstd, x, w, {.eps = 1e-6, .weight_offset = 1.0});
    return testing::dot(dy, y);
  });
}

TEST(RmsNorm, ErrorsNameTheArgument) {
  Tensor x = Tensor::zeros({4, 8}, DType::kF32), w = Tensor::zeros({9}, DType::kF32), y = Tensor::zeros({4, 8}, DType::kF32),
         r = Tensor::zeros({4}, DType::kF32);
  EXPECT_TRUE(throws_with([&] { cpu::rmsnorm_forward(y, r, x, w, {}); }, "`weight_D` expected shape [8], found [9]"));
  Tensor r64 = Tensor::zeros({4}, DType::kF64), w8 = Tensor::zeros({8}, DType::kF32);
  EXPECT_TRUE(throws_with([&] { cpu::rmsnorm_forward(y, r64, x, w8, {}); }, "`rstd_T` expected dtype f32"));
}

}  // namespace
}  // namespace shardtrain::ops
