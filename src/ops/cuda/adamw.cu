// CUDA AdamW (torch.optim.AdamW's formula) on f32 master weights and state; f32 math with
// the bias corrections computed once on the host in f64. The multi-tensor kernel also flags
// a tensor whose updated values are not finite (one block-wide vote per chunk).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "ops/adamw.h"
#include "ops/cuda/common.cuh"

namespace shardtrain::ops::cuda {
namespace {

constexpr int kThreads = 256;

// 1 - beta is taken in f64 on the host: 1 - 0.999f in f32 is off by 1.3e-5 relative, a bias
// the second moment would carry (the CPU twin and torch's non-fused AdamW use the exact value).
struct AdamWScalars {
  float lr, beta1, beta2, one_minus_beta1, one_minus_beta2, eps, decay_factor, step_size, inv_sqrt_bc2;
};

// Multi-tensor: one block per chunk of at most kChunk elements of one tensor.
constexpr int64_t kChunk = 32768;

struct Chunk {
  float* p;
  float* m;
  float* v;
  const float* g;
  void* copy;  // the compute copy (C), or null
  int* flag;   // the tensor's nonfinite flags (ops::kNonfinite* bits, OR-ed in), or null
  int64_t n;
  float decay_factor;
};

// The ops::kNonfinite* bits of one element's stored values.
__device__ __forceinline__ int nonfinite_bits(float p, float m, float v) {
  return (isfinite(p) ? 0 : kNonfiniteParam) | (isfinite(m) ? 0 : kNonfiniteExpAvg) |
         (isfinite(v) ? 0 : kNonfiniteExpAvgSq);
}

// One element's update: m, v and p in place (the same arithmetic in every path).
__device__ __forceinline__ void adamw_element(float& p, float& m, float& v, float g, float decay_factor,
                                              const AdamWScalars& c, float grad_scale, bool scaled) {
  const float gi = scaled ? g * grad_scale : g;  // as ops::scale would leave it
  m = c.beta1 * m + c.one_minus_beta1 * gi;
  v = c.beta2 * v + c.one_minus_beta2 * gi * gi;
  p = p * decay_factor - c.step_size * m / (sqrtf(v) * c.inv_sqrt_bc2 + c.eps);
}

__global__ void adamw_kernel(float* p, float* m, float* v, const float* g, int64_t n, AdamWScalars c) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    float pi = p[i], mi = m[i], vi = v[i];
    adamw_element(pi, mi, vi, g[i], c.decay_factor, c, 1.0f, false);
    m[i] = mi;
    v[i] = vi;
    p[i] = pi;
  }
}

