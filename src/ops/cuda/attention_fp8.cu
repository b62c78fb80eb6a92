// The FP8 attention's own passes (attention_fp8.h): one amax pass over the operands together,
// one kernel that turns the amaxes (and the backward's history) into every scale, one pass that
// writes the operands' e4m3 codes (rounding the forward's q, k and v in place), and the results'
// dequantisation. The operands' scale rule is ops/fp8.h's (fp8_quantize_factor), so the codes
// equal the CPU twin's (ops/cpu/attention_fp8.cpp) bit for bit.
#include "ops/cuda/attention_fp8.h"

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <algorithm>

#include "core/cuda/cuda_check.h"
#include "ops/attention.h"
#include "ops/cuda/common.cuh"
#include "ops/fp8.h"

namespace shardtrain::ops::cuda {
namespace {

constexpr float kE4m3Max = 448.0f;
constexpr int kMaxOperands = 5;

// One operand: `rows` runs of `cols` bf16 values `pitch` apart, and its contiguous codes; with
// `round_in_place` x is overwritten with the values its codes stand for.
struct Operand {
  __nv_bfloat16* x;
  uint8_t* codes;
  int64_t rows, cols, pitch;
  bool round_in_place;
};
struct Operands {
  Operand t[kMaxOperands];
  int count;
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

__device__ __forceinline__ void set(float* scales, int factor, float value) {
  scales[factor] = value;
  scales[factor + 1] = 1.0f / value;
}

// The forward's scales: q, k, v from their amaxes; out half v's (|out| <= max |v|, with room
// for the probabilities' rounding).
__global__ void forward_scales_kernel(const uint32_t* amax, float* scales) {
  for (int y = 0; y < 3; ++y) {
    scales[kFp8FactorQ + y] = fp8_quantize_factor(__uint_as_float(amax[y]), kE4m3Max);
    scales[kFp8DescaleQ + y] = 1.0f / scales[kFp8FactorQ + y];
  }
  scales[kFp8FactorOut] = 0.5f * scales[kFp8FactorV];
  scales[kFp8DescaleOut] = 1.0f / scales[kFp8FactorOut];
}

// The factor for a result whose largest magnitude was `seen` in earlier calls (two powers of two
// of headroom), or, with none seen yet, at most `bound`.
__device__ __forceinline__ float result_factor(float seen, float bound) {
  return fp8_quantize_factor(seen > 0.0f ? 4.0f * seen : bound, kE4m3Max);
}

// The backward's scales: the inputs as the forward's (dout from its amax), and the results'
// from the history. The bounds for a first call: |dP| <= H max|dout| max|v|; |dS| <= 2 P |dP|;
// dq sums dS over keys (its rows' P sum to 1), dk and dv over queries (columns sum to T at most).
__global__ void backward_scales_kernel(const uint32_t* amax, const float* history, float* scales, float H, float T,
                                       float softmax_scale) {
  for (int y = 0; y < 5; ++y)
    scales[kFp8FactorQ + y] = fp8_quantize_factor(__uint_as_float(amax[y]), kE4m3Max);
  scales[kFp8FactorOut] = 0.5f * scales[kFp8FactorV];
  for (int y = 0; y < 5; ++y) scales[kFp8DescaleQ + y] = 1.0f / scales[kFp8FactorQ + y];
  const float aq = __uint_as_float(amax[0]), ak = __uint_as_float(amax[1]), av = __uint_as_float(amax[2]),
              ado = __uint_as_float(amax[4]);
  const float dp = H * ado * av, ds = 2.0f * dp;
  set(scales, kFp8FactorDQ, result_factor(history[0], softmax_scale * ds * ak));
  set(scales, kFp8FactorDK, result_factor(history[1], softmax_scale * ds * aq * T));
  set(scales, kFp8FactorDV, result_factor(history[2], T * ado));
  set(scales, kFp8FactorDP, result_factor(history[3], dp));
  set(scales, kFp8FactorP, kFp8AttentionProbScale);
}

// The codes of operand blockIdx.y under scales[kFp8FactorQ + y]; rounded in place where asked.
__global__ void codes_kernel(Operands ops, const float* scales) {
  const Operand& o = ops.t[blockIdx.y];
  const float factor = scales[kFp8FactorQ + blockIdx.y];
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
      if (o.round_in_place) *src = p;
      *reinterpret_cast<uint2*>(o.codes + i) = *reinterpret_cast<const uint2*>(c);
    } else {
      for (int64_t e = i; e < min(n, i + 8); ++e) {
        __nv_bfloat16& x = o.x[at(o, e)];
        const uint8_t code = e4m3_code(__bfloat162float(x) * factor);
        o.codes[e] = code;
        if (o.round_in_place) x = __float2bfloat16(e4m3_value(code) / factor);
      }
    }
  }
}

// Operand y's values back: x = code times scales[descale], x's runs strided as the operand's.
__global__ void values_kernel(Operand o, const float* scales, int descale) {
  const float d = scales[descale];
  const int64_t n = o.rows * o.cols;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    o.x[at(o, i)] = __float2bfloat16(e4m3_value(o.codes[i]) * d);
}

__global__ void history_kernel(float* history, const float* amax) {
  const int i = threadIdx.x;
  if (i < 4) history[i] = fmaxf(amax[i], 0.5f * history[i]);  // a NaN amax leaves the halved history
}

Operand operand(const Tensor& x, const Tensor& codes, const char* op, const char* arg, bool round_in_place) {
  RowLayout l;
  ST_CHECK(x.dtype() == DType::kBF16 && row_layout(x, 2, l), op, ": `", arg,
           "` must be bf16 [B, T, heads, H] with each token's heads contiguous, found ", x.str());
  ST_CHECK(codes.dtype() == DType::kF8E4M3 && codes.is_contiguous() && codes.numel() == x.numel(), op,
           ": the codes of `", arg, "` must be contiguous f8e4m3 of ", x.numel(), " elements, found ", codes.str());
  return {static_cast<__nv_bfloat16*>(x.raw_data()), static_cast<uint8_t*>(codes.raw_data()), l.rows, l.cols,
          l.pitch, round_in_place};
}

void check_scales(const Tensor& scales_F, const Tensor& x, const char* op) {
  ST_CHECK(scales_F.dtype() == DType::kF32 && scales_F.numel() == kFp8Count && scales_F.device() == x.device(), op,
           ": the scales must be f32 [", kFp8Count, "] on ", x.device().str(), ", found ", scales_F.str());
}

// The amaxes of `ops` (u32 bits, [count] on the device), then the codes once `scales_kernel_launch`
// has turned them into scales.
template <typename Launch>
void quantize(Operands ops, const Tensor& scales_F, Device dev, Stream stream, Launch&& scales_kernel_launch) {
  ops.vec = true;
  for (int y = 0; y < ops.count; ++y) {
    const Operand& o = ops.t[y];
    ops.vec = ops.vec && o.cols % 8 == 0 && o.pitch % 8 == 0 && reinterpret_cast<uintptr_t>(o.x) % 16 == 0;
  }
  const cudaStream_t s = stream_of(stream);
  Tensor amax = Tensor::empty({ops.count}, DType::kI32, dev, "FP8 attention amax", stream);
  ST_CUDA_CHECK(cudaMemsetAsync(amax.raw_data(), 0, ops.count * sizeof(uint32_t), s));
  int64_t most = 0;
  for (int y = 0; y < ops.count; ++y) most = std::max(most, ops.t[y].rows * ops.t[y].cols);
  const dim3 grid(static_cast<unsigned>(grid_for((most + 7) / 8, 256)), static_cast<unsigned>(ops.count));
  amax_kernel<<<grid, 256, 0, s>>>(static_cast<uint32_t*>(amax.raw_data()), ops);
  ST_CUDA_CHECK_LAUNCH();
  scales_kernel_launch(static_cast<const uint32_t*>(amax.raw_data()), s);
  ST_CUDA_CHECK_LAUNCH();
  codes_kernel<<<grid, 256, 0, s>>>(ops, scales_F.data<float>());
  ST_CUDA_CHECK_LAUNCH();
}

}  // namespace

