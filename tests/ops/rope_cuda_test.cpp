// RoPE applied in place, and its inverse, on the GPU against the CPU twin, on random data in
// f32 and bf16, odd and aligned shapes, whole heads and a partial rotary's share of them.
// Skips without a device.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <tuple>

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
    cpu::rope_forward(ref, cf, sf, {});
    EXPECT_TRUE(matches(dx, ref)) << "forward T=" << T << " H=" << H;
    Tensor back = to_device(to_dtype(ref, dt));
    Tensor back_ref = to_dtype(to_dtype(ref, dt), DType::kF32);
    rope_backward(back, to_device(cos_t), to_device(sin_t));
    cpu::rope_backward(back_ref, cf, sf, {});
    EXPECT_TRUE(matches(back, back_ref)) << "backward T=" << T << " H=" << H;
  }
}

// Per-token positions (packed documents) on the scalar and the packed kernels, contiguous and
// on a stacked tensor's heads: the CPU twin with the same positions.
TEST_P(RopeCuda, PositionsPickEachTokensTableRow) {
  const DType dt = GetParam();
  for (auto [B, T, heads, H, stride] : {std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t>{2, 37, 3, 12, 3},
                                        {2, 300, 12, 64, 0}}) {
    Tensor cos64 = Tensor::empty({T, H / 2}, DType::kF32), sin64 = Tensor::empty({T, H / 2}, DType::kF32);
    rope_table(cos64, sin64, H, RopeOptions{});
    const Tensor cos_t = to_dtype(cos64, dt), sin_t = to_dtype(sin64, dt);
    const Tensor cf = to_dtype(cos_t, DType::kF32), sf = to_dtype(sin_t, DType::kF32);
    Tensor pos = Tensor::empty({B, T}, DType::kI32);
    for (int64_t i = 0, p = 0; i < B * T; ++i, ++p) {  // documents of 1, 2, 3, ... tokens, rows restarting
      if (i % T == 0 || p > (i % 7)) p = 0;
      pos.data<int32_t>()[i] = static_cast<int32_t>(p);
    }
    const Input x = random_input({B, T, heads + stride, H}, dt, 25);
    for (bool forward : {true, false}) {
      Tensor dev = to_device(x.host);
      Tensor part = dev.slice(2, 0, heads);
      Tensor ref = to_dtype(x.f32.slice(2, 0, heads), DType::kF32);
      if (forward) {
        rope_forward(part, to_device(cos_t), to_device(sin_t), to_device(pos));
        cpu::rope_forward(ref, cf, sf, pos);
      } else {
        rope_backward(part, to_device(cos_t), to_device(sin_t), to_device(pos));
        cpu::rope_backward(ref, cf, sf, pos);
      }
      EXPECT_TRUE(matches(contiguous(part), ref)) << (forward ? "forward" : "backward") << " T=" << T << " H=" << H;
    }
  }
}

// q's and k's heads sliced out of a stacked [B, T, N + 2M, H] tensor (the model's q|k|v
// product, rotated in one call): the same as the CPU twin on them, the v heads untouched.
TEST_P(RopeCuda, HeadsOfAStackedTensor) {
  const DType dt = GetParam();
  for (auto [B, T, N, M, H] : {std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t>{2, 37, 4, 2, 16},
                               {1, 33, 3, 1, 12}, {2, 64, 32, 8, 64}}) {
    Tensor cos64 = Tensor::empty({T, H / 2}, DType::kF32), sin64 = Tensor::empty({T, H / 2}, DType::kF32);
    rope_table(cos64, sin64, H, RopeOptions{});
    const Tensor cos_t = to_dtype(cos64, dt), sin_t = to_dtype(sin64, dt);
    const Tensor cf = to_dtype(cos_t, DType::kF32), sf = to_dtype(sin_t, DType::kF32);
    const Input x = random_input({B, T, N + 2 * M, H}, dt, 23);
    for (bool forward : {true, false}) {
      Tensor dev = to_device(x.host);
      Tensor qk = dev.slice(2, 0, N + M);
      Tensor ref = to_dtype(x.f32.slice(2, 0, N + M), DType::kF32);
      if (forward) {
        rope_forward(qk, to_device(cos_t), to_device(sin_t));
        cpu::rope_forward(ref, cf, sf, {});
      } else {
        rope_backward(qk, to_device(cos_t), to_device(sin_t));
        cpu::rope_backward(ref, cf, sf, {});
      }
      EXPECT_TRUE(matches(contiguous(qk), ref)) << "T=" << T << " H=" << H << (forward ? " forward" : " backward");
      const Tensor v = to_host(contiguous(dev.slice(2, N + M, N + 2 * M)));
      const Tensor v0 = to_dtype(x.host.slice(2, N + M, N + 2 * M), dt);
      EXPECT_EQ(std::memcmp(v.raw_data(), v0.raw_data(), v.nbytes()), 0) << "v heads changed, T=" << T;
    }
  }
}

