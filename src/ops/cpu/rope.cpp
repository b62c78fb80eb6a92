// CPU rotary embedding (HF rotate_half pairing, whole or partial heads) and its frequency
// tables with llama3, linear or LongRoPE scaling.
#include <cmath>
#include <numbers>

#include "ops/cpu/common.h"
#include "ops/rope.h"

namespace shardtrain::ops {

int64_t rope_rotary_dim(int64_t head_dim, const RopeOptions& o) {
  ST_CHECK(head_dim > 0 && head_dim % 2 == 0, "rope: head dimension must be even and positive, found ", head_dim);
  ST_CHECK(o.partial_rotary > 0 && o.partial_rotary <= 1, "rope: the rotated fraction of each head (partial_rotary) ",
           "must be in (0, 1], found ", o.partial_rotary);
  // as transformers: int(head_dim * partial_rotary_factor)
  const auto R = static_cast<int64_t>(static_cast<double>(head_dim) * o.partial_rotary);
  ST_CHECK(R > 0 && R % 2 == 0, "rope: a rotated fraction of ", o.partial_rotary, " of heads of ", head_dim,
           " rotates int(", head_dim, " x ", o.partial_rotary, ") = ", R,
           " dimensions, which must be even and > 0; choose a fraction that gives an even number");
  return R;
}

bool rope_long_factors(const RopeOptions& o, int64_t length) {
  return o.scaling.type == RopeScalingType::kLongRope && length > o.scaling.original_max_positions;
}

std::vector<double> rope_inv_frequencies(int64_t head_dim, const RopeOptions& o, bool long_factors) {
  const int64_t R = rope_rotary_dim(head_dim, o), K = R / 2;
  std::vector<double> inv(static_cast<size_t>(K));
  for (int64_t k = 0; k < K; ++k)
    inv[static_cast<size_t>(k)] = 1.0 / std::pow(o.theta, static_cast<double>(2 * k) / static_cast<double>(R));
  if (o.scaling.type == RopeScalingType::kLongRope) {
    const std::vector<double>& ext = long_factors ? o.scaling.long_factor : o.scaling.short_factor;
    ST_CHECK(static_cast<int64_t>(ext.size()) == K, "rope: LongRoPE's ", long_factors ? "long" : "short",
             "_factor has ", ext.size(), " entries; heads rotating ", R, " dimensions need ", K,
             " (one per frequency)");
    for (int64_t k = 0; k < K; ++k) inv[static_cast<size_t>(k)] /= ext[static_cast<size_t>(k)];
  }
  if (o.scaling.type == RopeScalingType::kLinear)
    for (double& f : inv) f /= o.scaling.factor;
  if (o.scaling.type == RopeScalingType::kLlama3) {
    const RopeScaling& s = o.scaling;
    const double orig = static_cast<double>(s.original_max_positions);
    const double low_wavelen = orig / s.low_freq_factor, high_wavelen = orig / s.high_freq_factor;
    for (double& f : inv) {
      const double wavelen = 2 * std::numbers::pi / f;
      if (wavelen > low_wavelen) {
        f /= s.factor;
      } else if (wavelen >= high_wavelen) {
        const double smooth = (orig / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
        f = (1 - smooth) * f / s.factor + smooth * f;
      }
    }
  }
  return inv;
}

void rope_table(Tensor& cos_TK, Tensor& sin_TK, int64_t head_dim, const RopeOptions& options, bool long_factors) {
  cpu::check_arg(cos_TK, "rope_table", "cos_TK");
  const int64_t K = rope_rotary_dim(head_dim, options) / 2;
  ST_CHECK(cos_TK.ndim() == 2 && cos_TK.size(1) == K, "rope_table: `cos_TK` must be [T, ", K, "], found ",
           cos_TK.str());
  cpu::check_arg(sin_TK, "rope_table", "sin_TK", cos_TK.dtype(), cos_TK.shape());
  const std::vector<double> inv = rope_inv_frequencies(head_dim, options, long_factors);
  const int64_t T = cos_TK.size(0);
  // LongRoPE's attention factor scales cos and sin (1 otherwise)
  const double scale = options.scaling.type == RopeScalingType::kLongRope ? options.scaling.attention_factor : 1.0;
  cpu::dispatch_real(cos_TK, "rope_table", "cos_TK", [&]<typename F>() {
    F* c = cos_TK.data<F>();
    F* s = sin_TK.data<F>();
    for (int64_t t = 0; t < T; ++t)
      for (int64_t k = 0; k < K; ++k) {
        const double angle = static_cast<double>(t) * inv[static_cast<size_t>(k)];
        c[t * K + k] = static_cast<F>(std::cos(angle) * scale);
        s[t * K + k] = static_cast<F>(std::sin(angle) * scale);
      }
  });
}

namespace cpu {
namespace {

void rotate(Tensor& x, const Tensor& cos_TK, const Tensor& sin_TK, const Tensor& positions_BT, double sign,
            const char* op) {
  check_cpu_float(x, op, "x_BTNH");
  ST_CHECK(x.ndim() == 4 && x.size(3) % 2 == 0, op, ": `x_BTNH` must be [B, T, heads, H] with even H, found ",
           x.str());
  const int64_t B = x.size(0), T = x.size(1), heads = x.size(2), H = x.size(3);
  const int64_t pitch = token_pitch(x, op, "x_BTNH");  // more than heads·H for heads of a stacked tensor
  check_arg(cos_TK, op, "cos_TK");
  // K frequencies rotate each head's first 2K elements (all H, or a partial rotary's share)
  const int64_t K = cos_TK.ndim() == 2 ? cos_TK.size(1) : 0;
  ST_CHECK(cos_TK.ndim() == 2 && K >= 1 && 2 * K <= H && cos_TK.size(0) >= T, op, ": `cos_TK` must be [>= ", T,
           ", K] with 1 <= K <= ", H / 2, " (heads of ", H, "), found ", cos_TK.str());
  check_dtype(cos_TK, x.dtype(), op, "cos_TK");
  check_arg(sin_TK, op, "sin_TK", x.dtype(), cos_TK.shape());
  const int32_t* pos = nullptr;
  if (positions_BT.defined()) {
    check_arg(positions_BT, op, "positions_BT", DType::kI32, {B, T});
    pos = positions_BT.data<int32_t>();
    for (int64_t i = 0; i < B * T; ++i)
      ST_CHECK(pos[i] >= 0 && pos[i] < cos_TK.size(0), op, ": position ", pos[i], " of token ", i,
               " outside the tables' ", cos_TK.size(0), " rows");
  }
  dispatch_real(x, op, "x_BTNH", [&]<typename F>() {
    F* p = x.data<F>();
    const F* c = cos_TK.data<F>();
    const F* s = sin_TK.data<F>();
#pragma omp parallel for collapse(2) if (B * T * heads * K > 65536)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < T; ++t)
        for (int64_t h = 0; h < heads; ++h) {
          F* row = p + (b * T + t) * pitch + h * H;
          const int64_t r = pos != nullptr ? pos[b * T + t] : t;  // the table row
          for (int64_t k = 0; k < K; ++k) {
            const F ck = c[r * K + k], sk = static_cast<F>(sign) * s[r * K + k];
            const F a = row[k], bb = row[k + K];
            row[k] = a * ck - bb * sk;
            row[k + K] = bb * ck + a * sk;
          }
        }
  });
}

}  // namespace

void rope_forward(Tensor& x_BTNH, const Tensor& cos_TK, const Tensor& sin_TK, const Tensor& positions_BT) {
  rotate(x_BTNH, cos_TK, sin_TK, positions_BT, 1.0, "rope_forward");
}

void rope_backward(Tensor& dx_BTNH, const Tensor& cos_TK, const Tensor& sin_TK, const Tensor& positions_BT) {
  rotate(dx_BTNH, cos_TK, sin_TK, positions_BT, -1.0, "rope_backward");
}

}  // namespace cpu
}  // namespace shardtrain::ops
