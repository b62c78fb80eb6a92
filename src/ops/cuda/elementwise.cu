// CUDA elementwise ops: fill, add, scale, softcap, cast, and a deterministic sum of squares
// (fixed per-block partials, then one block sums them in a fixed order; f64 accumulation).
#include "core/random_math.h"
#include "ops/cuda/common.cuh"
#include "ops/elementwise.h"

namespace shardtrain::ops::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxPartials = 1024;

template <typename T>
__global__ void fill_kernel(T* x, int64_t n, T value) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) x[i] = value;
}

template <typename T>
__global__ void fill_normal_kernel(T* x, int64_t n, uint64_t seed, uint64_t key, int64_t first, double std) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const double v = std * random_math::normal_at(seed, key, static_cast<uint64_t>(first + i));
    if constexpr (std::is_same_v<T, double>) x[i] = v;
    else x[i] = from_f32<T>(static_cast<float>(v));  // through f32, as the host rounds
  }
}

template <typename T>
__global__ void add_kernel(T* out, const T* a, const T* b, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    out[i] = from_f32<T>(to_f32(a[i]) + to_f32(b[i]));
}

// add_kernel over 16-byte packs (8 bf16 values a load): the same sums, at the copy rate.
template <typename T>
__global__ void add_packs_kernel(Pack<T>* out, const Pack<T>* a, const Pack<T>* b, int64_t packs) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < packs; i += int64_t{gridDim.x} * blockDim.x) {
    const Pack<T> x = a[i], y = b[i];
    Pack<T> r;
#pragma unroll
    for (int k = 0; k < Pack<T>::kSize; ++k) r.v[k] = from_f32<T>(to_f32(x.v[k]) + to_f32(y.v[k]));
    out[i] = r;
  }
}

template <>
__global__ void add_kernel<double>(double* out, const double* a, const double* b, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    out[i] = a[i] + b[i];
}

template <typename T>
__global__ void scale_kernel(T* x, int64_t n, float factor) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    x[i] = from_f32<T>(to_f32(x[i]) * factor);
}

template <>
__global__ void scale_kernel<double>(double* x, int64_t n, float factor) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    x[i] *= static_cast<double>(factor);
}

// x = cap · tanh(x / cap), in f64 and rounded to T through f32 (the CPU twin's arithmetic for f32).
template <typename T>
__global__ void softcap_kernel(T* x, int64_t n, double cap) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const double y = cap * tanh(static_cast<double>(to_f32(x[i])) / cap);
    x[i] = from_f32<T>(static_cast<float>(y));
  }
}

template <>
__global__ void softcap_kernel<double>(double* x, int64_t n, double cap) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    x[i] = cap * tanh(x[i] / cap);
}

// 8 values moved together: 16 bytes of bf16, 32 of f32 (two 16-byte loads or stores).
template <typename T>
struct alignas(8 * sizeof(T)) Eight {
  T v[8];
};

// cast_kernel between f32, bf16 and f16 by groups of 8: the same values, at the copy rate.
template <typename To, typename From>
__global__ void cast_eights_kernel(Eight<To>* out, const Eight<From>* in, int64_t groups) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < groups; i += int64_t{gridDim.x} * blockDim.x) {
    const Eight<From> x = in[i];
    Eight<To> r;
#pragma unroll
    for (int k = 0; k < 8; ++k) r.v[k] = from_f32<To>(to_f32(x.v[k]));
    out[i] = r;
  }
}

template <typename To, typename From>
__global__ void cast_kernel(To* out, const From* in, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    if constexpr (std::is_same_v<To, double> && std::is_same_v<From, double>) {
      out[i] = in[i];
    } else if constexpr (std::is_same_v<From, double>) {
      // f64 -> narrow: round once from f64 (via f32 only when the target is f32)
      if constexpr (std::is_same_v<To, __nv_bfloat16>) out[i] = __double2bfloat16(in[i]);
      else if constexpr (std::is_same_v<To, __half>) out[i] = __double2half(in[i]);
      else out[i] = static_cast<To>(in[i]);
    } else if constexpr (std::is_same_v<To, double>) {
      out[i] = static_cast<double>(to_f32(in[i]));
    } else {
      out[i] = from_f32<To>(to_f32(in[i]));
    }
  }
}

