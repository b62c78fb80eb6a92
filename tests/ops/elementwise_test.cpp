// CPU elementwise ops against direct computations; casts round to nearest even.
#include <cmath>

#include "ops/elementwise.h"
#include "ops/op_testing.h"

namespace shardtrain::ops {
namespace {

TEST(Elementwise, AddScaleFillF32AndF64) {
  for (DType dt : {DType::kF32, DType::kF64}) {
    for (int64_t n : {1, 37, 70001}) {
      const Tensor a64 = random_f64({n}, 1), b64 = random_f64({n}, 2, -0.3, 2.0);
      const Tensor a = testing::to_dtype(a64, dt), b = testing::to_dtype(b64, dt);
      Tensor out = Tensor::empty({n}, dt);
      cpu::add(out, a, b);
      Tensor ref = Tensor::empty({n}, DType::kF64);
      const Tensor a_ref = testing::to_f64(a), b_ref = testing::to_f64(b);
      for (int64_t i = 0; i < n; ++i) ref.data<double>()[i] = a_ref.data<double>()[i] + b_ref.data<double>()[i];
      EXPECT_TRUE(testing::all_close(out, ref, testing::kCpuF32VsF64)) << dtype_name(dt) << " add n=" << n;
      cpu::add(out, out, b);  // aliasing out and a
      cpu::scale(out, -2.5);
      for (int64_t i = 0; i < n; ++i) ref.data<double>()[i] = -2.5 * (ref.data<double>()[i] + b_ref.data<double>()[i]);
      EXPECT_TRUE(testing::all_close(out, ref, testing::kCpuF32VsF64)) << dtype_name(dt) << " scale n=" << n;
      cpu::fill(out, 3.25);
      const Tensor filled = testing::to_f64(out);
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(filled.data<double>()[i], 3.25) << "index " << i;
    }
  }
}

// Large fills run on several threads, each a contiguous share (the boundaries at n * t / threads):
// every element, the last of each share included, gets the value, and nothing past the end.
TEST(Elementwise, LargeFillsReachEveryElement) {
  const int64_t n = (int64_t{5} << 20) + 3;  // 5 shares of the threshold and a remainder
  Tensor f = Tensor::empty({n + 1}, DType::kF32), i = Tensor::empty({n + 1}, DType::kI64);
  f.data<float>()[n] = -1.0f;
  i.data<int64_t>()[n] = -1;
  Tensor fv = f.slice(0, 0, n), iv = i.slice(0, 0, n);
  cpu::fill(fv, 0.5);
  cpu::fill(iv, 7.0);
  for (int64_t k = 0; k < n; ++k) {
    ASSERT_EQ(f.data<float>()[k], 0.5f) << "index " << k;
    ASSERT_EQ(i.data<int64_t>()[k], 7) << "index " << k;
  }
  EXPECT_EQ(f.data<float>()[n], -1.0f) << "past the end";
  EXPECT_EQ(i.data<int64_t>()[n], -1) << "past the end";
}

TEST(Elementwise, CastRoundsToNearestEven) {
  Tensor f = Tensor::empty({4}, DType::kF32);
  float* p = f.data<float>();
  p[0] = 1.00390625f;  // halfway between bf16 neighbours 1 and 1.0078125: ties to even (1)
  p[1] = 1.01171875f;  // halfway, rounds up to the even 1.015625
  p[2] = -3.5f;
  p[3] = 65520.0f;     // overflows f16 to infinity
  Tensor b = Tensor::empty({4}, DType::kBF16), h = Tensor::empty({4}, DType::kF16), back = Tensor::empty({4}, DType::kF32);
  cpu::cast(b, f);
  cpu::cast(back, b);
  EXPECT_EQ(back.data<float>()[0], 1.0f);
  EXPECT_EQ(back.data<float>()[1], 1.015625f);
  EXPECT_EQ(back.data<float>()[2], -3.5f);
  cpu::cast(h, f);
  cpu::cast(back, h);
  EXPECT_TRUE(std::isinf(back.data<float>()[3]));
  Tensor d = Tensor::empty({4}, DType::kF64);
  cpu::cast(d, f);
  EXPECT_EQ(d.data<double>()[2], -3.5);
}

TEST(Elementwise, SumSquaresAccumulatesInF64) {
  const Tensor x = random_f64({100003}, 5, 0.2, 3.0);
  Tensor out = Tensor::zeros({1}, DType::kF64);
  out.data<double>()[0] = 1.5;
  cpu::sum_squares(out, testing::to_dtype(x, DType::kF32));
  double ref = 1.5;
  const Tensor x32 = testing::to_f64(testing::to_dtype(x, DType::kF32));
  for (int64_t i = 0; i < x.numel(); ++i) ref += x32.data<double>()[i] * x32.data<double>()[i];
  EXPECT_NEAR(out.data<double>()[0], ref, 1e-12 * ref);
}

TEST(Elementwise, ErrorsNameTheArgument) {
  Tensor a = Tensor::zeros({3}, DType::kF32), b = Tensor::zeros({4}, DType::kF32), c = Tensor::zeros({3}, DType::kF64);
  EXPECT_TRUE(throws_with([&] { cpu::add(a, a, b); }, "`b` expected shape [3], found [4]"));
  EXPECT_TRUE(throws_with([&] { cpu::add(a, a, c); }, "`b` expected dtype f32, found f64"));
  Tensor i = Tensor::zeros({1}, DType::kI32);
  EXPECT_TRUE(throws_with([&] { cpu::sum_squares(i, a); }, "`out_1` expected dtype f64"));
}

}  // namespace
}  // namespace shardtrain::ops
