// CPU SwiGLU / GeGLU: h = act(gate) * up, computed in double and rounded to the data dtype.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "ops/cpu/common.h"
#include "ops/swiglu.h"

namespace shardtrain::ops::cpu {
namespace {

constexpr double kGeluBeta = 0.7978845608028654;  // sqrt(2 / pi)
constexpr double kGeluKappa = 0.044715;

// act(g) * u in double; the forward and the backward's recompute share it, so bitwise equal.
double act_times(double g, double u, GluActivation act) {
  if (act == GluActivation::kGeluTanh) return 0.5 * g * (1.0 + std::tanh(kGeluBeta * (g + kGeluKappa * g * g * g))) * u;
  return g / (1.0 + std::exp(-g)) * u;
}

// gelu_tanh(g) and its slope (1 + t) / 2 + g (1 - t^2) sqrt(2/pi) (1 + 3 0.044715 g^2) / 2,
// t the tanh.
void gelu_tanh_and_slope(double g, double& a, double& slope) {
  const double t = std::tanh(kGeluBeta * (g + kGeluKappa * g * g * g));
  a = 0.5 * g * (1.0 + t);
  slope = 0.5 * (1.0 + t) + 0.5 * g * (1.0 - t * t) * kGeluBeta * (1.0 + 3.0 * kGeluKappa * g * g);
}

// [T, F] with rows a pitch apart (gate and up as halves of one stacked [T, 2F] product): the
// pitch, after the device, dtype and shape checks.
int64_t pitch_of(const Tensor& t, const char* op, const char* arg, const Tensor& ref) {
  check_cpu_float(t, op, arg);
  check_dtype(t, ref.dtype(), op, arg);
  check_shape(t, ref.shape(), op, arg);
  RowLayout l;
  ST_CHECK(t.ndim() == 2 && row_layout(t, 1, l), op, ": `", arg, "` must be [T, F] with contiguous rows, found ",
           t.str());
  return l.pitch;
}

// Max-es `bits` (a largest |v| as u32 bits, as ops/fp8.h) into amax_1.
void max_into(const Tensor& amax_1, uint32_t bits) {
  if (!amax_1.defined()) return;
  ST_CHECK(amax_1.device().is_cpu() && amax_1.dtype() == DType::kI32 && amax_1.numel() == 1, "swiglu: the amax "
           "must be one i32 on the CPU, found ", amax_1.str());
  uint32_t* slot = static_cast<uint32_t*>(amax_1.raw_data());
  *slot = std::max(*slot, bits);
}

// The largest |v| of rows x cols values a pitch apart (as f32), as u32 bits (NaN above all).
template <typename F_>
uint32_t largest(const F_* v, int64_t rows, int64_t cols, int64_t pitch) {
  uint32_t m = 0;
  for (int64_t t = 0; t < rows; ++t)
    for (int64_t f = 0; f < cols; ++f) {
      const float x = static_cast<float>(v[t * pitch + f]);
      uint32_t bits;
      std::memcpy(&bits, &x, sizeof bits);
      m = std::max(m, bits & 0x7fffffffu);
    }
  return m;
}

}  // namespace

void swiglu_forward(Tensor& h_TF, const Tensor& gate_TF, const Tensor& up_TF, const Tensor& amax_h_1,
                    GluActivation act) {
  const char* op = "swiglu_forward";
  const int64_t pg = pitch_of(gate_TF, op, "gate_TF", gate_TF), pu = pitch_of(up_TF, op, "up_TF", gate_TF),
                ph = pitch_of(h_TF, op, "h_TF", gate_TF);
  const int64_t T = gate_TF.size(0), F = gate_TF.size(1);
  dispatch_real(gate_TF, op, "gate_TF", [&]<typename F_>() {
    const F_* g = gate_TF.data<F_>();
    const F_* u = up_TF.data<F_>();
    F_* h = h_TF.data<F_>();
#pragma omp parallel for if (T * F > 65536)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t f = 0; f < F; ++f) h[t * ph + f] = static_cast<F_>(act_times(g[t * pg + f], u[t * pu + f], act));
    if (amax_h_1.defined()) max_into(amax_h_1, largest(h, T, F, ph));
  });
}

// dgate = dh up act'(gate), dup = dh act(gate).
void swiglu_backward(Tensor& dgate_TF, Tensor& dup_TF, Tensor& h_TF, const Tensor& dh_TF, const Tensor& gate_TF,
                     const Tensor& up_TF, const Tensor& amax_grads_1, GluActivation act) {
  const char* op = "swiglu_backward";
  const int64_t pg = pitch_of(gate_TF, op, "gate_TF", gate_TF), pu = pitch_of(up_TF, op, "up_TF", gate_TF),
                pdh = pitch_of(dh_TF, op, "dh_TF", gate_TF), pdg = pitch_of(dgate_TF, op, "dgate_TF", gate_TF),
                pdu = pitch_of(dup_TF, op, "dup_TF", gate_TF);
  const int64_t ph = h_TF.defined() ? pitch_of(h_TF, op, "h_TF", gate_TF) : 0;
  const int64_t T = gate_TF.size(0), F = gate_TF.size(1);
  dispatch_real(gate_TF, op, "gate_TF", [&]<typename F_>() {
    const F_* g = gate_TF.data<F_>();
    const F_* u = up_TF.data<F_>();
    const F_* dh = dh_TF.data<F_>();
    F_* dg = dgate_TF.data<F_>();
    F_* du = dup_TF.data<F_>();
    F_* h = h_TF.defined() ? h_TF.data<F_>() : nullptr;
#pragma omp parallel for if (T * F > 65536)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t f = 0; f < F; ++f) {
        const double gi = g[t * pg + f], ui = u[t * pu + f], d = dh[t * pdh + f];
        if (h) h[t * ph + f] = static_cast<F_>(act_times(gi, ui, act));
        if (act == GluActivation::kGeluTanh) {
          double a, slope;
          gelu_tanh_and_slope(gi, a, slope);
          dg[t * pdg + f] = static_cast<F_>(d * ui * slope);
          du[t * pdu + f] = static_cast<F_>(d * a);
        } else {  // d silu(g) / dg = s (1 + g (1 - s)) with s = sigmoid(g)
          const double s = 1.0 / (1.0 + std::exp(-gi));
          dg[t * pdg + f] = static_cast<F_>(d * ui * s * (1.0 + gi * (1.0 - s)));
          du[t * pdu + f] = static_cast<F_>(d * gi * s);
        }
      }
    if (amax_grads_1.defined())
      max_into(amax_grads_1, std::max(largest(dg, T, F, pdg), largest(du, T, F, pdu)));
  });
}

}  // namespace shardtrain::ops::cpu
