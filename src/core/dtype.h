// Element types as a runtime property of a tensor, and exact bf16/f16/fp8 <-> f32 conversions
// (round to nearest even, NaN preserved) on the host; device code uses CUDA intrinsics.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace shardtrain {

// kF8E4M3 and kF8E5M2 are OCP FP8 (e4m3fn: no infinities, one NaN code; e5m2: IEEE-like),
// storage for the operands of FP8 products (ops/fp8.h), not for arithmetic of their own.
enum class DType : uint8_t { kF32, kF64, kBF16, kF16, kI32, kI64, kU8, kF8E4M3, kF8E5M2 };

constexpr size_t dtype_size(DType t) {
  switch (t) {
    case DType::kF64:
    case DType::kI64:
      return 8;
    case DType::kF32:
    case DType::kI32:
      return 4;
    case DType::kBF16:
    case DType::kF16:
      return 2;
    case DType::kU8:
    case DType::kF8E4M3:
    case DType::kF8E5M2:
      return 1;
  }
  return 0;
}

constexpr bool is_floating(DType t) {
  return t == DType::kF32 || t == DType::kF64 || t == DType::kBF16 || t == DType::kF16;
}

std::string_view dtype_name(DType t);
// Parses "f32", "float32", "bf16", "bfloat16", ...; throws Error naming `what` otherwise.
DType parse_dtype(std::string_view name, std::string_view what);

// Maps a C++ element type to its DType.
template <typename T>
struct DTypeOf;
template <> struct DTypeOf<float> { static constexpr DType value = DType::kF32; };
template <> struct DTypeOf<double> { static constexpr DType value = DType::kF64; };
template <> struct DTypeOf<int32_t> { static constexpr DType value = DType::kI32; };
template <> struct DTypeOf<int64_t> { static constexpr DType value = DType::kI64; };
template <> struct DTypeOf<uint8_t> { static constexpr DType value = DType::kU8; };

// Storage-only half types. Arithmetic goes through float.
struct BFloat16 {
  uint16_t bits;
};
struct Float16 {
  uint16_t bits;
};
template <> struct DTypeOf<BFloat16> { static constexpr DType value = DType::kBF16; };
template <> struct DTypeOf<Float16> { static constexpr DType value = DType::kF16; };

inline uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline float bf16_to_float(BFloat16 h) { return bits_float(static_cast<uint32_t>(h.bits) << 16); }

inline BFloat16 float_to_bf16(float f) {
  uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return BFloat16{static_cast<uint16_t>((u >> 16) | 0x40)};
  uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
  return BFloat16{static_cast<uint16_t>((u + rounding) >> 16)};
}

float f16_to_float(Float16 h);
Float16 float_to_f16(float f);

constexpr bool is_fp8(DType t) { return t == DType::kF8E4M3 || t == DType::kF8E5M2; }
// The largest finite value of an FP8 format: 448 (e4m3), 57344 (e5m2).
constexpr float fp8_max(DType t) { return t == DType::kF8E4M3 ? 448.0f : 57344.0f; }
// f32 -> FP8 code, round to nearest even, saturating: a magnitude above the format's largest
// finite value (infinity included) becomes that value with the sign kept; NaN becomes 0x7f.
// These are the rules of CUDA's cvt.rn.satfinite, which the device kernels use.
uint8_t float_to_fp8(float f, DType format);
// FP8 code -> f32, exact (NaN codes give NaN; e5m2's infinities give infinities).
float fp8_to_float(uint8_t code, DType format);

}  // namespace shardtrain
