// CPU FP8 quantisation, the oracle of the CUDA kernels: for each group of an operand its
// amax (as the bits of |v|, so NaN wins as in the device's integer atomics), the factor of
// fp8_quantize_factor, and each code by float_to_fp8 of v * factor.
#include <algorithm>
#include <cstring>
#include <functional>
#include <vector>

#include "core/error.h"
#include "ops/fp8.h"

namespace shardtrain::ops {

std::string_view fp8_scaling_name(Fp8Scaling scaling) {
  switch (scaling) {
    case Fp8Scaling::kTensor: return "tensor";
    case Fp8Scaling::kRow: return "row";
    case Fp8Scaling::kBlock1x128: return "1x128";
    case Fp8Scaling::kBlock128x128: return "128x128";
  }
  return "?";
}

std::string_view fp8_recipe_name(Fp8Recipe recipe) {
  switch (recipe) {
    case Fp8Recipe::kOff: return "off";
    case Fp8Recipe::kTensorwise: return "tensorwise";
    case Fp8Recipe::kRowwise: return "rowwise";
    case Fp8Recipe::kBlockwise: return "blockwise";
  }
  return "?";
}

Fp8Recipe parse_fp8_recipe(std::string_view name, std::string_view what) {
  for (Fp8Recipe r : {Fp8Recipe::kOff, Fp8Recipe::kTensorwise, Fp8Recipe::kRowwise, Fp8Recipe::kBlockwise})
    if (name == fp8_recipe_name(r)) return r;
  ST_THROW(what, ": unknown FP8 recipe `", name, "`; expected off, tensorwise, rowwise or blockwise");
}

Fp8Scaling fp8_scaling(Fp8Recipe recipe, Fp8Role role) {
  switch (recipe) {
    case Fp8Recipe::kTensorwise: return Fp8Scaling::kTensor;
    case Fp8Recipe::kRowwise: return Fp8Scaling::kRow;
    case Fp8Recipe::kBlockwise: return role == Fp8Role::kWeight ? Fp8Scaling::kBlock128x128 : Fp8Scaling::kBlock1x128;
    case Fp8Recipe::kOff: break;
  }
  ST_THROW("fp8_scaling: the recipe is off");
}

Shape fp8_scale_shape(Fp8Scaling scaling, int64_t rows, int64_t padded_cols) {
  const int64_t col_blocks = (padded_cols + 127) / 128;
  switch (scaling) {
    case Fp8Scaling::kTensor: return {1};
    case Fp8Scaling::kRow: return {rows};
    case Fp8Scaling::kBlock1x128: return {col_blocks, rows};
    case Fp8Scaling::kBlock128x128: return {(rows + 127) / 128, (col_blocks + 3) / 4 * 4};
  }
  return {};
}

namespace cpu {
namespace {

float element(const char* base, DType t, int64_t i) {
  switch (t) {
    case DType::kF32: return reinterpret_cast<const float*>(base)[i];
    case DType::kF64: return static_cast<float>(reinterpret_cast<const double*>(base)[i]);
    case DType::kBF16: return bf16_to_float(reinterpret_cast<const BFloat16*>(base)[i]);
    case DType::kF16: return f16_to_float(reinterpret_cast<const Float16*>(base)[i]);
    default: ST_THROW("fp8_quantize: x must be f32, f64, bf16 or f16, found ", dtype_name(t));
  }
}

uint32_t magnitude_bits(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  return bits & 0x7fffffffu;
}
float bits_value(uint32_t bits) {
  float v;
  std::memcpy(&v, &bits, sizeof v);
  return v;
}

// One operand of R rows and C columns whose values `at(r, c)` gives, quantised; with `tensor_amax`
// (kTensor) the tensor's amax bits given instead of found.
void quantize_operand(Fp8Operand& q, int64_t R, int64_t C, const std::function<float(int64_t, int64_t)>& at,
                      const Fp8QuantizeOptions& o, const uint32_t* tensor_amax) {
  const int64_t P = fp8_padded(C, o.scaling);
  q.scaling = o.scaling;
  q.cols = C;
  q.data_RP = Tensor::empty({R, P}, o.format, Device::cpu(), "FP8 operand");
  q.scale = Tensor::empty(fp8_scale_shape(o.scaling, R, P), DType::kF32, Device::cpu(), "FP8 scales");
  const int64_t col_blocks = (P + 127) / 128;
  // the group of element (r, c), and the groups' count
  std::function<int64_t(int64_t, int64_t)> group;
  int64_t groups = 0;
  switch (o.scaling) {
    case Fp8Scaling::kTensor:
      group = [](int64_t, int64_t) { return int64_t{0}; };
      groups = 1;
      break;
    case Fp8Scaling::kRow:
      group = [](int64_t r, int64_t) { return r; };
      groups = R;
      break;
    case Fp8Scaling::kBlock1x128:
      group = [R](int64_t r, int64_t c) { return c / 128 * R + r; };
      groups = col_blocks * R;
      break;
    case Fp8Scaling::kBlock128x128: {
      const int64_t ld = q.scale.size(1);
      group = [ld](int64_t r, int64_t c) { return r / 128 * ld + c / 128; };
      groups = q.scale.numel();
      break;
    }
  }
  std::vector<uint32_t> amax(static_cast<size_t>(groups), 0);
  if (tensor_amax != nullptr) {
    amax[0] = *tensor_amax;
  } else {
    for (int64_t r = 0; r < R; ++r)
      for (int64_t c = 0; c < C; ++c) {
        uint32_t& m = amax[static_cast<size_t>(group(r, c))];
        m = std::max(m, magnitude_bits(at(r, c)));
      }
  }
  const float fmax = fp8_max(o.format);
  std::vector<float> factor(static_cast<size_t>(groups));
  float* scale = q.scale.data<float>();
  for (int64_t g = 0; g < groups; ++g) {
    factor[static_cast<size_t>(g)] = fp8_quantize_factor(bits_value(amax[static_cast<size_t>(g)]), fmax);
    scale[g] = 1.0f / factor[static_cast<size_t>(g)];
  }
  if (o.scaling == Fp8Scaling::kBlock128x128)  // padding entries of each row of blocks: 1
    for (int64_t rb = 0; rb < q.scale.size(0); ++rb)
      for (int64_t cb = col_blocks; cb < q.scale.size(1); ++cb) scale[rb * q.scale.size(1) + cb] = 1.0f;
  uint8_t* codes = static_cast<uint8_t*>(q.data_RP.raw_data());
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < P; ++c) {
      const float v = c < C ? at(r, c) : 0.0f;
      codes[r * P + c] = float_to_fp8(v * factor[static_cast<size_t>(group(r, c))], o.format);
    }
}

}  // namespace

void fp8_quantize(Fp8Operand* q_RC, Fp8Operand* qt_CR, const Tensor& x_RC, const Fp8QuantizeOptions& options) {
  const char* op = "fp8_quantize";
  ST_CHECK(x_RC.device().is_cpu(), op, ": `x_RC` must be on the CPU, found ", x_RC.str());
  ST_CHECK(is_fp8(options.format), op, ": the format must be f8e4m3 or f8e5m2, found ", dtype_name(options.format));
  RowLayout l;
  ST_CHECK(x_RC.ndim() == 2 && row_layout(x_RC, 1, l), op, ": `x_RC` must be 2-D with contiguous rows, found ",
           x_RC.str());
  const char* base = static_cast<const char*>(x_RC.raw_data());
  const DType t = x_RC.dtype();
  const int64_t R = l.rows, C = l.cols, pitch = l.pitch;
  // tensor scaling: x's amax, given or found once (x^T shares it: the same values)
  uint32_t tensor_amax = 0;
  const bool tensor = options.scaling == Fp8Scaling::kTensor;
  if (tensor) {
    uint32_t* given = nullptr;
    if (options.amax.defined()) {
      ST_CHECK(options.amax.device().is_cpu() && options.amax.dtype() == DType::kI32 && options.amax.numel() == 1, op,
               ": the amax must be one i32 on the CPU, found ", options.amax.str());
      given = static_cast<uint32_t*>(options.amax.raw_data());
    }
    if (given != nullptr && options.amax_ready) {
      tensor_amax = *given;
    } else {
      for (int64_t r = 0; r < R; ++r)
        for (int64_t c = 0; c < C; ++c) tensor_amax = std::max(tensor_amax, magnitude_bits(element(base, t, r * pitch + c)));
      if (given != nullptr) *given = tensor_amax;
    }
  }
  const uint32_t* known = tensor ? &tensor_amax : nullptr;
  if (q_RC)
    quantize_operand(*q_RC, R, C, [&](int64_t r, int64_t c) { return element(base, t, r * pitch + c); }, options,
                     known);
  if (qt_CR) {
    // x^T: its rows are x's columns
    quantize_operand(*qt_CR, C, R, [&](int64_t r, int64_t c) { return element(base, t, c * pitch + r); }, options,
                     known);
  }
}

void fp8_dequantize(Tensor& out_RC, const Fp8Operand& q) {
  const char* op = "fp8_dequantize";
  ST_CHECK(q.data_RP.device().is_cpu(), op, ": the operand must be on the CPU");
  const int64_t R = q.rows(), C = q.cols, P = q.padded_cols();
  ST_CHECK(out_RC.dtype() == DType::kF32 && out_RC.is_contiguous() && out_RC.shape() == Shape({R, C}), op,
           ": `out_RC` must be contiguous f32[", R, ", ", C, "], found ", out_RC.str());
  ST_CHECK(q.scale.shape() == fp8_scale_shape(q.scaling, R, P), op, ": scales ", q.scale.str(), " for ",
           fp8_scaling_name(q.scaling), " scaling of [", R, ", ", P, "]");
  const uint8_t* codes = static_cast<const uint8_t*>(q.data_RP.raw_data());
  const float* scale = q.scale.data<float>();
  float* out = out_RC.data<float>();
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < C; ++c) {
      float s = 0;
      switch (q.scaling) {
        case Fp8Scaling::kTensor: s = scale[0]; break;
        case Fp8Scaling::kRow: s = scale[r]; break;
        case Fp8Scaling::kBlock1x128: s = scale[c / 128 * R + r]; break;
        case Fp8Scaling::kBlock128x128: s = scale[r / 128 * q.scale.size(1) + c / 128]; break;
      }
      out[r * C + c] = fp8_to_float(codes[r * P + c], q.data_RP.dtype()) * s;
    }
}

}  // namespace cpu
}  // namespace shardtrain::ops
