// CUDA fused output projection + cross-entropy over chunks of tokens. Per chunk: the
// logits [C, V] come from the cuBLASLt linear in h's dtype (bf16 logits, as a bf16
// LlamaForCausalLM's lm_head produces them before its f32 loss); one block per row computes
// the log-sum-exp in f32 (one pass, online rescaling) and the row's loss, and overwrites the
// logits in place with grad_scale * (softmax - onehot); two GEMMs then give dh (overwrite)
// and dW (accumulate, or overwrite in the first chunk). With options.fp8 the three products
// are the linear's FP8 forms (each chunk's operands quantised, then multiplied in FP8). A
// block is 1024 threads and one runs per SM, so the rows in flight (132 x 256 KiB for
// V = 128,256 in bf16 on an H100) stay in L2 for the second read. Soft-capped logits (Gemma 2's
// final_logit_softcapping) are capped in place before the softmax, and their gradient is taken
// through the cap.
// Row losses land in a per-token buffer summed in a fixed order: deterministic. Nothing is
// read back to the host: targets outside [0, V) (not the ignore index) make the loss NaN
// unless options.check_targets asks for a host-side error first.
#include <algorithm>

#include "ops/cross_entropy.h"
#include "ops/cuda/common.cuh"
#include "ops/elementwise.h"
#include "ops/linear.h"