void fp8_attention_inputs(Tensor& q8, Tensor& k8, Tensor& v8, Tensor& scales_F, Tensor& q, Tensor& k, Tensor& v,
                          Stream stream) {
  const char* op = "attention_forward_fp8";
  check_scales(scales_F, q, op);
  Operands ops{};
  ops.t[0] = operand(q, q8, op, "q_BTNH", true);
  ops.t[1] = operand(k, k8, op, "k_BTMH", true);
  ops.t[2] = operand(v, v8, op, "v_BTMH", true);
  ops.count = 3;
  float* scales = scales_F.data<float>();
  quantize(ops, scales_F, q.device(), stream, [&](const uint32_t* amax, cudaStream_t s) {
    forward_scales_kernel<<<1, 1, 0, s>>>(amax, scales);
  });
}

void fp8_attention_backward_inputs(Tensor& q8, Tensor& k8, Tensor& v8, Tensor& out8, Tensor& dout8,
                                   Tensor& scales_F, const Tensor& q, const Tensor& k, const Tensor& v,
                                   const Tensor& out, const Tensor& dout, const Tensor& history_4,
                                   double softmax_scale, Stream stream) {
  const char* op = "attention_backward_fp8";
  check_scales(scales_F, q, op);
  ST_CHECK(history_4.dtype() == DType::kF32 && history_4.numel() == 4 && history_4.is_contiguous() &&
               history_4.device() == q.device(),
           op, ": the history must be contiguous f32 [4] on ", q.device().str(), ", found ", history_4.str());
  Operands ops{};
  ops.t[0] = operand(q, q8, op, "q_BTNH", false);
  ops.t[1] = operand(k, k8, op, "k_BTMH", false);
  ops.t[2] = operand(v, v8, op, "v_BTMH", false);
  ops.t[3] = operand(out, out8, op, "out_BTNH", false);
  ops.t[4] = operand(dout, dout8, op, "dout_BTNH", false);
  ops.count = 5;
  float* scales = scales_F.data<float>();
  const float H = static_cast<float>(q.size(3)), T = static_cast<float>(q.size(1));
  quantize(ops, scales_F, q.device(), stream, [&](const uint32_t* amax, cudaStream_t s) {
    backward_scales_kernel<<<1, 1, 0, s>>>(amax, history_4.data<float>(), scales, H, T,
                                           static_cast<float>(softmax_scale));
  });
}

void fp8_attention_output(Tensor& out, const Tensor& out8, const Tensor& scales_F, Stream stream) {
  fp8_attention_gradient(out, out8, scales_F, kFp8DescaleOut, stream);
}

void fp8_attention_gradient(Tensor& dx, const Tensor& dx8, const Tensor& scales_F, Fp8AttentionScale descale,
                            Stream stream) {
  const char* op = "attention_fp8";
  check_scales(scales_F, dx, op);
  const Operand o = operand(dx, dx8, op, "the result", false);
  values_kernel<<<grid_for(o.rows * o.cols, 256), 256, 0, stream_of(stream)>>>(o, scales_F.data<float>(),
                                                                                 static_cast<int>(descale));
  ST_CUDA_CHECK_LAUNCH();
}

void fp8_attention_update_history(Tensor& history_4, const Tensor& amax_4, Stream stream) {
  history_kernel<<<1, 32, 0, stream_of(stream)>>>(history_4.data<float>(), amax_4.data<float>());
  ST_CUDA_CHECK_LAUNCH();
}

}  // namespace shardtrain::ops::cuda
