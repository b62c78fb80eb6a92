// FP8 quantisation of a product's operands: e4m3 or e5m2 codes with f32 power-of-two scales
// per tensor, per row, per 1x128 group or per 128x128 block (DESIGN: low precision is a
// property of a product's inputs). The CPU version is the oracle: the CUDA kernels give the
// same codes and scales bit for bit.
//
// Letters local to this file: R an operand's rows, C its columns (the product's reduction
// dimension K), P = C padded with zeros: to a multiple of 16 (FP8 products read rows of
// 16-byte multiples), of 128 with block scalings (whole groups).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string_view>

#include "core/profile.h"
#include "core/tensor.h"
#include "ops/dispatch.h"

#ifdef __CUDACC__
#define ST_FP8_HOST_DEVICE __host__ __device__
#else
#define ST_FP8_HOST_DEVICE
#endif

namespace shardtrain::ops {

// How an operand's scales are grouped (cuBLASLt's scale modes on Hopper).
enum class Fp8Scaling : uint8_t {
  kTensor,        // one scale for the whole operand
  kRow,           // one per row (cuBLASLt's outer vector)
  kBlock1x128,    // one per 128 consecutive elements of a row (VEC128)
  kBlock128x128,  // one per 128x128 block (BLK128x128)
};
std::string_view fp8_scaling_name(Fp8Scaling scaling);

// The recipes of `training.fp8`: how each operand of a block's products is scaled.
//   tensorwise: every operand one scale per tensor from its current amax;
//   rowwise: every operand one scale per row of the product's operand (so a transposed
//     operand, x^T for a weight gradient, has one per column of x);
//   blockwise: weights one per 128x128 block, activations and gradients one per 1x128 group
//     (DeepSeek-V3's recipe).
enum class Fp8Recipe : uint8_t { kOff, kTensorwise, kRowwise, kBlockwise };
std::string_view fp8_recipe_name(Fp8Recipe recipe);
// "off", "tensorwise", "rowwise", "blockwise"; a clear error naming `what` otherwise.
Fp8Recipe parse_fp8_recipe(std::string_view name, std::string_view what);

enum class Fp8Role : uint8_t { kActivation, kWeight, kGradient };
Fp8Scaling fp8_scaling(Fp8Recipe recipe, Fp8Role role);

// P for C columns: FP8 operands' rows are padded with zeros to a multiple of 16 elements, of
// 128 with block scalings.
constexpr int64_t fp8_padded(int64_t cols, Fp8Scaling scaling) {
  const int64_t align = scaling == Fp8Scaling::kBlock1x128 || scaling == Fp8Scaling::kBlock128x128 ? 128 : 16;
  return (cols + align - 1) / align * align;
}

// An FP8 operand of a product: R rows of C elements, each row padded with zeros to P.
//   data_RP: [R, P] f8e4m3 or f8e5m2; value = fp8_to_float(code) * scale of its group.
//   scale:   f32 dequantisation factors (powers of two), laid out as cuBLASLt reads them:
//     kTensor [1]; kRow [R]; kBlock1x128 [ceil(P/128), R] (R contiguous);
//     kBlock128x128 [ceil(R/128), ceil(P/128) rounded up to 4] (the entries past
//     ceil(P/128) in a row are padding).
struct Fp8Operand {
  Tensor data_RP;
  Tensor scale;
  Fp8Scaling scaling = Fp8Scaling::kTensor;
  int64_t cols = 0;  // C: the columns before padding

