// CPU AdamW, torch.optim.AdamW's formula in f64 arithmetic, one rounding per store.
#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "ops/adamw.h"
#include "ops/cpu/common.h"
#include "ops/elementwise.h"

namespace shardtrain::ops::cpu {

namespace {

// Which of p, m, v holds NaN or inf, as kNonfinite* bits (the exponent all ones: no libm call,
// so the f32 loop stays vectorized).
template <typename F>
inline int32_t nonfinite_bits(F p, F m, F v) {
  if constexpr (std::is_same_v<F, float>) {
    constexpr uint32_t kExp = 0x7f800000u;
    return ((float_bits(p) & kExp) == kExp ? kNonfiniteParam : 0) | ((float_bits(m) & kExp) == kExp ? kNonfiniteExpAvg : 0) |
           ((float_bits(v) & kExp) == kExp ? kNonfiniteExpAvgSq : 0);
  } else {
    return (std::isfinite(p) ? 0 : kNonfiniteParam) | (std::isfinite(m) ? 0 : kNonfiniteExpAvg) |
           (std::isfinite(v) ? 0 : kNonfiniteExpAvgSq);
  }
}

// The update of one tensor; *flag |= the kNonfinite* bits of its stored values (flag may be null).
void adamw_scaled(Tensor& param, Tensor& exp_avg, Tensor& exp_avg_sq, const Tensor& grad, const AdamWOptions& o,
                  double grad_scale, int32_t* flag) {
  const char* op = "adamw_step";
  check_arg(param, op, "param");
  check_arg(exp_avg, op, "exp_avg", param.dtype(), param.shape());
  check_arg(exp_avg_sq, op, "exp_avg_sq", param.dtype(), param.shape());
  check_arg(grad, op, "grad", param.dtype(), param.shape());
  ST_CHECK(o.step >= 1, op, ": step must be >= 1, found ", o.step);
  const int64_t n = param.numel();
  const double bc1 = 1.0 - std::pow(o.beta1, static_cast<double>(o.step));
  const double bc2_sqrt = std::sqrt(1.0 - std::pow(o.beta2, static_cast<double>(o.step)));
  const double step_size = o.lr / bc1, decay = 1.0 - o.lr * o.weight_decay;
  const bool scaled = grad_scale != 1.0;
  dispatch_real(param, op, "param", [&]<typename F>() {
    F* p = param.data<F>();
    F* m = exp_avg.data<F>();
    F* v = exp_avg_sq.data<F>();
    const F* g = grad.data<F>();
    const F f = static_cast<F>(grad_scale);  // as ops::scale: the factor in F, one product in F
    int32_t bad = 0;
#pragma omp parallel for if (n > 65536) reduction(| : bad)
    for (int64_t i = 0; i < n; ++i) {
      // a scaled gradient is rounded to F, as an in-place scale would leave it
      const double gi = scaled ? static_cast<double>(static_cast<F>(g[i] * f)) : static_cast<double>(g[i]);
      const double mi = o.beta1 * m[i] + (1.0 - o.beta1) * gi;
      const double vi = o.beta2 * v[i] + (1.0 - o.beta2) * gi * gi;
      m[i] = static_cast<F>(mi);
      v[i] = static_cast<F>(vi);
      p[i] = static_cast<F>(p[i] * decay - step_size * mi / (std::sqrt(vi) / bc2_sqrt + o.eps));
      bad |= nonfinite_bits(p[i], m[i], v[i]);
    }
    if (flag != nullptr) *flag |= bad;
  });
}

// The CUDA kernel's arithmetic (ops/cuda/adamw.cu), scalars rounded to f32 the same way.
struct F32Scalars {
  float beta1, beta2, one_minus_beta1, one_minus_beta2, eps, decay_factor, step_size, inv_sqrt_bc2;
};

F32Scalars f32_scalars(const AdamWOptions& o) {
  const double bc1 = 1.0 - std::pow(o.beta1, static_cast<double>(o.step));
  const double bc2 = 1.0 - std::pow(o.beta2, static_cast<double>(o.step));
  return {static_cast<float>(o.beta1),     static_cast<float>(o.beta2),
          static_cast<float>(1.0 - o.beta1), static_cast<float>(1.0 - o.beta2),
          static_cast<float>(o.eps),       static_cast<float>(1.0 - o.lr * o.weight_decay),
          static_cast<float>(o.lr / bc1),  static_cast<float>(1.0 / std::sqrt(bc2))};
}

// float_to_bf16 as a select instead of a branch (the same bits), so the update loop vectorizes.
inline uint16_t bf16_bits_select(float f) {
  const uint32_t u = float_bits(f);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const uint32_t nan = (u >> 16) | 0x40u;
  return static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}

// Elements [a, b) of one f32 tensor and its compute copy (C: BFloat16, Float16, or void for
// none). Vectorized (this file builds with -fno-math-errno, so sqrt is one instruction; the
// arithmetic and its order are the scalar loop's, so the bits are too).
// Returns the kNonfinite* bits of the stored values.
template <typename C, bool kScaled>
int32_t adamw_f32_range(AdamWTensors& t, int64_t a, int64_t b, const F32Scalars& c, float decay_factor,
                        float grad_scale) {
  float* __restrict__ p = t.param.data<float>();
  float* __restrict__ m = t.exp_avg.data<float>();
  float* __restrict__ v = t.exp_avg_sq.data<float>();
  const float* __restrict__ g = t.grad.data<float>();
  [[maybe_unused]] C* __restrict__ copy = nullptr;
  if constexpr (!std::is_void_v<C>) copy = t.compute_copy.data<C>();
  const float beta1 = c.beta1, beta2 = c.beta2, omb1 = c.one_minus_beta1, omb2 = c.one_minus_beta2;
  const float step_size = c.step_size, inv_sqrt_bc2 = c.inv_sqrt_bc2, eps = c.eps;
  // Whether a stored value is NaN or inf, at four vector operations an element (SSE2 has no
  // unsigned max): p v is NaN or inf when p, v or (through p) m is, and then its magnitude's
  // bits plus one exponent step carry into bit 31. A p v past f32's range also carries; the
  // second look at the range, taken only then, says which tensors hold NaN or inf, if any.
  uint32_t carries = 0;
  for (int64_t i = a; i < b; ++i) {
    float gi = g[i];
    if constexpr (kScaled) gi *= grad_scale;
    const float mi = beta1 * m[i] + omb1 * gi;
    const float vi = beta2 * v[i] + omb2 * gi * gi;
    const float pi = p[i] * decay_factor - step_size * mi / (std::sqrt(vi) * inv_sqrt_bc2 + eps);
    m[i] = mi;
    v[i] = vi;
    p[i] = pi;
    if constexpr (std::is_same_v<C, BFloat16>) copy[i].bits = bf16_bits_select(pi);
    if constexpr (std::is_same_v<C, Float16>) copy[i] = float_to_f16(pi);
    carries |= (float_bits(pi * vi) & 0x7fffffffu) + 0x00800000u;
  }
  if ((carries & 0x80000000u) == 0) return 0;
  int32_t bad = 0;
  for (int64_t i = a; i < b; ++i) bad |= nonfinite_bits(p[i], m[i], v[i]);
  return bad;
}

template <typename C>
int32_t adamw_f32_piece(AdamWTensors& t, int64_t a, int64_t b, const F32Scalars& c, float decay_factor,
                        float grad_scale, bool scaled) {
  return scaled ? adamw_f32_range<C, true>(t, a, b, c, decay_factor, grad_scale)
                : adamw_f32_range<C, false>(t, a, b, c, decay_factor, grad_scale);
}

void adamw_multi_host_f32(std::vector<AdamWTensors>& tensors, const AdamWOptions& o, double grad_scale,
                          int32_t* flags) {
  const char* op = "adamw_step_multi";
  ST_CHECK(o.step >= 1, op, ": step must be >= 1, found ", o.step);
  for (AdamWTensors& t : tensors) {
    check_arg(t.param, op, "param", DType::kF32, t.param.shape());
    check_arg(t.exp_avg, op, "exp_avg", DType::kF32, t.param.shape());
    check_arg(t.exp_avg_sq, op, "exp_avg_sq", DType::kF32, t.param.shape());
    check_arg(t.grad, op, "grad", DType::kF32, t.param.shape());
    if (t.compute_copy.defined()) {
      check_arg(t.compute_copy, op, "compute_copy");
      check_shape(t.compute_copy, t.param.shape(), op, "compute_copy");
      ST_CHECK(t.compute_copy.dtype() == DType::kBF16 || t.compute_copy.dtype() == DType::kF16, op,
               ": with host_f32 a compute copy is bf16 or f16, found ", t.compute_copy.str());
    }
  }
  const F32Scalars c = f32_scalars(o);
  // every tensor cut into pieces the threads share out; one piece per (tensor, range)
  constexpr int64_t kPiece = 1 << 16;
  struct Piece {
    size_t tensor;
    int64_t a, b;
  };
  std::vector<Piece> pieces;
  for (size_t k = 0; k < tensors.size(); ++k) {
    const int64_t n = tensors[k].param.numel();
    for (int64_t a = 0; a < n; a += kPiece) pieces.push_back({k, a, std::min(n, a + kPiece)});
  }
  const float gs = static_cast<float>(grad_scale);
  const bool scaled = grad_scale != 1.0;
#pragma omp parallel for schedule(dynamic, 4)
  for (int64_t i = 0; i < static_cast<int64_t>(pieces.size()); ++i) {
    const Piece& piece = pieces[static_cast<size_t>(i)];
    AdamWTensors& t = tensors[piece.tensor];
    const float decay = t.decay ? c.decay_factor : 1.0f;
    int32_t bad = 0;
    if (!t.compute_copy.defined())
      bad = adamw_f32_piece<void>(t, piece.a, piece.b, c, decay, gs, scaled);
    else if (t.compute_copy.dtype() == DType::kBF16)
      bad = adamw_f32_piece<BFloat16>(t, piece.a, piece.b, c, decay, gs, scaled);
    else
      bad = adamw_f32_piece<Float16>(t, piece.a, piece.b, c, decay, gs, scaled);
    if (bad != 0 && flags != nullptr) {
#pragma omp atomic
      flags[piece.tensor] |= bad;
    }
  }
}

}  // namespace

void adamw_step(Tensor& param, Tensor& exp_avg, Tensor& exp_avg_sq, const Tensor& grad, const AdamWOptions& o) {
  adamw_scaled(param, exp_avg, exp_avg_sq, grad, o, 1.0, nullptr);
}

void adamw_step_multi(std::vector<AdamWTensors>& tensors, const AdamWOptions& o, double grad_scale,
                      Tensor* nonfinite_flags) {
  int32_t* flags = nullptr;
  if (nonfinite_flags != nullptr) {
    check_arg(*nonfinite_flags, "adamw_step_multi", "nonfinite_flags", DType::kI32,
              {static_cast<int64_t>(tensors.size())});
    flags = nonfinite_flags->data<int32_t>();
  }
  if (o.host_f32) return adamw_multi_host_f32(tensors, o, grad_scale, flags);
  for (size_t k = 0; k < tensors.size(); ++k) {
    AdamWTensors& t = tensors[k];
    AdamWOptions one = o;
    if (!t.decay) one.weight_decay = 0.0;
    adamw_scaled(t.param, t.exp_avg, t.exp_avg_sq, t.grad, one, grad_scale, flags != nullptr ? flags + k : nullptr);
    if (t.compute_copy.defined()) {
      ST_CHECK(t.compute_copy.numel() == t.param.numel(), "adamw_step_multi: compute copy ", t.compute_copy.str(),
               " does not match param ", t.param.str());
      cast(t.compute_copy, t.param);  // the same rounding as a cast after the step
    }
  }
}

}  // namespace shardtrain::ops::cpu
