// The FP8 attention forward's own passes (attention_fp8.h): one amax pass over q, k and v
// together, one pass that writes their e4m3 codes and rounds them in place, and the output's
// dequantisation. The scale rule is ops/fp8.h's (fp8_quantize_factor), so the codes equal the
// CPU twin's (ops/cpu/attention_fp8.cpp) bit for bit.
#include "ops/cuda/attention_fp8.h"

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <algorithm>

#include "core/cuda/cuda_check.h"
#include "ops/cuda/common.cuh"
#include "ops/fp8.h"

namespace shardtrain::ops::cuda {
namespace {

// One of q, k, v: `rows` runs of `cols` bf16 values `pitch` apart, and its contiguous codes.
struct Operand {
  __nv_bfloat16* x;
  uint8_t* codes;
  int64_t rows, cols, pitch;
};
struct Operands {
  Operand t[3];
  bool vec;  // every x and pitch 16-byte aligned, cols a multiple of 8: 8 values a load
};

__device__ __forceinline__ int64_t at(const Operand& o, int64_t i) { return i / o.cols * o.pitch + i % o.cols; }

// amax[y] = max |x| of operand y (bits, ops/fp8.h's u32 order), blockIdx.y the operand.
__global__ void amax_kernel(uint32_t* amax, Operands ops) {
  const Operand& o = ops.t[blockIdx.y];
  const int64_t n = o.rows * o.cols, step = int64_t{gridDim.x} * blockDim.x * 8;
  uint32_t m = 0;
  for (int64_t i = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) * 8; i < n; i += step) {
    if (ops.vec) {
      const Pack<__nv_bfloat16> p = *reinterpret_cast<const Pack<__nv_bfloat16>*>(o.x + at(o, i));
#pragma unroll
      for (int e = 0; e < 8; ++e) m = max(m, magnitude_bits(__bfloat162float(p.v[e])));
    } else {
      for (int64_t e = i; e < min(n, i + 8); ++e) m = max(m, magnitude_bits(__bfloat162float(o.x[at(o, e)])));
    }
  }
  block_amax(&amax[blockIdx.y], m);
}

__device__ __forceinline__ uint8_t e4m3_code(float v) {
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3));
}
__device__ __forceinline__ float e4m3_value(uint8_t code) {
  __nv_fp8_e4m3 f;
  f.__x = code;
  return static_cast<float>(f);
}

// The codes of operand blockIdx.y and its values rounded in place; the first block of each
// operand writes its scales.
__global__ void round_kernel(Operands ops, const uint32_t* amax, float* scales) {
  const Operand& o = ops.t[blockIdx.y];
  const float factor = fp8_quantize_factor(__uint_as_float(amax[blockIdx.y]), 448.0f);
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    scales[kFp8DescaleQ + blockIdx.y] = 1.0f / factor;
    if (blockIdx.y == 2) {  // the output's: half V's factor (|out| <= max |v|, with room for rounding)
      scales[kFp8ScaleOut] = 0.5f * factor;
      scales[kFp8DescaleOut] = 2.0f / factor;
    }
  }
  const int64_t n = o.rows * o.cols, step = int64_t{gridDim.x} * blockDim.x * 8;
  for (int64_t i = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) * 8; i < n; i += step) {
    if (ops.vec) {
      Pack<__nv_bfloat16>* src = reinterpret_cast<Pack<__nv_bfloat16>*>(o.x + at(o, i));
      Pack<__nv_bfloat16> p = *src;
      uint8_t c[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        c[e] = e4m3_code(__bfloat162float(p.v[e]) * factor);
        p.v[e] = __float2bfloat16(e4m3_value(c[e]) / factor);
      }
      *src = p;
      *reinterpret_cast<uint2*>(o.codes + i) = *reinterpret_cast<const uint2*>(c);
    } else {
      for (int64_t e = i; e < min(n, i + 8); ++e) {
        __nv_bfloat16& x = o.x[at(o, e)];
        const uint8_t code = e4m3_code(__bfloat162float(x) * factor);
        o.codes[e] = code;
        x = __float2bfloat16(e4m3_value(code) / factor);
      }
    }
  }
}

