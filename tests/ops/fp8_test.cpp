// The CPU twin of FP8 quantisation: e4m3/e5m2 conversion against a search of every code for
// the nearest value, the power-of-two scale rule, each scaling's groups, padding and scale
// layout, the transposed operand, the FP8 product against a direct f64 product, and the
// linear's FP8 forward and backward against products of the operands they must quantise.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <tuple>
#include <vector>

#include "ops/fp8.h"
#include "ops/linear.h"
#include "ops/op_testing.h"

namespace shardtrain::ops {
namespace {

constexpr DType kFormats[] = {DType::kF8E4M3, DType::kF8E5M2};
constexpr Fp8Scaling kScalings[] = {Fp8Scaling::kTensor, Fp8Scaling::kRow, Fp8Scaling::kBlock1x128,
                                    Fp8Scaling::kBlock128x128};

// The code of the finite value nearest to x by a search over all codes (ties to the even
// code), saturating to the largest finite value; independent of float_to_fp8's arithmetic.
uint8_t nearest_code(double x, DType format) {
  const double fmax = fp8_max(format);
  x = std::clamp(x, -fmax, fmax);
  int best = -1;
  double best_distance = INFINITY;
  for (int c = 0; c < 256; ++c) {
    const double v = fp8_to_float(static_cast<uint8_t>(c), format);
    if (!std::isfinite(v)) continue;
    if (v == 0 && (c & 0x80) != (std::signbit(x) ? 0x80 : 0)) continue;  // zero keeps x's sign
    const double d = std::fabs(v - x);
    if (d < best_distance || (d == best_distance && (c & 1) == 0)) {
      best = c;
      best_distance = d;
    }
  }
  return static_cast<uint8_t>(best);
}

TEST(Fp8, CodesRoundTrip) {
  for (DType f : kFormats) {
    for (int c = 0; c < 256; ++c) {
      const float v = fp8_to_float(static_cast<uint8_t>(c), f);
      if (std::isnan(v)) {
        EXPECT_EQ(float_to_fp8(v, f), 0x7f) << dtype_name(f);
      } else if (std::isinf(v)) {
        EXPECT_EQ(float_to_fp8(v, f), (c & 0x80) | (f == DType::kF8E4M3 ? 0x7e : 0x7b)) << "saturates";
      } else {
        EXPECT_EQ(float_to_fp8(v, f), c) << dtype_name(f) << " code " << c << " = " << v;
      }
    }
  }
  EXPECT_EQ(fp8_to_float(0x7e, DType::kF8E4M3), 448.0f);
  EXPECT_EQ(fp8_to_float(0x01, DType::kF8E4M3), 0x1p-9f);  // smallest subnormal
  EXPECT_EQ(fp8_to_float(0x7b, DType::kF8E5M2), 57344.0f);
  EXPECT_EQ(fp8_to_float(0x01, DType::kF8E5M2), 0x1p-16f);
}

TEST(Fp8, RoundsToNearestEvenAndSaturates) {
  for (DType f : kFormats) {
    Tensor x = Tensor::empty({20000}, DType::kF64);
    testing::fill_random(x, 11, 0.0, 1.0);
    for (int64_t i = 0; i < x.numel(); ++i) {
      // magnitudes from below the subnormals to past the largest value
      const double v = x.data<double>()[i] * std::exp2(static_cast<double>(i % 48) - 24.0);
      const float vf = static_cast<float>(v);
      ASSERT_EQ(float_to_fp8(vf, f), nearest_code(vf, f)) << dtype_name(f) << " x = " << vf;
    }
    // midpoints between neighbouring codes go to the even one
    for (int c = 1; c < 0x7e; ++c) {
      const double lo = fp8_to_float(static_cast<uint8_t>(c - 1), f), hi = fp8_to_float(static_cast<uint8_t>(c), f);
      if (!std::isfinite(hi)) break;
      const float mid = static_cast<float>((lo + hi) / 2);
      ASSERT_EQ(float_to_fp8(mid, f), (c - 1) % 2 == 0 ? c - 1 : c) << dtype_name(f) << " between codes " << c - 1;
    }
    EXPECT_EQ(float_to_fp8(1e30f, f), f == DType::kF8E4M3 ? 0x7e : 0x7b);
    EXPECT_EQ(float_to_fp8(-INFINITY, f), f == DType::kF8E4M3 ? 0xfe : 0xfb);
    EXPECT_EQ(float_to_fp8(-0.0f, f), 0x80);
    EXPECT_EQ(float_to_fp8(NAN, f), 0x7f);
  }
}

TEST(Fp8, QuantizeFactorIsThePowerOfTwoThatFits) {
  EXPECT_EQ(fp8_quantize_factor(448.0f, 448.0f), 1.0f);
  EXPECT_EQ(fp8_quantize_factor(449.0f, 448.0f), 0.5f);
  EXPECT_EQ(fp8_quantize_factor(1.0f, 448.0f), 256.0f);
  EXPECT_EQ(fp8_quantize_factor(1.0f, 57344.0f), 32768.0f);
  EXPECT_EQ(fp8_quantize_factor(3.5f, 448.0f), 128.0f);  // 448 / 3.5 = 128 exactly: the amax lands on 448
  EXPECT_EQ(fp8_quantize_factor(0.0f, 448.0f), 1.0f);
  EXPECT_EQ(fp8_quantize_factor(1e-40f, 448.0f), 0x1p126f);
  EXPECT_TRUE(std::isnan(fp8_quantize_factor(NAN, 448.0f)));
  EXPECT_TRUE(std::isnan(fp8_quantize_factor(INFINITY, 448.0f)));
  for (float amax : {1e-30f, 3e-5f, 0.7f, 1.0f, 123.0f, 5e4f, 3e38f}) {
    const float f = fp8_quantize_factor(amax, 448.0f);
    EXPECT_LE(static_cast<double>(amax) * f, 448.0) << amax;
    EXPECT_GT(static_cast<double>(amax) * f * 2, 448.0) << amax;
  }
}

// The group (index into the scale tensor) of element (r, c) of an operand of P columns.
int64_t group_of(const Fp8Operand& q, int64_t r, int64_t c) {
  switch (q.scaling) {
    case Fp8Scaling::kTensor: return 0;
    case Fp8Scaling::kRow: return r;
    case Fp8Scaling::kBlock1x128: return c / 128 * q.rows() + r;
    case Fp8Scaling::kBlock128x128: return r / 128 * q.scale.size(1) + c / 128;
  }
  return -1;
}

// x's rows scaled by 2^(r mod 9 - 4) and columns by 2^(c mod 5 - 2), so the groups' amaxes differ.
Tensor graded(int64_t R, int64_t C, uint64_t seed) {
  Tensor x = random_f64({R, C}, seed, 0.05, 1.0);
  Tensor x32 = Tensor::empty({R, C}, DType::kF32);
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < C; ++c)
      x32.data<float>()[r * C + c] =
          static_cast<float>(x.data<double>()[r * C + c] * std::exp2(r % 9 - 4.0) * std::exp2(c % 5 - 2.0));
  return x32;
}

// Each group: the largest |code value| is in (fmax / 2, fmax], its scale the inverse of the
// factor its amax gives, codes are the rounded scaled values, padding is zero.
void expect_quantized(const Fp8Operand& q, const Tensor& x_RC, DType format, const char* what) {
  const int64_t R = x_RC.size(0), C = x_RC.size(1), P = q.padded_cols();
  ASSERT_EQ(q.rows(), R) << what;
  ASSERT_EQ(q.cols, C) << what;
  ASSERT_EQ(P, fp8_padded(C, q.scaling)) << what;
  ASSERT_EQ(q.scale.shape(), fp8_scale_shape(q.scaling, R, P)) << what;
  const float fmax = fp8_max(format);
  std::vector<double> amax(static_cast<size_t>(q.scale.numel()), 0.0);
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < C; ++c) {
      double& m = amax[static_cast<size_t>(group_of(q, r, c))];
      m = std::max(m, std::fabs(static_cast<double>(x_RC.data<float>()[r * C + c])));
    }
  const uint8_t* codes = static_cast<const uint8_t*>(q.data_RP.raw_data());
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < P; ++c) {
      const uint8_t code = codes[r * P + c];
      if (c >= C) {
        ASSERT_EQ(code & 0x7f, 0) << what << ": padding at " << r << ", " << c;
        continue;
      }
      const int64_t g = group_of(q, r, c);
      const float factor = fp8_quantize_factor(static_cast<float>(amax[static_cast<size_t>(g)]), fmax);
      ASSERT_EQ(q.scale.data<float>()[g], 1.0f / factor) << what << ": group " << g;
      ASSERT_EQ(code, nearest_code(static_cast<double>(x_RC.data<float>()[r * C + c]) * factor, format))
          << what << ": element " << r << ", " << c;
      if (std::fabs(x_RC.data<float>()[r * C + c]) == amax[static_cast<size_t>(g)]) {
        ASSERT_GE(std::fabs(fp8_to_float(code, format)), fmax / 2) << what << ": the group's amax uses the top binade";
      }
    }
}