__device__ double block_sum(double v) {
  __shared__ double warp_sums[32];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) warp_sums[warp] = v;
  __syncthreads();
  v = threadIdx.x < blockDim.x / 32 ? warp_sums[threadIdx.x] : 0.0;
  if (warp == 0)
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
  return v;
}

template <typename T>
__global__ void sum_squares_partials(double* partials, const T* x, int64_t n) {
  double acc = 0;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const double v = static_cast<double>(to_f32(x[i]));
    acc += v * v;
  }
  acc = block_sum(acc);
  if (threadIdx.x == 0) partials[blockIdx.x] = acc;
}

template <>
__global__ void sum_squares_partials<double>(double* partials, const double* x, int64_t n) {
  double acc = 0;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    acc += x[i] * x[i];
  acc = block_sum(acc);
  if (threadIdx.x == 0) partials[blockIdx.x] = acc;
}

__global__ void sum_partials(double* out, const double* partials, int count) {
  double acc = 0;
  for (int i = threadIdx.x; i < count; i += blockDim.x) acc += partials[i];
  acc = block_sum(acc);
  if (threadIdx.x == 0) out[0] += acc;
}

}  // namespace

void fill(Tensor& x, double value, Stream s) {
  check_cuda_tensor(x, "fill", "x");
  const int64_t n = x.numel();
  if (n == 0) return;
  const int grid = grid_for(n, kThreads);
  switch (x.dtype()) {
    case DType::kI32:
      fill_kernel<<<grid, kThreads, 0, stream_of(s)>>>(x.data<int32_t>(), n, static_cast<int32_t>(value));
      break;
    case DType::kI64:
      fill_kernel<<<grid, kThreads, 0, stream_of(s)>>>(x.data<int64_t>(), n, static_cast<int64_t>(value));
      break;
    case DType::kF64:
      fill_kernel<<<grid, kThreads, 0, stream_of(s)>>>(x.data<double>(), n, value);
      break;
    case DType::kF32:
      fill_kernel<<<grid, kThreads, 0, stream_of(s)>>>(x.data<float>(), n, static_cast<float>(value));
      break;
    case DType::kBF16:
      fill_kernel<<<grid, kThreads, 0, stream_of(s)>>>(static_cast<__nv_bfloat16*>(x.raw_data()), n,
                                                        __double2bfloat16(value));
      break;
    case DType::kF16:
      fill_kernel<<<grid, kThreads, 0, stream_of(s)>>>(static_cast<__half*>(x.raw_data()), n, __double2half(value));
      break;
    default: ST_THROW("fill: no CUDA kernel for ", x.str());
  }
  ST_CUDA_CHECK_LAUNCH();
}

void fill_normal(Tensor& x, uint64_t seed, uint64_t key, int64_t first, double std, Stream s) {
  check_cuda_tensor(x, "fill_normal", "x");
  const int64_t n = x.numel();
  if (n == 0) return;
  dispatch_float(x.dtype(), "fill_normal", [&]<typename T>() {
    fill_normal_kernel<<<grid_for(n, kThreads), kThreads, 0, stream_of(s)>>>(static_cast<T*>(x.raw_data()), n, seed,
                                                                             key, first, std);
  });
  ST_CUDA_CHECK_LAUNCH();
}

void add(Tensor& out, const Tensor& a, const Tensor& b, Stream s) {
  check_cuda_tensor(out, "add", "out");
  check_cuda_tensor(a, "add", "a");
  check_cuda_tensor(b, "add", "b");
  check_shape(a, out.shape(), "add", "a");
  check_shape(b, out.shape(), "add", "b");
  check_dtype(a, out.dtype(), "add", "a");
  check_dtype(b, out.dtype(), "add", "b");
  const int64_t n = out.numel();
  if (n == 0) return;
  dispatch_float(out.dtype(), "add", [&]<typename T>() {
    if constexpr (!std::is_same_v<T, double>) {
      if (packable({&out, &a, &b}, n, sizeof(T))) {
        const int64_t packs = n / Pack<T>::kSize;
        add_packs_kernel<T><<<grid_for(packs, kThreads), kThreads, 0, stream_of(s)>>>(
            static_cast<Pack<T>*>(out.raw_data()), static_cast<const Pack<T>*>(a.raw_data()),
            static_cast<const Pack<T>*>(b.raw_data()), packs);
        return;
      }
    }
    add_kernel<T><<<grid_for(n, kThreads), kThreads, 0, stream_of(s)>>>(
        static_cast<T*>(out.raw_data()), static_cast<const T*>(a.raw_data()), static_cast<const T*>(b.raw_data()), n);
  });
  ST_CUDA_CHECK_LAUNCH();
}

