// Device helpers shared by the CUDA op files: dtype <-> C++ type mapping, f32 load/store
// of any storage type, grid sizing from the device's SM count, and the launch check.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <initializer_list>

#include "core/cuda/cuda_check.h"
#include "core/tensor.h"

namespace shardtrain::ops::cuda {

inline cudaStream_t stream_of(Stream s) { return static_cast<cudaStream_t>(resolve(s).handle); }

__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(double x) { return static_cast<float>(x); }
__device__ __forceinline__ float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_f32(__half x) { return __half2float(x); }

template <typename T> __device__ __forceinline__ T from_f32(float x);
template <> __device__ __forceinline__ float from_f32<float>(float x) { return x; }
template <> __device__ __forceinline__ double from_f32<double>(float x) { return x; }
template <> __device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
template <> __device__ __forceinline__ __half from_f32<__half>(float x) { return __float2half_rn(x); }

// Calls f.template operator()<T>() with T the device type of a floating dtype.
template <typename F>
void dispatch_float(DType t, const char* op, F&& f) {
  switch (t) {
    case DType::kF32: f.template operator()<float>(); return;
    case DType::kF64: f.template operator()<double>(); return;
    case DType::kBF16: f.template operator()<__nv_bfloat16>(); return;
    case DType::kF16: f.template operator()<__half>(); return;
    default: ST_THROW(op, ": no CUDA kernel for dtype ", dtype_name(t));
  }
}

// 16 bytes of T (8 bf16 values) moved by one load or store.
template <typename T>
struct alignas(16) Pack {
  static constexpr int kSize = 16 / sizeof(T);
  T v[kSize];
};

// True when every tensor starts 16-byte aligned and n is a multiple of the pack size.
bool packable(std::initializer_list<const Tensor*> tensors, int64_t n, size_t element_bytes);

// Blocks for a grid-stride loop over n items: enough to fill every SM a few times over.
int grid_for(int64_t n, int threads);
// The SMs of CUDA device `device` (queried once per device).
int sm_count(int device);

void check_cuda_tensor(const Tensor& t, const char* op, const char* arg);

// FP8 amax (ops/fp8.h): |v| as the bits of an f32, which order as unsigned integers (NaN above
// infinity), so integer max and atomicMax find the largest magnitude and keep a NaN.
__device__ __forceinline__ uint32_t magnitude_bits(float v) { return __float_as_uint(v) & 0x7fffffffu; }

// The largest `m` of the warp's 32 lanes, in every lane.
__device__ __forceinline__ uint32_t warp_max(uint32_t m) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) m = max(m, __shfl_xor_sync(0xffffffffu, m, o));
  return m;
}

// Max-es `m` into *amax, skipped where the value in L2 is already as large (a stale read only
// costs an atomic).
__device__ __forceinline__ void atomic_amax(uint32_t* amax, uint32_t m) {
  if (m > __ldcg(amax)) atomicMax(amax, m);
}

// Max-es the block's largest `m` into *amax: one atomic per block. Every thread of the block
// calls it.
__device__ __forceinline__ void block_amax(uint32_t* amax, uint32_t m) {
  __shared__ uint32_t warp_maxima[32];
  m = warp_max(m);
  if (threadIdx.x % 32 == 0) warp_maxima[threadIdx.x / 32] = m;
  __syncthreads();
  if (threadIdx.x < 32) {
    m = warp_max(threadIdx.x < (blockDim.x + 31) / 32 ? warp_maxima[threadIdx.x] : 0u);
    if (threadIdx.x == 0) atomic_amax(amax, m);
  }
}

}  // namespace shardtrain::ops::cuda