Tensor transposed(const Tensor& x_RC) {
  const int64_t R = x_RC.size(0), C = x_RC.size(1);
  Tensor t = Tensor::empty({C, R}, DType::kF32);
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < C; ++c) t.data<float>()[c * R + r] = x_RC.data<float>()[r * C + c];
  return t;
}

TEST(Fp8, QuantizeEachScalingAndItsTranspose) {
  for (auto [R, C] : {std::pair<int64_t, int64_t>{37, 45}, {130, 300}, {256, 128}, {1, 7}}) {
    const Tensor x = graded(R, C, 21 + static_cast<uint64_t>(R));
    const Tensor xt = transposed(x);
    for (Fp8Scaling s : kScalings) {
      for (DType f : kFormats) {
        const std::string name = std::string(fp8_scaling_name(s)) + " " + std::string(dtype_name(f)) + " " +
                                 std::to_string(R) + "x" + std::to_string(C);
        Fp8Operand q, qt, q_alone;
        cpu::fp8_quantize(&q, &qt, x, {s, f});
        expect_quantized(q, x, f, (name + " rows").c_str());
        expect_quantized(qt, xt, f, (name + " columns").c_str());
        // asked for alone, each is the same
        cpu::fp8_quantize(&q_alone, nullptr, x, {s, f});
        EXPECT_EQ(std::memcmp(q_alone.data_RP.raw_data(), q.data_RP.raw_data(), q.data_RP.nbytes()), 0) << name;
      }
    }
  }
}

