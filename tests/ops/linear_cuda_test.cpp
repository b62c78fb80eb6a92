// cuBLASLt linear forward and backward against the CPU BLAS twin: f32 (no TF32) and bf16
// inputs, bf16 and f32 outputs, bias, a residual in the GEMM, accumulate_dx, f32 weight
// gradients of bf16 inputs, and the backward's dx and dweight halves called alone.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>
#include <tuple>

#include <gtest/gtest.h>

#include "core/cuda/stream.h"
#include "ops/elementwise.h"
#include "ops/linear.h"
#include "testing/compare.h"
#include "testing/cuda_util.h"

namespace shardtrain::ops {
namespace {

using testing::all_close;
using testing::to_device;
using testing::to_dtype;
using testing::to_host;

struct Case {
  int64_t T, I, O;
  DType dt;
  bool bias;
};
void PrintTo(const Case& c, std::ostream* os) {
  *os << dtype_name(c.dt) << "_T" << c.T << "_I" << c.I << "_O" << c.O << (c.bias ? "_bias" : "");
}

class LinearCuda : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override { ST_REQUIRE_CUDA(); }
};

// An f32 dot product of K terms differs from another summation order by up to about
// sqrt(K) * 2^-24 * (the partial sums' size); elementwise bounds on GEMM outputs use that
// absolute term (near-zero outputs come from cancelling sums), rel-norm stays shared.
testing::Tolerance gemm_tolerance(const testing::Tolerance& base, int64_t K, double magnitude) {
  testing::Tolerance t = base;
  t.atol = std::max(t.atol, 4.0 * std::sqrt(static_cast<double>(K)) * 0x1p-24 * magnitude);
  return t;
}

// With a narrow output, cuBLASLt rounds the product to the output dtype before adding a
// bias or the accumulated C, and rounds again. A product that lands near a rounding
// boundary can round the other way than in the CPU reference (whose summation order
// differs), moving that element by one ulp of the product's magnitude: 2^-7 |p| in bf16.
testing::Tolerance narrow_sum_tolerance(const testing::Tolerance& base, DType dt, double product_magnitude) {
  testing::Tolerance t = base;
  if (dt == DType::kBF16) t.atol = std::max(t.atol, 0x1p-7 * product_magnitude);
  return t;
}

double max_abs(const Tensor& f32) {
  double m = 0;
  for (int64_t i = 0; i < f32.numel(); ++i) m = std::max(m, static_cast<double>(std::fabs(f32.data<float>()[i])));
  return m;
}

void check_against_cpu(const Case& c) {
  const auto [T, I, O, dt, with_bias] = c;
  const testing::Tolerance tol = dt == DType::kBF16 ? testing::kCudaBf16 : testing::kCudaF32VsCpu;
  const Tensor x = testing::rounded_f32({T, I}, dt, 1, 0.05, 1.0), w = testing::rounded_f32({O, I}, dt, 2, -0.02, 0.05),
               b = testing::rounded_f32({O}, dt, 3, 0.1, 0.5), dy = testing::rounded_f32({T, O}, dt, 4, 0.01, 1.0);
  const Tensor none;

  Tensor y = Tensor::empty({T, O}, dt, Device::cuda(0));
  linear_forward(y, to_device(to_dtype(x, dt)), to_device(to_dtype(w, dt)), with_bias ? to_device(to_dtype(b, dt)) : none);
  Tensor y_ref = Tensor::empty({T, O}, DType::kF32);
  cpu::linear_forward(y_ref, x, w, none);
  const double product_magnitude = max_abs(y_ref);
  if (with_bias) {
    // the contract for a narrow y: the product is rounded to dt, then the bias added
    y_ref = to_dtype(to_dtype(y_ref, dt), DType::kF32);
    Tensor bias_rows = Tensor::empty({T, O}, DType::kF32);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t o = 0; o < O; ++o) bias_rows.data<float>()[t * O + o] = b.data<float>()[o];
    cpu::add(y_ref, y_ref, bias_rows);
  }
  EXPECT_TRUE(all_close(to_host(y), to_dtype(y_ref, dt),
                        narrow_sum_tolerance(gemm_tolerance(tol, I, max_abs(y_ref)), dt, product_magnitude)))
      << "forward";

  {
    // the projection added onto a residual stream in one GEMM (C = residual, beta = 1)
    const Tensor res = testing::rounded_f32({T, O}, dt, 8, 0.0, 1.0);
    Tensor y2 = Tensor::empty({T, O}, dt, Device::cuda(0));
    linear_forward_add(y2, to_device(to_dtype(x, dt)), to_device(to_dtype(w, dt)), to_device(to_dtype(res, dt)));
    Tensor sum_ref = Tensor::empty({T, O}, DType::kF32);
    cpu::linear_forward(sum_ref, x, w, none);
    sum_ref = to_dtype(to_dtype(sum_ref, dt), DType::kF32);  // the contract: product rounded to dt, then added
    cpu::add(sum_ref, sum_ref, res);
    EXPECT_TRUE(all_close(to_host(y2), to_dtype(sum_ref, dt),
                          narrow_sum_tolerance(gemm_tolerance(tol, I, max_abs(sum_ref)), dt, product_magnitude)))
        << "forward + residual";
  }

