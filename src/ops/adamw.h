// AdamW with decoupled weight decay, matching torch.optim.AdamW (fused or not):
//   p *= 1 - lr*wd;  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;
//   p -= (lr / (1 - b1^step)) * m / (sqrt(v) / sqrt(1 - b2^step) + eps)
#pragma once

#include <cstdint>

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
};

namespace cpu {
void adamw_step(Tensor& param, Tensor& exp_avg, Tensor& exp_avg_sq, const Tensor& grad,
                const AdamWOptions& options);
}  // namespace cpu

namespace cuda {
void adamw_step(Tensor& param, Tensor& exp_avg, Tensor& exp_avg_sq, const Tensor& grad,
                const AdamWOptions& options, Stream stream);
}  // namespace cuda

// param, exp_avg (m), exp_avg_sq (v) updated in place from grad; all one shape, f32 or f64
// (master precision), contiguous. Arithmetic in f64 on the CPU, rounded once per store.
inline void adamw_step(Tensor& param, Tensor& exp_avg, Tensor& exp_avg_sq, const Tensor& grad,
                       const AdamWOptions& options, [[maybe_unused]] Stream stream = {}) {
  profile::ScopedTimer profile_timer("adamw_step", param.device());
  if (param.device().is_cpu()) return cpu::adamw_step(param, exp_avg, exp_avg_sq, grad, options);
#ifdef SHARDTRAIN_WITH_CUDA
  return cuda::adamw_step(param, exp_avg, exp_avg_sq, grad, options, stream);
#else
  no_kernel("adamw_step", param);
#endif
}

}  // namespace shardtrain::ops
