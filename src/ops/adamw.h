// AdamW with decoupled weight decay, matching torch.optim.AdamW (fused or not):
//   p *= 1 - lr*wd;  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;
//   p -= (lr / (1 - b1^step)) * m / (sqrt(v) / sqrt(1 - b2^step) + eps)
#pragma once

#include <cstdint>
#include <vector>

#include "core/profile.h"
#include "core/tensor.h"
#include "ops/dispatch.h"

namespace shardtrain::ops {

struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  int64_t step = 1;  // 1-based step count after this update, for bias correction
  // CPU, f32 tensors: the CUDA kernel's f32 arithmetic in one fused, threaded pass that also
  // writes the compute copies (the host optimizer of parallel.offload). false: f64
  // arithmetic, the CPU engine's update and every kernel's oracle.
  bool host_f32 = false;
};

// The bits of adamw_step_multi's nonfinite_flags: which of a tensor's arrays holds NaN or inf.
constexpr int32_t kNonfiniteParam = 1, kNonfiniteExpAvg = 2, kNonfiniteExpAvgSq = 4;

// One tensor of a multi-tensor update: 1-D views of the same length.
struct AdamWTensors {
  Tensor param, exp_avg, exp_avg_sq, grad;
  bool decay = true;  // weight decay applies to this tensor
  // Optional, same length, a narrower float dtype (bf16 for f32 master weights): overwritten
  // with the updated param rounded to its dtype, bitwise what ops::cast(compute_copy, param)
  // would write after the update, in the same pass (no second read of the weights).
  Tensor compute_copy;
};

namespace cpu {
void adamw_step(Tensor& param, Tensor& exp_avg, Tensor& exp_avg_sq, const Tensor& grad,
                const AdamWOptions& options);
void adamw_step_multi(std::vector<AdamWTensors>& tensors, const AdamWOptions& options, double grad_scale,
                      Tensor* nonfinite_flags = nullptr);
}  // namespace cpu

namespace cuda {
void adamw_step(Tensor& param, Tensor& exp_avg, Tensor& exp_avg_sq, const Tensor& grad,
                const AdamWOptions& options, Stream stream);
void adamw_step_multi(std::vector<AdamWTensors>& tensors, const AdamWOptions& options, double grad_scale,
                      Tensor* nonfinite_flags, Stream stream);
}  // namespace cuda

// param, exp_avg (m), exp_avg_sq (v) updated in place from grad; all one shape, f32 or f64
// (master precision), contiguous. Arithmetic in f64 on the CPU, rounded once per store.
inline void adamw_step(Tensor& param, Tensor& exp_avg, Tensor& exp_avg_sq, const Tensor& grad,
                       const AdamWOptions& options, [[maybe_unused]] Stream stream = {}) {
  // param, m and v read and written, the gradient read
  const double state = profile::bytes_of({&param, &exp_avg, &exp_avg_sq});
  profile::ScopedTimer profile_timer("adamw_step", param.device(), {0, 2 * state + profile::bytes_of({&grad})});
  if (param.device().is_cpu()) return cpu::adamw_step(param, exp_avg, exp_avg_sq, grad, options);
#ifdef SHARDTRAIN_WITH_CUDA
  return cuda::adamw_step(param, exp_avg, exp_avg_sq, grad, options, stream);
#else
  no_kernel("adamw_step", param);
#endif
}

// The update of many tensors in one pass (one kernel launch on a GPU): options.weight_decay
// applies to the tensors marked decay; compute copies, where given, are written too. Each
// gradient is first multiplied by grad_scale and rounded to its dtype (exactly as scaling
// the gradients in place before the step would, e.g. by norm clipping). All tensors on one
// device.
// nonfinite_flags, when given: i32 [tensors.size()] on the tensors' device, accumulates (OR):
// flags[k] |= kNonfiniteParam, kNonfiniteExpAvg, kNonfiniteExpAvgSq when an updated element of
// tensors[k]'s param, exp_avg or exp_avg_sq is NaN or inf, found in the same pass (no second
// read); elements that stay finite leave it as it was. Zero it once; it never clears itself.
inline void adamw_step_multi(std::vector<AdamWTensors>& tensors, const AdamWOptions& options, double grad_scale = 1.0,
                             Tensor* nonfinite_flags = nullptr, [[maybe_unused]] Stream stream = {}) {
  if (tensors.empty()) return;
  profile::Cost cost;  // summed only for the profile: a pass over every tensor
  if (profile::enabled())
    for (const AdamWTensors& t : tensors)
      cost.bytes += 2 * profile::bytes_of({&t.param, &t.exp_avg, &t.exp_avg_sq}) +
                    profile::bytes_of({&t.grad, &t.compute_copy});
  profile::ScopedTimer profile_timer("adamw_step_multi", tensors.front().param.device(), cost);
  if (tensors.front().param.device().is_cpu())
    return cpu::adamw_step_multi(tensors, options, grad_scale, nonfinite_flags);
#ifdef SHARDTRAIN_WITH_CUDA
  return cuda::adamw_step_multi(tensors, options, grad_scale, nonfinite_flags, stream);
#else
  no_kernel("adamw_step_multi", tensors.front().param);
#endif
}

}  // namespace shardtrain::ops
