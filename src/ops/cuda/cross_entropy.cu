// CUDA fused output projection + cross-entropy over chunks of tokens. Per chunk: the
// logits [C, V] in f32 come from the cuBLASLt linear; one block per row computes the
// log-sum-exp (one pass, online rescaling) and the row's loss, and overwrites the logits
// with grad_scale * (softmax - onehot) in the input dtype; two GEMMs then give dh (overwrite) and dW (accumulate).
// Row losses land in a per-token buffer summed in a fixed order: deterministic.
#include <algorithm>

#include "ops/cross_entropy.h"
#include "ops/cuda/common.cuh"
#include "ops/elementwise.h"
#include "ops/linear.h"

namespace shardtrain::ops::cuda {
namespace {

constexpr int kThreads = 256;

__device__ float block_reduce(float v, bool is_max, float* scratch) {
  for (int o = 16; o > 0; o >>= 1) {
    const float other = __shfl_xor_sync(0xffffffffu, v, o);
    v = is_max ? fmaxf(v, other) : v + other;
  }
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = scratch[0];
  for (int w = 1; w < static_cast<int>(blockDim.x / 32); ++w) v = is_max ? fmaxf(v, scratch[w]) : v + scratch[w];
  return v;
}

// One block per row of the chunk.
template <typename G>
__global__ void softmax_grad_kernel(G* grad, float* row_loss, const float* logits, const int32_t* targets, int64_t V,
                                    int32_t ignore_index, float grad_scale, bool compute_grad) {
  __shared__ float scratch[32];
  const int64_t r = blockIdx.x;
  const float* z = logits + r * V;
  const int32_t target = targets[r];
  G* g = grad + r * V;
  if (target == ignore_index) {
    if (threadIdx.x == 0) row_loss[r] = 0;
    if (compute_grad)
      for (int64_t c = threadIdx.x; c < V; c += blockDim.x) g[c] = from_f32<G>(0.0f);
    return;
  }
  // one pass for the log-sum-exp: each thread keeps a running max and a sum rescaled to it
  float mx = -INFINITY, sum = 0;
  for (int64_t c = threadIdx.x; c < V; c += blockDim.x) {
    const float x = z[c];
    if (x > mx) {
      sum = sum * __expf(mx - x) + 1.0f;
      mx = x;
    } else {
      sum += __expf(x - mx);
    }
  }
  const float row_max = block_reduce(mx, true, scratch);
  sum = block_reduce(mx == -INFINITY ? 0.0f : sum * __expf(mx - row_max), false, scratch);
  const float lse = row_max + __logf(sum);
  if (threadIdx.x == 0) row_loss[r] = lse - z[target];
  if (!compute_grad) return;
  for (int64_t c = threadIdx.x; c < V; c += blockDim.x) {
    const float p = __expf(z[c] - lse);
    g[c] = from_f32<G>(grad_scale * (p - (c == target ? 1.0f : 0.0f)));
  }
}

__global__ void sum_losses_kernel(float* loss_sum, const float* row_loss, int64_t n) {
  // one thread, fixed order: the number of rows per step is modest and this keeps runs bitwise equal
  if (threadIdx.x == 0 && blockIdx.x == 0) {
    double acc = 0;
    for (int64_t i = 0; i < n; ++i) acc += row_loss[i];
    loss_sum[0] += static_cast<float>(acc);
  }
}

__global__ void check_targets_kernel(const int32_t* targets, int64_t n, int64_t V, int32_t ignore_index, int* bad) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    if (targets[i] != ignore_index && (targets[i] < 0 || targets[i] >= V)) atomicMin(bad, static_cast<int>(i));
}

}  // namespace

