// Linear layer y = x W^T (+ b) with weights in the HF/PyTorch layout [out, in] (O, I).
// The CPU version calls BLAS (f32 sgemm, f64 dgemm).
#pragma once

#include "core/tensor.h"
#include "ops/dispatch.h"

namespace shardtrain::ops {

struct LinearBackwardOptions {
  // Exception to the house rule, for branches that meet (q/k/v, gate/up share an input):
  // when true, dx_TI accumulates (+=) instead of being overwritten.
  bool accumulate_dx = false;
};

namespace cpu {
void linear_forward(Tensor& y_TO, const Tensor& x_TI, const Tensor& weight_OI, const Tensor& bias_O);
void linear_backward(Tensor& dx_TI, Tensor& dweight_OI, Tensor& dbias_O, const Tensor& dy_TO,
                     const Tensor& x_TI, const Tensor& weight_OI, const LinearBackwardOptions& options);
}  // namespace cpu

// y_TO = x_TI · weight_OI^T + bias_O (overwrites). bias_O may be undefined (no bias).
// One dtype for all (f32/f64 on the CPU); accumulation in that dtype by BLAS. No aliasing.
inline void linear_forward(Tensor& y_TO, const Tensor& x_TI, const Tensor& weight_OI,
                           const Tensor& bias_O = Tensor(), Stream = {}) {
  if (x_TI.device().is_cpu()) return cpu::linear_forward(y_TO, x_TI, weight_OI, bias_O);
  no_kernel("linear_forward", x_TI);
}

// dx_TI = dy_TO · weight_OI (overwrites, or accumulates with options.accumulate_dx; skipped
// when dx_TI is undefined), dweight_OI += dy_TO^T · x_TI (accumulates), dbias_O += sum over
// T of dy_TO (accumulates; skipped when undefined).
inline void linear_backward(Tensor& dx_TI, Tensor& dweight_OI, Tensor& dbias_O, const Tensor& dy_TO,
                            const Tensor& x_TI, const Tensor& weight_OI,
                            const LinearBackwardOptions& options = {}, Stream = {}) {
  if (x_TI.device().is_cpu())
    return cpu::linear_backward(dx_TI, dweight_OI, dbias_O, dy_TO, x_TI, weight_OI, options);
  no_kernel("linear_backward", x_TI);
}

}  // namespace shardtrain::ops
