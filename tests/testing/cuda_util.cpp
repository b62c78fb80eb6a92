// Test copies through the CUDA runtime (synchronous: tests favour simplicity).
#include "testing/cuda_util.h"

#include "core/cuda/cuda_check.h"
#include "core/cuda/device.h"

namespace shardtrain::testing {

bool cuda_available() {
  static const bool ok = [] {
    if (cuda::device_count() == 0) return false;
    cuda::init_device(0);
    return true;
  }();
  return ok;
}

Tensor to_device(const Tensor& host) {
  ST_CHECK(host.is_contiguous() && host.device().is_cpu(), "to_device: needs a contiguous host tensor, found ", host.str());
  Tensor d = Tensor::empty(host.shape(), host.dtype(), Device::cuda(0), "test tensor");
  ST_CUDA_CHECK(cudaMemcpy(d.raw_data(), host.raw_data(), host.nbytes(), cudaMemcpyHostToDevice));
  return d;
}

Tensor to_host(const Tensor& device) {
  ST_CHECK(device.is_contiguous(), "to_host: needs a contiguous tensor, found ", device.str());
  ST_CUDA_CHECK(cudaDeviceSynchronize());
  Tensor h = Tensor::empty(device.shape(), device.dtype(), Device::cpu(), "test tensor");
  // a host tensor is copied too (the caller keeps a copy that outlives its owner)
  ST_CUDA_CHECK(cudaMemcpy(h.raw_data(), device.raw_data(), device.nbytes(),
                           device.device().is_cpu() ? cudaMemcpyHostToHost : cudaMemcpyDeviceToHost));
  return h;
}

}  // namespace shardtrain::testing