  // dx accumulates onto a random start; dweight (f32) accumulates onto a random start
  const Tensor dx0 = testing::rounded_f32({T, I}, dt, 5, 0.0, 1.0), dw0 = testing::rounded_f32({O, I}, DType::kF32, 6, 0.0, 1.0),
               db0 = testing::rounded_f32({O}, DType::kF32, 7, 0.0, 1.0);
  Tensor dx = to_device(to_dtype(dx0, dt)), dw = to_device(dw0), db = to_device(db0);
  Tensor dbias = with_bias ? db : Tensor();
  linear_backward(dx, dw, dbias, to_device(to_dtype(dy, dt)), to_device(to_dtype(x, dt)), to_device(to_dtype(w, dt)),
                  {.accumulate_dx = true});
  // Tensors share storage when copied: clone the starting values for the references.
  Tensor dx_ref = to_dtype(dx0, DType::kF32), dw_ref = to_dtype(dw0, DType::kF32), db_ref = to_dtype(db0, DType::kF32);
  Tensor dbias_ref = with_bias ? db_ref : Tensor();
  double dx_product_magnitude = 0;
  {
    // The header's contract for a narrow dx: the product is rounded to dt, then added.
    Tensor product = Tensor::empty({T, I}, DType::kF32);
    Tensor unused_dw = Tensor::zeros({O, I}, DType::kF32), no_db;
    cpu::linear_backward(product, unused_dw, no_db, dy, x, w, {});
    dx_product_magnitude = max_abs(product);
    product = to_dtype(to_dtype(product, dt), DType::kF32);
    cpu::add(dx_ref, dx_ref, product);
    Tensor no_dx;
    cpu::linear_backward(no_dx, dw_ref, dbias_ref, dy, x, w, {});
  }
  EXPECT_TRUE(all_close(to_host(dx), to_dtype(dx_ref, dt),
                        narrow_sum_tolerance(gemm_tolerance(tol, O, max_abs(dx_ref)), dt, dx_product_magnitude)))
      << "dx (accumulated)";
  // f32 output of bf16 products: only the summation order differs from the CPU
  EXPECT_TRUE(all_close(to_host(dw), dw_ref, gemm_tolerance(testing::kCudaF32VsCpu, T, max_abs(dw_ref))))
      << "dweight (f32, accumulated)";
  if (with_bias) {
    EXPECT_TRUE(all_close(to_host(db), db_ref, gemm_tolerance(testing::kCudaF32VsCpu, T, max_abs(db_ref)))) << "dbias";
  }

  Tensor dx_over = to_device(to_dtype(dx0, dt));
  Tensor dw2 = to_device(dw0);
  Tensor no_bias;
  linear_backward(dx_over, dw2, no_bias, to_device(to_dtype(dy, dt)), to_device(to_dtype(x, dt)),
                  to_device(to_dtype(w, dt)));
  Tensor dx_over_ref = Tensor::empty({T, I}, DType::kF32), dw2_ref = to_dtype(dw0, DType::kF32);
  cpu::linear_backward(dx_over_ref, dw2_ref, no_bias, dy, x, w, {});
  EXPECT_TRUE(all_close(to_host(dx_over), to_dtype(dx_over_ref, dt), gemm_tolerance(tol, O, max_abs(dx_over_ref))))
      << "dx (overwritten)";

  // each half alone (a backward that recomputes x after dx): bitwise the same products
  Tensor dx_alone = to_device(to_dtype(dx0, dt)), dw_alone = to_device(dw0), no_dx, no_dw, no_x;
  linear_backward(dx_alone, no_dw, no_bias, to_device(to_dtype(dy, dt)), no_x, to_device(to_dtype(w, dt)));
  EXPECT_TRUE(all_close(to_host(dx_alone), to_host(dx_over), testing::kExact)) << "dx alone";
  linear_backward(no_dx, dw_alone, no_bias, to_device(to_dtype(dy, dt)), to_device(to_dtype(x, dt)),
                  to_device(to_dtype(w, dt)));
  EXPECT_TRUE(all_close(to_host(dw_alone), to_host(dw2), testing::kExact)) << "dweight alone";

