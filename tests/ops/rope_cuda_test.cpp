// RoPE applied in place, and its inverse, on the GPU against the CPU twin, on random data in
// f32 and bf16, odd and aligned shapes. Skips without a device.
#include <gtest/gtest.h>

#include <cmath>

#include "ops/rope.h"
#include "testing/cuda_ops.h"

namespace shardtrain::ops {
namespace {

using namespace testing;  // Input, random_input, matches, to_device, to_host, ...

class RopeCuda : public testing::CudaDtypeTest {};

TEST_P(RopeCuda, RopeAndInverse) {
  const DType dt = GetParam();
  RopeOptions o;
  o.theta = 500000;
  o.scaling.type = RopeScalingType::kLlama3;
  // H/2 = 6: the scalar kernel; 8, 32 and 64: the 16-byte packed one (f32 and bf16)
  for (auto [B, T, heads, H] : {std::tuple<int64_t, int64_t, int64_t, int64_t>{2, 37, 3, 16}, {1, 33, 2, 12},
                                {2, 64, 4, 64}, {1, 1024, 8, 128}}) {
    Tensor cos64 = Tensor::empty({T + 5, H / 2}, DType::kF32), sin64 = Tensor::empty({T + 5, H / 2}, DType::kF32);
    rope_table(cos64, sin64, H, o);
    const Tensor cos_t = to_dtype(cos64, dt), sin_t = to_dtype(sin64, dt);
    Input x = random_input({B, T, heads, H}, dt, 21);
    Tensor dx = to_device(x.host);
    rope_forward(dx, to_device(cos_t), to_device(sin_t));
    Tensor ref = x.f32;
    Tensor cf = to_dtype(cos_t, DType::kF32), sf = to_dtype(sin_t, DType::kF32);
    cpu::rope_forward(ref, cf, sf);
    EXPECT_TRUE(matches(dx, ref)) << "forward T=" << T << " H=" << H;
    Tensor back = to_device(to_dtype(ref, dt));
    Tensor back_ref = to_dtype(to_dtype(ref, dt), DType::kF32);
    rope_backward(back, to_device(cos_t), to_device(sin_t));
    cpu::rope_backward(back_ref, cf, sf);
    EXPECT_TRUE(matches(back, back_ref)) << "backward T=" << T << " H=" << H;
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, RopeCuda, ::testing::Values(DType::kF32, DType::kBF16), testing::dtype_param_name);

}  // namespace
}  // namespace shardtrain::ops