namespace shardtrain::ops::cuda {
namespace {

constexpr int kThreads = 1024;

// max (is_max) or sum of v over the block; every thread gets the result.
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

// Folds n values into a running (max, sum of exp(x - max)).
template <int n>
__device__ __forceinline__ void online_add(float& mx, float& sum, const float (&x)[n]) {
  float m = x[0];
#pragma unroll
  for (int i = 1; i < n; ++i) m = fmaxf(m, x[i]);
  if (m > mx) {
    sum *= __expf(mx - m);  // mx = -inf at first: exp(-inf) = 0
    mx = m;
  }
  if (mx == -INFINITY) return;  // every value so far is -inf
#pragma unroll
  for (int i = 0; i < n; ++i) sum += __expf(x[i] - mx);
}

// The gradient of a logit z (soft-capped already when cap > 0) with softmax probability
// exp(z - lse): grad_scale * (p - onehot), and with a cap through it, times 1 - (z / cap)^2
// (d(cap tanh(x / cap)) / dx at the capped value z).
__device__ __forceinline__ float logit_grad(float z, float lse, bool is_target, float grad_scale, float cap) {
  const float g = grad_scale * (__expf(z - lse) - (is_target ? 1.0f : 0.0f));
  return cap > 0 ? g * (1.0f - (z / cap) * (z / cap)) : g;
}

// One block per row of the chunk: row_loss[r] = lse - z[target], and z overwritten with
// grad_scale * (softmax(z) - onehot(target)) when compute_grad (with cap > 0, z holds the
// soft-capped logits and the gradient is taken through the cap). kPacked: V a multiple of
// the 16-byte pack and z 16-byte aligned.
template <typename G, bool kPacked>
__global__ void __launch_bounds__(kThreads) softmax_grad_kernel(G* logits, float* row_loss, const int32_t* targets,
                                                               int64_t V, int32_t ignore_index, float grad_scale,
                                                               const float* grad_scale_device, bool compute_grad,
                                                               float cap) {
  __shared__ float scratch[32];
  __shared__ float target_logit;
  constexpr int P = Pack<G>::kSize;
  const int64_t r = blockIdx.x;
  G* z = logits + r * V;
  const int32_t target = targets[r];
  if (target == ignore_index) {
    if (threadIdx.x == 0) row_loss[r] = 0;
    if (compute_grad)
      for (int64_t c = threadIdx.x; c < V; c += blockDim.x) z[c] = from_f32<G>(0.0f);
    return;
  }
  const bool valid = target >= 0 && target < V;
  if (threadIdx.x == 0) target_logit = valid ? to_f32(z[target]) : NAN;  // read before any thread overwrites it
  float mx = -INFINITY, sum = 0;
  if constexpr (kPacked) {
    const Pack<G>* zp = reinterpret_cast<const Pack<G>*>(z);
    for (int64_t j = threadIdx.x; j < V / P; j += blockDim.x) {
      const Pack<G> p = zp[j];
      float x[P];
#pragma unroll
      for (int i = 0; i < P; ++i) x[i] = to_f32(p.v[i]);
      online_add(mx, sum, x);
    }
  } else {
    for (int64_t c = threadIdx.x; c < V; c += blockDim.x) {
      const float x[1] = {to_f32(z[c])};
      online_add(mx, sum, x);
    }
  }
  const float row_max = block_reduce(mx, true, scratch);
  sum = block_reduce(mx == -INFINITY ? 0.0f : sum * __expf(mx - row_max), false, scratch);
  const float lse = row_max + __logf(sum);
  if (threadIdx.x == 0) row_loss[r] = lse - target_logit;
  if (!compute_grad) return;
  if (grad_scale_device != nullptr) grad_scale = *grad_scale_device;
  if constexpr (kPacked) {
    Pack<G>* zp = reinterpret_cast<Pack<G>*>(z);
    for (int64_t j = threadIdx.x; j < V / P; j += blockDim.x) {
      Pack<G> p = zp[j];
#pragma unroll
      for (int i = 0; i < P; ++i) {
        const int64_t c = j * P + i;
        p.v[i] = from_f32<G>(logit_grad(to_f32(p.v[i]), lse, c == target, grad_scale, cap));
      }
      zp[j] = p;
    }
  } else {
    for (int64_t c = threadIdx.x; c < V; c += blockDim.x)
      z[c] = from_f32<G>(logit_grad(to_f32(z[c]), lse, c == target, grad_scale, cap));
  }
  if (!valid && threadIdx.x == 0) z[0] = from_f32<G>(NAN);  // a bad target poisons the gradient too
}

// loss_sum += sum of row_loss[0, n) in f64: each thread sums a fixed strided subset, then a
// fixed tree over the threads. Same order on every run.
constexpr int kSumThreads = 512;
__global__ void __launch_bounds__(kSumThreads) sum_losses_kernel(float* loss_sum, const float* row_loss, int64_t n) {
  __shared__ double part[kSumThreads];
  double acc = 0;
  for (int64_t i = threadIdx.x; i < n; i += kSumThreads) acc += row_loss[i];
  part[threadIdx.x] = acc;
  __syncthreads();
  for (int w = kSumThreads / 2; w > 0; w >>= 1) {
    if (static_cast<int>(threadIdx.x) < w) part[threadIdx.x] += part[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) loss_sum[0] += static_cast<float>(part[0]);
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
  ST_CHECK(o.logit_softcap >= 0, op, ": logit_softcap must be >= 0 (0: none), found ", o.logit_softcap);
  if (o.grad_scale_device.defined()) {
    check_cuda_tensor(o.grad_scale_device, op, "grad_scale_device");
    check_dtype(o.grad_scale_device, DType::kF32, op, "grad_scale_device");
    ST_CHECK(o.grad_scale_device.numel() == 1, op, ": `grad_scale_device` must hold 1 element");
  }
  if (o.compute_grad) {
    check_cuda_tensor(dh_TD, op, "dh_TD");
    check_shape(dh_TD, {T, D}, op, "dh_TD");
    check_cuda_tensor(dweight_VD, op, "dweight_VD");
    check_shape(dweight_VD, {V, D}, op, "dweight_VD");
  }
  if (T == 0) {
    if (o.compute_grad && o.overwrite_dweight) fill(dweight_VD, 0.0, s);  // no tokens: the gradient is zero
    return;
  }
  const Device dev = h_TD.device();
  if (o.check_targets) {
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
  // logits in h's dtype, overwritten in place by their gradient
  Tensor chunk = Tensor::empty({C, V}, h_TD.dtype(), dev, "logits chunk", s);
  Tensor row_loss = Tensor::empty({T}, DType::kF32, dev, "row losses", s);
  Tensor none;
  for (int64_t t0 = 0; t0 < T; t0 += C) {
    const int64_t rows = std::min(C, T - t0);
    Tensor z = chunk.slice(0, 0, rows);
    const Tensor h = h_TD.slice(0, t0, t0 + rows);
    if (o.fp8.on())
      linear_forward_fp8(z, h, weight_VD, none, none, o.fp8, s);
    else
      linear_forward(z, h, weight_VD, none, s);
    // soft-capped logits (Gemma 2): capped in place in their dtype, as the CPU twin holds them
    if (o.logit_softcap > 0) cuda::softcap(z, o.logit_softcap, s);
    dispatch_float(h_TD.dtype(), op, [&]<typename G>() {
      const bool packed = packable({&chunk}, V, sizeof(G));
      auto kernel = packed ? softmax_grad_kernel<G, true> : softmax_grad_kernel<G, false>;
      kernel<<<static_cast<unsigned>(rows), kThreads, 0, stream_of(s)>>>(
          static_cast<G*>(chunk.raw_data()), row_loss.data<float>() + t0, targets_T.data<int32_t>() + t0, V,
          o.ignore_index, static_cast<float>(o.grad_scale),
          o.grad_scale_device.defined() ? o.grad_scale_device.data<float>() : nullptr, o.compute_grad,
          static_cast<float>(o.logit_softcap));
    });
    ST_CUDA_CHECK_LAUNCH();
    if (o.compute_grad) {
      Tensor dh = dh_TD.slice(0, t0, t0 + rows);
      // dh = G W (overwrite) and dW += G^T h: the linear backward with G as dy (the first
      // chunk overwrites dW when asked to)
      LinearBackwardOptions lo;
      lo.overwrite_dweight = o.overwrite_dweight && t0 == 0;
      lo.fp8 = o.fp8;
      if (o.fp8.on())
        linear_backward_fp8(dh, dweight_VD, none, z, h, weight_VD, lo, s);
      else
        cuda::linear_backward(dh, dweight_VD, none, z, h, weight_VD, lo, s);
    }
  }
  sum_losses_kernel<<<1, kSumThreads, 0, stream_of(s)>>>(loss_sum_1.data<float>(), row_loss.data<float>(), T);
  ST_CUDA_CHECK_LAUNCH();
}

}  // namespace shardtrain::ops::cuda
