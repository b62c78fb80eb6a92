// Checking CUDA runtime calls: the failing expression, the status string, file:line and the
// current device go into the Error. Only for files compiled with the CUDA backend.
#pragma once

#include <cuda_runtime.h>

#include "core/error.h"

namespace shardtrain::detail {
[[noreturn]] void throw_cuda_error(cudaError_t status, const char* expression, const char* file, int line);
}  // namespace shardtrain::detail

#define ST_CUDA_CHECK(expr)                                                          \
  do {                                                                               \
    const cudaError_t st_status_ = (expr);                                           \
    if (st_status_ != cudaSuccess)                                                   \
      ::shardtrain::detail::throw_cuda_error(st_status_, #expr, __FILE__, __LINE__); \
  } while (0)

// After a kernel launch: reports launch-configuration errors at the launch site.
#define ST_CUDA_CHECK_LAUNCH() ST_CUDA_CHECK(cudaGetLastError())
