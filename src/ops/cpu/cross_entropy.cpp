// CPU fused output projection + cross-entropy over chunks of tokens: only [chunk x V]
// logits exist at once; they are turned into the gradient in place and consumed by two
// GEMMs (dh = G W, dW += G^T h). With options.fp8 the three products are the FP8 twin's
// (ops/linear.h), the oracle of the CUDA head's.
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "ops/cpu/common.h"
#include "ops/cross_entropy.h"

namespace shardtrain::ops::cpu {
namespace {

void gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
          const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, ta, tb, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), 1.0f, a,
              static_cast<int>(lda), b, static_cast<int>(ldb), beta, c, static_cast<int>(ldc));
}
void gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int64_t m, int64_t n, int64_t k, const double* a, int64_t lda,
          const double* b, int64_t ldb, double beta, double* c, int64_t ldc) {
  cblas_dgemm(CblasRowMajor, ta, tb, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), 1.0, a,
              static_cast<int>(lda), b, static_cast<int>(ldb), beta, c, static_cast<int>(ldc));
}

}  // namespace

void linear_cross_entropy(Tensor& loss_sum_1, Tensor& dh_TD, Tensor& dweight_VD, const Tensor& h_TD,
                          const Tensor& weight_VD, const Tensor& targets_T, const CrossEntropyOptions& o) {
  const char* op = "linear_cross_entropy";
  check_arg(h_TD, op, "h_TD");
  ST_CHECK(h_TD.ndim() == 2, op, ": `h_TD` must be 2-D, found ", h_TD.str());
  const int64_t T = h_TD.size(0), D = h_TD.size(1);
  check_arg(weight_VD, op, "weight_VD");
  ST_CHECK(weight_VD.ndim() == 2 && weight_VD.size(1) == D, op, ": `weight_VD` must be [V, ", D, "], found ",
           weight_VD.str());
  check_dtype(weight_VD, h_TD.dtype(), op, "weight_VD");
  const int64_t V = weight_VD.size(0);
  check_arg(targets_T, op, "targets_T", DType::kI32, {T});
  ST_CHECK(loss_sum_1.defined() && loss_sum_1.numel() == 1 && loss_sum_1.device().is_cpu(), op,
           ": `loss_sum_1` must be a 1-element host tensor");
  ST_CHECK(o.chunk_tokens > 0, op, ": chunk_tokens must be positive, found ", o.chunk_tokens);
  if (o.compute_grad) {
    check_arg(dh_TD, op, "dh_TD", h_TD.dtype(), {T, D});
    check_arg(dweight_VD, op, "dweight_VD", h_TD.dtype(), {V, D});
  }
  const int32_t* targets = targets_T.data<int32_t>();
  for (int64_t t = 0; t < T; ++t)
    ST_CHECK(targets[t] == o.ignore_index || (targets[t] >= 0 && targets[t] < V), op, ": target ", targets[t],
             " at position ", t, " outside [0, ", V, ") and not the ignore index ", o.ignore_index);
  ST_CHECK(V < INT32_MAX && D < INT32_MAX, op, ": dimensions exceed BLAS's 32-bit sizes");

  dispatch_real(h_TD, op, "h_TD", [&]<typename F>() {
    if (o.compute_grad && o.overwrite_dweight && T == 0) std::fill_n(dweight_VD.data<F>(), V * D, F(0));
    const F* h = h_TD.data<F>();
    const F* w = weight_VD.data<F>();
    const int64_t C = std::min(o.chunk_tokens, std::max<int64_t>(T, 1));
    std::vector<F> logits(static_cast<size_t>(C * V));
    double loss = 0;
    for (int64_t t0 = 0; t0 < T; t0 += C) {
      const int64_t rows = std::min(C, T - t0);
      Tensor z = Tensor::from_blob(logits.data(), {rows, V}, h_TD.dtype());
      const Tensor h_chunk = h_TD.slice(0, t0, t0 + rows);
      if (o.fp8.on())
        linear_forward_fp8(z, h_chunk, weight_VD, Tensor(), Tensor(), o.fp8, Stream{});
      else
        gemm(CblasNoTrans, CblasTrans, rows, V, D, h + t0 * D, D, w, D, F(0), logits.data(), V);
      double chunk_loss = 0;
#pragma omp parallel for reduction(+ : chunk_loss) if (rows * V > 65536)
      for (int64_t r = 0; r < rows; ++r) {
        F* z = logits.data() + r * V;
        const int32_t target = targets[t0 + r];
        if (target == o.ignore_index) {
          if (o.compute_grad) std::fill_n(z, V, F(0));
          continue;
        }
        const double cap = o.logit_softcap;
        if (cap > 0)
          for (int64_t c = 0; c < V; ++c) z[c] = static_cast<F>(cap * std::tanh(static_cast<double>(z[c]) / cap));
        double mx = z[0];
        for (int64_t c = 1; c < V; ++c) mx = std::max(mx, static_cast<double>(z[c]));
        double sum = 0;
        for (int64_t c = 0; c < V; ++c) sum += std::exp(static_cast<double>(z[c]) - mx);
        const double lse = mx + std::log(sum);
        chunk_loss += lse - static_cast<double>(z[target]);
        if (o.compute_grad) {
          if (cap > 0) {
            // the capped logit's gradient, then through the cap: 1 - tanh^2 = 1 - (z / cap)^2
            for (int64_t c = 0; c < V; ++c) {
              const double zc = z[c];
              const double g = o.grad_scale * (std::exp(zc - lse) - (c == target ? 1.0 : 0.0));
              z[c] = static_cast<F>(g * (1 - (zc / cap) * (zc / cap)));
            }
          } else {
            for (int64_t c = 0; c < V; ++c)
              z[c] = static_cast<F>(o.grad_scale * std::exp(static_cast<double>(z[c]) - lse));
            z[target] -= static_cast<F>(o.grad_scale);
          }
        }
      }
      loss += chunk_loss;
      if (o.compute_grad && o.fp8.on()) {
        Tensor dh = dh_TD.slice(0, t0, t0 + rows), none;
        LinearBackwardOptions lo;
        lo.overwrite_dweight = o.overwrite_dweight && t0 == 0;
        lo.fp8 = o.fp8;
        linear_backward_fp8(dh, dweight_VD, none, z, h_chunk, weight_VD, lo, Stream{});
      } else if (o.compute_grad) {
        gemm(CblasNoTrans, CblasNoTrans, rows, D, V, logits.data(), V, w, D, F(0), dh_TD.data<F>() + t0 * D, D);
        const bool overwrite = o.overwrite_dweight && t0 == 0;  // the first chunk replaces, the rest add
        gemm(CblasTrans, CblasNoTrans, V, D, rows, logits.data(), V, h + t0 * D, D, F(overwrite ? 0 : 1),
             dweight_VD.data<F>(), D);
      }
    }
    if (loss_sum_1.dtype() == DType::kF64) {
      loss_sum_1.data<double>()[0] += loss;
    } else {
      check_dtype(loss_sum_1, DType::kF32, op, "loss_sum_1");
      loss_sum_1.data<float>()[0] += static_cast<float>(loss);
    }
  });
}

}  // namespace shardtrain::ops::cpu
