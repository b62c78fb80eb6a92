// The CPU twin of the FP8 attention forward (ops/attention.h, attention_forward_fp8): q, k and
// v rounded in place to their e4m3 values under one power-of-two scale each (the kTensor rule
// of ops/fp8.h, so the codes are the CUDA kernel's bit for bit), exact attention over them,
// and the output rounded once to e4m3 at the output's scale.
#include <cmath>

#include "core/dtype.h"
#include "ops/attention.h"
#include "ops/cpu/common.h"
#include "ops/fp8.h"

namespace shardtrain::ops::cpu {
namespace {

// max |x| over x's elements, as f32 (the CUDA pass reads the values as f32 too).
template <typename T>
float amax_of(const T* x, int64_t n) {
  float m = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    const float a = std::fabs(static_cast<float>(x[i]));
    if (std::isnan(a)) return a;  // NaN wins, as in the u32 order of the CUDA pass
    m = std::fmax(m, a);
  }
  return m;
}

// Rounds x to the e4m3 value of x * factor, divided back by factor; returns 1 / factor.
template <typename T>
float round_to_e4m3(T* x, int64_t n, float dequant_of_out = 0.0f) {
  const float factor = dequant_of_out > 0.0f ? 1.0f / dequant_of_out
                                             : fp8_quantize_factor(amax_of(x, n), fp8_max(DType::kF8E4M3));
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t code = float_to_fp8(static_cast<float>(x[i]) * factor, DType::kF8E4M3);
    x[i] = static_cast<T>(fp8_to_float(code, DType::kF8E4M3) / factor);
  }
  return 1.0f / factor;
}

}  // namespace

Fp8AttentionScales attention_forward_fp8(Tensor& out_BTNH, Tensor& lse_BNT, Tensor& q_BTNH, Tensor& k_BTMH,
                                         Tensor& v_BTMH, const AttentionOptions& options) {
  const char* op = "attention_forward_fp8";
  check_arg(q_BTNH, op, "q_BTNH");
  check_arg(k_BTMH, op, "k_BTMH");
  check_arg(v_BTMH, op, "v_BTMH");
  ST_CHECK(options.documents == nullptr && options.window == 0, op,
           ": the FP8 forward takes neither packed documents nor a sliding window; use attention_forward");
  ST_CHECK(q_BTNH.ndim() == 4 && k_BTMH.ndim() == 4 && k_BTMH.size(1) == q_BTNH.size(1), op,
           ": expected q [B, T, N, H] and k [B, T, M, H] with as many keys as queries, found ", q_BTNH.str(),
           " and ", k_BTMH.str());
  Fp8AttentionScales s;
  dispatch_real(q_BTNH, op, "q_BTNH", [&]<typename T>() {
    s.q = round_to_e4m3(q_BTNH.data<T>(), q_BTNH.numel());
    s.k = round_to_e4m3(k_BTMH.data<T>(), k_BTMH.numel());
    s.v = round_to_e4m3(v_BTMH.data<T>(), v_BTMH.numel());
  });
  s.out = 2.0f * s.v;
  cpu::attention_forward(out_BTNH, lse_BNT, q_BTNH, k_BTMH, v_BTMH, options);
  dispatch_real(out_BTNH, op, "out_BTNH",
                [&]<typename T>() { round_to_e4m3(out_BTNH.data<T>(), out_BTNH.numel(), s.out); });
  return s;
}

}  // namespace shardtrain::ops::cpu