TEST(Fp8, QuantizeReadsRowsAPitchApartAndLowPrecisionInputs) {
  const Tensor wide = graded(40, 96, 5);
  const Tensor half = wide.slice(1, 32, 80);  // rows 96 apart
  Tensor contiguous = Tensor::empty({40, 48}, DType::kF32);
  copy(contiguous, half);
  for (Fp8Scaling s : kScalings) {
    Fp8Operand a, b, at, bt;
    cpu::fp8_quantize(&a, &at, half, {s, DType::kF8E4M3});
    cpu::fp8_quantize(&b, &bt, contiguous, {s, DType::kF8E4M3});
    EXPECT_EQ(std::memcmp(a.data_RP.raw_data(), b.data_RP.raw_data(), a.data_RP.nbytes()), 0);
    EXPECT_EQ(std::memcmp(at.data_RP.raw_data(), bt.data_RP.raw_data(), at.data_RP.nbytes()), 0);
    EXPECT_EQ(std::memcmp(a.scale.raw_data(), b.scale.raw_data(), a.scale.nbytes()), 0);
  }
  // a bf16 tensor quantises as the f32 tensor of its values
  const Tensor rounded = testing::to_dtype(testing::to_dtype(contiguous, DType::kBF16), DType::kF32);
  Fp8Operand from_bf16, from_f32;
  cpu::fp8_quantize(&from_bf16, nullptr, testing::to_dtype(rounded, DType::kBF16), {Fp8Scaling::kRow, DType::kF8E4M3});
  cpu::fp8_quantize(&from_f32, nullptr, rounded, {Fp8Scaling::kRow, DType::kF8E4M3});
  EXPECT_EQ(std::memcmp(from_bf16.data_RP.raw_data(), from_f32.data_RP.raw_data(), from_f32.data_RP.nbytes()), 0);
}

// Tensor scaling with an amax slot: a pass not told the amax is ready writes it there; one
// told it is ready reads it and gives the same operand as finding it itself.
TEST(Fp8, TensorAmaxWrittenThenReused) {
  const Tensor x = graded(60, 90, 14);
  Fp8Operand found, first, reused;
  cpu::fp8_quantize(&found, nullptr, x, {Fp8Scaling::kTensor, DType::kF8E4M3});
  Tensor slot = Tensor::zeros({1}, DType::kI32);
  Fp8QuantizeOptions o{Fp8Scaling::kTensor, DType::kF8E4M3};
  o.amax = slot;
  cpu::fp8_quantize(&first, nullptr, x, o);
  float written;
  std::memcpy(&written, slot.raw_data(), sizeof written);
  float largest = 0;
  for (int64_t i = 0; i < x.numel(); ++i) largest = std::max(largest, std::fabs(x.data<float>()[i]));
  EXPECT_EQ(written, largest);
  o.amax_ready = true;
  cpu::fp8_quantize(nullptr, &reused, x, o);
  Fp8Operand found_t;
  cpu::fp8_quantize(nullptr, &found_t, x, {Fp8Scaling::kTensor, DType::kF8E4M3});
  EXPECT_EQ(std::memcmp(first.data_RP.raw_data(), found.data_RP.raw_data(), found.data_RP.nbytes()), 0);
  EXPECT_EQ(std::memcmp(reused.data_RP.raw_data(), found_t.data_RP.raw_data(), found_t.data_RP.nbytes()), 0);
  EXPECT_EQ(reused.scale.data<float>()[0], found.scale.data<float>()[0]);
  // a ready slot is believed: twice the amax halves the factor
  const float twice = 2 * largest;
  std::memcpy(slot.raw_data(), &twice, sizeof twice);
  Fp8Operand halved;
  cpu::fp8_quantize(&halved, nullptr, x, o);
  EXPECT_EQ(halved.scale.data<float>()[0], 2 * found.scale.data<float>()[0]);
}