  int64_t rows() const { return data_RP.defined() ? data_RP.size(0) : 0; }
  int64_t padded_cols() const { return data_RP.defined() ? data_RP.size(1) : 0; }
};
Shape fp8_scale_shape(Fp8Scaling scaling, int64_t rows, int64_t padded_cols);

// The multiplier that quantisation applies to a group whose largest magnitude is `amax`: the
// largest power of two that keeps amax * factor within the format's largest value `fmax`
// (448 for e4m3, 57344 for e5m2), at most 2^126; 1 for an all-zero group; NaN when amax is
// not finite (the codes become NaN, and so does the product). A power of two makes the
// scaling exact: the only rounding is the FP8 code's own. Its dequantisation factor is
// 1 / factor, exact too.
ST_FP8_HOST_DEVICE inline float fp8_quantize_factor(float amax, float fmax) {
  if (!(amax <= 3.4028234663852886e38f)) return NAN;  // NaN or infinite
  if (amax == 0.0f) return 1.0f;
  const float ratio = fmax / amax;  // IEEE division, the same on host and device; a normal number
  if (!(ratio < 0x1p126f)) return 0x1p126f;
  // the power of two at or below ratio: its exponent bits alone
#ifdef __CUDA_ARCH__
  return __uint_as_float(__float_as_uint(ratio) & 0xff800000u);
#else
  uint32_t bits;
  std::memcpy(&bits, &ratio, sizeof bits);
  bits &= 0xff800000u;
  float power;
  std::memcpy(&power, &bits, sizeof power);
  return power;
#endif
}

struct Fp8QuantizeOptions {
  Fp8Scaling scaling = Fp8Scaling::kTensor;
  DType format = DType::kF8E4M3;  // f8e4m3 or f8e5m2
  // kTensor only (ignored otherwise): x's amax, one i32 on x's device holding the u32 bits of
  // max |x| (integer order is float order for magnitudes, NaN above all). With amax_ready it
  // is x's amax already (made by the op that made x, or by an earlier quantisation of x), and
  // no pass computes it; without, the pass writes it there for later ones.
  Tensor amax = {};
  bool amax_ready = false;
};

// Quantises x_RC (f32, bf16 or f16; rows may be a pitch apart) into q_RC, the operand whose
// rows are x's rows, and/or qt_CR, the operand whose rows are x's columns (x^T, for a product
// that reduces over x's rows: a weight gradient). Either pointer may be null; what is given
// is overwritten with newly allocated data and scales on x's device. Each operand's groups
// follow its own rows: with kRow, q has one scale per row of x and qt one per column. With
// kTensor both share x's amax. Codes round to nearest even and saturate (float_to_fp8).
// CUDA: one pass over x for the block scalings; for kTensor and kRow one pass for the amax
// and one to write both operands.
namespace cpu {
void fp8_quantize(Fp8Operand* q_RC, Fp8Operand* qt_CR, const Tensor& x_RC, const Fp8QuantizeOptions& options);
// out_RC (f32, overwrites) = the values q holds, its first C columns.
void fp8_dequantize(Tensor& out_RC, const Fp8Operand& q);
}  // namespace cpu

namespace cuda {
void fp8_quantize(Fp8Operand* q_RC, Fp8Operand* qt_CR, const Tensor& x_RC, const Fp8QuantizeOptions& options,
                  Stream stream);
}  // namespace cuda

inline void fp8_quantize(Fp8Operand* q_RC, Fp8Operand* qt_CR, const Tensor& x_RC, const Fp8QuantizeOptions& options,
                         [[maybe_unused]] Stream stream = {}) {
  const double out_bytes = static_cast<double>(x_RC.numel()) * ((q_RC ? 1 : 0) + (qt_CR ? 1 : 0));
  profile::ScopedTimer profile_timer("fp8_quantize", x_RC.device(),
                                     {0, static_cast<double>(x_RC.nbytes()) + out_bytes});
  if (x_RC.device().is_cpu()) return cpu::fp8_quantize(q_RC, qt_CR, x_RC, options);
#ifdef SHARDTRAIN_WITH_CUDA
  return cuda::fp8_quantize(q_RC, qt_CR, x_RC, options, stream);
#else
  no_kernel("fp8_quantize", x_RC);
#endif
}

}  // namespace shardtrain::ops
