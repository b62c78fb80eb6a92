// CPU RMSNorm: statistics in f64, rstd stored in the stats dtype and reused by the backward.
#include "ops/cpu/common.h"
#include "ops/rmsnorm.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace shardtrain::ops::cpu {

void rmsnorm_forward(Tensor& y_TD, Tensor& rstd_T, const Tensor& x_TD, const Tensor& weight_D,
                     const RmsNormOptions& options) {
  const char* op = "rmsnorm_forward";
  check_arg(x_TD, op, "x_TD");
  ST_CHECK(x_TD.ndim() == 2, op, ": `x_TD` must be 2-D, found ", x_TD.str());
  const int64_t T = x_TD.size(0), D = x_TD.size(1);
  check_arg(weight_D, op, "weight_D", x_TD.dtype(), {D});
  check_arg(y_TD, op, "y_TD", x_TD.dtype(), {T, D});
  check_arg(rstd_T, op, "rstd_T", stats_dtype(x_TD.dtype()), {T});
  ST_CHECK(T == 0 || y_TD.raw_data() != x_TD.raw_data(), op, ": `y_TD` may not alias `x_TD`");
  dispatch_real(x_TD, op, "x_TD", [&]<typename F>() {
    const F* x = x_TD.data<F>();
    const F* w = weight_D.data<F>();
    F* y = y_TD.data<F>();
    F* rstd = rstd_T.data<F>();
    const F off = static_cast<F>(options.weight_offset);
#pragma omp parallel for if (T * D > 32768)
    for (int64_t t = 0; t < T; ++t) {
      double ss = 0;
      for (int64_t i = 0; i < D; ++i) ss += static_cast<double>(x[t * D + i]) * x[t * D + i];
      const F r = static_cast<F>(1.0 / std::sqrt(ss / static_cast<double>(D) + options.eps));
      rstd[t] = r;
      for (int64_t i = 0; i < D; ++i) y[t * D + i] = (w[i] + off) * (x[t * D + i] * r);
    }
    if (options.amax_y_1.defined()) {
      // the largest |y| (as f32) as u32 bits, max-ed into the slot (ops/fp8.h's amax)
      const Tensor& a = options.amax_y_1;
      ST_CHECK(a.device().is_cpu() && a.dtype() == DType::kI32 && a.numel() == 1, op,
               ": the amax must be one i32 on the CPU, found ", a.str());
      uint32_t* slot = static_cast<uint32_t*>(a.raw_data());
      for (int64_t i = 0; i < T * D; ++i) {
        const float v = static_cast<float>(y[i]);
        uint32_t bits;
        std::memcpy(&bits, &v, sizeof bits);
        *slot = std::max(*slot, bits & 0x7fffffffu);
      }
    }
  });
}

// With xhat = x r and g = dy (w + offset):  dx = r (g - xhat mean(g xhat)),  dweight += sum_t dy xhat.
void rmsnorm_backward(Tensor& dx_TD, Tensor& dweight_D, const Tensor& dy_TD, const Tensor& x_TD,
                      const Tensor& weight_D, const Tensor& rstd_T, const RmsNormBackwardOptions& options) {
  const char* op = "rmsnorm_backward";
  check_arg(x_TD, op, "x_TD");
  ST_CHECK(x_TD.ndim() == 2, op, ": `x_TD` must be 2-D, found ", x_TD.str());
  const int64_t T = x_TD.size(0), D = x_TD.size(1);
  const DType dt = x_TD.dtype();
  check_arg(weight_D, op, "weight_D", dt, {D});
  check_arg(dweight_D, op, "dweight_D", dt, {D});
  check_arg(dy_TD, op, "dy_TD", dt, {T, D});
  check_arg(dx_TD, op, "dx_TD", dt, {T, D});
  check_arg(rstd_T, op, "rstd_T", stats_dtype(dt), {T});
  ST_CHECK(T == 0 || dx_TD.raw_data() != dy_TD.raw_data(), op, ": `dx_TD` may not alias `dy_TD`");
  dispatch_real(x_TD, op, "x_TD", [&]<typename F>() {
    const F* x = x_TD.data<F>();
    const F* w = weight_D.data<F>();
    const F* dy = dy_TD.data<F>();
    const F* rstd = rstd_T.data<F>();
    F* dx = dx_TD.data<F>();
    F* dw = dweight_D.data<F>();
    const double off = options.weight_offset;
#pragma omp parallel for if (T * D > 32768)
    for (int64_t t = 0; t < T; ++t) {
      const double r = rstd[t];
      double dot = 0;
      for (int64_t i = 0; i < D; ++i) dot += static_cast<double>(dy[t * D + i]) * (w[i] + off) * x[t * D + i] * r;
      dot /= static_cast<double>(D);
      for (int64_t i = 0; i < D; ++i) {
        const double xhat = x[t * D + i] * r;
        dx[t * D + i] = static_cast<F>(r * (static_cast<double>(dy[t * D + i]) * (w[i] + off) - xhat * dot));
      }
    }
    // column sums in token order (deterministic), parallel over columns
#pragma omp parallel for if (T * D > 32768)
    for (int64_t i = 0; i < D; ++i) {
      double acc = 0;
      for (int64_t t = 0; t < T; ++t) acc += static_cast<double>(dy[t * D + i]) * x[t * D + i] * rstd[t];
      dw[i] = options.overwrite_dweight ? static_cast<F>(acc) : dw[i] + static_cast<F>(acc);
    }
  });
}

}  // namespace shardtrain::ops::cpu