TEST(Fp8, NonFiniteInputsPoisonTheirGroup) {
  Tensor x = graded(4, 256, 9);
  x.data<float>()[1 * 256 + 3] = INFINITY;
  x.data<float>()[2 * 256 + 200] = NAN;
  Fp8Operand q;
  cpu::fp8_quantize(&q, nullptr, x, {Fp8Scaling::kBlock1x128, DType::kF8E4M3});
  Tensor values = Tensor::empty({4, 256}, DType::kF32);
  cpu::fp8_dequantize(values, q);
  for (int64_t r = 0; r < 4; ++r)
    for (int64_t c = 0; c < 256; ++c) {
      const bool poisoned = (r == 1 && c < 128) || (r == 2 && c >= 128);
      EXPECT_EQ(std::isnan(values.data<float>()[r * 256 + c]), poisoned) << r << ", " << c;
    }
}

// b_NK · a_MK^T of the operands' values, in f64.
Tensor product_of_values(const Fp8Operand& a, const Fp8Operand& b) {
  Tensor av = Tensor::empty({a.rows(), a.cols}, DType::kF32), bv = Tensor::empty({b.rows(), b.cols}, DType::kF32);
  cpu::fp8_dequantize(av, a);
  cpu::fp8_dequantize(bv, b);
  const int64_t M = a.rows(), N = b.rows(), K = a.cols;
  Tensor out = Tensor::empty({N, M}, DType::kF64);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t m = 0; m < M; ++m) {
      double s = 0;
      for (int64_t k = 0; k < K; ++k)
        s += static_cast<double>(bv.data<float>()[n * K + k]) * static_cast<double>(av.data<float>()[m * K + k]);
      out.data<double>()[n * M + m] = s;
    }
  return out;
}

TEST(Fp8, ProductMatchesTheDirectProductOfItsValues) {
  const int64_t M = 48, N = 37, K = 200;
  for (Fp8Scaling sa : kScalings) {
    Fp8Operand a, b;
    cpu::fp8_quantize(&a, nullptr, graded(M, K, 31), {sa, DType::kF8E4M3});
    cpu::fp8_quantize(&b, nullptr, graded(N, K, 32), {Fp8Scaling::kBlock1x128, DType::kF8E5M2});
    if (a.padded_cols() != b.padded_cols()) cpu::fp8_quantize(&b, nullptr, graded(N, K, 32), {sa, DType::kF8E5M2});
    const Tensor ref = product_of_values(a, b);
    Tensor out = Tensor::empty({N, M}, DType::kF64);
    cpu::fp8_product(out, a, b, Tensor(), Tensor(), {});
    EXPECT_TRUE(testing::all_close(out, ref, {1e-12, 1e-12, 1e-12})) << fp8_scaling_name(sa);
    // bias, then C, then accumulation
    const Tensor bias = random_f64({M}, 33), c = random_f64({N, M}, 34);
    cpu::fp8_product(out, a, b, bias, c, {});
    Tensor expected = Tensor::empty({N, M}, DType::kF64);
    for (int64_t i = 0; i < N * M; ++i)
      expected.data<double>()[i] = ref.data<double>()[i] + bias.data<double>()[i % M] + c.data<double>()[i];
    EXPECT_TRUE(testing::all_close(out, expected, {1e-12, 1e-12, 1e-12})) << "bias and c";
    cpu::fp8_product(out, a, b, Tensor(), Tensor(), {.accumulate = true});
    for (int64_t i = 0; i < N * M; ++i) expected.data<double>()[i] += ref.data<double>()[i];
    EXPECT_TRUE(testing::all_close(out, expected, {1e-12, 1e-12, 1e-12})) << "accumulate";
  }
}