// C: the compute copies' element type (every chunk's copy, where present, has it). Chunks
// whose four f32 arrays start 16-byte aligned (and the copy 8-byte) move four elements per
// load and store; the rest, and the tail past a multiple of four, one at a time.
template <typename C>
__global__ void adamw_multi_kernel(const Chunk* chunks, AdamWScalars c, float grad_scale, bool scaled) {
  const Chunk k = chunks[blockIdx.x];
  C* copy = static_cast<C*>(k.copy);
  const auto bits = [](const void* q) { return reinterpret_cast<uintptr_t>(q); };
  const bool vector = ((bits(k.p) | bits(k.m) | bits(k.v) | bits(k.g)) % 16 == 0) && bits(copy) % 8 == 0;
  int64_t done = 0;
  int bad = 0;  // this thread's elements' kNonfinite* bits
  if (vector) {
    const int64_t quads = k.n / 4;
    for (int64_t q = threadIdx.x; q < quads; q += blockDim.x) {
      float4 p = reinterpret_cast<const float4*>(k.p)[q], m = reinterpret_cast<const float4*>(k.m)[q],
             v = reinterpret_cast<const float4*>(k.v)[q];
      const float4 g = reinterpret_cast<const float4*>(k.g)[q];
      adamw_element(p.x, m.x, v.x, g.x, k.decay_factor, c, grad_scale, scaled);
      adamw_element(p.y, m.y, v.y, g.y, k.decay_factor, c, grad_scale, scaled);
      adamw_element(p.z, m.z, v.z, g.z, k.decay_factor, c, grad_scale, scaled);
      adamw_element(p.w, m.w, v.w, g.w, k.decay_factor, c, grad_scale, scaled);
      bad |= nonfinite_bits(p.x, m.x, v.x) | nonfinite_bits(p.y, m.y, v.y) | nonfinite_bits(p.z, m.z, v.z) |
             nonfinite_bits(p.w, m.w, v.w);
      reinterpret_cast<float4*>(k.m)[q] = m;
      reinterpret_cast<float4*>(k.v)[q] = v;
      reinterpret_cast<float4*>(k.p)[q] = p;
      if (copy != nullptr) {
        struct alignas(8) Four {
          C e[4];
        } out{{from_f32<C>(p.x), from_f32<C>(p.y), from_f32<C>(p.z), from_f32<C>(p.w)}};  // as ops::cast rounds
        reinterpret_cast<Four*>(copy)[q] = out;
      }
    }
    done = quads * 4;
  }
  for (int64_t i = done + threadIdx.x; i < k.n; i += blockDim.x) {
    float p = k.p[i], m = k.m[i], v = k.v[i];
    adamw_element(p, m, v, k.g[i], k.decay_factor, c, grad_scale, scaled);
    k.m[i] = m;
    k.v[i] = v;
    k.p[i] = p;
    if (copy != nullptr) copy[i] = from_f32<C>(p);  // as ops::cast rounds
    bad |= nonfinite_bits(p, m, v);
  }
  // one barrier per chunk, and one atomic only where a value is not finite
  if (k.flag != nullptr) {
    const int any_param = __syncthreads_or(bad & kNonfiniteParam), any_m = __syncthreads_or(bad & kNonfiniteExpAvg),
              any_v = __syncthreads_or(bad & kNonfiniteExpAvgSq);
    const int bits = (any_param ? kNonfiniteParam : 0) | (any_m ? kNonfiniteExpAvg : 0) |
                     (any_v ? kNonfiniteExpAvgSq : 0);
    if (threadIdx.x == 0 && bits != 0) atomicOr(k.flag, bits);
  }
}

AdamWScalars scalars(const AdamWOptions& o) {
  const double bc1 = 1.0 - std::pow(o.beta1, static_cast<double>(o.step));
  const double bc2 = 1.0 - std::pow(o.beta2, static_cast<double>(o.step));
  AdamWScalars c;
  c.lr = static_cast<float>(o.lr);
  c.beta1 = static_cast<float>(o.beta1);
  c.beta2 = static_cast<float>(o.beta2);
  c.one_minus_beta1 = static_cast<float>(1.0 - o.beta1);
  c.one_minus_beta2 = static_cast<float>(1.0 - o.beta2);
  c.eps = static_cast<float>(o.eps);
  c.decay_factor = static_cast<float>(1.0 - o.lr * o.weight_decay);
  c.step_size = static_cast<float>(o.lr / bc1);
  c.inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bc2));
  return c;
}

}  // namespace

