// CUDA fused linear + cross-entropy against the CPU twin: loss, dh (overwrite), dW
// (accumulate), ignored targets, chunking, f32 and bf16, soft-capped logits (Gemma 2); the FP8
// head against the twin's.
// Skips without a device.
#include <algorithm>
#include <cmath>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

#include "ops/cross_entropy.h"
#include "ops/elementwise.h"
#include "testing/compare.h"
#include "testing/cuda_util.h"

namespace shardtrain::ops {
namespace {

using testing::all_close;
using testing::to_device;
using testing::to_dtype;
using testing::to_host;

struct Case {
  int64_t T, D, V, chunk;
  DType dt;
  double softcap = 0;  // logits soft-capped at this value (Gemma 2's final_logit_softcapping; 0: none)
};
void PrintTo(const Case& c, std::ostream* os) {
  *os << dtype_name(c.dt) << "_T" << c.T << "_D" << c.D << "_V" << c.V << "_chunk" << c.chunk;
  if (c.softcap > 0) *os << "_softcap" << static_cast<int>(c.softcap * 10) << "tenths";
}

class CrossEntropyCuda : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override { ST_REQUIRE_CUDA(); }
};

TEST_P(CrossEntropyCuda, MatchesCpu) {
  const auto [T, D, V, chunk, dt, softcap] = GetParam();
  const Tensor h = testing::rounded_f32({T, D}, dt, 1, 0.05, 1.0), w = testing::rounded_f32({V, D}, dt, 2, 0.0, 0.05);
  Tensor targets = Tensor::empty({T}, DType::kI32);
  testing::fill_random_ints(targets, 3, 0, V);
  for (int64_t t = 0; t < T; t += 7) targets.data<int32_t>()[t] = -100;
  int64_t counted = 0;
  for (int64_t t = 0; t < T; ++t) counted += targets.data<int32_t>()[t] != -100;
  CrossEntropyOptions o;
  o.grad_scale = 1.0 / static_cast<double>(counted);
  o.chunk_tokens = chunk;
  o.logit_softcap = softcap;

  const Tensor dw0 = testing::rounded_f32({V, D}, DType::kF32, 4, 0.0, 1e-3);
  Tensor loss = Tensor::empty({1}, DType::kF32, Device::cuda(0));
  fill(loss, 0.25);
  Tensor dh = Tensor::empty({T, D}, dt, Device::cuda(0));
  fill(dh, 7.0);  // garbage: dh must be overwritten
  Tensor dw = to_device(dw0);
  linear_cross_entropy(loss, dh, dw, to_device(to_dtype(h, dt)), to_device(to_dtype(w, dt)), to_device(targets), o);

  Tensor loss_ref = Tensor::zeros({1}, DType::kF64);
  loss_ref.data<double>()[0] = 0.25;
  Tensor dh_ref = Tensor::empty({T, D}, DType::kF32), dw_ref = to_dtype(dw0, DType::kF32);
  cpu::linear_cross_entropy(loss_ref, dh_ref, dw_ref, h, w, targets, o);

  // bf16 inputs: the logits' gradient is rounded to bf16 before the GEMMs (header), so
  // every output carries bf16-level error; f32 inputs compare at the f32 bound with the
  // sqrt(K) summation-order term for near-zero (cancelling) elements.
  const bool narrow = dt == DType::kBF16;
  auto bound = [&](int64_t K, const Tensor& ref) {
    testing::Tolerance t = narrow ? testing::kCudaBf16 : testing::kCudaF32VsCpu;
    double m = 0;
    const Tensor r = to_dtype(ref, DType::kF32);
    for (int64_t i = 0; i < r.numel(); ++i) m = std::max(m, static_cast<double>(std::fabs(r.data<float>()[i])));
    t.atol = std::max(t.atol, (narrow ? 0x1p-8 : 4.0 * std::sqrt(static_cast<double>(K)) * 0x1p-24) * m);
    return t;
  };
  EXPECT_TRUE(all_close(to_host(loss), loss_ref, narrow ? testing::kCudaBf16 : testing::kCudaF32VsCpu)) << "loss";
  EXPECT_TRUE(all_close(to_host(dh), to_dtype(dh_ref, dt), bound(V, dh_ref))) << "dh";
  EXPECT_TRUE(all_close(to_host(dw), dw_ref, bound(T, dw_ref))) << "dweight (accumulated)";

  // overwrite_dweight: the first chunk replaces what dweight held, the others add; the
  // reference is the CPU twin's accumulated gradient less its start (no second CPU run)
  CrossEntropyOptions over = o;
  over.overwrite_dweight = true;
  Tensor dw_new = to_device(dw0);
  linear_cross_entropy(loss, dh, dw_new, to_device(to_dtype(h, dt)), to_device(to_dtype(w, dt)), to_device(targets),
                       over);
  Tensor dw_new_ref = to_dtype(dw_ref, DType::kF32);
  const Tensor start = to_dtype(dw0, DType::kF32);
  for (int64_t i = 0; i < dw_new_ref.numel(); ++i) dw_new_ref.data<float>()[i] -= start.data<float>()[i];
  EXPECT_TRUE(all_close(to_host(dw_new), dw_new_ref, bound(T, dw_new_ref))) << "dweight (overwritten)";
}

// A target outside [0, V): an error naming it when checked; NaN (never a finite loss or a
// silent out-of-bounds read) when the caller has promised to check.
TEST(CrossEntropyCudaTargets, BadTargetIsAnErrorWhenCheckedAndNaNOtherwise) {
  ST_REQUIRE_CUDA();
  const int64_t T = 5, D = 16, V = 40;
  const Tensor h = to_device(to_dtype(testing::rounded_f32({T, D}, DType::kBF16, 1, 0.0, 1.0), DType::kBF16));
  const Tensor w = to_device(to_dtype(testing::rounded_f32({V, D}, DType::kBF16, 2, 0.0, 0.1), DType::kBF16));
  Tensor targets = Tensor::empty({T}, DType::kI32);
  testing::fill_random_ints(targets, 3, 0, V);
  targets.data<int32_t>()[3] = static_cast<int32_t>(V);
  Tensor loss = Tensor::empty({1}, DType::kF32, Device::cuda(0));
  Tensor dh = Tensor::empty({T, D}, DType::kBF16, Device::cuda(0)), dw = Tensor::empty({V, D}, DType::kF32, Device::cuda(0));
  fill(dw, 0.0);
  fill(loss, 0.0);
  CrossEntropyOptions o;
  try {
    linear_cross_entropy(loss, dh, dw, h, w, to_device(targets), o);
    ADD_FAILURE() << "the bad target was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("target 40 at position 3 outside [0, 40)"), std::string::npos) << e.what();
  }
  o.check_targets = false;
  linear_cross_entropy(loss, dh, dw, h, w, to_device(targets), o);
  EXPECT_TRUE(std::isnan(to_host(loss).data<float>()[0]));
}

// The FP8 head (training.fp8_head) on the device against the CPU twin's FP8 head on the same
// bf16 values. The device's logits and their gradient are bf16 (the twin's f32), so a few of
// the gradient's codes land one FP8 step apart (2^-3 of a value in e4m3, 2^-2 in e5m2, for the
// ~2^-5 of values within bf16's rounding of a code boundary); those and the products' 14-bit
// accumulation bound dh and dW by 2^-5 of their largest element. A wrong operand, transpose or
// scale would be off by the whole magnitude.
TEST(CrossEntropyCudaFp8, Fp8HeadMatchesTheTwin) {
  ST_REQUIRE_CUDA();
  const int64_t T = 515, D = 256, V = 8000, chunk = 192;  // three chunks, the last one short
  const Tensor h = testing::rounded_f32({T, D}, DType::kBF16, 11, 0.05, 1.0);
  const Tensor w = testing::rounded_f32({V, D}, DType::kBF16, 12, 0.0, 0.05);
  Tensor targets = Tensor::empty({T}, DType::kI32);
  testing::fill_random_ints(targets, 13, 0, V);
  for (int64_t t = 0; t < T; t += 11) targets.data<int32_t>()[t] = -100;
  for (Fp8Recipe recipe : {Fp8Recipe::kTensorwise, Fp8Recipe::kRowwise, Fp8Recipe::kBlockwise}) {
    for (DType gf : {DType::kF8E4M3, DType::kF8E5M2}) {
      const std::string name = std::string(fp8_recipe_name(recipe)) + " dy " + std::string(dtype_name(gf));
      CrossEntropyOptions o;
      o.grad_scale = 1.0 / 468.0;
      o.chunk_tokens = chunk;
      o.overwrite_dweight = true;
      o.fp8 = {.recipe = recipe, .gradient_format = gf};
      try {
        Tensor loss = Tensor::empty({1}, DType::kF32, Device::cuda(0));
        fill(loss, 0.0);
        Tensor dh = Tensor::empty({T, D}, DType::kBF16, Device::cuda(0));
        Tensor dw = Tensor::empty({V, D}, DType::kF32, Device::cuda(0));
        linear_cross_entropy(loss, dh, dw, to_device(to_dtype(h, DType::kBF16)), to_device(to_dtype(w, DType::kBF16)),
                             to_device(targets), o);
        Tensor loss_ref = Tensor::zeros({1}, DType::kF64);
        Tensor dh_ref = Tensor::empty({T, D}, DType::kF32), dw_ref = Tensor::empty({V, D}, DType::kF32);
        cpu::linear_cross_entropy(loss_ref, dh_ref, dw_ref, h, w, targets, o);
        auto bound = [](const Tensor& ref) {
          double m = 0;
          for (int64_t i = 0; i < ref.numel(); ++i) m = std::max(m, static_cast<double>(std::fabs(ref.data<float>()[i])));
          return testing::Tolerance{0x1p-5, 0x1p-5, 0x1p-5 * m};
        };
        // the loss: bf16 logits (2^-8) and the products' accumulation, summed over ~470 rows
        const double l = to_host(loss).data<float>()[0], lr = loss_ref.data<double>()[0];
        EXPECT_NEAR(l, lr, 2e-3 * std::fabs(lr)) << name << " loss";
        EXPECT_TRUE(all_close(to_dtype(to_host(dh), DType::kF32), dh_ref, bound(dh_ref))) << name << " dh";
        EXPECT_TRUE(all_close(to_host(dw), dw_ref, bound(dw_ref))) << name << " dweight";
      } catch (const std::exception& e) {  // one refused case must not hide the others
        ADD_FAILURE() << name << ": " << e.what();
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, CrossEntropyCuda,
                         ::testing::Values(Case{37, 64, 259, 16, DType::kF32}, Case{37, 64, 259, 1000, DType::kBF16},
                                           Case{1031, 512, 32003, 256, DType::kBF16},
                                           Case{1024, 2048, 128256, 512, DType::kBF16},
                                           // soft-capped logits at caps the logits reach (tanh bends them),
                                           // so a missing cap or a gradient without its derivative shows
                                           Case{37, 64, 259, 16, DType::kF32, 0.5},
                                           Case{37, 64, 259, 1000, DType::kBF16, 0.5},
                                           Case{1031, 512, 32003, 256, DType::kBF16, 1.0}),
                         [](const ::testing::TestParamInfo<Case>& i) {
                           std::ostringstream s;
                           PrintTo(i.param, &s);
                           return s.str();
                         });

}  // namespace
}  // namespace shardtrain::ops