// The linear's FP8 wiring: y = Q(x) Q(W)^T, dx = Q(dy) Qt(W), dW = Qt(dy)^T Qt(x), with Q the
// operand of a tensor's rows and Qt of its columns, each with its role's scaling and format.
TEST(Fp8, LinearQuantisesTheOperandsEachProductNeeds) {
  const int64_t T = 37, I = 144, O = 80;
  const Tensor x = graded(T, I, 41), w = graded(O, I, 42), dy = graded(T, O, 43), b = testing::to_dtype(random_f64({O}, 44), DType::kF32);
  for (Fp8Recipe recipe : {Fp8Recipe::kTensorwise, Fp8Recipe::kRowwise, Fp8Recipe::kBlockwise}) {
    for (DType gradient_format : kFormats) {
      const LinearFp8 fp8{recipe, gradient_format};
      const std::string name = std::string(fp8_recipe_name(recipe)) + " " + std::string(dtype_name(gradient_format));
      const Fp8QuantizeOptions act{fp8_scaling(recipe, Fp8Role::kActivation), DType::kF8E4M3},
          wt{fp8_scaling(recipe, Fp8Role::kWeight), DType::kF8E4M3},
          grad{fp8_scaling(recipe, Fp8Role::kGradient), gradient_format};
      Fp8Operand qx, qxt, qw, qwt, qdy, qdyt;
      cpu::fp8_quantize(&qx, &qxt, x, act);
      cpu::fp8_quantize(&qw, &qwt, w, wt);
      cpu::fp8_quantize(&qdy, &qdyt, dy, grad);

      Tensor y = Tensor::empty({T, O}, DType::kF32);
      linear_forward(y, x, w, b, fp8);
      Tensor y_ref = product_of_values(qw, qx);
      for (int64_t i = 0; i < T * O; ++i)
        y_ref.data<double>()[i] = static_cast<float>(y_ref.data<double>()[i]) + b.data<float>()[i % O];
      EXPECT_TRUE(testing::all_close(y, y_ref, testing::kCpuF32VsF64)) << name << " forward";
      // and near the unquantised product: e4m3 keeps 4 significant bits
      Tensor y_exact = Tensor::empty({T, O}, DType::kF32);
      linear_forward(y_exact, x, w, b);
      EXPECT_TRUE(testing::all_close(y, y_exact, {0.08, 1e30, 1e30})) << name << " forward against bf16-free";

      Tensor dx = Tensor::zeros({T, I}, DType::kF32), dw = Tensor::zeros({O, I}, DType::kF32),
             db = Tensor::zeros({O}, DType::kF32);
      linear_backward(dx, dw, db, dy, x, w, {.fp8 = fp8});
      EXPECT_TRUE(testing::all_close(dx, product_of_values(qwt, qdy), testing::kCpuF32VsF64)) << name << " dx";
      EXPECT_TRUE(testing::all_close(dw, product_of_values(qxt, qdyt), testing::kCpuF32VsF64)) << name << " dweight";
      Tensor db_ref = Tensor::zeros({O}, DType::kF64);
      for (int64_t t = 0; t < T; ++t)
        for (int64_t o = 0; o < O; ++o) db_ref.data<double>()[o] += dy.data<float>()[t * O + o];
      EXPECT_TRUE(testing::all_close(db, db_ref, testing::kCpuF32VsF64)) << name << " dbias (unquantised)";
    }
  }
}

TEST(Fp8, RecipeNamesAndScalings) {
  for (Fp8Recipe r : {Fp8Recipe::kOff, Fp8Recipe::kTensorwise, Fp8Recipe::kRowwise, Fp8Recipe::kBlockwise})
    EXPECT_EQ(parse_fp8_recipe(fp8_recipe_name(r), "training.fp8"), r);
  EXPECT_TRUE(testing::throws_with([] { parse_fp8_recipe("mxfp8", "training.fp8"); }, "training.fp8"));
  EXPECT_EQ(fp8_scaling(Fp8Recipe::kBlockwise, Fp8Role::kWeight), Fp8Scaling::kBlock128x128);
  EXPECT_EQ(fp8_scaling(Fp8Recipe::kBlockwise, Fp8Role::kGradient), Fp8Scaling::kBlock1x128);
  EXPECT_EQ(fp8_scaling(Fp8Recipe::kRowwise, Fp8Role::kWeight), Fp8Scaling::kRow);
  EXPECT_EQ(fp8_scale_shape(Fp8Scaling::kBlock128x128, 300, 640), Shape({3, 8}));
  EXPECT_EQ(fp8_scale_shape(Fp8Scaling::kBlock1x128, 300, 640), Shape({5, 300}));
}

}  // namespace
}  // namespace shardtrain::ops
