// Attention backward for one-token sequences, which cuDNN's flash kernels do not take:
// with a single key the softmax is constant (= 1), so dq = dk = 0 and dv sums dout over
// the query heads of each kv head's group.
#include "ops/cuda/attention_single.h"

#include "ops/cuda/common.cuh"

namespace shardtrain::ops::cuda {
namespace {

constexpr int kThreads = 256;

template <typename T>
__global__ void single_token_backward_kernel(T* dq, T* dk, T* dv, const T* dout, int64_t B, int64_t N, int64_t M,
                                             int64_t H) {
  const int64_t group = N / M;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < B * N * H; i += int64_t{gridDim.x} * blockDim.x)
    dq[i] = from_f32<T>(0.0f);
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < B * M * H; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t b = i / (M * H), m = (i / H) % M, h = i % H;
    float acc = 0;
    for (int64_t g = 0; g < group; ++g) acc += to_f32(dout[(b * N + m * group + g) * H + h]);
    dk[i] = from_f32<T>(0.0f);
    dv[i] = from_f32<T>(acc);
  }
}

}  // namespace

void attention_backward_single_token(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dout, Stream s) {
  const int64_t B = dq.size(0), N = dq.size(2), M = dk.size(2), H = dq.size(3);
  dispatch_float(dq.dtype(), "attention_backward", [&]<typename T>() {
    single_token_backward_kernel<T><<<grid_for(B * N * H, kThreads), kThreads, 0, stream_of(s)>>>(
        static_cast<T*>(dq.raw_data()), static_cast<T*>(dk.raw_data()), static_cast<T*>(dv.raw_data()),
        static_cast<const T*>(dout.raw_data()), B, N, M, H);
  });
  ST_CUDA_CHECK_LAUNCH();
}

}  // namespace shardtrain::ops::cuda
