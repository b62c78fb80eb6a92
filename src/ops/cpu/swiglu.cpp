// CPU SwiGLU: h = silu(gate) * up, computed in the data dtype with a double sigmoid.
#include <cmath>

#include "ops/cpu/common.h"
#include "ops/swiglu.h"

namespace shardtrain::ops::cpu {
namespace {

// silu(g) * u in double; the forward and the backward's recompute share it, so bitwise equal.
double silu_times(double g, double u) { return g / (1.0 + std::exp(-g)) * u; }

}  // namespace

void swiglu_forward(Tensor& h_TF, const Tensor& gate_TF, const Tensor& up_TF) {
  const char* op = "swiglu_forward";
  check_arg(gate_TF, op, "gate_TF");
  check_arg(up_TF, op, "up_TF", gate_TF.dtype(), gate_TF.shape());
  check_arg(h_TF, op, "h_TF", gate_TF.dtype(), gate_TF.shape());
  const int64_t n = h_TF.numel();
  dispatch_real(gate_TF, op, "gate_TF", [&]<typename F>() {
    const F* g = gate_TF.data<F>();
    const F* u = up_TF.data<F>();
    F* h = h_TF.data<F>();
#pragma omp parallel for if (n > 65536)
    for (int64_t i = 0; i < n; ++i) h[i] = static_cast<F>(silu_times(g[i], u[i]));
  });
}

// d silu(g) / dg = s (1 + g (1 - s)) with s = sigmoid(g).
void swiglu_backward(Tensor& dgate_TF, Tensor& dup_TF, Tensor& h_TF, const Tensor& dh_TF, const Tensor& gate_TF,
                     const Tensor& up_TF) {
  const char* op = "swiglu_backward";
  check_arg(gate_TF, op, "gate_TF");
  for (const Tensor* t : {&up_TF, &dh_TF}) check_arg(*t, op, "up_TF/dh_TF", gate_TF.dtype(), gate_TF.shape());
  check_arg(dgate_TF, op, "dgate_TF", gate_TF.dtype(), gate_TF.shape());
  check_arg(dup_TF, op, "dup_TF", gate_TF.dtype(), gate_TF.shape());
  if (h_TF.defined()) check_arg(h_TF, op, "h_TF", gate_TF.dtype(), gate_TF.shape());
  const int64_t n = dh_TF.numel();
  dispatch_real(gate_TF, op, "gate_TF", [&]<typename F>() {
    const F* g = gate_TF.data<F>();
    const F* u = up_TF.data<F>();
    const F* dh = dh_TF.data<F>();
    F* dg = dgate_TF.data<F>();
    F* du = dup_TF.data<F>();
    F* h = h_TF.defined() ? h_TF.data<F>() : nullptr;
#pragma omp parallel for if (n > 65536)
    for (int64_t i = 0; i < n; ++i) {
      const double gi = g[i], ui = u[i], d = dh[i];
      const double s = 1.0 / (1.0 + std::exp(-gi));
      if (h) h[i] = static_cast<F>(silu_times(gi, ui));
      dg[i] = static_cast<F>(d * ui * s * (1.0 + gi * (1.0 - s)));
      du[i] = static_cast<F>(d * gi * s);
    }
  });
}

}  // namespace shardtrain::ops::cpu
