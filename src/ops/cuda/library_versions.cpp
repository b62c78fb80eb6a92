// Versions of the loaded CUDA libraries.
#include "ops/library_versions.h"

#include <cublasLt.h>
#include <cuda_runtime.h>
#include <cudnn.h>

namespace shardtrain::ops::cuda {
namespace {

// major * 10000 + minor * 100 + patch (cuBLASLt, cuDNN 9) as "major.minor.patch"
std::string three_parts(size_t v) {
  return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
}

// major * 1000 + minor * 10 (the CUDA runtime and driver) as "major.minor"
std::string two_parts(int v) { return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10); }

}  // namespace

std::string library_versions() {
  int runtime = 0, driver = 0;
  cudaRuntimeGetVersion(&runtime);
  cudaDriverGetVersion(&driver);  // 0 without a driver
  return "CUDA runtime " + two_parts(runtime) + ", driver " + (driver > 0 ? two_parts(driver) : std::string("none")) +
         ", cuBLASLt " + three_parts(cublasLtGetVersion()) + ", cuDNN " + three_parts(cudnnGetVersion());
}

}  // namespace shardtrain::ops::cuda
