// Shared pieces of the CPU op tests: random tensors in f64 and a check that an op's
// backward equals central finite differences of L = <dy, forward(inputs)>.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "testing/compare.h"
#include "testing/gradcheck.h"

namespace shardtrain::ops {

inline Tensor random_f64(const Shape& shape, uint64_t seed, double mean = 0.1, double scale = 1.0) {
  Tensor t = Tensor::empty(shape, DType::kF64);
  testing::fill_random(t, seed, mean, scale);
  return t;
}

// For each (name, input, analytic gradient): the gradient must match finite differences
// of `loss` (which reads the inputs) within kFiniteDifference.
struct GradCase {
  std::string name;
  Tensor* input;
  Tensor analytic;
};
inline void expect_gradients(const std::vector<GradCase>& cases, const std::function<double()>& loss) {
  for (const GradCase& c : cases) {
    const Tensor fd = testing::finite_difference(*c.input, loss);
    EXPECT_TRUE(testing::all_close(c.analytic, fd, testing::kFiniteDifference)) << "gradient of " << c.name;
  }
}

using testing::throws_with;  // testing/compare.h

}  // namespace shardtrain::ops
