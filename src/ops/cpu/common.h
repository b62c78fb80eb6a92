// Helpers shared by the CPU kernels: dtype dispatch to float/double and entry checks.
#pragma once

#include "core/tensor.h"
#include "ops/dispatch.h"

namespace shardtrain::ops::cpu {

// Calls f.template operator()<T>() with T = float or double for a CPU float tensor.
template <typename F>
void dispatch_real(const Tensor& t, const char* op, const char* arg, F&& f) {
  check_cpu_float(t, op, arg);
  if (t.dtype() == DType::kF32) {
    f.template operator()<float>();
  } else {
    f.template operator()<double>();
  }
}

// Device CPU, contiguous, and (when given) the dtype and shape.
void check_arg(const Tensor& t, const char* op, const char* arg);
void check_arg(const Tensor& t, const char* op, const char* arg, DType dtype, const Shape& shape);

}  // namespace shardtrain::ops::cpu