void linear_cross_entropy(Tensor& loss_sum_1, Tensor& dh_TD, Tensor& dweight_VD, const Tensor& h_TD,
                          const Tensor& weight_VD, const Tensor& targets_T, const CrossEntropyOptions& o, Stream s) {
  const char* op = "linear_cross_entropy";
  check_cuda_tensor(h_TD, op, "h_TD");
  check_cuda_tensor(weight_VD, op, "weight_VD");
  check_cuda_tensor(targets_T, op, "targets_T");
  check_cuda_tensor(loss_sum_1, op, "loss_sum_1");
  ST_CHECK(h_TD.ndim() == 2 && weight_VD.ndim() == 2 && weight_VD.size(1) == h_TD.size(1), op,
           ": expected h_TD [T, D] and weight_VD [V, D], found ", h_TD.str(), " and ", weight_VD.str());
  const int64_t T = h_TD.size(0), D = h_TD.size(1), V = weight_VD.size(0);
  check_dtype(weight_VD, h_TD.dtype(), op, "weight_VD");
  check_dtype(targets_T, DType::kI32, op, "targets_T");
  check_shape(targets_T, {T}, op, "targets_T");
  check_dtype(loss_sum_1, DType::kF32, op, "loss_sum_1");
  ST_CHECK(loss_sum_1.numel() == 1, op, ": `loss_sum_1` must hold 1 element");
  ST_CHECK(o.chunk_tokens > 0, op, ": chunk_tokens must be positive");
  if (o.compute_grad) {
    check_cuda_tensor(dh_TD, op, "dh_TD");
    check_shape(dh_TD, {T, D}, op, "dh_TD");
    check_cuda_tensor(dweight_VD, op, "dweight_VD");
    check_shape(dweight_VD, {V, D}, op, "dweight_VD");
  }
  if (T == 0) return;
  const Device dev = h_TD.device();
  {
    Tensor bad = Tensor::empty({1}, DType::kI32, dev, "target check", s);
    fill(bad, static_cast<double>(INT32_MAX), s);
    check_targets_kernel<<<grid_for(T, kThreads), kThreads, 0, stream_of(s)>>>(targets_T.data<int32_t>(), T, V,
                                                                               o.ignore_index, bad.data<int32_t>());
    ST_CUDA_CHECK_LAUNCH();
    int32_t first = 0;
    ST_CUDA_CHECK(cudaMemcpyAsync(&first, bad.raw_data(), 4, cudaMemcpyDeviceToHost, stream_of(s)));
    ST_CUDA_CHECK(cudaStreamSynchronize(stream_of(s)));
    if (first != INT32_MAX) {
      int32_t value = 0;
      ST_CUDA_CHECK(cudaMemcpy(&value, targets_T.data<int32_t>() + first, 4, cudaMemcpyDeviceToHost));
      ST_THROW(op, ": target ", value, " at position ", first, " outside [0, ", V, ") and not the ignore index ",
               o.ignore_index);
    }
  }
  const int64_t C = std::min(o.chunk_tokens, T);
  Tensor logits = Tensor::empty({C, V}, DType::kF32, dev, "logits chunk", s);
  Tensor grad = Tensor::empty({C, V}, h_TD.dtype(), dev, "logits gradient chunk", s);
  Tensor row_loss = Tensor::empty({T}, DType::kF32, dev, "row losses", s);
  Tensor none;
  for (int64_t t0 = 0; t0 < T; t0 += C) {
    const int64_t rows = std::min(C, T - t0);
    Tensor z = logits.slice(0, 0, rows);
    linear_forward(z, h_TD.slice(0, t0, t0 + rows), weight_VD, none, s);
    dispatch_float(h_TD.dtype(), op, [&]<typename G>() {
      softmax_grad_kernel<G><<<static_cast<unsigned>(rows), kThreads, 0, stream_of(s)>>>(
          static_cast<G*>(grad.raw_data()), row_loss.data<float>() + t0, logits.data<float>(),
          targets_T.data<int32_t>() + t0, V, o.ignore_index, static_cast<float>(o.grad_scale), o.compute_grad);
    });
    ST_CUDA_CHECK_LAUNCH();
    if (o.compute_grad) {
      Tensor dh = dh_TD.slice(0, t0, t0 + rows);
      // dh = G W (overwrite) and dW += G^T h: the linear backward with G as dy
      linear_backward(dh, dweight_VD, none, grad.slice(0, 0, rows), h_TD.slice(0, t0, t0 + rows), weight_VD, {}, s);
    }
  }
  sum_losses_kernel<<<1, 32, 0, stream_of(s)>>>(loss_sum_1.data<float>(), row_loss.data<float>(), T);
  ST_CUDA_CHECK_LAUNCH();
}

}  // namespace shardtrain::ops::cuda
