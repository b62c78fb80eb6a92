// Small elementwise ops and reductions: fill, add, scale, cast, sum of squares.
// Any contiguous shape; all tensors of one call on one device.
#pragma once

#include "core/tensor.h"
#include "ops/dispatch.h"

namespace shardtrain::ops {

namespace cpu {
void fill(Tensor& x, double value);
void add(Tensor& out, const Tensor& a, const Tensor& b);
void scale(Tensor& x, double factor);
void cast(Tensor& out, const Tensor& in);
void sum_squares(Tensor& out_1, const Tensor& x);
}  // namespace cpu

// x[:] = value (overwrites). Floating dtypes and i32/i64.
inline void fill(Tensor& x, double value, Stream = {}) {
  if (x.device().is_cpu()) return cpu::fill(x, value);
  no_kernel("fill", x);
}

// out = a + b elementwise (overwrites out; out may alias a or b). Same shape and dtype,
// f32 or f64 on the CPU.
inline void add(Tensor& out, const Tensor& a, const Tensor& b, Stream = {}) {
  if (out.device().is_cpu()) return cpu::add(out, a, b);
  no_kernel("add", out);
}

// x *= factor in place. f32 or f64 on the CPU.
inline void scale(Tensor& x, double factor, Stream = {}) {
  if (x.device().is_cpu()) return cpu::scale(x, factor);
  no_kernel("scale", x);
}

// out = in converted to out's dtype (overwrites). Any pair of f32/f64/bf16/f16, same
// shape; round to nearest even when narrowing. Also a plain copy when dtypes match.
inline void cast(Tensor& out, const Tensor& in, Stream = {}) {
  if (out.device().is_cpu()) return cpu::cast(out, in);
  no_kernel("cast", out);
}

// out_1 += sum(x^2), accumulated in f64; out_1 is a 1-element f64 tensor. x any floating dtype.
inline void sum_squares(Tensor& out_1, const Tensor& x, Stream = {}) {
  if (x.device().is_cpu()) return cpu::sum_squares(out_1, x);
  no_kernel("sum_squares", x);
}

}  // namespace shardtrain::ops