// Partial rotary (Phi-4-mini) with LongRoPE's tables: the first 2K elements of each head
// rotate as the CPU twin rotates them, the rest stay bit for bit; on the scalar kernel (K not a
// multiple of the pack, or heads of H not one: 20 in bf16) and the packed one, contiguous and on
// a stacked tensor's heads, with per-token positions on one shape.
TEST_P(RopeCuda, PartialRotaryLeavesTheLastDimensionsAlone) {
  const DType dt = GetParam();
  for (auto [B, T, heads, H, fraction, stride] :
       {std::tuple<int64_t, int64_t, int64_t, int64_t, double, int64_t>{2, 37, 3, 16, 0.75, 0},
        {1, 33, 2, 20, 0.8, 1}, {2, 64, 4, 64, 0.75, 2}, {1, 300, 8, 128, 0.75, 0}, {2, 40, 3, 96, 0.75, 1}}) {
    RopeOptions o;
    o.theta = 10000;
    o.partial_rotary = fraction;
    const int64_t K = rope_rotary_dim(H, o) / 2;
    o.scaling.type = RopeScalingType::kLongRope;
    o.scaling.original_max_positions = 16;
    o.scaling.attention_factor = 1.19;
    for (int64_t k = 0; k < K; ++k) {
      o.scaling.short_factor.push_back(1.0 + 0.1 * static_cast<double>(k));
      o.scaling.long_factor.push_back(1.0 + 0.7 * static_cast<double>(k));
    }
    Tensor cos64 = Tensor::empty({T, K}, DType::kF32), sin64 = Tensor::empty({T, K}, DType::kF32);
    rope_table(cos64, sin64, H, o, T > 16);
    const Tensor cos_t = to_dtype(cos64, dt), sin_t = to_dtype(sin64, dt);
    const Tensor cf = to_dtype(cos_t, DType::kF32), sf = to_dtype(sin_t, DType::kF32);
    Tensor pos;
    if (stride == 1) {  // documents restarting their positions
      pos = Tensor::empty({B, T}, DType::kI32);
      for (int64_t i = 0; i < B * T; ++i) pos.data<int32_t>()[i] = static_cast<int32_t>((i % T) % 9);
    }
    const Input x = random_input({B, T, heads + stride, H}, dt, 27);
    for (bool forward : {true, false}) {
      Tensor dev = to_device(x.host);
      Tensor part = dev.slice(2, 0, heads);
      Tensor ref = to_dtype(x.f32.slice(2, 0, heads), DType::kF32);
      const Tensor dpos = pos.defined() ? to_device(pos) : Tensor();
      if (forward) {
        rope_forward(part, to_device(cos_t), to_device(sin_t), dpos);
        cpu::rope_forward(ref, cf, sf, pos);
      } else {
        rope_backward(part, to_device(cos_t), to_device(sin_t), dpos);
        cpu::rope_backward(ref, cf, sf, pos);
      }
      EXPECT_TRUE(matches(contiguous(part), ref))
          << (forward ? "forward" : "backward") << " T=" << T << " H=" << H << " K=" << K;
      // the pass-through elements (and any heads after `heads`) exactly as they were
      const Tensor got = to_host(dev);
      const Tensor was = to_dtype(x.host, dt);
      const size_t e = dtype_size(dt);
      for (int64_t r = 0; r < B * T * (heads + stride); ++r) {
        const int64_t from = r % (heads + stride) < heads ? 2 * K : 0;
        ASSERT_EQ(std::memcmp(static_cast<const char*>(got.raw_data()) + (r * H + from) * e,
                              static_cast<const char*>(was.raw_data()) + (r * H + from) * e, (H - from) * e),
                  0)
            << "row " << r << " changed past element " << from << ", H=" << H;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, RopeCuda, ::testing::Values(DType::kF32, DType::kBF16), testing::dtype_param_name);

}  // namespace
}  // namespace shardtrain::ops