  // overwrite_dweight: dweight and dbias replace what their buffers held (the CPU twin
  // accumulates onto zeros); the timed selection's trials may write into them first
  Tensor dw_new = to_device(dw0), db_new = to_device(db0), dbias_new = with_bias ? db_new : Tensor();
  linear_backward(no_dx, dw_new, dbias_new, to_device(to_dtype(dy, dt)), to_device(to_dtype(x, dt)),
                  to_device(to_dtype(w, dt)), {.overwrite_dweight = true});
  Tensor dw_new_ref = Tensor::zeros({O, I}, DType::kF32), db_new_ref = Tensor::zeros({O}, DType::kF32);
  Tensor dbias_new_ref = with_bias ? db_new_ref : Tensor();
  cpu::linear_backward(no_dx, dw_new_ref, dbias_new_ref, dy, x, w, {});
  EXPECT_TRUE(all_close(to_host(dw_new), dw_new_ref, gemm_tolerance(testing::kCudaF32VsCpu, T, max_abs(dw_new_ref))))
      << "dweight (f32, overwritten)";
  if (with_bias) {
    EXPECT_TRUE(all_close(to_host(db_new), db_new_ref,
                          gemm_tolerance(testing::kCudaF32VsCpu, T, max_abs(db_new_ref))))
        << "dbias (overwritten)";
  }
}

// Both ways of choosing the algorithm: the timed one runs trial products first, which must
// leave accumulating outputs (dx, dW) holding exactly one product on top of their start.
TEST_P(LinearCuda, ForwardAndBackwardMatchCpu) {
  for (GemmSelection selection : {GemmSelection::kHeuristic, GemmSelection::kTimed}) {
    SCOPED_TRACE(selection == GemmSelection::kTimed ? "timed selection" : "heuristic selection");
    set_gemm_selection(selection);
    check_against_cpu(GetParam());
  }
  set_gemm_selection(GemmSelection::kHeuristic);
}

// Timed selection picks each shape's algorithm on its first eager call; a CUDA graph captured
// afterwards must replay those picks, not fall back to the heuristic's: the replay's outputs
// equal the eager calls' bitwise, and the capture adds no choice of its own to the cache.
TEST(LinearCudaGraph, CapturedCallsReplayTheTimedPicks) {
  ST_REQUIRE_CUDA();
  set_gemm_selection(GemmSelection::kTimed);
  const Device dev = Device::cuda(0);
  for (auto [T, I, O] : {std::tuple<int64_t, int64_t, int64_t>{4096, 2048, 8192}, {4096, 8192, 2048},
                         {4096, 2048, 512}, {2048, 2048, 2048}}) {
    SCOPED_TRACE(::testing::Message() << "T" << T << " I" << I << " O" << O);
    auto normal = [&](const Shape& s, DType t, uint64_t key) {
      Tensor x = Tensor::empty(s, t, dev, "test input");
      fill_normal(x, 3, key, 0, 0.5);
      return x;
    };
    const Tensor x = normal({T, I}, DType::kBF16, 1), w = normal({O, I}, DType::kBF16, 2),
                 dy = normal({T, O}, DType::kBF16, 3);
    Tensor y[2], dx[2], dw[2];
    for (int k = 0; k < 2; ++k) {
      y[k] = Tensor::empty({T, O}, DType::kBF16, dev, "y");
      dx[k] = Tensor::empty({T, I}, DType::kBF16, dev, "dx");
      dw[k] = Tensor::empty({O, I}, DType::kF32, dev, "dw");
    }
    LinearBackwardOptions o;
    o.overwrite_dweight = true;
    Tensor no_bias;
    auto products = [&](int k) {
      linear_forward(y[k], x, w, no_bias);
      linear_backward(dx[k], dw[k], no_bias, dy, x, w, o);
    };
    products(0);  // eager: times and caches the picks
    const size_t cached = cuda::cached_gemm_algorithms();
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
    EXPECT_EQ(cuda::cached_gemm_algorithms(), cached) << "the capture chose algorithms of its own";
    for (auto [a, b, name] : {std::tuple{&y[0], &y[1], "y"}, {&dx[0], &dx[1], "dx"}, {&dw[0], &dw[1], "dw"}}) {
      const Tensor ha = to_host(*a), hb = to_host(*b);
      EXPECT_EQ(std::memcmp(ha.raw_data(), hb.raw_data(), ha.nbytes()), 0)
          << name << ": the graph's product differs from the eager call's";
    }
  }
  set_gemm_selection(GemmSelection::kHeuristic);
}

INSTANTIATE_TEST_SUITE_P(Shapes, LinearCuda,
                         ::testing::Values(Case{37, 67, 45, DType::kF32, true}, Case{37, 67, 45, DType::kBF16, true},
                                           Case{256, 2048, 512, DType::kF32, false},
                                           Case{1031, 2048, 8192, DType::kBF16, false},
                                           Case{4096, 2048, 2048, DType::kBF16, true}),
                         [](const ::testing::TestParamInfo<Case>& i) {
                           std::ostringstream s;
                           PrintTo(i.param, &s);
                           return s.str();
                         });

}  // namespace
}  // namespace shardtrain::ops
