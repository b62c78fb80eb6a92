// CPU SwiGLU and GeGLU: forward against act(g) * u in f64, backward against finite differences.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "ops/op_testing.h"
#include "ops/swiglu.h"

namespace shardtrain::ops {
namespace {

TEST(SwiGlu, ForwardAndBackward) {
  for (auto [T, F] : {std::pair<int64_t, int64_t>{37, 67}, {128, 512}}) {
    for (DType dt : {DType::kF32, DType::kF64}) {
      const Tensor g64 = random_f64({T, F}, 1, 0.2, 2.0), u64 = random_f64({T, F}, 2);
      const Tensor g = testing::to_dtype(g64, dt), u = testing::to_dtype(u64, dt);
      Tensor h = Tensor::empty({T, F}, dt);
      cpu::swiglu_forward(h, g, u);
      Tensor ref = Tensor::empty({T, F}, DType::kF64);
      const Tensor gr = testing::to_f64(g), ur = testing::to_f64(u);
      for (int64_t i = 0; i < T * F; ++i) {
        const double x = gr.data<double>()[i];
        ref.data<double>()[i] = x / (1 + std::exp(-x)) * ur.data<double>()[i];
      }
      EXPECT_TRUE(testing::all_close(h, ref, testing::kCpuF32VsF64)) << dtype_name(dt) << " T=" << T << " F=" << F;
    }
  }
  const int64_t T = 5, F = 11;
  Tensor g = random_f64({T, F}, 3, 0.2, 2.0), u = random_f64({T, F}, 4);
  const Tensor dh = random_f64({T, F}, 5);
  Tensor dg = random_f64({T, F}, 6), du = random_f64({T, F}, 7);  // garbage: overwritten
  Tensor no_h;
  cpu::swiglu_backward(dg, du, no_h, dh, g, u);
  Tensor h = Tensor::empty({T, F}, DType::kF64);
  expect_gradients({{"gate", &g, dg}, {"up", &u, du}}, [&] {
    cpu::swiglu_forward(h, g, u);
    return testing::dot(dh, h);
  });
}

// GeGLU (gelu_pytorch_tanh on the gate, Gemma's MLP): the forward against the formula in f64,
// the backward against finite differences, and h recomputed bitwise by the backward.
TEST(SwiGlu, GeluTanhForwardAndBackward) {
  const GluActivation gelu = GluActivation::kGeluTanh;
  for (DType dt : {DType::kF32, DType::kF64}) {
    const int64_t T = 37, F = 67;
    const Tensor g = testing::to_dtype(random_f64({T, F}, 21, 0.2, 3.0), dt), u = testing::to_dtype(random_f64({T, F}, 22), dt);
    Tensor h = Tensor::empty({T, F}, dt);
    cpu::swiglu_forward(h, g, u, {}, gelu);
    Tensor ref = Tensor::empty({T, F}, DType::kF64);
    const Tensor gr = testing::to_f64(g), ur = testing::to_f64(u);
    for (int64_t i = 0; i < T * F; ++i) {
      const double x = gr.data<double>()[i];
      const double gelu_x = 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
      ref.data<double>()[i] = gelu_x * ur.data<double>()[i];
    }
    EXPECT_TRUE(testing::all_close(h, ref, testing::kCpuF32VsF64)) << dtype_name(dt);
    // not silu: the two activations differ on these gates
    Tensor h_silu = Tensor::empty({T, F}, dt);
    cpu::swiglu_forward(h_silu, g, u);
    EXPECT_FALSE(testing::all_close(h_silu, ref, testing::kCpuF32VsF64)) << dtype_name(dt);
    const Tensor dh = testing::to_dtype(random_f64({T, F}, 23), dt);
    Tensor dg = Tensor::empty({T, F}, dt), du = Tensor::empty({T, F}, dt), no_h;
    Tensor dg2 = Tensor::empty({T, F}, dt), du2 = Tensor::empty({T, F}, dt), h_again = Tensor::empty({T, F}, dt);
    cpu::swiglu_backward(dg, du, no_h, dh, g, u, {}, gelu);
    cpu::swiglu_backward(dg2, du2, h_again, dh, g, u, {}, gelu);
    EXPECT_TRUE(testing::all_close(h_again, h, testing::kExact)) << dtype_name(dt);
    EXPECT_TRUE(testing::all_close(dg2, dg, testing::kExact)) << dtype_name(dt);
  }
  const int64_t T = 5, F = 11;
  Tensor g = random_f64({T, F}, 24, 0.2, 3.0), u = random_f64({T, F}, 25);
  const Tensor dh = random_f64({T, F}, 26);
  Tensor dg = random_f64({T, F}, 27), du = random_f64({T, F}, 28);  // garbage: overwritten
  Tensor no_h;
  cpu::swiglu_backward(dg, du, no_h, dh, g, u, {}, gelu);
  Tensor h = Tensor::empty({T, F}, DType::kF64);
  expect_gradients({{"gate", &g, dg}, {"up", &u, du}}, [&] {
    cpu::swiglu_forward(h, g, u, {}, gelu);
    return testing::dot(dh, h);
  });
}

// Pointwise checkpointing drops h and has the backward recompute it: it must be bitwise the
// forward's, and the gradients the same as without it.
TEST(SwiGlu, BackwardRecomputesTheForwardsH) {
  for (DType dt : {DType::kF32, DType::kF64}) {
    const int64_t T = 37, F = 67;
    const Tensor g = testing::to_dtype(random_f64({T, F}, 11, 0.2, 2.0), dt);
    const Tensor u = testing::to_dtype(random_f64({T, F}, 12), dt), dh = testing::to_dtype(random_f64({T, F}, 13), dt);
    Tensor h = Tensor::empty({T, F}, dt), h_again = testing::to_dtype(random_f64({T, F}, 14), dt);
    cpu::swiglu_forward(h, g, u);
    Tensor dg = Tensor::empty({T, F}, dt), du = Tensor::empty({T, F}, dt), no_h;
    Tensor dg2 = Tensor::empty({T, F}, dt), du2 = Tensor::empty({T, F}, dt);
    cpu::swiglu_backward(dg, du, no_h, dh, g, u);
    cpu::swiglu_backward(dg2, du2, h_again, dh, g, u);
    EXPECT_TRUE(testing::all_close(h_again, h, testing::kExact)) << dtype_name(dt);
    EXPECT_TRUE(testing::all_close(dg2, dg, testing::kExact)) << dtype_name(dt);
    EXPECT_TRUE(testing::all_close(du2, du, testing::kExact)) << dtype_name(dt);
  }
}

// gate and up as the two halves of one stacked [T, 2F] product (rows 2F apart), the
// gradients written over them in place as the block does: the same bits as contiguous.
TEST(SwiGlu, HalvesOfAStackedTensor) {
  const int64_t T = 9, F = 13;
  const Tensor gu = random_f64({T, 2 * F}, 21, 0.2, 2.0), dh = random_f64({T, F}, 22);
  const Tensor g = contiguous(gu.slice(1, 0, F)), u = contiguous(gu.slice(1, F, 2 * F));
  Tensor h = Tensor::empty({T, F}, DType::kF64), h_ref = Tensor::empty({T, F}, DType::kF64);
  cpu::swiglu_forward(h, gu.slice(1, 0, F), gu.slice(1, F, 2 * F));
  cpu::swiglu_forward(h_ref, g, u);
  EXPECT_TRUE(testing::all_close(h, h_ref, testing::kExact));
  Tensor dgu = testing::to_f64(gu);
  Tensor dg = dgu.slice(1, 0, F), du = dgu.slice(1, F, 2 * F), h_again = Tensor::empty({T, F}, DType::kF64);
  cpu::swiglu_backward(dg, du, h_again, dh, dg, du);
  Tensor dg_ref = Tensor::empty({T, F}, DType::kF64), du_ref = Tensor::empty({T, F}, DType::kF64), no_h;
  cpu::swiglu_backward(dg_ref, du_ref, no_h, dh, g, u);
  EXPECT_TRUE(testing::all_close(contiguous(dg), dg_ref, testing::kExact));
  EXPECT_TRUE(testing::all_close(contiguous(du), du_ref, testing::kExact));
  EXPECT_TRUE(testing::all_close(h_again, h_ref, testing::kExact));
}

// The FP8 amax outputs: the largest |h| (forward) and the largest |dgate|, |dup| (backward) of
// the values written, max-ed into the slot (u32 bits of the f32 magnitude), which keeps a larger
// value already there; a NaN wins.
TEST(SwiGlu, AmaxOfWhatItWrites) {
  const int64_t T = 23, F = 37;
  const Tensor g64 = random_f64({T, F}, 51, 0.2, 2.0), u64 = random_f64({T, F}, 52), dh64 = random_f64({T, F}, 53);
  const Tensor g = testing::to_dtype(g64, DType::kF32), u = testing::to_dtype(u64, DType::kF32),
               dh = testing::to_dtype(dh64, DType::kF32);
  auto largest = [](std::initializer_list<const Tensor*> ts) {
    float m = 0;
    for (const Tensor* t : ts)
      for (int64_t i = 0; i < t->numel(); ++i) m = std::max(m, std::fabs(t->data<float>()[i]));
    return m;
  };
  auto slot_value = [](const Tensor& slot) {
    float v;
    std::memcpy(&v, slot.raw_data(), sizeof v);
    return v;
  };
  Tensor h = Tensor::empty({T, F}, DType::kF32), slot = Tensor::zeros({1}, DType::kI32);
  cpu::swiglu_forward(h, g, u, slot);
  EXPECT_EQ(slot_value(slot), largest({&h}));
  Tensor dg = Tensor::empty({T, F}, DType::kF32), du = Tensor::empty({T, F}, DType::kF32), no_h;
  Tensor grads = Tensor::zeros({1}, DType::kI32);
  cpu::swiglu_backward(dg, du, no_h, dh, g, u, grads);
  EXPECT_EQ(slot_value(grads), largest({&dg, &du}));
  // a larger value already in the slot stays
  const float big = 1e6f;
  std::memcpy(slot.raw_data(), &big, sizeof big);
  cpu::swiglu_forward(h, g, u, slot);
  EXPECT_EQ(slot_value(slot), big);
  Tensor poisoned = testing::to_dtype(g64, DType::kF32);
  poisoned.data<float>()[5] = NAN;
  Tensor nan_slot = Tensor::zeros({1}, DType::kI32);
  cpu::swiglu_forward(h, poisoned, u, nan_slot);
  EXPECT_TRUE(std::isnan(slot_value(nan_slot)));
}

}  // namespace
}  // namespace shardtrain::ops
