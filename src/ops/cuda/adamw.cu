// CUDA AdamW (torch.optim.AdamW's formula) on f32 master weights and state; f32 math with
// the bias corrections computed once on the host in f64.
#include <cmath>

#include "ops/adamw.h"
#include "ops/cuda/common.cuh"

namespace shardtrain::ops::cuda {
namespace {

constexpr int kThreads = 256;

struct AdamWScalars {
  float lr, beta1, beta2, eps, decay_factor, step_size, inv_sqrt_bc2;
};

__global__ void adamw_kernel(float* p, float* m, float* v, const float* g, int64_t n, AdamWScalars c) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const float gi = g[i];
    const float mi = c.beta1 * m[i] + (1.0f - c.beta1) * gi;
    const float vi = c.beta2 * v[i] + (1.0f - c.beta2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    p[i] = p[i] * c.decay_factor - c.step_size * mi / (sqrtf(vi) * c.inv_sqrt_bc2 + c.eps);
  }
}

}  // namespace

void adamw_step(Tensor& param, Tensor& exp_avg, Tensor& exp_avg_sq, const Tensor& grad, const AdamWOptions& o,
                Stream s) {
  for (const Tensor* t : std::initializer_list<const Tensor*>{&param, &exp_avg, &exp_avg_sq, &grad}) {
    check_cuda_tensor(*t, "adamw_step", "param/exp_avg/exp_avg_sq/grad");
    check_dtype(*t, DType::kF32, "adamw_step", "param/exp_avg/exp_avg_sq/grad");
    check_shape(*t, param.shape(), "adamw_step", "param/exp_avg/exp_avg_sq/grad");
  }
  ST_CHECK(o.step >= 1, "adamw_step: step must be >= 1, found ", o.step);
  const int64_t n = param.numel();
  if (n == 0) return;
  const double bc1 = 1.0 - std::pow(o.beta1, static_cast<double>(o.step));
  const double bc2 = 1.0 - std::pow(o.beta2, static_cast<double>(o.step));
  AdamWScalars c;
  c.lr = static_cast<float>(o.lr);
  c.beta1 = static_cast<float>(o.beta1);
  c.beta2 = static_cast<float>(o.beta2);
  c.eps = static_cast<float>(o.eps);
  c.decay_factor = static_cast<float>(1.0 - o.lr * o.weight_decay);
  c.step_size = static_cast<float>(o.lr / bc1);
  c.inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bc2));
  adamw_kernel<<<grid_for(n, kThreads), kThreads, 0, stream_of(s)>>>(param.data<float>(), exp_avg.data<float>(),
                                                                     exp_avg_sq.data<float>(), grad.data<float>(), n, c);
  ST_CUDA_CHECK_LAUNCH();
}

}  // namespace shardtrain::ops::cuda