__global__ void output_kernel(__nv_bfloat16* out, const uint8_t* codes, int64_t n, const float* scales) {
  const float descale = scales[kFp8DescaleOut];
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    out[i] = __float2bfloat16(e4m3_value(codes[i]) * descale);
}

Operand operand(Tensor& x, Tensor& codes, const char* arg) {
  const char* op = "attention_forward_fp8";
  RowLayout l;
  ST_CHECK(x.dtype() == DType::kBF16 && row_layout(x, 2, l), op, ": `", arg,
           "` must be bf16 [B, T, heads, H] with each token's heads contiguous, found ", x.str());
  ST_CHECK(codes.dtype() == DType::kF8E4M3 && codes.is_contiguous() && codes.numel() == x.numel(), op,
           ": the codes of `", arg, "` must be contiguous f8e4m3 of ", x.numel(), " elements, found ", codes.str());
  return {static_cast<__nv_bfloat16*>(x.raw_data()), static_cast<uint8_t*>(codes.raw_data()), l.rows, l.cols,
          l.pitch};
}

}  // namespace

void fp8_attention_inputs(Tensor& q8, Tensor& k8, Tensor& v8, Tensor& scales_F, Tensor& q, Tensor& k, Tensor& v,
                          Stream stream) {
  const char* op = "attention_forward_fp8";
  ST_CHECK(scales_F.dtype() == DType::kF32 && scales_F.numel() == kFp8AttentionScaleCount &&
               scales_F.device() == q.device(),
           op, ": the scales must be f32 [", kFp8AttentionScaleCount, "] on ", q.device().str(), ", found ",
           scales_F.str());
  Operands ops{{operand(q, q8, "q_BTNH"), operand(k, k8, "k_BTMH"), operand(v, v8, "v_BTMH")}, true};
  for (const Operand& o : ops.t)
    ops.vec = ops.vec && o.cols % 8 == 0 && o.pitch % 8 == 0 && reinterpret_cast<uintptr_t>(o.x) % 16 == 0;
  const cudaStream_t s = stream_of(stream);
  Tensor amax = Tensor::empty({3}, DType::kI32, q.device(), "FP8 attention amax", stream);
  ST_CUDA_CHECK(cudaMemsetAsync(amax.raw_data(), 0, 3 * sizeof(uint32_t), s));
  const int64_t most = std::max<int64_t>({q.numel(), k.numel(), v.numel()});
  const dim3 grid(static_cast<unsigned>(grid_for((most + 7) / 8, 256)), 3);
  amax_kernel<<<grid, 256, 0, s>>>(static_cast<uint32_t*>(amax.raw_data()), ops);
  ST_CUDA_CHECK_LAUNCH();
  round_kernel<<<grid, 256, 0, s>>>(ops, static_cast<const uint32_t*>(amax.raw_data()), scales_F.data<float>());
  ST_CUDA_CHECK_LAUNCH();
}

void fp8_attention_output(Tensor& out, const Tensor& out8, const Tensor& scales_F, Stream stream) {
  const char* op = "attention_forward_fp8";
  ST_CHECK(out.dtype() == DType::kBF16 && out.is_contiguous() && out8.dtype() == DType::kF8E4M3 &&
               out8.numel() == out.numel(),
           op, ": the output must be contiguous bf16 and its codes f8e4m3 of as many elements, found ", out.str(),
           " and ", out8.str());
  const int64_t n = out.numel();
  output_kernel<<<grid_for(n, 256), 256, 0, stream_of(stream)>>>(static_cast<__nv_bfloat16*>(out.raw_data()),
                                                                  static_cast<const uint8_t*>(out8.raw_data()), n,
                                                                  scales_F.data<float>());
  ST_CUDA_CHECK_LAUNCH();
}

}  // namespace shardtrain::ops::cuda
