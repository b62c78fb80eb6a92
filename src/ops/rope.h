// Rotary position embedding in HF's rotate_half convention: element i pairs with i + H/2.
// Letters: K = H/2, the number of rotation frequencies. Positions are 0..T-1 per sequence, or
// given per token (documents packed into a sequence each count from 0).
#pragma once

#include <cstdint>
#include <vector>

#include "core/profile.h"
#include "core/tensor.h"
#include "ops/dispatch.h"

namespace shardtrain::ops {

enum class RopeScalingType { kNone, kLlama3, kLinear };

// Llama 3.1 frequency scaling (HF `rope_type: llama3`): wavelengths longer than
// original_max_positions / low_freq_factor are divided by `factor`, shorter than
// original_max_positions / high_freq_factor are kept, and those between are interpolated.
// Linear (HF `rope_type: linear`, position interpolation): every frequency divided by `factor`.
struct RopeScaling {
  RopeScalingType type = RopeScalingType::kNone;
  double factor = 8.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_positions = 8192;
};

struct RopeOptions {
  double theta = 500000.0;
  RopeScaling scaling;
};

// inv_freq[k] = theta^(-2k/H) for k < K, then the scaling; computed in f64.
std::vector<double> rope_inv_frequencies(int64_t head_dim, const RopeOptions& options);

// Host tables cos_TK, sin_TK of angle t * inv_freq[k] for t < T (overwrites); f32 or f64,
// angles in f64 then rounded to the table dtype. T is the tables' first dimension.
void rope_table(Tensor& cos_TK, Tensor& sin_TK, int64_t head_dim, const RopeOptions& options);

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
// Tables have at least T rows and the same dtype as x (f32/f64 on the CPU). The position of
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
