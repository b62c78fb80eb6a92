// RMSNorm forward and backward (with and without the residual gradient) on the GPU against the
// CPU twin, on random data in f32 and bf16, odd and aligned shapes. Skips without a device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>

#include <cmath>

#include "ops/elementwise.h"
#include "ops/rmsnorm.h"
#include "testing/cuda_ops.h"

namespace shardtrain::ops {
namespace {

using namespace testing;  // Input, random_input, matches, to_device, to_host, ...

class RmsNormCuda : public testing::CudaDtypeTest {};

TEST_P(RmsNormCuda, RmsNorm) {
  const DType dt = GetParam();
  // odd width: element loops; 2048, 4096: 16-byte packs, a block per row in the backward;
  // 3001 x 512: more rows than the backward's blocks, so each block takes several rows and
  // prefetches past the last one; 8200: rows too wide for a block per row (more than 1024
  // packs), the shared-memory backward
  for (auto [T, D] : {std::pair<int64_t, int64_t>{37, 67}, {256, 2048}, {1031, 4096}, {3001, 512}, {19, 8200}}) {
    Input x = random_input({T, D}, dt, 11, 0.3, 2.0), w = random_input({D}, dt, 12, 1.0, 0.2),
          dy = random_input({T, D}, dt, 13);
    Tensor y = Tensor::empty({T, D}, dt, Device::cuda(0)), rstd = Tensor::empty({T}, DType::kF32, Device::cuda(0));
    rmsnorm_forward(y, rstd, to_device(x.host), to_device(w.host), {1e-5});
    Tensor y_ref = Tensor::empty({T, D}, DType::kF32), rstd_ref = Tensor::empty({T}, DType::kF32);
    cpu::rmsnorm_forward(y_ref, rstd_ref, x.f32, w.f32, {1e-5});
    EXPECT_TRUE(matches(y, y_ref)) << "forward T=" << T << " D=" << D;
    EXPECT_TRUE(all_close(to_host(rstd), rstd_ref, testing::kCudaF32VsCpu)) << "rstd";
    {
      // the FP8 amax output: the largest |y| of what the kernel wrote, as u32 bits
      Tensor y2 = Tensor::empty({T, D}, dt, Device::cuda(0)), slot = Tensor::empty({1}, DType::kI32, Device::cuda(0));
      fill(slot, 0.0);
      rmsnorm_forward(y2, rstd, to_device(x.host), to_device(w.host), {.eps = 1e-5, .amax_y_1 = slot});
      const Tensor yh = to_dtype(to_host(y2), DType::kF32), sh = to_host(slot);
      uint32_t largest = 0, got;
      for (int64_t i = 0; i < yh.numel(); ++i) {
        uint32_t b;
        std::memcpy(&b, &yh.data<float>()[i], sizeof b);
        largest = std::max(largest, b & 0x7fffffffu);
      }
      std::memcpy(&got, sh.raw_data(), sizeof got);
      EXPECT_EQ(got, largest) << "amax T=" << T << " D=" << D;
    }

    Input dw0 = random_input({D}, dt, 14);
    Tensor dx = Tensor::empty({T, D}, dt, Device::cuda(0)), dw = to_device(dw0.host);
    rmsnorm_backward(dx, dw, to_device(dy.host), to_device(x.host), to_device(w.host), rstd);
    Tensor dx_ref = Tensor::empty({T, D}, DType::kF32), dw_ref = dw0.f32;
    cpu::rmsnorm_backward(dx_ref, dw_ref, dy.f32, x.f32, w.f32, rstd_ref);
    EXPECT_TRUE(matches(dx, dx_ref)) << "dx T=" << T << " D=" << D;
    // dweight sums T products of order 1 that largely cancel: summation order alone moves a
    // column by up to ~T * 2^-24 * max|term|, so the elementwise bound scales with T here.
    testing::Tolerance column_sum = cuda_tolerance(dt);
    column_sum.atol = std::max(column_sum.atol, static_cast<double>(T) * 6e-8 * 16);
    EXPECT_TRUE(all_close(to_host(dw), to_dtype(dw_ref, dt), column_sum)) << "dweight (accumulated) T=" << T << " D=" << D;

    // with the residual's gradient added to dx, and an f32 weight gradient (mixed precision)
    Input res = random_input({T, D}, dt, 15);
    Tensor dx2 = Tensor::empty({T, D}, dt, Device::cuda(0)), dw32 = to_device(to_dtype(dw0.host, DType::kF32));
    rmsnorm_backward(dx2, dw32, to_device(dy.host), to_device(x.host), to_device(w.host), rstd, to_device(res.host));
    Tensor dx2_ref = Tensor::empty({T, D}, DType::kF32);
    cpu::add(dx2_ref, dx_ref, res.f32);
    EXPECT_TRUE(matches(dx2, dx2_ref)) << "dx + residual T=" << T << " D=" << D;
    EXPECT_TRUE(all_close(to_host(dw32), dw_ref, column_sum)) << "f32 dweight T=" << T << " D=" << D;

    // overwrite_dweight: bitwise what accumulating onto zeros gives
    Tensor dw_zero = Tensor::empty({D}, DType::kF32, Device::cuda(0));
    Tensor dw_over = to_device(to_dtype(dw0.host, DType::kF32));
    fill(dw_zero, 0.0);
    rmsnorm_backward(dx2, dw_zero, to_device(dy.host), to_device(x.host), to_device(w.host), rstd);
    rmsnorm_backward(dx2, dw_over, to_device(dy.host), to_device(x.host), to_device(w.host), rstd, Tensor(),
                     {.overwrite_dweight = true});
    EXPECT_TRUE(all_close(to_host(dw_over), to_host(dw_zero), testing::kExact)) << "dweight (overwritten) T=" << T;
  }
}

// Gemma's (1 + w) norm on the GPU against the CPU twin: forward (scaled in f32, rounded once),
// dx and the weight's gradient, packed and element widths.
TEST_P(RmsNormCuda, WeightOffset) {
  const DType dt = GetParam();
  for (auto [T, D] : {std::pair<int64_t, int64_t>{37, 67}, {256, 2048}, {19, 8200}}) {
    Input x = random_input({T, D}, dt, 51, 0.3, 2.0), w = random_input({D}, dt, 52, 0.0, 0.2),
          dy = random_input({T, D}, dt, 53);
    Tensor y = Tensor::empty({T, D}, dt, Device::cuda(0)), rstd = Tensor::empty({T}, DType::kF32, Device::cuda(0));
    rmsnorm_forward(y, rstd, to_device(x.host), to_device(w.host), {.eps = 1e-6, .weight_offset = 1.0});
    Tensor y_ref = Tensor::empty({T, D}, DType::kF32), rstd_ref = Tensor::empty({T}, DType::kF32);
    cpu::rmsnorm_forward(y_ref, rstd_ref, x.f32, w.f32, {.eps = 1e-6, .weight_offset = 1.0});
    EXPECT_TRUE(matches(y, y_ref)) << "forward T=" << T << " D=" << D;
    Tensor dx = Tensor::empty({T, D}, dt, Device::cuda(0)), dw = Tensor::empty({D}, DType::kF32, Device::cuda(0));
    rmsnorm_backward(dx, dw, to_device(dy.host), to_device(x.host), to_device(w.host), rstd, Tensor(),
                     {.weight_offset = 1.0, .overwrite_dweight = true});
    Tensor dx_ref = Tensor::empty({T, D}, DType::kF32), dw_ref = Tensor::zeros({D}, DType::kF32);
    cpu::rmsnorm_backward(dx_ref, dw_ref, dy.f32, x.f32, w.f32, rstd_ref, {.weight_offset = 1.0});
    EXPECT_TRUE(matches(dx, dx_ref)) << "dx T=" << T << " D=" << D;
    testing::Tolerance column_sum = cuda_tolerance(dt);
    column_sum.atol = std::max(column_sum.atol, static_cast<double>(T) * 6e-8 * 16);
    EXPECT_TRUE(all_close(to_host(dw), dw_ref, column_sum)) << "dweight T=" << T << " D=" << D;
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, RmsNormCuda, ::testing::Values(DType::kF32, DType::kBF16), testing::dtype_param_name);

}  // namespace
}  // namespace shardtrain::ops
