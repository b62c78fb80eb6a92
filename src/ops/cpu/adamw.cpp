// CPU AdamW, torch.optim.AdamW's formula in f64 arithmetic, one rounding per store.
#include <cmath>

#include "ops/adamw.h"
#include "ops/cpu/common.h"
#include "ops/elementwise.h"

namespace shardtrain::ops::cpu {

namespace {

void adamw_scaled(Tensor& param, Tensor& exp_avg, Tensor& exp_avg_sq, const Tensor& grad, const AdamWOptions& o,
                  double grad_scale) {
  const char* op = "adamw_step";
  check_arg(param, op, "param");
  check_arg(exp_avg, op, "exp_avg", param.dtype(), param.shape());
  check_arg(exp_avg_sq, op, "exp_avg_sq", param.dtype(), param.shape());
  check_arg(grad, op, "grad", param.dtype(), param.shape());
  ST_CHECK(o.step >= 1, op, ": step must be >= 1, found ", o.step);
  const int64_t n = param.numel();
  const double bc1 = 1.0 - std::pow(o.beta1, static_cast<double>(o.step));
  const double bc2_sqrt = std::sqrt(1.0 - std::pow(o.beta2, static_cast<double>(o.step)));
  const double step_size = o.lr / bc1, decay = 1.0 - o.lr * o.weight_decay;
  const bool scaled = grad_scale != 1.0;
  dispatch_real(param, op, "param", [&]<typename F>() {
    F* p = param.data<F>();
    F* m = exp_avg.data<F>();
    F* v = exp_avg_sq.data<F>();
    const F* g = grad.data<F>();
    const F f = static_cast<F>(grad_scale);  // as ops::scale: the factor in F, one product in F
#pragma omp parallel for if (n > 65536)
    for (int64_t i = 0; i < n; ++i) {
      // a scaled gradient is rounded to F, as an in-place scale would leave it
      const double gi = scaled ? static_cast<double>(static_cast<F>(g[i] * f)) : static_cast<double>(g[i]);
      const double mi = o.beta1 * m[i] + (1.0 - o.beta1) * gi;
      const double vi = o.beta2 * v[i] + (1.0 - o.beta2) * gi * gi;
      m[i] = static_cast<F>(mi);
      v[i] = static_cast<F>(vi);
      p[i] = static_cast<F>(p[i] * decay - step_size * mi / (std::sqrt(vi) / bc2_sqrt + o.eps));
    }
  });
}

}  // namespace

void adamw_step(Tensor& param, Tensor& exp_avg, Tensor& exp_avg_sq, const Tensor& grad, const AdamWOptions& o) {
  adamw_scaled(param, exp_avg, exp_avg_sq, grad, o, 1.0);
}

void adamw_step_multi(std::vector<AdamWTensors>& tensors, const AdamWOptions& o, double grad_scale) {
  for (AdamWTensors& t : tensors) {
    AdamWOptions one = o;
    if (!t.decay) one.weight_decay = 0.0;
    adamw_scaled(t.param, t.exp_avg, t.exp_avg_sq, t.grad, one, grad_scale);
    if (t.compute_copy.defined()) {
      ST_CHECK(t.compute_copy.numel() == t.param.numel(), "adamw_step_multi: compute copy ", t.compute_copy.str(),
               " does not match param ", t.param.str());
      cast(t.compute_copy, t.param);  // the same rounding as a cast after the step
    }
  }
}

}  // namespace shardtrain::ops::cpu
