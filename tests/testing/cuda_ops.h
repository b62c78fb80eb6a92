// Shared pieces of the CUDA op tests: random inputs with their exact f32 values for the CPU
// twin, the per-dtype tolerance, and a fixture that runs a test for f32 and bf16.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "testing/compare.h"
#include "testing/cuda_util.h"

namespace shardtrain::testing {

// A random host tensor of `dtype`, and the f32 copy of exactly the same (rounded) values.
struct Input {
  Tensor host;  // dtype
  Tensor f32;   // the values as f32, for the CPU reference
};

inline Input random_input(const Shape& shape, DType dtype, uint64_t seed, double mean = 0.1, double scale = 1.0) {
  Tensor h = Tensor::empty(shape, DType::kF64);
  fill_random(h, seed, mean, scale);
  Input in;
  in.host = to_dtype(h, dtype);
  in.f32 = to_dtype(in.host, DType::kF32);
  return in;
}

inline const Tolerance& cuda_tolerance(DType t) { return t == DType::kBF16 ? kCudaBf16 : kCudaF32VsCpu; }

// Compares a device result with an f32 CPU reference rounded to the device result's dtype.
inline ::testing::AssertionResult matches(const Tensor& device, const Tensor& ref_f32) {
  return all_close(to_host(device), to_dtype(ref_f32, device.dtype()), cuda_tolerance(device.dtype()));
}

// TEST_P fixture over the compute dtypes; skips without a device.
class CudaDtypeTest : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override { ST_REQUIRE_CUDA(); }
};

inline std::string dtype_param_name(const ::testing::TestParamInfo<DType>& info) {
  return std::string(dtype_name(info.param));
}

}  // namespace shardtrain::testing
