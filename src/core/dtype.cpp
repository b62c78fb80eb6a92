// DType names and IEEE binary16 conversions (round to nearest even, subnormals exact).
#include "core/dtype.h"

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
  ST_THROW(what, ": unknown dtype `", name, "`; expected one of f32, f64, bf16, f16, i32, i64");
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
