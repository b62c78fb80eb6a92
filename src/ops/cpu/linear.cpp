// CPU linear layer through BLAS (row-major sgemm / dgemm).
#include <cblas.h>

#include <algorithm>
#include <vector>

#include "ops/cpu/common.h"
#include "ops/linear.h"

namespace shardtrain::ops::cpu {
namespace {

// C[m x n] = alpha op(A) op(B) + beta C, all row-major.
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha, const float* a, int64_t lda,
          const float* b, int64_t ldb, double beta, float* c, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
              static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), static_cast<float>(alpha), a,
              static_cast<int>(lda), b, static_cast<int>(ldb), static_cast<float>(beta), c, static_cast<int>(ldc));
}
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha, const double* a, int64_t lda,
          const double* b, int64_t ldb, double beta, double* c, int64_t ldc) {
  cblas_dgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
              static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), alpha, a, static_cast<int>(lda), b,
              static_cast<int>(ldb), beta, c, static_cast<int>(ldc));
}

// y[m] = alpha A[m x n] x + beta y, A row-major.
void gemv(int64_t m, int64_t n, double alpha, const float* a, int64_t lda, const float* x, double beta, float* y) {
  cblas_sgemv(CblasRowMajor, CblasNoTrans, static_cast<int>(m), static_cast<int>(n), static_cast<float>(alpha), a,
              static_cast<int>(lda), x, 1, static_cast<float>(beta), y, 1);
}
void gemv(int64_t m, int64_t n, double alpha, const double* a, int64_t lda, const double* x, double beta, double* y) {
  cblas_dgemv(CblasRowMajor, CblasNoTrans, static_cast<int>(m), static_cast<int>(n), alpha, a, static_cast<int>(lda),
              x, 1, beta, y, 1);
}

void check_weight(const Tensor& x_TI, const Tensor& weight_OI, const char* op, int64_t& T, int64_t& I, int64_t& O) {
  check_arg(x_TI, op, "x_TI");
  check_arg(weight_OI, op, "weight_OI");
  ST_CHECK(x_TI.ndim() == 2, op, ": `x_TI` must be 2-D, found ", x_TI.str());
  ST_CHECK(weight_OI.ndim() == 2, op, ": `weight_OI` must be 2-D, found ", weight_OI.str());
  T = x_TI.size(0);
  I = x_TI.size(1);
  O = weight_OI.size(0);
  check_shape(weight_OI, {O, I}, op, "weight_OI");
  check_dtype(weight_OI, x_TI.dtype(), op, "weight_OI");
  ST_CHECK(T < INT32_MAX && I < INT32_MAX && O < INT32_MAX, op, ": dimensions exceed BLAS's 32-bit sizes");
}

// The values an FP8 operand holds, [rows, padded cols] in f64 (exact: codes times powers of two).
std::vector<double> dequantized(const Fp8Operand& q) {
  Tensor values = Tensor::empty({q.rows(), q.cols}, DType::kF32);
  fp8_dequantize(values, q);
  const int64_t R = q.rows(), C = q.cols, P = q.padded_cols();
  std::vector<double> out(static_cast<size_t>(R * P), 0.0);
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < C; ++c) out[static_cast<size_t>(r * P + c)] = values.data<float>()[r * C + c];
  return out;
}

}  // namespace

void fp8_product(Tensor& out_NM, const Fp8Operand& a_MK, const Fp8Operand& b_NK, const Tensor& bias_M,
                 const Tensor& c_NM, const Fp8ProductOptions& options) {
  const char* op = "fp8_product";
  const int64_t M = a_MK.rows(), N = b_NK.rows(), K = a_MK.padded_cols();
  ST_CHECK(a_MK.data_RP.device().is_cpu() && b_NK.data_RP.device().is_cpu(), op, ": operands must be on the CPU");
  ST_CHECK(a_MK.cols == b_NK.cols && b_NK.padded_cols() == K, op, ": the operands' columns differ: ", a_MK.cols,
           " and ", b_NK.cols);
  check_arg(out_NM, op, "out_NM");
  check_cpu_float(out_NM, op, "out_NM");
  check_shape(out_NM, {N, M}, op, "out_NM");
  if (bias_M.defined()) check_arg(bias_M, op, "bias_M", out_NM.dtype(), {M});
  if (c_NM.defined()) check_arg(c_NM, op, "c_NM", out_NM.dtype(), {N, M});
  std::vector<double> product(static_cast<size_t>(N * M), 0.0);
  if (N > 0 && M > 0 && K > 0) {
    const std::vector<double> a = dequantized(a_MK), b = dequantized(b_NK);
    gemm(false, true, N, M, K, 1.0, b.data(), K, a.data(), K, 0.0, product.data(), M);
  }
  dispatch_real(out_NM, op, "out_NM", [&]<typename F>() {
    F* out = out_NM.data<F>();
    const F* bias = bias_M.defined() ? bias_M.data<F>() : nullptr;
    const F* c = c_NM.defined() ? c_NM.data<F>() : nullptr;
    for (int64_t n = 0; n < N; ++n)
      for (int64_t m = 0; m < M; ++m) {
        const int64_t i = n * M + m;
        F v = static_cast<F>(product[static_cast<size_t>(i)]);  // the product rounded to out's dtype first
        if (bias) v = static_cast<F>(v + bias[m]);
        if (c) {
          v = static_cast<F>(v + c[i]);
        } else if (options.accumulate) {
          v = static_cast<F>(out[i] + v);
        }
        out[i] = v;
      }
  });
}

