// CUDA FP8 quantisation against the CPU twin bit for bit (every scaling, both formats, x's
// rows and columns, odd and multi-tile shapes, rows a pitch apart, f32 and bf16 inputs, wide
// ranges of magnitude, non-finite inputs); cuBLASLt's FP8 products against the twin's product of
// the same codes; the linear's FP8 forward and backward against the CPU twin; and a CUDA graph
// of FP8 linears replaying its eager calls bitwise.
#include <cmath>
#include <cstring>
#include <string>
#include <tuple>

#include <gtest/gtest.h>

#include "core/cuda/stream.h"
#include "ops/elementwise.h"
#include "ops/fp8.h"
#include "ops/linear.h"
#include "testing/compare.h"
#include "testing/cuda_util.h"

namespace shardtrain::ops {
namespace {

using testing::to_device;
using testing::to_dtype;
using testing::to_host;

constexpr DType kFormats[] = {DType::kF8E4M3, DType::kF8E5M2};
constexpr Fp8Scaling kScalings[] = {Fp8Scaling::kTensor, Fp8Scaling::kRow, Fp8Scaling::kBlock1x128,
                                    Fp8Scaling::kBlock128x128};

// x: N(0.05, 1) with rows scaled by 2^(row_shift * (r mod 9 - 4)) and columns by 2^(c mod 5 - 2).
Tensor graded(int64_t R, int64_t C, uint64_t seed, double row_shift = 1) {
  Tensor x = Tensor::empty({R, C}, DType::kF64);
  testing::fill_random(x, seed, 0.05, 1.0);
  Tensor out = Tensor::empty({R, C}, DType::kF32);
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < C; ++c)
      out.data<float>()[r * C + c] = static_cast<float>(x.data<double>()[r * C + c] *
                                                        std::exp2(row_shift * (r % 9 - 4.0)) * std::exp2(c % 5 - 2.0));
  return out;
}

Fp8Operand on_host(const Fp8Operand& q) { return {to_host(q.data_RP), to_host(q.scale), q.scaling, q.cols}; }
Fp8Operand on_device(const Fp8Operand& q) { return {to_device(q.data_RP), to_device(q.scale), q.scaling, q.cols}; }

// Bytes equal, except that NaN scales need only both be NaN (payloads differ between host and device).
::testing::AssertionResult same_operand(const Fp8Operand& gpu, const Fp8Operand& cpu) {
  if (!(gpu.data_RP.shape() == cpu.data_RP.shape()) || gpu.data_RP.dtype() != cpu.data_RP.dtype() ||
      !(gpu.scale.shape() == cpu.scale.shape()) || gpu.cols != cpu.cols || gpu.scaling != cpu.scaling)
    return ::testing::AssertionFailure() << "shapes " << gpu.data_RP.str() << " / " << gpu.scale.str() << " against "
                                         << cpu.data_RP.str() << " / " << cpu.scale.str();
  const uint8_t* a = static_cast<const uint8_t*>(gpu.data_RP.raw_data());
  const uint8_t* b = static_cast<const uint8_t*>(cpu.data_RP.raw_data());
  const int64_t P = cpu.padded_cols();
  for (int64_t i = 0; i < cpu.data_RP.numel(); ++i)
    if (a[i] != b[i])
      return ::testing::AssertionFailure() << "code at row " << i / P << ", column " << i % P << ": "
                                           << int{a[i]} << " against the twin's " << int{b[i]};
  for (int64_t i = 0; i < cpu.scale.numel(); ++i) {
    const float x = gpu.scale.data<float>()[i], y = cpu.scale.data<float>()[i];
    if (!(x == y || (std::isnan(x) && std::isnan(y))))
      return ::testing::AssertionFailure() << "scale " << i << ": " << x << " against the twin's " << y;
  }
  return ::testing::AssertionSuccess();
}

void expect_twin(const Tensor& x_host, DType dt, Fp8Scaling s, DType f, const std::string& name) {
  const Tensor x_dt = to_dtype(x_host, dt);
  for (int mode = 0; mode < 3; ++mode) {  // rows, columns, both
    const bool rows = mode != 1, cols = mode != 0;
    Fp8Operand q, qt, ref, ref_t;
    cuda::fp8_quantize(rows ? &q : nullptr, cols ? &qt : nullptr, to_device(x_dt), {s, f}, {});
    cpu::fp8_quantize(rows ? &ref : nullptr, cols ? &ref_t : nullptr, to_dtype(x_dt, DType::kF32), {s, f});
    const std::string what = name + (mode == 0 ? " rows" : mode == 1 ? " columns" : " both");
    if (rows) {
      EXPECT_TRUE(same_operand(on_host(q), ref)) << what << ": x's rows";
    }
    if (cols) {
      EXPECT_TRUE(same_operand(on_host(qt), ref_t)) << what << ": x's columns";
    }
  }
}

TEST(Fp8Cuda, QuantizeMatchesTheTwinBitForBit) {
  ST_REQUIRE_CUDA();
  for (auto [R, C] : {std::pair<int64_t, int64_t>{37, 45}, {130, 300}, {256, 384}, {1, 7}, {300, 2048}}) {
    const Tensor x = graded(R, C, 100 + static_cast<uint64_t>(R * 7 + C));
    for (DType dt : {DType::kBF16, DType::kF32})
      for (Fp8Scaling s : kScalings)
        for (DType f : kFormats)
          expect_twin(x, dt, s, f,
                      std::string(dtype_name(dt)) + " " + std::string(fp8_scaling_name(s)) + " " +
                          std::string(dtype_name(f)) + " " + std::to_string(R) + "x" + std::to_string(C));
  }
}

TEST(Fp8Cuda, QuantizeWideRangesAndSubnormals) {
  ST_REQUIRE_CUDA();
  // rows from 2^-96 to 2^96 of each other: each row's own factor (kRow, 1x128) reaches from
  // 2^-90 to 2^100, and tensor scaling drives the small rows into e4m3's subnormals and zero
  const Tensor x = graded(200, 260, 7, 24.0);
  for (Fp8Scaling s : kScalings)
    for (DType f : kFormats) expect_twin(x, DType::kF32, s, f, std::string(fp8_scaling_name(s)) + " wide");
  // f32 subnormal inputs
  Tensor tiny = graded(64, 128, 8);
  for (int64_t i = 0; i < tiny.numel(); ++i) tiny.data<float>()[i] *= 0x1p-130f;
  for (Fp8Scaling s : kScalings) expect_twin(tiny, DType::kF32, s, DType::kF8E4M3, "subnormal inputs");
}

TEST(Fp8Cuda, QuantizeRowsAPitchApartAndNonFinite) {
  ST_REQUIRE_CUDA();
  const Tensor wide = to_dtype(graded(150, 512, 9), DType::kBF16);
  const Tensor dev = to_device(wide).slice(1, 128, 400);  // 272 of 512 columns: rows 512 apart
  const Tensor host = to_dtype(wide, DType::kF32).slice(1, 128, 400);
  for (Fp8Scaling s : kScalings) {
    Fp8Operand q, qt, ref, ref_t;
    cuda::fp8_quantize(&q, &qt, dev, {s, DType::kF8E4M3}, {});
    cpu::fp8_quantize(&ref, &ref_t, host, {s, DType::kF8E4M3});
    EXPECT_TRUE(same_operand(on_host(q), ref)) << fp8_scaling_name(s) << " rows, pitched";
    EXPECT_TRUE(same_operand(on_host(qt), ref_t)) << fp8_scaling_name(s) << " columns, pitched";
  }
  Tensor poisoned = graded(140, 260, 10);
  poisoned.data<float>()[3 * 260 + 5] = INFINITY;
  poisoned.data<float>()[131 * 260 + 200] = NAN;
  for (Fp8Scaling s : kScalings) expect_twin(poisoned, DType::kF32, s, DType::kF8E4M3, "non-finite");
}

// Tensor scaling with an amax slot on the device: written by a pass not told it is ready, then
// read by one that is (no pass of its own): the twin's operands either way.
TEST(Fp8Cuda, TensorAmaxWrittenThenReused) {
  ST_REQUIRE_CUDA();
  const Tensor x = to_dtype(to_dtype(graded(300, 500, 15), DType::kBF16), DType::kF32);
  const Tensor xd = to_device(to_dtype(x, DType::kBF16));
  Fp8Operand ref, ref_t;
  cpu::fp8_quantize(&ref, &ref_t, x, {Fp8Scaling::kTensor, DType::kF8E5M2});
  Tensor slot = Tensor::empty({1}, DType::kI32, Device::cuda(0));
  fill(slot, 0.0);
  Fp8QuantizeOptions o{Fp8Scaling::kTensor, DType::kF8E5M2};
  o.amax = slot;
  Fp8Operand q, qt;
  cuda::fp8_quantize(&q, nullptr, xd, o, {});
  EXPECT_TRUE(same_operand(on_host(q), ref)) << "writing the slot";
  o.amax_ready = true;
  cuda::fp8_quantize(nullptr, &qt, xd, o, {});
  EXPECT_TRUE(same_operand(on_host(qt), ref_t)) << "reading the slot";
}

double max_abs(const Tensor& t) {
  const Tensor d = testing::to_f64(t);
  double m = 0;
  for (int64_t i = 0; i < d.numel(); ++i) m = std::max(m, std::fabs(d.data<double>()[i]));
  return m;
}

// Hopper's FP8 tensor cores keep about 14 bits of a running sum before cuBLASLt promotes it
// to f32 (DeepSeek-V3, section 3.3.2), so the device's sum of K exact products differs from the
// twin's f64 sum by up to about sqrt(K) * 2^-14 of the partial sums' size; a narrow output adds
// its own rounding (one ulp of the result: 2^-7 relative in bf16) on top.
testing::Tolerance product_tolerance(DType out, int64_t K, double magnitude) {
  testing::Tolerance t = out == DType::kBF16 ? testing::kCudaBf16 : testing::Tolerance{1e-3, 1e-3, 0};
  t.atol = std::max(4.0 * std::sqrt(static_cast<double>(K)) * 0x1p-14 * magnitude,
                    out == DType::kBF16 ? 0x1p-7 * magnitude : 0.0);
  return t;
}

TEST(Fp8Cuda, ProductMatchesTheTwin) {
  ST_REQUIRE_CUDA();
  // the pairs the recipes multiply: (a, b) scalings
  const std::tuple<Fp8Scaling, Fp8Scaling> pairs[] = {
      {Fp8Scaling::kTensor, Fp8Scaling::kTensor}, {Fp8Scaling::kRow, Fp8Scaling::kRow},
      {Fp8Scaling::kBlock128x128, Fp8Scaling::kBlock1x128}, {Fp8Scaling::kBlock1x128, Fp8Scaling::kBlock1x128}};
  for (auto [M, N, K] : {std::tuple<int64_t, int64_t, int64_t>{80, 37, 200}, {2048, 1031, 4096}}) {
    for (auto [sa, sb] : pairs) {
      for (DType fb : kFormats) {
        for (DType out_dt : {DType::kBF16, DType::kF32}) {
          const std::string name = std::string(fp8_scaling_name(sa)) + " x " + std::string(fp8_scaling_name(sb)) +
                                   " e4m3 x " + std::string(dtype_name(fb)) + " -> " +
                                   std::string(dtype_name(out_dt)) + " M" + std::to_string(M) + " N" +
                                   std::to_string(N) + " K" + std::to_string(K);
          try {
          Fp8Operand a, b;
          cpu::fp8_quantize(&a, nullptr, graded(M, K, 51), {sa, DType::kF8E4M3});
          cpu::fp8_quantize(&b, nullptr, graded(N, K, 52), {sb, fb});
          Tensor ref = Tensor::empty({N, M}, DType::kF32);
          cpu::fp8_product(ref, a, b, Tensor(), Tensor(), {});
          const double magnitude = max_abs(ref);
          Tensor out = Tensor::empty({N, M}, out_dt, Device::cuda(0));
          cuda::fp8_product(out, on_device(a), on_device(b), Tensor(), Tensor(), {}, {});
          EXPECT_TRUE(testing::all_close(to_host(out), to_dtype(ref, out_dt), product_tolerance(out_dt, K, magnitude)))
              << name;
          // with a bias (forward), with C (a residual), accumulating (gradients)
          const Tensor bias = to_dtype(to_dtype(graded(1, M, 53).view({M}), out_dt), DType::kF32);
          const Tensor c = to_dtype(to_dtype(graded(N, M, 54), out_dt), DType::kF32);
          Tensor ref_bias = Tensor::empty({N, M}, DType::kF32), ref_c = Tensor::empty({N, M}, DType::kF32);
          cpu::fp8_product(ref_bias, a, b, bias, Tensor(), {});
          cpu::fp8_product(ref_c, a, b, Tensor(), c, {});
          Tensor out_bias = Tensor::empty({N, M}, out_dt, Device::cuda(0));
          cuda::fp8_product(out_bias, on_device(a), on_device(b), to_device(to_dtype(bias, out_dt)), Tensor(), {}, {});
          EXPECT_TRUE(testing::all_close(to_host(out_bias), to_dtype(ref_bias, out_dt),
                                         product_tolerance(out_dt, K, max_abs(ref_bias))))
              << name << " + bias";
          Tensor out_c = Tensor::empty({N, M}, out_dt, Device::cuda(0));
          cuda::fp8_product(out_c, on_device(a), on_device(b), Tensor(), to_device(to_dtype(c, out_dt)), {}, {});
          EXPECT_TRUE(testing::all_close(to_host(out_c), to_dtype(ref_c, out_dt),
                                         product_tolerance(out_dt, K, max_abs(ref_c))))
              << name << " + c";
          Tensor acc = to_device(to_dtype(c, out_dt));
          cuda::fp8_product(acc, on_device(a), on_device(b), Tensor(), Tensor(), {.accumulate = true}, {});
          EXPECT_TRUE(testing::all_close(to_host(acc), to_dtype(ref_c, out_dt),
                                         product_tolerance(out_dt, K, max_abs(ref_c))))
              << name << " accumulated";
          } catch (const std::exception& e) {  // one refused case must not hide the others
            ADD_FAILURE() << name << ": " << e.what();
          }
        }
      }
    }
  }
}

// The linear's FP8 forms on the device against the CPU twin's on the same values: the codes
// are the same, so the results differ by the products' accumulation and the outputs' rounding.
TEST(Fp8Cuda, LinearMatchesTheTwin) {
  ST_REQUIRE_CUDA();
  for (auto [T, I, O] : {std::tuple<int64_t, int64_t, int64_t>{37, 144, 80}, {1031, 2048, 512}, {1024, 256, 512}}) {
    const Tensor x = to_dtype(to_dtype(graded(T, I, 61), DType::kBF16), DType::kF32),
                 w = to_dtype(to_dtype(graded(O, I, 62, 0.5), DType::kBF16), DType::kF32),
                 dy = to_dtype(to_dtype(graded(T, O, 63), DType::kBF16), DType::kF32),
                 res = to_dtype(to_dtype(graded(T, O, 64), DType::kBF16), DType::kF32);
    const Tensor xd = to_device(to_dtype(x, DType::kBF16)), wd = to_device(to_dtype(w, DType::kBF16)),
                 dyd = to_device(to_dtype(dy, DType::kBF16)), resd = to_device(to_dtype(res, DType::kBF16));
    for (Fp8Recipe recipe : {Fp8Recipe::kTensorwise, Fp8Recipe::kRowwise, Fp8Recipe::kBlockwise}) {
      for (DType gf : kFormats) {
        const LinearFp8 fp8{recipe, gf};
        const std::string name = std::string(fp8_recipe_name(recipe)) + " dy " + std::string(dtype_name(gf)) + " T" +
                                 std::to_string(T) + " I" + std::to_string(I) + " O" + std::to_string(O);
        try {
        Tensor y = Tensor::empty({T, O}, DType::kBF16, Device::cuda(0)), y_ref = Tensor::empty({T, O}, DType::kF32);
        linear_forward(y, xd, wd, Tensor(), fp8);
        linear_forward(y_ref, x, w, Tensor(), fp8);
        EXPECT_TRUE(testing::all_close(to_host(y), to_dtype(y_ref, DType::kBF16),
                                       product_tolerance(DType::kBF16, I, max_abs(y_ref))))
            << name << " forward";
        Tensor y2 = Tensor::empty({T, O}, DType::kBF16, Device::cuda(0)), y2_ref = Tensor::empty({T, O}, DType::kF32);
        linear_forward_add(y2, xd, wd, resd, fp8);
        linear_forward_add(y2_ref, x, w, res, fp8);
        EXPECT_TRUE(testing::all_close(to_host(y2), to_dtype(y2_ref, DType::kBF16),
                                       product_tolerance(DType::kBF16, I, max_abs(y2_ref))))
            << name << " forward + residual";
        Tensor dx = Tensor::empty({T, I}, DType::kBF16, Device::cuda(0)), dw = Tensor::empty({O, I}, DType::kF32, Device::cuda(0));
        Tensor dx_ref = Tensor::empty({T, I}, DType::kF32), dw_ref = Tensor::zeros({O, I}, DType::kF32), none;
        LinearBackwardOptions o{.overwrite_dweight = true, .fp8 = fp8};
        linear_backward(dx, dw, none, dyd, xd, wd, o);
        linear_backward(dx_ref, dw_ref, none, dy, x, w, {.fp8 = fp8});
        EXPECT_TRUE(testing::all_close(to_host(dx), to_dtype(dx_ref, DType::kBF16),
                                       product_tolerance(DType::kBF16, O, max_abs(dx_ref))))
            << name << " dx";
        EXPECT_TRUE(testing::all_close(to_host(dw), dw_ref, product_tolerance(DType::kF32, T, max_abs(dw_ref))))
            << name << " dweight";
        // accumulating: dx onto itself, dweight onto itself (a second micro-batch)
        Tensor dx2 = to_device(to_host(dx)), dw2 = to_device(to_host(dw));
        Tensor dx2_ref = to_dtype(to_host(dx), DType::kF32), dw2_ref = to_host(dw);
        linear_backward(dx2, dw2, none, dyd, xd, wd, {.accumulate_dx = true, .fp8 = fp8});
        linear_backward(dx2_ref, dw2_ref, none, dy, x, w, {.accumulate_dx = true, .fp8 = fp8});
        EXPECT_TRUE(testing::all_close(to_host(dx2), to_dtype(dx2_ref, DType::kBF16),
                                       product_tolerance(DType::kBF16, O, max_abs(dx2_ref))))
            << name << " dx accumulated";
        EXPECT_TRUE(testing::all_close(to_host(dw2), dw2_ref, product_tolerance(DType::kF32, T, max_abs(dw2_ref))))
            << name << " dweight accumulated";
        } catch (const std::exception& e) {
          ADD_FAILURE() << name << ": " << e.what();
        }
      }
    }
  }
}

// Dynamic scales live in device memory and the amax buffers are cleared by the stream, so a
// captured step of FP8 linears replays its eager calls bit for bit.
TEST(Fp8Cuda, CapturedLinearsReplayTheEagerCalls) {
  ST_REQUIRE_CUDA();
  const Device dev = Device::cuda(0);
  const int64_t T = 1024, I = 2048, O = 1536;
  const Tensor x = to_device(to_dtype(graded(T, I, 71), DType::kBF16)),
               w = to_device(to_dtype(graded(O, I, 72), DType::kBF16)),
               dy = to_device(to_dtype(graded(T, O, 73), DType::kBF16));
  for (Fp8Recipe recipe : {Fp8Recipe::kTensorwise, Fp8Recipe::kRowwise, Fp8Recipe::kBlockwise}) {
    const LinearFp8 fp8{recipe, DType::kF8E5M2};
    Tensor y[2], dx[2], dw[2], none;
    for (int k = 0; k < 2; ++k) {
      y[k] = Tensor::empty({T, O}, DType::kBF16, dev, "y");
      dx[k] = Tensor::empty({T, I}, DType::kBF16, dev, "dx");
      dw[k] = Tensor::empty({O, I}, DType::kF32, dev, "dw");
    }
    auto products = [&](int k) {
      linear_forward(y[k], x, w, none, fp8);
      linear_backward(dx[k], dw[k], none, dy, x, w, {.overwrite_dweight = true, .fp8 = fp8});
    };
    products(0);
    {
      shardtrain::cuda::BlockingStream stream;
      set_current_compute_stream(stream.get().handle);
      shardtrain::cuda::Graph graph;
      graph.begin_capture(stream.get());
      products(1);
      graph.end_capture();
      graph.launch(stream.get());
      synchronize(dev);
      set_current_compute_stream(nullptr);
    }
    for (auto [a, b, name] : {std::tuple{&y[0], &y[1], "y"}, {&dx[0], &dx[1], "dx"}, {&dw[0], &dw[1], "dw"}}) {
      const Tensor ha = to_host(*a), hb = to_host(*b);
      EXPECT_EQ(std::memcmp(ha.raw_data(), hb.raw_data(), ha.nbytes()), 0)
          << fp8_recipe_name(recipe) << " " << name << ": the graph's result differs from the eager call's";
    }
  }
}

}  // namespace
}  // namespace shardtrain::ops
