// Grid sizing from device properties (queried once per device) and entry checks.
#include <algorithm>
#include <mutex>
#include <vector>

#include "ops/cuda/common.cuh"

namespace shardtrain::ops::cuda {

int sm_count(int device) {
  static std::once_flag once;
  static std::vector<int> sms;
  std::call_once(once, [] {
    int count = 0;
    ST_CUDA_CHECK(cudaGetDeviceCount(&count));
    sms.resize(static_cast<size_t>(count));
    for (int d = 0; d < count; ++d) ST_CUDA_CHECK(cudaDeviceGetAttribute(&sms[static_cast<size_t>(d)],
                                                                         cudaDevAttrMultiProcessorCount, d));
  });
  ST_ASSERT(device >= 0 && static_cast<size_t>(device) < sms.size(), "CUDA device ", device, " of ", sms.size());
  return sms[static_cast<size_t>(device)];
}

int grid_for(int64_t n, int threads) {
  int dev = 0;
  ST_CUDA_CHECK(cudaGetDevice(&dev));
  const int64_t needed = (n + threads - 1) / threads;
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(needed, int64_t{sm_count(dev)} * 8)));
}

bool packable(std::initializer_list<const Tensor*> tensors, int64_t n, size_t element_bytes) {
  if (n % static_cast<int64_t>(16 / element_bytes) != 0) return false;
  for (const Tensor* t : tensors)
    if (reinterpret_cast<uintptr_t>(t->raw_data()) % 16 != 0) return false;
  return true;
}

void check_cuda_tensor(const Tensor& t, const char* op, const char* arg) {
  ST_CHECK(t.device().is_cuda(), op, ": `", arg, "` expected on a CUDA device, found ", t.str());
  ST_CHECK(t.is_contiguous(), op, ": `", arg, "` must be contiguous, found ", t.str());
}

}  // namespace shardtrain::ops::cuda