void scale(Tensor& x, double factor, Stream s) {
  check_cuda_tensor(x, "scale", "x");
  const int64_t n = x.numel();
  if (n == 0) return;
  dispatch_float(x.dtype(), "scale", [&]<typename T>() {
    scale_kernel<T><<<grid_for(n, kThreads), kThreads, 0, stream_of(s)>>>(static_cast<T*>(x.raw_data()), n,
                                                                         static_cast<float>(factor));
  });
  ST_CUDA_CHECK_LAUNCH();
}

void softcap(Tensor& x, double cap, Stream s) {
  check_cuda_tensor(x, "softcap", "x");
  ST_CHECK(cap > 0, "softcap: the cap must be > 0, found ", cap);
  const int64_t n = x.numel();
  if (n == 0) return;
  dispatch_float(x.dtype(), "softcap", [&]<typename T>() {
    softcap_kernel<T><<<grid_for(n, kThreads), kThreads, 0, stream_of(s)>>>(static_cast<T*>(x.raw_data()), n, cap);
  });
  ST_CUDA_CHECK_LAUNCH();
}

void cast(Tensor& out, const Tensor& in, Stream s) {
  check_cuda_tensor(out, "cast", "out");
  check_cuda_tensor(in, "cast", "in");
  check_shape(in, out.shape(), "cast", "in");
  const int64_t n = out.numel();
  if (n == 0) return;
  dispatch_float(out.dtype(), "cast", [&]<typename To>() {
    dispatch_float(in.dtype(), "cast", [&]<typename From>() {
      if constexpr (!std::is_same_v<To, double> && !std::is_same_v<From, double>) {
        const auto aligned = [](const Tensor& t, size_t bytes) {
          return reinterpret_cast<uintptr_t>(t.raw_data()) % bytes == 0;
        };
        if (n % 8 == 0 && aligned(out, sizeof(Eight<To>)) && aligned(in, sizeof(Eight<From>))) {
          cast_eights_kernel<To, From><<<grid_for(n / 8, kThreads), kThreads, 0, stream_of(s)>>>(
              static_cast<Eight<To>*>(out.raw_data()), static_cast<const Eight<From>*>(in.raw_data()), n / 8);
          return;
        }
      }
      cast_kernel<To, From><<<grid_for(n, kThreads), kThreads, 0, stream_of(s)>>>(
          static_cast<To*>(out.raw_data()), static_cast<const From*>(in.raw_data()), n);
    });
  });
  ST_CUDA_CHECK_LAUNCH();
}

void sum_squares(Tensor& out_1, const Tensor& x, Stream s) {
  check_cuda_tensor(out_1, "sum_squares", "out_1");
  check_cuda_tensor(x, "sum_squares", "x");
  check_dtype(out_1, DType::kF64, "sum_squares", "out_1");
  ST_CHECK(out_1.numel() == 1, "sum_squares: `out_1` must hold 1 element, found ", out_1.str());
  const int64_t n = x.numel();
  if (n == 0) return;
  const int grid = std::min(grid_for(n, kThreads), kMaxPartials);
  Tensor partials = Tensor::empty({grid}, DType::kF64, x.device(), "sum_squares partials", s);
  dispatch_float(x.dtype(), "sum_squares", [&]<typename T>() {
    sum_squares_partials<T><<<grid, kThreads, 0, stream_of(s)>>>(partials.data<double>(),
                                                                static_cast<const T*>(x.raw_data()), n);
  });
  ST_CUDA_CHECK_LAUNCH();
  sum_partials<<<1, kThreads, 0, stream_of(s)>>>(out_1.data<double>(), partials.data<double>(), grid);
  ST_CUDA_CHECK_LAUNCH();
}

}  // namespace shardtrain::ops::cuda