void adamw_step_multi(std::vector<AdamWTensors>& tensors, const AdamWOptions& o, double grad_scale,
                      Tensor* nonfinite_flags, Stream s) {
  ST_CHECK(o.step >= 1, "adamw_step_multi: step must be >= 1, found ", o.step);
  int* flags = nullptr;
  if (nonfinite_flags != nullptr) {
    check_cuda_tensor(*nonfinite_flags, "adamw_step_multi", "nonfinite_flags");
    check_dtype(*nonfinite_flags, DType::kI32, "adamw_step_multi", "nonfinite_flags");
    check_shape(*nonfinite_flags, {static_cast<int64_t>(tensors.size())}, "adamw_step_multi", "nonfinite_flags");
    flags = nonfinite_flags->data<int32_t>();
  }
  const AdamWScalars c = scalars(o);
  const float no_decay = 1.0f;
  std::vector<Chunk> chunks;
  DType copy_dtype = DType::kBF16;
  bool any_copy = false;
  for (size_t ti = 0; ti < tensors.size(); ++ti) {
    AdamWTensors& t = tensors[ti];
    for (const Tensor* x : std::initializer_list<const Tensor*>{&t.param, &t.exp_avg, &t.exp_avg_sq, &t.grad}) {
      check_cuda_tensor(*x, "adamw_step_multi", "param/exp_avg/exp_avg_sq/grad");
      check_dtype(*x, DType::kF32, "adamw_step_multi", "param/exp_avg/exp_avg_sq/grad");
      check_shape(*x, t.param.shape(), "adamw_step_multi", "param/exp_avg/exp_avg_sq/grad");
    }
    char* copy = nullptr;
    if (t.compute_copy.defined()) {
      check_cuda_tensor(t.compute_copy, "adamw_step_multi", "compute_copy");
      check_shape(t.compute_copy, t.param.shape(), "adamw_step_multi", "compute_copy");
      ST_CHECK(t.compute_copy.dtype() == DType::kBF16 || t.compute_copy.dtype() == DType::kF16,
               "adamw_step_multi: a compute copy is bf16 or f16 on a GPU, found ", t.compute_copy.str());
      ST_CHECK(!any_copy || t.compute_copy.dtype() == copy_dtype,
               "adamw_step_multi: every compute copy of one call has one dtype, found ", dtype_name(copy_dtype),
               " and ", t.compute_copy.str());
      copy_dtype = t.compute_copy.dtype();
      any_copy = true;
      copy = static_cast<char*>(t.compute_copy.raw_data());
    }
    const int64_t n = t.param.numel();
    const int64_t copy_bytes = static_cast<int64_t>(dtype_size(copy_dtype));
    for (int64_t a = 0; a < n; a += kChunk)
      chunks.push_back({t.param.data<float>() + a, t.exp_avg.data<float>() + a, t.exp_avg_sq.data<float>() + a,
                        t.grad.data<float>() + a, copy ? copy + a * copy_bytes : nullptr,
                        flags != nullptr ? flags + ti : nullptr, std::min(kChunk, n - a),
                        t.decay ? c.decay_factor : no_decay});
  }
  if (chunks.empty()) return;
  const Device dev = tensors.front().param.device();
  Tensor table = Tensor::empty({static_cast<int64_t>(chunks.size() * sizeof(Chunk))}, DType::kU8, dev,
                               "adamw chunk table", s);
  ST_CUDA_CHECK(cudaMemcpyAsync(table.raw_data(), chunks.data(), chunks.size() * sizeof(Chunk), cudaMemcpyHostToDevice,
                                stream_of(s)));
  auto kernel = copy_dtype == DType::kF16 ? adamw_multi_kernel<__half> : adamw_multi_kernel<__nv_bfloat16>;
  kernel<<<static_cast<unsigned>(chunks.size()), kThreads, 0, stream_of(s)>>>(
      static_cast<const Chunk*>(table.raw_data()), c, static_cast<float>(grad_scale), grad_scale != 1.0);
  ST_CUDA_CHECK_LAUNCH();
}

void adamw_step(Tensor& param, Tensor& exp_avg, Tensor& exp_avg_sq, const Tensor& grad, const AdamWOptions& o,
                Stream s) {
  for (const Tensor* t : std::initializer_list<const Tensor*>{&param, &exp_avg, &exp_avg_sq, &grad}) {
    check_cuda_tensor(*t, "adamw_step", "param/exp_avg/exp_avg_sq/grad");
    check_dtype(*t, DType::kF32, "adamw_step", "param/exp_avg/exp_avg_sq/grad");
    check_shape(*t, param.shape(), "adamw_step", "param/exp_avg/exp_avg_sq/grad");
  }
  ST_CHECK(o.step >= 1, "adamw_step: step must be >= 1, found ", o.step);
  const int64_t n = param.numel();
  if (n == 0) return;
  const AdamWScalars c = scalars(o);
  adamw_kernel<<<grid_for(n, kThreads), kThreads, 0, stream_of(s)>>>(param.data<float>(), exp_avg.data<float>(),
                                                                     exp_avg_sq.data<float>(), grad.data<float>(), n, c);
  ST_CUDA_CHECK_LAUNCH();
}

}  // namespace shardtrain::ops::cuda
