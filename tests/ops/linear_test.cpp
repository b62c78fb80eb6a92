// CPU linear (BLAS): forward against a direct f64 product, backward against finite
// differences for x, weight and bias, and the dx overwrite/accumulate and dW accumulate rules;
// the scoped GEMM SM reserve.
#include <algorithm>
#include <cmath>
#include <thread>

#include "ops/linear.h"
#include "ops/op_testing.h"

namespace shardtrain::ops {
namespace {

Tensor direct(const Tensor& x, const Tensor& w, const Tensor& b) {
  const int64_t T = x.size(0), I = x.size(1), O = w.size(0);
  const Tensor x64 = testing::to_f64(x), w64 = testing::to_f64(w), b64 = b.defined() ? testing::to_f64(b) : Tensor();
  Tensor y = Tensor::empty({T, O}, DType::kF64);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t o = 0; o < O; ++o) {
      double s = b.defined() ? b64.data<double>()[o] : 0.0;
      for (int64_t i = 0; i < I; ++i) s += x64.data<double>()[t * I + i] * w64.data<double>()[o * I + i];
      y.data<double>()[t * O + o] = s;
    }
  return y;
}

// f32 BLAS sums K products in its own order: elements near zero (cancelling sums) differ
// from the f64 reference by up to about sqrt(K) * 2^-24 * the partial sums' size, so the
// elementwise bound carries that absolute term; the relative-norm bound stays shared.
testing::Tolerance gemm_tolerance(int64_t K, const Tensor& ref) {
  double m = 0;
  for (int64_t i = 0; i < ref.numel(); ++i) m = std::max(m, std::fabs(ref.data<double>()[i]));
  testing::Tolerance t = testing::kCpuF32VsF64;
  t.atol = std::max(t.atol, 4.0 * std::sqrt(static_cast<double>(K)) * 0x1p-24 * m);
  return t;
}

TEST(Linear, ForwardMatchesDirect) {
  for (auto [T, I, O] : {std::tuple<int64_t, int64_t, int64_t>{37, 67, 45}, {64, 128, 256}, {1, 300, 7}}) {
    for (DType dt : {DType::kF32, DType::kF64}) {
      for (bool bias : {false, true}) {
        const Tensor x = testing::to_dtype(random_f64({T, I}, 1), dt), w = testing::to_dtype(random_f64({O, I}, 2, -0.05, 0.2), dt);
        const Tensor b = bias ? testing::to_dtype(random_f64({O}, 3), dt) : Tensor();
        Tensor y = Tensor::empty({T, O}, dt);
        cpu::linear_forward(y, x, w, b);
        const Tensor ref = direct(x, w, b);
        EXPECT_TRUE(testing::all_close(y, ref, gemm_tolerance(I, ref)))
            << dtype_name(dt) << " T=" << T << " I=" << I << " O=" << O << " bias=" << bias;
      }
    }
  }
}

TEST(Linear, BackwardMatchesFiniteDifferences_f64_T7_I9_O5) {
  const int64_t T = 7, I = 9, O = 5;
  Tensor x = random_f64({T, I}, 4), w = random_f64({O, I}, 5), b = random_f64({O}, 6);
  const Tensor dy = random_f64({T, O}, 7);
  const Tensor dw0 = random_f64({O, I}, 8), db0 = random_f64({O}, 9), dx0 = random_f64({T, I}, 10);
  Tensor dx = testing::to_f64(dx0), dw = testing::to_f64(dw0), db = testing::to_f64(db0);
  cpu::linear_backward(dx, dw, db, dy, x, w, {});
  auto minus = [](const Tensor& a, const Tensor& s) {
    Tensor r = testing::to_f64(a);
    for (int64_t i = 0; i < r.numel(); ++i) r.data<double>()[i] -= s.data<double>()[i];
    return r;
  };
  Tensor y = Tensor::empty({T, O}, DType::kF64);
  expect_gradients({{"x (overwritten)", &x, dx}, {"weight (accumulated)", &w, minus(dw, dw0)},
                    {"bias (accumulated)", &b, minus(db, db0)}},
                   [&] {
                     cpu::linear_forward(y, x, w, b);
                     return testing::dot(dy, y);
                   });
  // accumulate_dx adds onto what is there
  Tensor dx_acc = testing::to_f64(dx0), unused_dw = Tensor::zeros({O, I}, DType::kF64), none;
  cpu::linear_backward(dx_acc, unused_dw, none, dy, x, w, {.accumulate_dx = true});
  EXPECT_TRUE(testing::all_close(minus(dx_acc, dx0), dx, {1e-12, 1e-12, 1e-12}));
  // each half alone, as a backward that recomputes x after dx calls them: the same products,
  // and a call for dx alone needs no x
  Tensor dx_alone = Tensor::empty({T, I}, DType::kF64), dw_alone = testing::to_f64(dw0), no_x;
  cpu::linear_backward(dx_alone, none, none, dy, no_x, w, {});
  EXPECT_TRUE(testing::all_close(dx_alone, dx, testing::kExact));
  cpu::linear_backward(none, dw_alone, none, dy, x, w, {});
  EXPECT_TRUE(testing::all_close(dw_alone, dw, testing::kExact));
  EXPECT_TRUE(throws_with([&] { cpu::linear_backward(none, dw_alone, none, dy, no_x, w, {}); },
                          "`x_TI` may be undefined only in a call for `dx_TI` alone"));
}

// overwrite_dweight: the weight's and bias's gradients replace what their buffers held,
// bitwise what accumulating onto zeros gives, in both dtypes and with no tokens at all.
TEST(Linear, OverwriteDweightEqualsAccumulatingOntoZeros) {
  for (DType dt : {DType::kF32, DType::kF64}) {
    for (int64_t T : {0, 1, 33}) {
      const int64_t I = 19, O = 11;
      const Tensor x = testing::to_dtype(random_f64({T, I}, 21), dt), w = testing::to_dtype(random_f64({O, I}, 22), dt);
      const Tensor dy = testing::to_dtype(random_f64({T, O}, 23), dt);
      Tensor dw_zero = testing::to_dtype(Tensor::zeros({O, I}, DType::kF64), dt);
      Tensor db_zero = testing::to_dtype(Tensor::zeros({O}, DType::kF64), dt);
      Tensor dw_over = testing::to_dtype(random_f64({O, I}, 24), dt);  // garbage to be replaced
      Tensor db_over = testing::to_dtype(random_f64({O}, 25), dt);
      Tensor none;
      cpu::linear_backward(none, dw_zero, db_zero, dy, x, w, {});
      cpu::linear_backward(none, dw_over, db_over, dy, x, w, {.overwrite_dweight = true});
      const std::string what = std::string(dtype_name(dt)) + " T=" + std::to_string(T);
      EXPECT_TRUE(testing::all_close(dw_over, dw_zero, testing::kExact)) << what;
      EXPECT_TRUE(testing::all_close(db_over, db_zero, testing::kExact)) << what;
    }
  }
}

TEST(Linear, ErrorsNameTheArgument) {
  Tensor x = Tensor::zeros({4, 8}, DType::kF32), w = Tensor::zeros({3, 9}, DType::kF32), y = Tensor::zeros({4, 3}, DType::kF32);
  EXPECT_TRUE(throws_with([&] { cpu::linear_forward(y, x, w, Tensor()); }, "`weight_OI` expected shape [3, 8], found [3, 9]"));
}

// The SM reserve is per thread and scoped: guards nest and restore the reserve before them.
TEST(Linear, GemmSmReserveNestsAndRestores) {
  EXPECT_EQ(gemm_sm_reserve(), 0);
  {
    const GemmSmReserve outer(16);
    EXPECT_EQ(gemm_sm_reserve(), 16);
    {
      const GemmSmReserve inner(0);
      EXPECT_EQ(gemm_sm_reserve(), 0);
    }
    EXPECT_EQ(gemm_sm_reserve(), 16);
    int other_thread = -1;
    std::thread([&] { other_thread = gemm_sm_reserve(); }).join();
    EXPECT_EQ(other_thread, 0);
  }
  EXPECT_EQ(gemm_sm_reserve(), 0);
  EXPECT_TRUE(throws_with([] { const GemmSmReserve bad(-1); }, "expected 0 or more SMs, found -1"));
}

}  // namespace
}  // namespace shardtrain::ops
