// RMSNorm as in HF LlamaRMSNorm: y = weight * (x * rsqrt(mean(x^2) + eps)), statistics in
// f32 (f64 for f64 data); eps inside the square root. With a weight offset (Gemma's norms:
// 1) the scale is weight + offset, added inside the op, so that stored weights stay as the
// checkpoint has them (near 0, where bf16 keeps their precision).
#pragma once

#include "core/profile.h"
#include "core/tensor.h"
#include "ops/dispatch.h"
#include "ops/elementwise.h"

namespace shardtrain::ops {

struct RmsNormOptions {
  double eps = 1e-5;
  // y = (weight + weight_offset) * xhat. Nonzero (Gemma's 1), CUDA scales xhat in f32 and
  // rounds once, as transformers' Gemma norm; at 0 it rounds xhat before the weight, as Llama's.
  double weight_offset = 0;
  // When defined (i32 [1] on y's device, read as u32): the largest |y| written, as the bits of
  // its f32 value (ops/fp8.h's amax), is max-ed into it (it must start at a lower bound, such as
  // 0): a tensorwise FP8 product of y then needs no pass of its own for it.
  Tensor amax_y_1 = {};
};

struct RmsNormBackwardOptions {
  double weight_offset = 0;  // the forward's (RmsNormOptions::weight_offset)
  // dweight_D overwritten instead of accumulated: the first gradient a micro-batch writes
  // into a buffer whose old contents are not wanted (no zero-fill needed before).
  bool overwrite_dweight = false;
};

namespace cpu {
void rmsnorm_forward(Tensor& y_TD, Tensor& rstd_T, const Tensor& x_TD, const Tensor& weight_D,
                     const RmsNormOptions& options);
void rmsnorm_backward(Tensor& dx_TD, Tensor& dweight_D, const Tensor& dy_TD, const Tensor& x_TD,
                      const Tensor& weight_D, const Tensor& rstd_T, const RmsNormBackwardOptions& options = {});
}  // namespace cpu

namespace cuda {
void rmsnorm_forward(Tensor& y_TD, Tensor& rstd_T, const Tensor& x_TD, const Tensor& weight_D,
                     const RmsNormOptions& options, Stream stream);
void rmsnorm_backward(Tensor& dx_TD, Tensor& dweight_D, const Tensor& dy_TD, const Tensor& x_TD,
                      const Tensor& weight_D, const Tensor& rstd_T, const Tensor& dresidual_TD,
                      const RmsNormBackwardOptions& options, Stream stream);
}  // namespace cuda

// y_TD (overwrites) and rstd_T (overwrites; stats_dtype(x), kept for the backward) from
// x_TD and weight_D. y, x, weight share one dtype (f32/f64 on the CPU). y may not alias x.
inline void rmsnorm_forward(Tensor& y_TD, Tensor& rstd_T, const Tensor& x_TD, const Tensor& weight_D,
                            const RmsNormOptions& options, [[maybe_unused]] Stream stream = {}) {
  profile::ScopedTimer profile_timer("rmsnorm_forward", y_TD.device(),
                                     {0, profile::bytes_of({&y_TD, &rstd_T, &x_TD, &weight_D})});
  if (x_TD.device().is_cpu()) return cpu::rmsnorm_forward(y_TD, rstd_T, x_TD, weight_D, options);
#ifdef SHARDTRAIN_WITH_CUDA
  return cuda::rmsnorm_forward(y_TD, rstd_T, x_TD, weight_D, options, stream);
#else
  no_kernel("rmsnorm_forward", x_TD);
#endif
}

// dx_TD (overwrites) and dweight_D (accumulates, or overwrites with
// options.overwrite_dweight) from dy_TD, the forward's x_TD, weight_D and rstd_T. dx may
// not alias dy. dresidual_TD, when defined, is added to dx: the gradient of a residual
// stream that also flows around the norm (CUDA adds it before rounding; the CPU adds it
// after, as a separate op). CUDA: dweight may be f32 under bf16/f16 data.
inline void rmsnorm_backward(Tensor& dx_TD, Tensor& dweight_D, const Tensor& dy_TD, const Tensor& x_TD,
                             const Tensor& weight_D, const Tensor& rstd_T, const Tensor& dresidual_TD = Tensor(),
                             const RmsNormBackwardOptions& options = {}, [[maybe_unused]] Stream stream = {}) {
  const double read_written = profile::bytes_of({&dx_TD, &dy_TD, &x_TD, &weight_D, &rstd_T, &dresidual_TD});
  profile::ScopedTimer profile_timer(
      "rmsnorm_backward", dx_TD.device(),
      {0, read_written + (options.overwrite_dweight ? 1 : 2) * profile::bytes_of({&dweight_D})});
  if (x_TD.device().is_cpu()) {
    cpu::rmsnorm_backward(dx_TD, dweight_D, dy_TD, x_TD, weight_D, rstd_T, options);
    if (dresidual_TD.defined()) cpu::add(dx_TD, dx_TD, dresidual_TD);
    return;
  }
#ifdef SHARDTRAIN_WITH_CUDA
  return cuda::rmsnorm_backward(dx_TD, dweight_D, dy_TD, x_TD, weight_D, rstd_T, dresidual_TD, options, stream);
#else
  no_kernel("rmsnorm_backward", x_TD);
#endif
}

}  // namespace shardtrain::ops
