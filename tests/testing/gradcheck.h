// Central finite differences in f64 for backward checks: dL/dx[i] ~ (L(x+h e_i) - L(x-h e_i)) / 2h.
#pragma once

#include <functional>

#include "core/tensor.h"

namespace shardtrain::testing {

// Perturbs each element of x (f64, CPU, modified in place and restored) and evaluates
// `loss` (which must read x) at x ± step. Returns the f64 gradient estimate, shaped like x.
Tensor finite_difference(Tensor& x, const std::function<double()>& loss, double step = 1e-6);

// sum(a * b) in f64, the usual scalar loss L = <dy, y> for checking a backward with a
// random upstream gradient dy.
double dot(const Tensor& a, const Tensor& b);

}  // namespace shardtrain::testing