void linear_forward(Tensor& y_TO, const Tensor& x_TI, const Tensor& weight_OI, const Tensor& bias_O) {
  const char* op = "linear_forward";
  int64_t T, I, O;
  check_weight(x_TI, weight_OI, op, T, I, O);
  check_arg(y_TO, op, "y_TO", x_TI.dtype(), {T, O});
  if (bias_O.defined()) check_arg(bias_O, op, "bias_O", x_TI.dtype(), {O});
  dispatch_real(x_TI, op, "x_TI", [&]<typename F>() {
    F* y = y_TO.data<F>();
    double beta = 0;
    if (bias_O.defined()) {
      const F* b = bias_O.data<F>();
      for (int64_t t = 0; t < T; ++t)
        for (int64_t o = 0; o < O; ++o) y[t * O + o] = b[o];
      beta = 1;
    }
    // one row (a token decoded over a KV cache): a matrix-vector product, as OpenBLAS's GEMM
    // would first copy the whole weight into its packed layout (most of such a token's time)
    if (T == 1 && O > 0) gemv(O, I, 1.0, weight_OI.data<F>(), I, x_TI.data<F>(), beta, y);
    else if (T > 0 && O > 0) gemm(false, true, T, O, I, 1.0, x_TI.data<F>(), I, weight_OI.data<F>(), I, beta, y, O);
  });
}

void linear_backward(Tensor& dx_TI, Tensor& dweight_OI, Tensor& dbias_O, const Tensor& dy_TO, const Tensor& x_TI,
                     const Tensor& weight_OI, const LinearBackwardOptions& options) {
  const char* op = "linear_backward";
  ST_CHECK(x_TI.defined() || (dx_TI.defined() && !dweight_OI.defined()), op,
           ": `x_TI` may be undefined only in a call for `dx_TI` alone");
  const Tensor& shape_TI = x_TI.defined() ? x_TI : dx_TI;
  int64_t T, I, O;
  check_weight(shape_TI, weight_OI, op, T, I, O);
  const DType dt = weight_OI.dtype();
  check_arg(dy_TO, op, "dy_TO", dt, {T, O});
  if (dweight_OI.defined()) check_arg(dweight_OI, op, "dweight_OI", dt, {O, I});
  if (dx_TI.defined()) check_arg(dx_TI, op, "dx_TI", dt, {T, I});
  if (dbias_O.defined()) check_arg(dbias_O, op, "dbias_O", dt, {O});
  dispatch_real(weight_OI, op, "weight_OI", [&]<typename F>() {
    const F* dy = dy_TO.data<F>();
    if (dx_TI.defined() && T > 0 && I > 0) {
      if (O > 0) {
        gemm(false, false, T, I, O, 1.0, dy, O, weight_OI.data<F>(), I, options.accumulate_dx ? 1.0 : 0.0,
             dx_TI.data<F>(), I);
      } else if (!options.accumulate_dx) {
        std::fill_n(dx_TI.data<F>(), T * I, F(0));
      }
    }
    const bool overwrite = options.overwrite_dweight;
    if (dweight_OI.defined() && T > 0) {
      gemm(true, false, O, I, T, 1.0, dy, O, x_TI.data<F>(), I, overwrite ? 0.0 : 1.0, dweight_OI.data<F>(), I);
    } else if (dweight_OI.defined() && overwrite) {
      std::fill_n(dweight_OI.data<F>(), O * I, F(0));  // no tokens: the gradient is zero
    }
    if (dbias_O.defined()) {
      F* db = dbias_O.data<F>();
      for (int64_t o = 0; o < O; ++o) {
        double acc = 0;
        for (int64_t t = 0; t < T; ++t) acc += dy[t * O + o];
        db[o] = overwrite ? static_cast<F>(acc) : db[o] + static_cast<F>(acc);
      }
    }
  });
}

}  // namespace shardtrain::ops::cpu
