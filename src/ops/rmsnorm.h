// RMSNorm as in HF LlamaRMSNorm: y = weight * (x * rsqrt(mean(x^2) + eps)), statistics in
// f32 (f64 for f64 data); eps inside the square root.
#pragma once

#include "core/tensor.h"
#include "ops/dispatch.h"

namespace shardtrain::ops {

struct RmsNormOptions {
  double eps = 1e-5;
};

namespace cpu {
void rmsnorm_forward(Tensor& y_TD, Tensor& rstd_T, const Tensor& x_TD, const Tensor& weight_D,
                     const RmsNormOptions& options);
void rmsnorm_backward(Tensor& dx_TD, Tensor& dweight_D, const Tensor& dy_TD, const Tensor& x_TD,
                      const Tensor& weight_D, const Tensor& rstd_T);
}  // namespace cpu

// y_TD (overwrites) and rstd_T (overwrites; stats_dtype(x), kept for the backward) from
// x_TD and weight_D. y, x, weight share one dtype (f32/f64 on the CPU). y may not alias x.
inline void rmsnorm_forward(Tensor& y_TD, Tensor& rstd_T, const Tensor& x_TD, const Tensor& weight_D,
                            const RmsNormOptions& options, Stream = {}) {
  if (x_TD.device().is_cpu()) return cpu::rmsnorm_forward(y_TD, rstd_T, x_TD, weight_D, options);
  no_kernel("rmsnorm_forward", x_TD);
}

// dx_TD (overwrites) and dweight_D (accumulates) from dy_TD, the forward's x_TD, weight_D
// and rstd_T. dx may not alias dy.
inline void rmsnorm_backward(Tensor& dx_TD, Tensor& dweight_D, const Tensor& dy_TD, const Tensor& x_TD,
                             const Tensor& weight_D, const Tensor& rstd_T, Stream = {}) {
  if (x_TD.device().is_cpu()) return cpu::rmsnorm_backward(dx_TD, dweight_D, dy_TD, x_TD, weight_D, rstd_T);
  no_kernel("rmsnorm_backward", x_TD);
}

}  // namespace shardtrain::ops
