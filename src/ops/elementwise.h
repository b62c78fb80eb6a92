// Small elementwise ops and reductions: fill, add, scale, softcap, cast, sum of squares.
// Any contiguous shape; all tensors of one call on one device.
#pragma once

#include "core/profile.h"
#include "core/tensor.h"
#include "ops/dispatch.h"

namespace shardtrain::ops {

namespace cpu {
void fill(Tensor& x, double value);
void fill_normal(Tensor& x, uint64_t seed, uint64_t key, int64_t first, double std);
void add(Tensor& out, const Tensor& a, const Tensor& b);
void scale(Tensor& x, double factor);
void softcap(Tensor& x, double cap);
void cast(Tensor& out, const Tensor& in);
void sum_squares(Tensor& out_1, const Tensor& x);
}  // namespace cpu

namespace cuda {
void fill(Tensor& x, double value, Stream stream);
void fill_normal(Tensor& x, uint64_t seed, uint64_t key, int64_t first, double std, Stream stream);
void add(Tensor& out, const Tensor& a, const Tensor& b, Stream stream);
void scale(Tensor& x, double factor, Stream stream);
void softcap(Tensor& x, double cap, Stream stream);
void cast(Tensor& out, const Tensor& in, Stream stream);
void sum_squares(Tensor& out_1, const Tensor& x, Stream stream);
}  // namespace cuda

// x[:] = value (overwrites). Floating dtypes and i32/i64.
inline void fill(Tensor& x, double value, [[maybe_unused]] Stream stream = {}) {
  profile::ScopedTimer profile_timer("fill", x.device(), {0, profile::bytes_of({&x})});
  if (x.device().is_cpu()) return cpu::fill(x, value);
#ifdef SHARDTRAIN_WITH_CUDA
  return cuda::fill(x, value, stream);
#else
  no_kernel("fill", x);
#endif
}

// x[i] = std * normal_at(seed, key, first + i) for every element i: the counter-based
// parameter init (core/random.h), computed in f64 where x lives and rounded once to f32 (then
// to x's dtype, as cast rounds). Host and device agree up to the last bit of f64 log/cos.
// Floating dtypes.
inline void fill_normal(Tensor& x, uint64_t seed, uint64_t key, int64_t first, double std,
                        [[maybe_unused]] Stream stream = {}) {
  profile::ScopedTimer profile_timer("fill_normal", x.device(), {0, profile::bytes_of({&x})});
  if (x.device().is_cpu()) return cpu::fill_normal(x, seed, key, first, std);
#ifdef SHARDTRAIN_WITH_CUDA
  return cuda::fill_normal(x, seed, key, first, std, stream);
#else
  no_kernel("fill_normal", x);
#endif
}

// out = a + b elementwise (overwrites out; out may alias a or b). Same shape and dtype,
// f32 or f64 on the CPU.
inline void add(Tensor& out, const Tensor& a, const Tensor& b, [[maybe_unused]] Stream stream = {}) {
  profile::ScopedTimer profile_timer("add", out.device(), {0, profile::bytes_of({&out, &a, &b})});
  if (out.device().is_cpu()) return cpu::add(out, a, b);
#ifdef SHARDTRAIN_WITH_CUDA
  return cuda::add(out, a, b, stream);
#else
  no_kernel("add", out);
#endif
}

// x *= factor in place. f32 or f64 on the CPU.
inline void scale(Tensor& x, double factor, [[maybe_unused]] Stream stream = {}) {
  profile::ScopedTimer profile_timer("scale", x.device(), {0, 2 * profile::bytes_of({&x})});
  if (x.device().is_cpu()) return cpu::scale(x, factor);
#ifdef SHARDTRAIN_WITH_CUDA
  return cuda::scale(x, factor, stream);
#else
  no_kernel("scale", x);
#endif
}

// x = cap · tanh(x / cap) in place (Gemma 2's logit soft-capping), cap > 0, computed in f64 and
// rounded once to x's dtype: f32 or f64 on the CPU; f32, f64, bf16 or f16 on CUDA.
inline void softcap(Tensor& x, double cap, [[maybe_unused]] Stream stream = {}) {
  profile::ScopedTimer profile_timer("softcap", x.device(), {0, 2 * profile::bytes_of({&x})});
  if (x.device().is_cpu()) return cpu::softcap(x, cap);
#ifdef SHARDTRAIN_WITH_CUDA
  return cuda::softcap(x, cap, stream);
#else
  no_kernel("softcap", x);
#endif
}

// A cast whose input and output live on different devices (staged through a copy).
void cast_across_devices(Tensor& out, const Tensor& in, Stream stream);

// out = in converted to out's dtype (overwrites). Any pair of f32/f64/bf16/f16, same
// shape; round to nearest even when narrowing. Also a plain copy when dtypes match. out
// and in may be on different devices (host <-> CUDA): the bytes are staged through a copy
// and the conversion runs where out lives.
inline void cast(Tensor& out, const Tensor& in, [[maybe_unused]] Stream stream = {}) {
  profile::ScopedTimer profile_timer("cast", out.device(), {0, profile::bytes_of({&out, &in})});
  if (!(out.device() == in.device())) return cast_across_devices(out, in, stream);
  if (out.device().is_cpu()) return cpu::cast(out, in);
#ifdef SHARDTRAIN_WITH_CUDA
  return cuda::cast(out, in, stream);
#else
  no_kernel("cast", out);
#endif
}

// out_1 += sum(x^2), accumulated in f64; out_1 is a 1-element f64 tensor. x any floating dtype.
inline void sum_squares(Tensor& out_1, const Tensor& x, [[maybe_unused]] Stream stream = {}) {
  profile::ScopedTimer profile_timer("sum_squares", out_1.device(), {0, profile::bytes_of({&x})});
  if (x.device().is_cpu()) return cpu::sum_squares(out_1, x);
#ifdef SHARDTRAIN_WITH_CUDA
  return cuda::sum_squares(out_1, x, stream);
#else
  no_kernel("sum_squares", x);
#endif
}

}  // namespace shardtrain::ops
