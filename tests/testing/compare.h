// The project's comparison rules and default tolerances (STYLE §7), in one place.
// A comparison passes when both the relative norm ||a - r|| / ||r|| and every element's
// |a - r| <= atol + rtol * |r| hold; a failure names the worst element.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>

#include <gtest/gtest.h>

#include "core/error.h"
#include "core/tensor.h"

namespace shardtrain {
// Readable dtype names in parameterised test output.
inline void PrintTo(DType t, std::ostream* os) { *os << dtype_name(t); }
}  // namespace shardtrain

namespace shardtrain::testing {

// Runs `f` and expects an Error whose message contains `needle`.
template <typename F>
::testing::AssertionResult throws_with(F&& f, const std::string& needle) {
  try {
    f();
  } catch (const Error& e) {
    if (std::string(e.what()).find(needle) != std::string::npos) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << "message `" << e.what() << "` lacks `" << needle << "`";
  }
  return ::testing::AssertionFailure() << "no error thrown";
}

struct Tolerance {
  double rel_norm;
  double rtol;
  double atol;
};

constexpr Tolerance kCpuF32VsF64{1e-5, 1e-5, 1e-6};
// rtol/atol huge: finite differences are judged by the relative norm alone.
constexpr Tolerance kFiniteDifference{1e-6, 1e30, 1e30};
constexpr Tolerance kCudaF32VsCpu{1e-5, 1e-4, 1e-6};
constexpr Tolerance kCudaTf32{2e-3, 1e-2, 1e-4};
constexpr Tolerance kCudaF16{2e-3, 2e-3, 1e-4};
constexpr Tolerance kCudaBf16{1e-2, 1.6e-2, 1e-3};
constexpr Tolerance kRanksF32{1e-5, 1e30, 1e30};
constexpr Tolerance kExact{0.0, 0.0, 0.0};

// Compares two CPU tensors of the same shape (any float dtypes; both read as f64).
::testing::AssertionResult all_close(const Tensor& actual, const Tensor& reference, const Tolerance& tol);

// Fills x (CPU, any float dtype) with mean + scale * N(0, 1) from a counter-based stream.
void fill_random(Tensor& x, uint64_t seed, double mean = 0.1, double scale = 1.0);
// Fills x (i32) with uniform integers in [low, high).
void fill_random_ints(Tensor& x, uint64_t seed, int64_t low, int64_t high);

// An f32 host tensor holding mean + scale * N(0, 1) values rounded to `dtype` first, so a
// `dtype` copy of it and the f32 reference see exactly the same inputs.
Tensor rounded_f32(const Shape& shape, DType dtype, uint64_t seed, double mean, double scale);

// Returns a CPU f64 copy of any float tensor (contiguous result).
Tensor to_f64(const Tensor& x);
// Returns a CPU copy in `dtype` (float dtypes, round to nearest even).
Tensor to_dtype(const Tensor& x, DType dtype);

}  // namespace shardtrain::testing
