// SwiGLU forward and backward on the GPU against the CPU twin, on random data in f32 and bf16,
// odd and aligned shapes, with and without the backward's recompute of h, in place. Skips without a device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "ops/elementwise.h"
#include "ops/swiglu.h"
#include "testing/cuda_ops.h"

namespace shardtrain::ops {
namespace {

using namespace testing;  // Input, random_input, matches, to_device, to_host, ...

class SwiGluCuda : public testing::CudaDtypeTest {};

TEST_P(SwiGluCuda, SwiGlu) {
  const DType dt = GetParam();
  // odd (element kernels), few packs (fewer than the grid's threads), many packs (two per
  // thread and iteration, and a tail)
  for (auto [T, F] : {std::pair<int64_t, int64_t>{37, 67}, {64, 64}, {512, 8192}}) {
    Input g = random_input({T, F}, dt, 31, 0.2, 2.0), u = random_input({T, F}, dt, 32), dh = random_input({T, F}, dt, 33);
    Tensor h = Tensor::empty({T, F}, dt, Device::cuda(0));
    swiglu_forward(h, to_device(g.host), to_device(u.host));
    Tensor h_ref = Tensor::empty({T, F}, DType::kF32);
    cpu::swiglu_forward(h_ref, g.f32, u.f32);
    EXPECT_TRUE(matches(h, h_ref)) << "forward";
    Tensor dg = Tensor::empty({T, F}, dt, Device::cuda(0)), du = Tensor::empty({T, F}, dt, Device::cuda(0));
    Tensor no_h;
    swiglu_backward(dg, du, no_h, to_device(dh.host), to_device(g.host), to_device(u.host));
    Tensor dg_ref = Tensor::empty({T, F}, DType::kF32), du_ref = Tensor::empty({T, F}, DType::kF32);
    cpu::swiglu_backward(dg_ref, du_ref, no_h, dh.f32, g.f32, u.f32);
    EXPECT_TRUE(matches(dg, dg_ref)) << "dgate";
    EXPECT_TRUE(matches(du, du_ref)) << "dup";
    // with h recomputed (pointwise checkpointing): h bitwise the forward's, the gradients unchanged
    Tensor dg2 = Tensor::empty({T, F}, dt, Device::cuda(0)), du2 = Tensor::empty({T, F}, dt, Device::cuda(0));
    Tensor h2 = Tensor::empty({T, F}, dt, Device::cuda(0));
    swiglu_backward(dg2, du2, h2, to_device(dh.host), to_device(g.host), to_device(u.host));
    EXPECT_TRUE(all_close(to_host(h2), to_host(h), kExact)) << "recomputed h";
    EXPECT_TRUE(all_close(to_host(dg2), to_host(dg), kExact)) << "dgate with h";
    EXPECT_TRUE(all_close(to_host(du2), to_host(du), kExact)) << "dup with h";
    // in place, as the block runs it: the gradients overwrite gate and up
    Tensor g_in_place = to_device(g.host), u_in_place = to_device(u.host);
    swiglu_backward(g_in_place, u_in_place, no_h, to_device(dh.host), g_in_place, u_in_place);
    EXPECT_TRUE(all_close(to_host(g_in_place), to_host(dg), kExact)) << "dgate in place";
    EXPECT_TRUE(all_close(to_host(u_in_place), to_host(du), kExact)) << "dup in place";
  }
}

// gate and up as the two halves of one stacked [T, 2F] product (the block's gate|up GEMM
// output), the gradients written over them in place: the row kernels against the CPU twin.
TEST_P(SwiGluCuda, HalvesOfAStackedTensor) {
  const DType dt = GetParam();
  for (auto [T, F] : {std::pair<int64_t, int64_t>{37, 64}, {3, 8192}, {1000, 1024}}) {
    const Input gu = random_input({T, 2 * F}, dt, 41, 0.2, 2.0), dh = random_input({T, F}, dt, 42);
    const Tensor g32 = to_dtype(gu.f32.slice(1, 0, F), DType::kF32);
    const Tensor u32 = to_dtype(gu.f32.slice(1, F, 2 * F), DType::kF32);
    const Tensor dev = to_device(gu.host);
    Tensor h = Tensor::empty({T, F}, dt, Device::cuda(0));
    swiglu_forward(h, dev.slice(1, 0, F), dev.slice(1, F, 2 * F));
    Tensor h_ref = Tensor::empty({T, F}, DType::kF32);
    cpu::swiglu_forward(h_ref, g32, u32);
    EXPECT_TRUE(matches(h, h_ref)) << "forward T=" << T;
    Tensor dgu = to_device(gu.host);
    Tensor dg = dgu.slice(1, 0, F), du = dgu.slice(1, F, 2 * F), h2 = Tensor::empty({T, F}, dt, Device::cuda(0));
    swiglu_backward(dg, du, h2, to_device(dh.host), dg, du);
    Tensor dg_ref = Tensor::empty({T, F}, DType::kF32), du_ref = Tensor::empty({T, F}, DType::kF32), no_h;
    cpu::swiglu_backward(dg_ref, du_ref, no_h, dh.f32, g32, u32);
    EXPECT_TRUE(matches(contiguous(dg), dg_ref)) << "dgate T=" << T;
    EXPECT_TRUE(matches(contiguous(du), du_ref)) << "dup T=" << T;
    EXPECT_TRUE(all_close(to_host(h2), to_host(h), kExact)) << "recomputed h T=" << T;
  }
}

// The FP8 amax outputs on the device: the largest magnitude of the values the kernel wrote
// (read back), for the element kernels and the row kernels (halves of a stacked tensor).
TEST_P(SwiGluCuda, AmaxOfWhatItWrites) {
  const DType dt = GetParam();
  auto largest_bits = [](std::initializer_list<const Tensor*> device) {
    uint32_t m = 0;
    for (const Tensor* d : device) {
      const Tensor h = to_dtype(to_host(*d), DType::kF32);
      for (int64_t i = 0; i < h.numel(); ++i) {
        uint32_t b;
        std::memcpy(&b, &h.data<float>()[i], sizeof b);
        m = std::max(m, b & 0x7fffffffu);
      }
    }
    return m;
  };
  auto slot_bits = [](const Tensor& slot) {
    const Tensor h = to_host(slot);
    uint32_t b;
    std::memcpy(&b, h.raw_data(), sizeof b);
    return b;
  };
  // an odd width (separate tensors, the element kernels) and the halves of a stacked tensor
  for (auto [T, F] : {std::pair<int64_t, int64_t>{37, 67}, {1000, 1024}}) {
    const bool stacked = F % 8 == 0;
    const Input gu = random_input({T, 2 * F}, dt, 61, 0.2, 2.0), dh = random_input({T, F}, dt, 62);
    Tensor dgu = to_device(gu.host);
    Tensor gate = stacked ? dgu.slice(1, 0, F) : contiguous(dgu.slice(1, 0, F));
    Tensor up = stacked ? dgu.slice(1, F, 2 * F) : contiguous(dgu.slice(1, F, 2 * F));
    Tensor h = Tensor::empty({T, F}, dt, Device::cuda(0)), slot = Tensor::empty({1}, DType::kI32, Device::cuda(0));
    fill(slot, 0.0);
    swiglu_forward(h, gate, up, slot);
    EXPECT_EQ(slot_bits(slot), largest_bits({&h})) << "h, T=" << T;
    Tensor grads = Tensor::empty({1}, DType::kI32, Device::cuda(0)), no_h;
    fill(grads, 0.0);
    swiglu_backward(gate, up, no_h, to_device(dh.host), gate, up, grads);
    EXPECT_EQ(slot_bits(grads), stacked ? largest_bits({&dgu}) : largest_bits({&gate, &up})) << "dgate|dup, T=" << T;
  }
}

// GeGLU (Gemma's gelu_pytorch_tanh gate) on the GPU against the CPU twin: element and row
// kernels, the halves of a stacked tensor, h recomputed bitwise by the backward.
TEST_P(SwiGluCuda, GeluTanh) {
  const DType dt = GetParam();
  const GluActivation gelu = GluActivation::kGeluTanh;
  for (auto [T, F] : {std::pair<int64_t, int64_t>{37, 67}, {512, 8192}}) {
    Input g = random_input({T, F}, dt, 61, 0.2, 3.0), u = random_input({T, F}, dt, 62), dh = random_input({T, F}, dt, 63);
    Tensor h = Tensor::empty({T, F}, dt, Device::cuda(0));
    swiglu_forward(h, to_device(g.host), to_device(u.host), Tensor(), gelu);
    Tensor h_ref = Tensor::empty({T, F}, DType::kF32);
    cpu::swiglu_forward(h_ref, g.f32, u.f32, {}, gelu);
    EXPECT_TRUE(matches(h, h_ref)) << "forward T=" << T << " F=" << F;
    Tensor dg = Tensor::empty({T, F}, dt, Device::cuda(0)), du = Tensor::empty({T, F}, dt, Device::cuda(0));
    Tensor h2 = Tensor::empty({T, F}, dt, Device::cuda(0));
    swiglu_backward(dg, du, h2, to_device(dh.host), to_device(g.host), to_device(u.host), Tensor(), gelu);
    Tensor dg_ref = Tensor::empty({T, F}, DType::kF32), du_ref = Tensor::empty({T, F}, DType::kF32), no_h;
    cpu::swiglu_backward(dg_ref, du_ref, no_h, dh.f32, g.f32, u.f32, {}, gelu);
    EXPECT_TRUE(matches(dg, dg_ref)) << "dgate T=" << T << " F=" << F;
    EXPECT_TRUE(matches(du, du_ref)) << "dup T=" << T << " F=" << F;
    EXPECT_TRUE(all_close(to_host(h2), to_host(h), kExact)) << "recomputed h";
  }
  // gate and up as halves of one stacked product, gradients in place
  const int64_t T = 37, F = 64;
  const Input gu = random_input({T, 2 * F}, dt, 64, 0.2, 3.0), dh = random_input({T, F}, dt, 65);
  const Tensor g32 = to_dtype(gu.f32.slice(1, 0, F), DType::kF32), u32 = to_dtype(gu.f32.slice(1, F, 2 * F), DType::kF32);
  Tensor dev = to_device(gu.host), h = Tensor::empty({T, F}, dt, Device::cuda(0));
  swiglu_forward(h, dev.slice(1, 0, F), dev.slice(1, F, 2 * F), Tensor(), gelu);
  Tensor h_ref = Tensor::empty({T, F}, DType::kF32);
  cpu::swiglu_forward(h_ref, g32, u32, {}, gelu);
  EXPECT_TRUE(matches(h, h_ref)) << "stacked forward";
  Tensor dg = dev.slice(1, 0, F), du = dev.slice(1, F, 2 * F), no_h;
  swiglu_backward(dg, du, no_h, to_device(dh.host), dg, du, Tensor(), gelu);
  Tensor dg_ref = Tensor::empty({T, F}, DType::kF32), du_ref = Tensor::empty({T, F}, DType::kF32);
  cpu::swiglu_backward(dg_ref, du_ref, no_h, dh.f32, g32, u32, {}, gelu);
  EXPECT_TRUE(matches(contiguous(dg), dg_ref)) << "stacked dgate";
  EXPECT_TRUE(matches(contiguous(du), du_ref)) << "stacked dup";
}

INSTANTIATE_TEST_SUITE_P(Dtypes, SwiGluCuda, ::testing::Values(DType::kF32, DType::kBF16), testing::dtype_param_name);

}  // namespace
}  // namespace shardtrain::ops
