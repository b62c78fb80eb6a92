// Finite-difference gradients for backward tests (f64 only: f32 steps are too coarse).
#include "testing/gradcheck.h"

#include "testing/compare.h"

namespace shardtrain::testing {

Tensor finite_difference(Tensor& x, const std::function<double()>& loss, double step) {
  ST_CHECK(x.dtype() == DType::kF64 && x.is_contiguous() && x.device().is_cpu(),
           "finite_difference needs a contiguous f64 host tensor, found ", x.str());
  Tensor grad = Tensor::empty(x.shape(), DType::kF64);
  double* px = x.data<double>();
  double* pg = grad.data<double>();
  for (int64_t i = 0; i < x.numel(); ++i) {
    const double saved = px[i];
    px[i] = saved + step;
    const double up = loss();
    px[i] = saved - step;
    const double down = loss();
    px[i] = saved;
    pg[i] = (up - down) / (2 * step);
  }
  return grad;
}

double dot(const Tensor& a, const Tensor& b) {
  const Tensor fa = to_f64(a);
  const Tensor fb = to_f64(b);
  ST_CHECK(fa.numel() == fb.numel(), "dot: ", a.str(), " vs ", b.str());
  double s = 0;
  for (int64_t i = 0; i < fa.numel(); ++i) s += fa.data<double>()[i] * fb.data<double>()[i];
  return s;
}

}  // namespace shardtrain::testing
