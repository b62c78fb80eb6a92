// Whether this build's kernels can run on a device: one trivial kernel of the build asks the
// runtime (the same images, compute capabilities and PTX every kernel of the build carries).
#include <cuda_runtime.h>

#include "core/cuda/cuda_check.h"
#include "core/cuda/device.h"

namespace shardtrain::cuda {
namespace {

__global__ void probe_kernel() {}

}  // namespace

void check_kernel_image(int index) {
  cudaFuncAttributes attributes{};
  const cudaError_t status = cudaFuncGetAttributes(&attributes, probe_kernel);
  if (status == cudaErrorNoKernelImageForDevice || status == cudaErrorInvalidDeviceFunction ||
      status == cudaErrorUnsupportedPtxVersion) {
    (void)cudaGetLastError();  // the query's error is not sticky: clear it
    cudaDeviceProp prop{};
    ST_CUDA_CHECK(cudaGetDeviceProperties(&prop, index));
    throw Error(no_kernel_image_message(SHARDTRAIN_CUDA_ARCHS, prop.major, prop.minor, prop.name, index));
  }
  ST_CUDA_CHECK(status);
}

}  // namespace shardtrain::cuda
