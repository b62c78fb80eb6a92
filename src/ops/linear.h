// Linear layer y = x W^T (+ b) with weights in the HF/PyTorch layout [out, in] (O, I), in the
// input dtype or, with an FP8 recipe (LinearFp8), as FP8 products of quantised operands.
// The CPU version calls BLAS (f32 sgemm, f64 dgemm).
#pragma once

#include "core/profile.h"
#include "core/tensor.h"
#include "ops/dispatch.h"
#include "ops/elementwise.h"
#include "ops/fp8.h"

namespace shardtrain::ops {

// FP8 products (training.fp8): with a recipe, each product quantises its operands (ops/fp8.h)
// and multiplies the codes with f32 accumulation; x and the weight in e4m3, the output's
// gradient dy in `gradient_format`. Outputs, the bias and its gradient keep their dtypes.
// The weight gradient reduces over tokens, so x and dy enter it transposed (x^T, dy^T
// quantised with their own groups), and dx takes the weight transposed.
struct LinearFp8 {
  Fp8Recipe recipe = Fp8Recipe::kOff;
  DType gradient_format = DType::kF8E5M2;
  // Tensorwise only (Fp8QuantizeOptions::amax): x's amax slot, read when x_amax_ready and
  // written by the forward's pass otherwise (the backward's x^T then reuses it); dy's, read.
  Tensor x_amax = {};
  bool x_amax_ready = false;
  Tensor dy_amax = {};
  bool on() const { return recipe != Fp8Recipe::kOff; }
};

struct LinearBackwardOptions {
  // Exception to the house rule, for branches that meet (q/k/v, gate/up share an input):
  // when true, dx_TI accumulates (+=) instead of being overwritten.
  bool accumulate_dx = false;
  // When true, dweight_OI and dbias_O are overwritten instead of accumulated (+=): the first
  // gradient a micro-batch writes into a buffer whose old contents are not wanted, so that
  // buffer needs no zero-fill beforehand and the GEMM reads no old values.
  bool overwrite_dweight = false;
  LinearFp8 fp8 = {};  // FP8 products for dx and dweight (the bias gradient stays in dy's dtype)
};

// How the CUDA linear picks the cuBLASLt algorithm for a GEMM shape it meets for the first
// time (the choice is then cached for the process):
//   kHeuristic: cuBLASLt's first recommendation; the same on every run (bitwise reproducible).
//   kTimed: times up to 8 recommendations on that first call's own operands and keeps the
//     fastest. The trials run back to back on a board held at its power cap, as a training
//     step runs them (three interleaved rounds of ~20 ms per candidate, the median round;
//     the process's first selection loads the board for 300 ms first): 8 x 3 x 20 ms, about
//     half a second per shape. On the 1B shape on an H100: +0.3-0.5 % tokens/s; the pick can differ
//     between processes, and with it the last bits of the results. The trial runs write
//     into the call's output when it is overwritten anyway, else into a scratch buffer (up
//     to 256 MiB; larger accumulating outputs keep the heuristic's choice). No trials
//     during CUDA graph capture: a captured step replays the picks its eager first step
//     made, and a shape first met inside a capture keeps the heuristic's choice.
enum class GemmSelection { kHeuristic, kTimed };
void set_gemm_selection(GemmSelection selection);
GemmSelection gemm_selection();

// SMs the CUDA linear leaves free, on this thread, while a guard lives: its GEMMs are planned
// for the device's SMs less `sms` (cuBLASLt's SM count target), so that a collective running
// beside them on another stream gets SMs at once instead of after the GEMM (whose CTAs would
// otherwise hold every SM to its end). 0: every SM. Shapes planned with a reserve are cached
// apart from the same shapes without one.
class GemmSmReserve {
 public:
  explicit GemmSmReserve(int sms);
  ~GemmSmReserve();
  GemmSmReserve(const GemmSmReserve&) = delete;
  GemmSmReserve& operator=(const GemmSmReserve&) = delete;

