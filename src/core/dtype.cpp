// DType names and IEEE binary16 conversions (round to nearest even, subnormals exact).
#include "core/dtype.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "core/error.h"

namespace shardtrain {

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::kF32: return "f32";
    case DType::kF64: return "f64";
    case DType::kBF16: return "bf16";
    case DType::kF16: return "f16";
    case DType::kI32: return "i32";
    case DType::kI64: return "i64";
    case DType::kU8: return "u8";
    case DType::kF8E4M3: return "f8e4m3";
    case DType::kF8E5M2: return "f8e5m2";
  }
  return "?";
}

DType parse_dtype(std::string_view name, std::string_view what) {
  if (name == "f32" || name == "float32") return DType::kF32;
  if (name == "f64" || name == "float64") return DType::kF64;
  if (name == "bf16" || name == "bfloat16") return DType::kBF16;
  if (name == "f16" || name == "float16") return DType::kF16;
  if (name == "i32" || name == "int32") return DType::kI32;
  if (name == "i64" || name == "int64") return DType::kI64;
  if (name == "f8e4m3" || name == "float8_e4m3fn") return DType::kF8E4M3;
  if (name == "f8e5m2" || name == "float8_e5m2") return DType::kF8E5M2;
  ST_THROW(what, ": unknown dtype `", name, "`; expected one of f32, f64, bf16, f16, i32, i64, f8e4m3, f8e5m2");
}

float f16_to_float(Float16 h) {
  const uint32_t sign = (h.bits & 0x8000u) << 16;
  const uint32_t exp = (h.bits >> 10) & 0x1f;
  const uint32_t mant = h.bits & 0x3ff;
  if (exp == 0) {
    // zero or subnormal: mant * 2^-24, exact in f32
    float v = std::ldexp(static_cast<float>(mant), -24);
    return sign ? -v : v;
  }
  if (exp == 31) return bits_float(sign | 0x7f800000u | (mant << 13));
  return bits_float(sign | ((exp + 112) << 23) | (mant << 13));
}

Float16 float_to_f16(float f) {
  const uint32_t u = float_bits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return Float16{static_cast<uint16_t>(sign | 0x7e00u)};  // NaN
  if (abs >= 0x477ff000u) return Float16{static_cast<uint16_t>(sign | 0x7c00u)};  // overflow
  if (abs < 0x38800000u) {
    // result is subnormal or zero: round abs * 2^24 to the nearest integer, ties to even
    const float scaled = bits_float(abs) * 16777216.0f;  // exact: power-of-two scale
    const float r = std::nearbyint(scaled);             // default rounding mode: nearest even
    return Float16{static_cast<uint16_t>(sign | static_cast<uint16_t>(r))};
  }
  // normal: rebias exponent, round mantissa from 23 to 10 bits, nearest even
  uint32_t v = abs - (112u << 23);
  const uint32_t rounding = 0xfffu + ((v >> 13) & 1u);
  v = (v + rounding) >> 13;
  return Float16{static_cast<uint16_t>(sign | v)};
}

}  // namespace shardtrain

namespace shardtrain {
namespace {

// An FP8 format's fields: mantissa bits, exponent bias, and the smallest normal exponent.
struct Fp8Format {
  int mantissa_bits;
  int bias;
  int min_exponent() const { return 1 - bias; }
};
Fp8Format fp8_format(DType t) { return t == DType::kF8E4M3 ? Fp8Format{3, 7} : Fp8Format{2, 15}; }

}  // namespace

uint8_t float_to_fp8(float f, DType format) {
  ST_ASSERT(is_fp8(format), "float_to_fp8: ", dtype_name(format), " is not an FP8 format");
  if (std::isnan(f)) return 0x7f;
  const Fp8Format fmt = fp8_format(format);
  const uint8_t sign = std::signbit(f) ? 0x80 : 0;
  // saturate first: every magnitude above the largest finite value rounds to it (satfinite)
  const float a = std::min(std::fabs(f), fp8_max(format));
  if (a == 0) return sign;
  // the grid's spacing at a: 2^(e - m) for a in [2^e, 2^(e+1)), e at least the smallest normal
  // exponent (below it the subnormals share that spacing); a / spacing is exact
  int e = 0;
  std::frexp(a, &e);  // a = f * 2^e, f in [0.5, 1): the exponent of a is e - 1
  const int exponent = std::max(e - 1, fmt.min_exponent());
  const float steps = std::nearbyint(std::ldexp(a, fmt.mantissa_bits - exponent));  // ties to even
  // steps in [2^m, 2^(m+1)] for a normal, [0, 2^m] for a subnormal; 2^(m+1) moves up a binade
  int64_t n = static_cast<int64_t>(steps);
  int biased = exponent + fmt.bias;
  if (n >= (int64_t{2} << fmt.mantissa_bits)) {
    n >>= 1;
    ++biased;
  }
  if (n < (int64_t{1} << fmt.mantissa_bits)) return static_cast<uint8_t>(sign | n);  // subnormal (biased 0)
  const int64_t mantissa = n - (int64_t{1} << fmt.mantissa_bits);
  return static_cast<uint8_t>(sign | (biased << fmt.mantissa_bits) | mantissa);
}

float fp8_to_float(uint8_t code, DType format) {
  ST_ASSERT(is_fp8(format), "fp8_to_float: ", dtype_name(format), " is not an FP8 format");
  const Fp8Format fmt = fp8_format(format);
  const bool negative = (code & 0x80) != 0;
  const int bits = code & 0x7f;
  const int biased = bits >> fmt.mantissa_bits, mantissa = bits & ((1 << fmt.mantissa_bits) - 1);
  float v;
  if (format == DType::kF8E4M3 && bits == 0x7f) {
    v = NAN;
  } else if (format == DType::kF8E5M2 && biased == 31) {
    v = mantissa == 0 ? INFINITY : NAN;
  } else if (biased == 0) {
    v = std::ldexp(static_cast<float>(mantissa), fmt.min_exponent() - fmt.mantissa_bits);
  } else {
    v = std::ldexp(static_cast<float>(mantissa + (1 << fmt.mantissa_bits)), biased - fmt.bias - fmt.mantissa_bits);
  }
  return negative ? -v : v;
}

}  // namespace shardtrain
