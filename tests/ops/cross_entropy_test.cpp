// CPU fused linear + cross-entropy: loss against full logits in f64, gradients against
// finite differences, chunk sizes, ignored targets, and the overwrite/accumulate contract;
// with FP8 products (training.fp8_head), the twin's FP8 linears around the same softmax.
#include <cmath>
#include <string>

#include "ops/cross_entropy.h"
#include "ops/op_testing.h"

namespace shardtrain::ops {
namespace {

double direct_loss(const Tensor& h, const Tensor& w, const Tensor& targets, int32_t ignore, double softcap = 0) {
  const int64_t T = h.size(0), D = h.size(1), V = w.size(0);
  const Tensor h64 = testing::to_f64(h), w64 = testing::to_f64(w);
  double total = 0;
  for (int64_t t = 0; t < T; ++t) {
    const int32_t y = targets.data<int32_t>()[t];
    if (y == ignore) continue;
    std::vector<double> z(static_cast<size_t>(V));
    double mx = -INFINITY;
    for (int64_t c = 0; c < V; ++c) {
      double s = 0;
      for (int64_t d = 0; d < D; ++d) s += h64.data<double>()[t * D + d] * w64.data<double>()[c * D + d];
      if (softcap > 0) s = softcap * std::tanh(s / softcap);
      z[static_cast<size_t>(c)] = s;
      mx = std::max(mx, s);
    }
    double sum = 0;
    for (double s : z) sum += std::exp(s - mx);
    total += mx + std::log(sum) - z[static_cast<size_t>(y)];
  }
  return total;
}

TEST(CrossEntropy, LossMatchesFullLogitsForAnyChunk) {
  const int64_t T = 37, D = 24, V = 67;
  Tensor targets = Tensor::empty({T}, DType::kI32);
  testing::fill_random_ints(targets, 1, 0, V);
  targets.data<int32_t>()[4] = -100;
  for (DType dt : {DType::kF32, DType::kF64}) {
    const Tensor h = testing::to_dtype(random_f64({T, D}, 2), dt), w = testing::to_dtype(random_f64({V, D}, 3, 0.0, 0.3), dt);
    const double ref = direct_loss(h, w, targets, -100);
    for (int64_t chunk : {1, 7, 37, 256}) {
      Tensor loss = Tensor::zeros({1}, DType::kF64), none;
      CrossEntropyOptions o;
      o.chunk_tokens = chunk;
      o.compute_grad = false;
      cpu::linear_cross_entropy(loss, none, none, h, w, targets, o);
      EXPECT_NEAR(loss.data<double>()[0], ref, 1e-5 * std::fabs(ref)) << dtype_name(dt) << " chunk " << chunk;
    }
  }
}

TEST(CrossEntropy, GradientsMatchFiniteDifferences_f64_T9_D6_V11) {
  const int64_t T = 9, D = 6, V = 11;
  Tensor h = random_f64({T, D}, 4), w = random_f64({V, D}, 5, 0.0, 0.5);
  Tensor targets = Tensor::empty({T}, DType::kI32);
  testing::fill_random_ints(targets, 6, 0, V);
  targets.data<int32_t>()[2] = -100;
  CrossEntropyOptions o;
  o.grad_scale = 1.0 / 8.0;
  o.chunk_tokens = 4;
  Tensor loss = Tensor::zeros({1}, DType::kF64);
  Tensor dh = random_f64({T, D}, 7);  // garbage: overwritten
  const Tensor dw0 = random_f64({V, D}, 8);
  Tensor dw = testing::to_f64(dw0);
  cpu::linear_cross_entropy(loss, dh, dw, h, w, targets, o);
  for (int64_t d = 0; d < D; ++d) EXPECT_EQ(dh.data<double>()[2 * D + d], 0.0) << "ignored row";
  Tensor dw_only = testing::to_f64(dw);
  for (int64_t i = 0; i < V * D; ++i) dw_only.data<double>()[i] -= dw0.data<double>()[i];
  expect_gradients({{"h", &h, dh}, {"weight", &w, dw_only}}, [&] { return direct_loss(h, w, targets, -100) / 8.0; });
}

// Gemma 2's soft-capped logits (logit_softcap · tanh(z / logit_softcap) before the softmax):
// the loss against the capped full logits, the gradients against finite differences.
TEST(CrossEntropy, SoftcappedLogits) {
  const int64_t T = 9, D = 6, V = 11;
  Tensor h = random_f64({T, D}, 41, 0.0, 2.0), w = random_f64({V, D}, 42, 0.0, 1.0);  // logits well past the cap
  Tensor targets = Tensor::empty({T}, DType::kI32);
  testing::fill_random_ints(targets, 43, 0, V);
  targets.data<int32_t>()[3] = -100;
  CrossEntropyOptions o;
  o.grad_scale = 1.0 / 8.0;
  o.chunk_tokens = 4;
  o.logit_softcap = 1.5;
  Tensor loss = Tensor::zeros({1}, DType::kF64);
  Tensor dh = random_f64({T, D}, 44), dw = Tensor::zeros({V, D}, DType::kF64);
  cpu::linear_cross_entropy(loss, dh, dw, h, w, targets, o);
  EXPECT_NEAR(loss.data<double>()[0], direct_loss(h, w, targets, -100, 1.5), 1e-12);
  EXPECT_GT(std::fabs(loss.data<double>()[0] - direct_loss(h, w, targets, -100)), 1e-3) << "the cap changes the loss";
  expect_gradients({{"h", &h, dh}, {"weight", &w, dw}}, [&] { return direct_loss(h, w, targets, -100, 1.5) / 8.0; });
}

// overwrite_dweight: the first chunk's weight gradient replaces what the buffer held and the
// later chunks add to it: bitwise what accumulating every chunk onto zeros gives.
TEST(CrossEntropy, OverwriteDweightEqualsAccumulatingOntoZeros) {
  for (int64_t T : {0, 9}) {
    const int64_t D = 6, V = 11;
    const Tensor h = random_f64({T, D}, 41), w = random_f64({V, D}, 42, 0.0, 0.5);
    Tensor targets = Tensor::empty({T}, DType::kI32);
    testing::fill_random_ints(targets, 43, 0, V);
    CrossEntropyOptions o;
    o.chunk_tokens = 4;  // three chunks
    Tensor loss = Tensor::zeros({1}, DType::kF64), dh = Tensor::empty({T, D}, DType::kF64);
    Tensor dw_zero = Tensor::zeros({V, D}, DType::kF64), dw_over = random_f64({V, D}, 44);
    cpu::linear_cross_entropy(loss, dh, dw_zero, h, w, targets, o);
    o.overwrite_dweight = true;
    cpu::linear_cross_entropy(loss, dh, dw_over, h, w, targets, o);
    EXPECT_TRUE(testing::all_close(dw_over, dw_zero, testing::kExact)) << "T=" << T;
  }
}

TEST(CrossEntropy, LossOnlyLeavesGradientsAndBadTargetsAreNamed) {
  const Tensor h = random_f64({3, 4}, 9), w = random_f64({5, 4}, 10);
  Tensor targets = Tensor::zeros({3}, DType::kI32);
  Tensor loss = Tensor::zeros({1}, DType::kF64), dh = random_f64({3, 4}, 11), dw = random_f64({5, 4}, 12);
  const Tensor dh0 = testing::to_f64(dh);
  CrossEntropyOptions o;
  o.compute_grad = false;
  cpu::linear_cross_entropy(loss, dh, dw, h, w, targets, o);
  EXPECT_TRUE(testing::all_close(dh, dh0, testing::kExact));
  targets.data<int32_t>()[1] = 5;
  EXPECT_TRUE(throws_with([&] { cpu::linear_cross_entropy(loss, dh, dw, h, w, targets, o); }, "target 5 at position 1"));
}

// The FP8 head is, chunk by chunk, the FP8 twin's linear forward (the logits), the softmax
// and loss in f64, then the twin's FP8 linear backward of grad_scale (softmax - onehot): the
// same composition written out here gives the same bits. FP8 changes the results (the option
// is applied), by little (the products are near the exact ones).
TEST(CrossEntropy, Fp8HeadIsTheTwinsFp8ProductsAroundTheSoftmax) {
  const int64_t T = 40, D = 48, V = 80, C = 16;  // three chunks, the last one short
  const Tensor h = testing::to_dtype(random_f64({T, D}, 51, 0.0, 1.0), DType::kF32);
  const Tensor w = testing::to_dtype(random_f64({V, D}, 52, 0.0, 0.2), DType::kF32);
  Tensor targets = Tensor::empty({T}, DType::kI32);
  testing::fill_random_ints(targets, 53, 0, V);
  targets.data<int32_t>()[5] = -100;
  const double grad_scale = 1.0 / 39.0;
  for (Fp8Recipe recipe : {Fp8Recipe::kTensorwise, Fp8Recipe::kRowwise, Fp8Recipe::kBlockwise}) {
    for (DType gf : {DType::kF8E4M3, DType::kF8E5M2}) {
      const std::string name = std::string(fp8_recipe_name(recipe)) + " dy " + std::string(dtype_name(gf));
      CrossEntropyOptions o;
      o.grad_scale = grad_scale;
      o.chunk_tokens = C;
      o.overwrite_dweight = true;
      o.fp8 = {.recipe = recipe, .gradient_format = gf};
      Tensor loss = Tensor::zeros({1}, DType::kF64), dh = Tensor::empty({T, D}, DType::kF32),
             dw = Tensor::empty({V, D}, DType::kF32);
      cpu::linear_cross_entropy(loss, dh, dw, h, w, targets, o);

      double loss_ref = 0;
      Tensor dh_ref = Tensor::empty({T, D}, DType::kF32), dw_ref = Tensor::empty({V, D}, DType::kF32);
      for (int64_t t0 = 0; t0 < T; t0 += C) {
        const int64_t rows = std::min(C, T - t0);
        const Tensor hc = h.slice(0, t0, t0 + rows);
        Tensor z = Tensor::empty({rows, V}, DType::kF32);
        linear_forward(z, hc, w, Tensor(), o.fp8);
        for (int64_t r = 0; r < rows; ++r) {
          float* zr = z.data<float>() + r * V;
          const int32_t y = targets.data<int32_t>()[t0 + r];
          if (y == -100) {
            std::fill_n(zr, V, 0.0f);
            continue;
          }
          double mx = -INFINITY, sum = 0;
          for (int64_t c = 0; c < V; ++c) mx = std::max(mx, static_cast<double>(zr[c]));
          for (int64_t c = 0; c < V; ++c) sum += std::exp(zr[c] - mx);
          const double lse = mx + std::log(sum);
          loss_ref += lse - zr[y];
          for (int64_t c = 0; c < V; ++c) zr[c] = static_cast<float>(grad_scale * std::exp(zr[c] - lse));
          zr[y] -= static_cast<float>(grad_scale);
        }
        Tensor dhc = dh_ref.slice(0, t0, t0 + rows), none;
        linear_backward(dhc, dw_ref, none, z, hc, w, {.overwrite_dweight = t0 == 0, .fp8 = o.fp8});
      }
      EXPECT_NEAR(loss.data<double>()[0], loss_ref, 1e-12 * std::fabs(loss_ref)) << name;
      EXPECT_TRUE(testing::all_close(dh, dh_ref, testing::kExact)) << name << " dh";
      EXPECT_TRUE(testing::all_close(dw, dw_ref, testing::kExact)) << name << " dweight";

      // against the exact head: close, not equal
      Tensor loss_exact = Tensor::zeros({1}, DType::kF64), dh_exact = Tensor::empty({T, D}, DType::kF32),
             dw_exact = Tensor::empty({V, D}, DType::kF32);
      CrossEntropyOptions exact = o;
      exact.fp8 = {};
      cpu::linear_cross_entropy(loss_exact, dh_exact, dw_exact, h, w, targets, exact);
      EXPECT_NE(loss.data<double>()[0], loss_exact.data<double>()[0]) << name;
      EXPECT_NEAR(loss.data<double>()[0], loss_exact.data<double>()[0], 0.02 * loss_exact.data<double>()[0]) << name;
      double err = 0, mag = 0;
      for (int64_t i = 0; i < T * D; ++i) {
        err = std::max(err, static_cast<double>(std::fabs(dh.data<float>()[i] - dh_exact.data<float>()[i])));
        mag = std::max(mag, static_cast<double>(std::fabs(dh_exact.data<float>()[i])));
      }
      EXPECT_GT(err, 0.0) << name;
      EXPECT_LT(err, (gf == DType::kF8E5M2 ? 0.25 : 0.125) * mag) << name << " dh against the exact head";
    }
  }
}

}  // namespace
}  // namespace shardtrain::ops
