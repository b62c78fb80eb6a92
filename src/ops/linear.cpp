// The linear's FP8 forms, the same on both devices: each quantises the operands its products
// need (ops/fp8.h) and multiplies them with fp8_product; the device's kernels do the work. Also
// the process's GEMM selection and each thread's SM reserve (linear.h).
#include "ops/linear.h"

#include <atomic>

namespace shardtrain::ops {

namespace {
std::atomic<GemmSelection> g_gemm_selection{GemmSelection::kHeuristic};
}  // namespace

void set_gemm_selection(GemmSelection selection) { g_gemm_selection = selection; }
GemmSelection gemm_selection() { return g_gemm_selection; }

namespace {
thread_local int t_gemm_sm_reserve = 0;
}  // namespace

GemmSmReserve::GemmSmReserve(int sms) : previous_(t_gemm_sm_reserve) {
  ST_CHECK(sms >= 0, "GEMM SM reserve: expected 0 or more SMs, found ", sms);
  t_gemm_sm_reserve = sms;
}
GemmSmReserve::~GemmSmReserve() { t_gemm_sm_reserve = previous_; }
int gemm_sm_reserve() { return t_gemm_sm_reserve; }

namespace {

// The role's scaling and format, with the amax the call knows of (tensorwise x and dy).
Fp8QuantizeOptions quantize_options(const LinearFp8& fp8, Fp8Role role) {
  Fp8QuantizeOptions o{fp8_scaling(fp8.recipe, role), role == Fp8Role::kGradient ? fp8.gradient_format : DType::kF8E4M3};
  if (o.scaling == Fp8Scaling::kTensor && role == Fp8Role::kActivation) {
    o.amax = fp8.x_amax;
    o.amax_ready = fp8.x_amax_ready;
  }
  if (o.scaling == Fp8Scaling::kTensor && role == Fp8Role::kGradient && fp8.dy_amax.defined()) {
    o.amax = fp8.dy_amax;
    o.amax_ready = true;
  }
  return o;
}

void check_formats(const LinearFp8& fp8, const char* op) {
  ST_CHECK(fp8.gradient_format == DType::kF8E4M3 || fp8.gradient_format == DType::kF8E5M2, op,
           ": the gradient format must be f8e4m3 or f8e5m2, found ", dtype_name(fp8.gradient_format));
}

}  // namespace

void linear_forward_fp8(Tensor& y_TO, const Tensor& x_TI, const Tensor& weight_OI, const Tensor& bias_O,
                        const Tensor& residual_TO, const LinearFp8& fp8, Stream stream) {
  const char* op = residual_TO.defined() ? "linear_forward_add (FP8)" : "linear_forward (FP8)";
  check_formats(fp8, op);
  ST_CHECK(x_TI.ndim() == 2 && weight_OI.ndim() == 2 && y_TO.ndim() == 2, op,
           ": `x_TI`, `weight_OI` and `y_TO` must be 2-D, found ", x_TI.str(), ", ", weight_OI.str(), " and ",
           y_TO.str());
  const int64_t T = x_TI.size(0), I = x_TI.size(1), O = weight_OI.size(0);
  ST_CHECK(weight_OI.size(1) == I && y_TO.size(0) == T && y_TO.size(1) == O, op, ": shapes x ", x_TI.str(),
           ", weight ", weight_OI.str(), ", y ", y_TO.str(), " do not make y = x weight^T");
  Fp8Operand x8, w8;
  fp8_quantize(&x8, nullptr, x_TI, quantize_options(fp8, Fp8Role::kActivation), stream);
  fp8_quantize(&w8, nullptr, weight_OI, quantize_options(fp8, Fp8Role::kWeight), stream);
  fp8_product(y_TO, w8, x8, bias_O, residual_TO, {}, stream);
}

void linear_backward_fp8(Tensor& dx_TI, Tensor& dweight_OI, Tensor& dbias_O, const Tensor& dy_TO, const Tensor& x_TI,
                         const Tensor& weight_OI, const LinearBackwardOptions& options, Stream stream) {
  const char* op = "linear_backward (FP8)";
  const LinearFp8& fp8 = options.fp8;
  check_formats(fp8, op);
  ST_CHECK(x_TI.defined() || (dx_TI.defined() && !dweight_OI.defined()), op,
           ": `x_TI` may be undefined only in a call for `dx_TI` alone");
  ST_CHECK(dy_TO.ndim() == 2 && weight_OI.ndim() == 2, op, ": `dy_TO` and `weight_OI` must be 2-D, found ",
           dy_TO.str(), " and ", weight_OI.str());
  const int64_t T = dy_TO.size(0), O = dy_TO.size(1), I = weight_OI.size(1);
  ST_CHECK(weight_OI.size(0) == O, op, ": `weight_OI` ", weight_OI.str(), " for `dy_TO` ", dy_TO.str());
  if (T == 0) {
    // no tokens: nothing to quantise; the input-dtype op writes the zero gradients
    LinearBackwardOptions plain = options;
    plain.fp8 = {};
    return linear_backward(dx_TI, dweight_OI, dbias_O, dy_TO, x_TI, weight_OI, plain, stream);
  }
  const bool want_dx = dx_TI.defined() && I > 0, want_dw = dweight_OI.defined() && I > 0;
  Fp8Operand dy8, dyT8;  // dy's rows for dx, its columns (dy^T) for the weight gradient
  if (want_dx || want_dw)
    fp8_quantize(want_dx ? &dy8 : nullptr, want_dw ? &dyT8 : nullptr, dy_TO,
                 quantize_options(fp8, Fp8Role::kGradient), stream);
  if (want_dx) {
    ST_CHECK(dx_TI.ndim() == 2 && dx_TI.size(0) == T && dx_TI.size(1) == I, op, ": `dx_TI` must be [", T, ", ", I,
             "], found ", dx_TI.str());
    Fp8Operand wT8;  // dx = dy W: the weight's columns are the second operand's rows
    fp8_quantize(nullptr, &wT8, weight_OI, quantize_options(fp8, Fp8Role::kWeight), stream);
    fp8_product(dx_TI, wT8, dy8, Tensor(), Tensor(), {.accumulate = options.accumulate_dx}, stream);
  }
  if (want_dw) {
    ST_CHECK(x_TI.ndim() == 2 && x_TI.size(0) == T && x_TI.size(1) == I, op, ": `x_TI` must be [", T, ", ", I,
             "], found ", x_TI.str());
    Fp8Operand xT8;  // dW = dy^T x: both enter with the tokens as their reduction dimension
    fp8_quantize(nullptr, &xT8, x_TI, quantize_options(fp8, Fp8Role::kActivation), stream);
    fp8_product(dweight_OI, xT8, dyT8, Tensor(), Tensor(), {.accumulate = !options.overwrite_dweight}, stream);
  }
  if (dbias_O.defined()) {
    // the bias gradient sums dy in its own dtype, as without FP8
    LinearBackwardOptions plain = options;
    plain.fp8 = {};
    Tensor none;
    linear_backward(none, none, dbias_O, dy_TO, x_TI.defined() ? x_TI : dx_TI, weight_OI, plain, stream);
  }
}

}  // namespace shardtrain::ops
