// Rotary position embedding in HF's rotate_half convention: element i pairs with i + K among the
// first 2K elements of each head. Letters: K, the number of rotation frequencies: H/2, or with
// partial rotary (Phi-4-mini) R/2 for the R = int(H · partial_rotary) rotated dimensions, the
// others passed through unchanged. Positions are 0..T-1 per sequence, or given per token
// (documents packed into a sequence each count from 0).
#pragma once

#include <cstdint>
#include <vector>

#include "core/profile.h"
#include "core/tensor.h"
#include "ops/dispatch.h"

namespace shardtrain::ops {

enum class RopeScalingType { kNone, kLlama3, kLinear, kLongRope };

// Llama 3.1 frequency scaling (HF `rope_type: llama3`): wavelengths longer than
// original_max_positions / low_freq_factor are divided by `factor`, shorter than
// original_max_positions / high_freq_factor are kept, and those between are interpolated.
// Linear (HF `rope_type: linear`, position interpolation): every frequency divided by `factor`.
// LongRoPE (HF `rope_type: longrope`, Phi-3): frequency k divided by short_factor[k] for a
// sequence of at most original_max_positions positions, by long_factor[k] for a longer one
// (K entries each), and cos and sin multiplied by attention_factor.
struct RopeScaling {
  RopeScalingType type = RopeScalingType::kNone;
  double factor = 8.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_positions = 8192;
  std::vector<double> short_factor, long_factor;
  double attention_factor = 1.0;
};

struct RopeOptions {
  double theta = 500000.0;
  RopeScaling scaling;
  // The fraction of each head that rotates (HF `partial_rotary_factor`; Phi-4-mini: 0.75): the
  // first int(H · partial_rotary) dimensions, which must be even; 1: all of them.
  double partial_rotary = 1.0;
};

// R, the rotated dimensions of a head of `head_dim`: int(head_dim · partial_rotary), checked
// even and > 0 (an error names the fraction and the head dimension).
int64_t rope_rotary_dim(int64_t head_dim, const RopeOptions& options);

// Whether a sequence whose largest position is `length` - 1 takes LongRoPE's long factors (as
// transformers decides: length > original_max_positions); false without LongRoPE.
bool rope_long_factors(const RopeOptions& options, int64_t length);

// inv_freq[k] = theta^(-2k/R) for k < K = R/2, then the scaling (LongRoPE: its long factors when
// `long_factors`, else its short ones); computed in f64.
std::vector<double> rope_inv_frequencies(int64_t head_dim, const RopeOptions& options, bool long_factors = false);

// Host tables cos_TK, sin_TK of angle t * inv_freq[k] for t < T (overwrites), times LongRoPE's
// attention factor; f32 or f64, angles in f64 then rounded to the table dtype. T is the tables'
// first dimension, K = rope_rotary_dim / 2 their second.
void rope_table(Tensor& cos_TK, Tensor& sin_TK, int64_t head_dim, const RopeOptions& options,
                bool long_factors = false);

namespace cpu {
void rope_forward(Tensor& x_BTNH, const Tensor& cos_TK, const Tensor& sin_TK, const Tensor& positions_BT);
void rope_backward(Tensor& dx_BTNH, const Tensor& cos_TK, const Tensor& sin_TK, const Tensor& positions_BT);
}  // namespace cpu

namespace cuda {
void rope_forward(Tensor& x_BTNH, const Tensor& cos_TK, const Tensor& sin_TK, const Tensor& positions_BT,
                  Stream stream);
void rope_backward(Tensor& dx_BTNH, const Tensor& cos_TK, const Tensor& sin_TK, const Tensor& positions_BT,
                   Stream stream);
}  // namespace cuda

// In place on x_BTNH (q with N heads or k with M heads; any head count):
//   x'[i]   = x[i] cos - x[i+K] sin,   x'[i+K] = x[i+K] cos + x[i] sin   (i < K, t = position)
// with K the tables' second dimension, 2K <= H: elements 2K..H-1 of each head stay as they are
// (partial rotary). Tables have at least T rows and the same dtype as x (f32/f64 on the CPU). The position of
// token t of row b is t, or positions_BT[b, t] when that is defined (i32 [B, T], contiguous,
// on x's device, each below the tables' rows: checked on the CPU; on CUDA the caller's, as
// pack_documents's positions are, never above t).
inline void rope_forward(Tensor& x_BTNH, const Tensor& cos_TK, const Tensor& sin_TK, const Tensor& positions_BT = {},
                         [[maybe_unused]] Stream stream = {}) {
  profile::ScopedTimer profile_timer("rope_forward", x_BTNH.device(), {0, 2 * profile::bytes_of({&x_BTNH})});
  if (x_BTNH.device().is_cpu()) return cpu::rope_forward(x_BTNH, cos_TK, sin_TK, positions_BT);
#ifdef SHARDTRAIN_WITH_CUDA
  return cuda::rope_forward(x_BTNH, cos_TK, sin_TK, positions_BT, stream);
#else
  no_kernel("rope_forward", x_BTNH);
#endif
}

// In place: turns the gradient w.r.t. the rotated x into the gradient w.r.t. the input x
// (the transpose of the rotation, i.e. rotation by -angle).
inline void rope_backward(Tensor& dx_BTNH, const Tensor& cos_TK, const Tensor& sin_TK,
                          const Tensor& positions_BT = {}, [[maybe_unused]] Stream stream = {}) {
  profile::ScopedTimer profile_timer("rope_backward", dx_BTNH.device(), {0, 2 * profile::bytes_of({&dx_BTNH})});
  if (dx_BTNH.device().is_cpu()) return cpu::rope_backward(dx_BTNH, cos_TK, sin_TK, positions_BT);
#ifdef SHARDTRAIN_WITH_CUDA
  return cuda::rope_backward(dx_BTNH, cos_TK, sin_TK, positions_BT, stream);
#else
  no_kernel("rope_backward", dx_BTNH);
#endif
}

}  // namespace shardtrain::ops
