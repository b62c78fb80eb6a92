// Elementwise ops (Gemma 2's softcap among them), casts and the counter-based parameter init (fill_normal) on the GPU against
// the CPU twin, on random data in f32 and bf16, odd and aligned shapes. Skips without a
// device.
#include <gtest/gtest.h>

#include <cmath>

#include "ops/elementwise.h"
#include "testing/cuda_ops.h"

namespace shardtrain::ops {
namespace {

using namespace testing;  // Input, random_input, matches, to_device, to_host, ...

class ElementwiseCuda : public testing::CudaDtypeTest {};

TEST_P(ElementwiseCuda, ElementwiseAndCast) {
  const DType dt = GetParam();
  for (int64_t n : {1, 37, 4096, 300001}) {
    Input a = random_input({n}, dt, 1 + n), b = random_input({n}, dt, 2 + n);
    Tensor da = to_device(a.host), db = to_device(b.host);
    Tensor out = Tensor::empty({n}, dt, Device::cuda(0));
    add(out, da, db);
    Tensor ref = Tensor::empty({n}, DType::kF32);
    cpu::add(ref, a.f32, b.f32);
    EXPECT_TRUE(matches(out, ref)) << "add n=" << n;
    // in place, as the tensor-parallel pieces are summed: against the sums of what it read
    Tensor first = Tensor::empty({n}, DType::kF32);
    cpu::cast(first, to_host(out));
    add(out, out, db);
    cpu::add(ref, first, b.f32);
    EXPECT_TRUE(matches(out, ref)) << "add in place n=" << n;
    scale(out, -0.37);
    cpu::scale(ref, -0.37);
    EXPECT_TRUE(matches(out, ref)) << "scale n=" << n;
    // Gemma 2's logit soft-cap, at a cap the values reach (tanh bends them)
    softcap(out, 0.7);
    cpu::softcap(ref, 0.7);
    EXPECT_TRUE(matches(out, ref)) << "softcap n=" << n;
    Tensor sq = Tensor::empty({1}, DType::kF64, Device::cuda(0));
    fill(sq, 0.5);
    sum_squares(sq, da);
    Tensor sq_ref = Tensor::zeros({1}, DType::kF64);
    sq_ref.data<double>()[0] = 0.5;
    cpu::sum_squares(sq_ref, a.f32);
    EXPECT_TRUE(all_close(to_host(sq), sq_ref, {1e-6, 1e-6, 0})) << "sum_squares n=" << n;
    for (DType to : {DType::kF32, DType::kBF16, DType::kF16, DType::kF64}) {
      Tensor c = Tensor::empty({n}, to, Device::cuda(0));
      cast(c, da);
      Tensor c_ref = Tensor::empty({n}, to);
      cpu::cast(c_ref, a.host.dtype() == DType::kBF16 ? a.f32 : a.host);
      EXPECT_TRUE(all_close(to_host(c), c_ref, testing::kExact)) << "cast to " << dtype_name(to) << " n=" << n;
    }
  }
}

// The GPU initialises parameters from the same counters as the host: f64 values agree to an
// ulp or two (log and cos may round differently), so f32/bf16 values agree to one ulp at most
// and almost always exactly.
TEST(ElementwiseCudaInit, FillNormalMatchesHost) {
  ST_REQUIRE_CUDA();
  const int64_t n = (int64_t{1} << 20) + 7, first = 123456789;
  for (DType dt : {DType::kF64, DType::kF32, DType::kBF16}) {
    Tensor dev = Tensor::empty({n}, dt, Device::cuda(0)), host = Tensor::empty({n}, dt);
    fill_normal(dev, 42, 0xabcdef, first, 0.02);
    cpu::fill_normal(host, 42, 0xabcdef, first, 0.02);
    const Tensor got = to_host(dev);
    int64_t differing = 0;
    double sum_sq = 0;
    for (int64_t i = 0; i < n; ++i) {
      double a = 0, b = 0, ulp = 0;
      if (dt == DType::kF64) {
        a = got.data<double>()[i], b = host.data<double>()[i];
        ulp = std::nextafter(std::abs(b), 1.0) - std::abs(b);
      } else if (dt == DType::kF32) {
        a = got.data<float>()[i], b = host.data<float>()[i];
        ulp = std::nextafterf(static_cast<float>(std::abs(b)), 1.0f) - std::abs(b);
      } else {
        a = bf16_to_float(got.data<BFloat16>()[i]), b = bf16_to_float(host.data<BFloat16>()[i]);
        ulp = std::abs(b) * 0x1p-7 + 1e-30;  // bf16 keeps 8 significant bits
      }
      sum_sq += b * b;
      if (a != b) {
        ++differing;
        ASSERT_LE(std::abs(a - b), (dt == DType::kF64 ? 4 : 1) * ulp)
            << dtype_name(dt) << " element " << i << ": device " << a << ", host " << b;
      }
    }
    if (dt != DType::kF64) {
      EXPECT_LE(differing, n / 10000) << dtype_name(dt) << ": too many one-ulp differences";
    }
    EXPECT_NEAR(std::sqrt(sum_sq / static_cast<double>(n)), 0.02, 2e-4) << dtype_name(dt) << ": not N(0, 0.02^2)";
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, ElementwiseCuda, ::testing::Values(DType::kF32, DType::kBF16), testing::dtype_param_name);

}  // namespace
}  // namespace shardtrain::ops