 private:
  int previous_;
};
int gemm_sm_reserve();  // this thread's reserve now

// out_NM = b_NK · a_MK^T of two FP8 operands with the same padded K (their scales applied,
// f32 accumulation), + bias_M on every row when defined; then + c_NM when defined (c may not
// alias out), or += the old out with `accumulate`. out is bf16, f16 or f32 (f32 or f64 on the
// CPU), the bias and c of out's dtype. The CPU twin multiplies the dequantised operands in f64
// (the oracle); with a narrow out, the product is rounded to out's dtype before the bias or c
// is added. CUDA: cuBLASLt's FP8 GEMM with the operands' scale modes (Hopper); with 1x128 scales
// a needs a multiple of 4 rows (b with fewer is padded into a copy, its output through a
// temporary).
struct Fp8ProductOptions {
  bool accumulate = false;
  bool fast_accumulation = false;  // CUDA: cuBLASLt's FP8 fast accumulation (no periodic f32 promotion)
};

namespace cpu {
void fp8_product(Tensor& out_NM, const Fp8Operand& a_MK, const Fp8Operand& b_NK, const Tensor& bias_M,
                 const Tensor& c_NM, const Fp8ProductOptions& options);
void linear_forward(Tensor& y_TO, const Tensor& x_TI, const Tensor& weight_OI, const Tensor& bias_O);
void linear_backward(Tensor& dx_TI, Tensor& dweight_OI, Tensor& dbias_O, const Tensor& dy_TO,
                     const Tensor& x_TI, const Tensor& weight_OI, const LinearBackwardOptions& options);
}  // namespace cpu

namespace cuda {
void fp8_product(Tensor& out_NM, const Fp8Operand& a_MK, const Fp8Operand& b_NK, const Tensor& bias_M,
                 const Tensor& c_NM, const Fp8ProductOptions& options, Stream stream);
void linear_forward(Tensor& y_TO, const Tensor& x_TI, const Tensor& weight_OI, const Tensor& bias_O, Stream stream);
void linear_forward_add(Tensor& y_TO, const Tensor& x_TI, const Tensor& weight_OI, const Tensor& residual_TO,
                        Stream stream);
void linear_backward(Tensor& dx_TI, Tensor& dweight_OI, Tensor& dbias_O, const Tensor& dy_TO, const Tensor& x_TI,
                     const Tensor& weight_OI, const LinearBackwardOptions& options, Stream stream);
// How many GEMM problems (shape, layout, selection) have a cached algorithm, over every device.
size_t cached_gemm_algorithms();
}  // namespace cuda

inline void fp8_product(Tensor& out_NM, const Fp8Operand& a_MK, const Fp8Operand& b_NK, const Tensor& bias_M,
                        const Tensor& c_NM, const Fp8ProductOptions& options = {}, [[maybe_unused]] Stream stream = {}) {
  const double flops = 2.0 * static_cast<double>(a_MK.rows()) * static_cast<double>(b_NK.rows()) *
                       static_cast<double>(a_MK.padded_cols());
  profile::ScopedTimer profile_timer(
      "fp8_product", out_NM.device(),
      {flops, static_cast<double>(a_MK.data_RP.nbytes() + b_NK.data_RP.nbytes()) +
                  (options.accumulate || c_NM.defined() ? 2.0 : 1.0) * static_cast<double>(out_NM.nbytes())});
  if (out_NM.device().is_cpu()) return cpu::fp8_product(out_NM, a_MK, b_NK, bias_M, c_NM, options);
#ifdef SHARDTRAIN_WITH_CUDA
  return cuda::fp8_product(out_NM, a_MK, b_NK, bias_M, c_NM, options, stream);
#else
  no_kernel("fp8_product", out_NM);
#endif
}

// The linear's FP8 forms (linear.cpp): quantise the operands per the recipe, then fp8_product.
// y = x W^T + bias (+ residual when defined); the contracts of linear_forward(_add).
void linear_forward_fp8(Tensor& y_TO, const Tensor& x_TI, const Tensor& weight_OI, const Tensor& bias_O,
                        const Tensor& residual_TO, const LinearFp8& fp8, Stream stream);
// linear_backward's contract with options.fp8 on.
void linear_backward_fp8(Tensor& dx_TI, Tensor& dweight_OI, Tensor& dbias_O, const Tensor& dy_TO, const Tensor& x_TI,
                         const Tensor& weight_OI, const LinearBackwardOptions& options, Stream stream);

// FLOPs of one product y_TO = x_TI · weight^T: 2·T·I·O.
inline double linear_flops(const Tensor& y_TO, const Tensor& x_TI) {
  if (x_TI.ndim() != 2 || y_TO.ndim() != 2) return 0;  // the op's own checks report it
  return 2.0 * static_cast<double>(x_TI.numel()) * static_cast<double>(y_TO.size(1));
}

// linear_backward's products and the traffic of each: dx (dy and weight read, dx written,
// and read first when it accumulates), dweight (dy and x read, dweight written, and read
// first when it accumulates), dbias (dy read, dbias as dweight).
inline profile::Cost linear_backward_cost(const Tensor& dx_TI, const Tensor& dweight_OI, const Tensor& dbias_O,
                                          const Tensor& dy_TO, const Tensor& x_TI, const Tensor& weight_OI,
                                          const LinearBackwardOptions& options) {
  profile::Cost c;
  if (dy_TO.ndim() != 2 || weight_OI.ndim() != 2) return c;  // the op's own checks report it
  const double product = 2.0 * static_cast<double>(dy_TO.numel()) * static_cast<double>(weight_OI.size(1));
  if (dx_TI.defined()) {
    c.flops += product;
    c.bytes += profile::bytes_of({&dy_TO, &weight_OI}) + (options.accumulate_dx ? 2 : 1) * profile::bytes_of({&dx_TI});
  }
  const double passes = options.overwrite_dweight ? 1 : 2;  // dweight and dbias: written, or read and written
  if (dweight_OI.defined()) {
    c.flops += product;
    c.bytes += profile::bytes_of({&dy_TO, &x_TI}) + passes * profile::bytes_of({&dweight_OI});
  }
  if (dbias_O.defined()) c.bytes += profile::bytes_of({&dy_TO}) + passes * profile::bytes_of({&dbias_O});
  return c;
}

// y_TO = x_TI · weight_OI^T + bias_O (overwrites). bias_O may be undefined (no bias).
// CPU: one dtype for all (f32/f64), accumulation in that dtype by BLAS. CUDA: x and weight
// f32, bf16 or f16, y of that dtype or f32 (bias matching y), f32 accumulation through
// cuBLASLt (no TF32); with a bf16/f16 y the bias is added to the product rounded to y's
// dtype. No aliasing.
// With fp8 on: FP8 products (LinearFp8), the same contract, on the CPU too (its twin).
inline void linear_forward(Tensor& y_TO, const Tensor& x_TI, const Tensor& weight_OI,
                           const Tensor& bias_O = Tensor(), const LinearFp8& fp8 = {},
                           [[maybe_unused]] Stream stream = {}) {
  if (fp8.on()) return linear_forward_fp8(y_TO, x_TI, weight_OI, bias_O, Tensor(), fp8, stream);
  profile::ScopedTimer profile_timer(
      "linear_forward", y_TO.device(),
      {linear_flops(y_TO, x_TI), profile::bytes_of({&y_TO, &x_TI, &weight_OI, &bias_O})});
  if (x_TI.device().is_cpu()) return cpu::linear_forward(y_TO, x_TI, weight_OI, bias_O);
#ifdef SHARDTRAIN_WITH_CUDA
  return cuda::linear_forward(y_TO, x_TI, weight_OI, bias_O, stream);
#else
  no_kernel("linear_forward", x_TI);
#endif
}

// y_TO = x_TI · weight_OI^T + residual_TO (overwrites y; residual may not alias y): a
// projection added onto the residual stream in one pass. CPU: the product, then the add.
// CUDA: the residual enters the GEMM as its C input; y, x, weight and residual share one
// dtype (for bf16 the product is rounded to bf16 before the add, as two ops would).
inline void linear_forward_add(Tensor& y_TO, const Tensor& x_TI, const Tensor& weight_OI, const Tensor& residual_TO,
                               const LinearFp8& fp8 = {}, [[maybe_unused]] Stream stream = {}) {
  if (fp8.on()) return linear_forward_fp8(y_TO, x_TI, weight_OI, Tensor(), residual_TO, fp8, stream);
  profile::ScopedTimer profile_timer(
      "linear_forward_add", y_TO.device(),
      {linear_flops(y_TO, x_TI), profile::bytes_of({&y_TO, &x_TI, &weight_OI, &residual_TO})});
  if (x_TI.device().is_cpu()) {
    cpu::linear_forward(y_TO, x_TI, weight_OI, Tensor());
    return cpu::add(y_TO, y_TO, residual_TO);
  }
#ifdef SHARDTRAIN_WITH_CUDA
  return cuda::linear_forward_add(y_TO, x_TI, weight_OI, residual_TO, stream);
#else
  no_kernel("linear_forward_add", x_TI);
#endif
}

// dx_TI = dy_TO · weight_OI (overwrites, or accumulates with options.accumulate_dx; skipped
// when dx_TI is undefined), dweight_OI += dy_TO^T · x_TI (accumulates, or overwrites with
// options.overwrite_dweight; skipped when undefined), dbias_O += sum over T of dy_TO (as
// dweight; skipped when undefined). x_TI is read only for dweight_OI: a call for dx_TI alone
// may leave x_TI undefined (a backward that recomputes x later, after dx). CUDA: dweight and
// dbias may be f32 with bf16 inputs (f32 gradient accumulation for mixed precision); a
// bf16/f16 dx that accumulates receives the product rounded to its dtype, then the sum
// rounded again.
inline void linear_backward(Tensor& dx_TI, Tensor& dweight_OI, Tensor& dbias_O, const Tensor& dy_TO,
                            const Tensor& x_TI, const Tensor& weight_OI,
                            const LinearBackwardOptions& options = {}, [[maybe_unused]] Stream stream = {}) {
  if (options.fp8.on()) return linear_backward_fp8(dx_TI, dweight_OI, dbias_O, dy_TO, x_TI, weight_OI, options, stream);
  profile::ScopedTimer profile_timer("linear_backward", weight_OI.device(),
                                     linear_backward_cost(dx_TI, dweight_OI, dbias_O, dy_TO, x_TI, weight_OI, options));
  if (weight_OI.device().is_cpu())
    return cpu::linear_backward(dx_TI, dweight_OI, dbias_O, dy_TO, x_TI, weight_OI, options);
#ifdef SHARDTRAIN_WITH_CUDA
  return cuda::linear_backward(dx_TI, dweight_OI, dbias_O, dy_TO, x_TI, weight_OI, options, stream);
#else
  no_kernel("linear_backward", weight_OI);
#endif
}

}  // namespace shardtrain::ops
