// Gradient-norm clipping.
#include "optim/clip.h"

#include <cmath>

#include "ops/elementwise.h"

namespace shardtrain::optim {

double global_grad_norm(const std::vector<const Tensor*>& grads, dist::Communicator* comm) {
  // summed where the gradients live, then read on the host (where MPI reduces)
  const Device device = grads.empty() ? Device::cpu() : grads.front()->device();
  Tensor local = Tensor::empty({1}, DType::kF64, device, "grad norm");
  ops::fill(local, 0.0);
  for (const Tensor* g : grads) ops::sum_squares(local, *g);
  Tensor sum = Tensor::empty({1}, DType::kF64, Device::cpu(), "grad norm");
  ops::cast(sum, local);
  return grad_norm_from_sum_squares(sum.data<double>()[0], comm);
}

double grad_norm_from_sum_squares(double local_sum_squares, dist::Communicator* comm) {
  Tensor sum = Tensor::empty({1}, DType::kF64, Device::cpu(), "grad norm");
  sum.data<double>()[0] = local_sum_squares;
  if (comm != nullptr) comm->all_reduce(sum, dist::ReduceOp::kSum);
  return std::sqrt(sum.data<double>()[0]);
}

double clip_coefficient(double norm, double max_norm) {
  return max_norm > 0 && norm > max_norm ? max_norm / (norm + 1e-6) : 1.0;
}

double clip_grad_norm(const std::vector<Tensor*>& grads, double max_norm, dist::Communicator* comm) {
  std::vector<const Tensor*> c(grads.begin(), grads.end());
  const double norm = global_grad_norm(c, comm);
  const double factor = clip_coefficient(norm, max_norm);
  if (factor != 1.0)
    for (Tensor* g : grads) ops::scale(*g, factor);
  return norm;
}

}  // namespace shardtrain::optim
